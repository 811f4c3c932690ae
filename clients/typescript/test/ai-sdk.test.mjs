// The Vercel AI SDK adapter against the real `ai` package: generateText runs its tool loop
// with a scripted MockLanguageModelV3 (from `ai/test`), every tool call going through the real
// server.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { Client } from "../dist/index.js";
import { switchboardTools } from "../dist/ai-sdk.js";
import { TOKEN, startServer, until } from "./_server.mjs";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client(server.baseUrl, { token: TOKEN });
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** A model answering with `steps[i]` (tool calls `[name, input]`, or text) at its i-th call; its
 * tool call ids are `${prefix}_${i}_${j}` (a session answers an id it has seen from its answers:
 * a second run in one session needs another prefix). */
function scripted(steps, prefix = "call") {
  const prompts = [];
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      prompts.push(options.prompt);
      const step = steps[prompts.length - 1];
      if (typeof step === "string") {
        return { content: [{ type: "text", text: step }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      }
      return {
        content: step.map(([toolName, input], i) => ({
          type: "tool-call",
          toolCallId: `${prefix}_${prompts.length}_${i}`,
          toolName,
          input: JSON.stringify(input),
        })),
        finishReason: { unified: "tool-calls", raw: "tool_use" },
        usage,
        warnings: [],
      };
    },
  });
  return { model, prompts };
}

function toolResults(prompt) {
  return prompt.filter((m) => m.role === "tool").flatMap((m) => m.content);
}

test("generateText runs built-ins and client tools through the engine, one turn per step", async () => {
  const session = client.session();
  session.tool({
    name: "ticket",
    description: "Fetches a ticket.",
    inputSchema: { type: "object", properties: { ticket_id: { type: "string" } }, required: ["ticket_id"] },
    execute: ({ ticket_id }) => ({ id: ticket_id, status: "open" }),
  });
  const tools = await switchboardTools(session);
  assert.ok("bash" in tools && "ticket" in tools);
  const { model, prompts } = scripted([
    [
      ["ticket", { ticket_id: "T-42" }],
      ["bash", { command: "echo from-bash" }],
      ["write_file", { path: "n.txt", content: "x" }],
    ],
    [["read_file", { path: "n.txt" }]],
    "Ticket T-42 is open.",
  ]);
  const result = await generateText({ model, tools, prompt: "Read ticket T-42.", stopWhen: stepCountIs(5) });
  assert.equal(result.text, "Ticket T-42 is open.");
  assert.equal(prompts.length, 3);
  const first = toolResults(prompts[1]);
  assert.deepEqual(
    first.map((r) => r.toolName),
    ["ticket", "bash", "write_file"],
  );
  const outputs = first.map((r) => r.output.value);
  assert.deepEqual(JSON.parse(outputs[0]), { id: "T-42", status: "open" });
  assert.equal(outputs[1], "from-bash");
  const second = toolResults(prompts[2]).at(-1);
  assert.equal(second.toolName, "read_file");
  assert.equal(second.output.value, "x");
  // The three calls of the first step were one turn, the read the second.
  assert.equal((await session.info()).turns, 2);
  await session.close();
});

test("failures: the engine's error text as the output, or thrown with errors: 'throw'", async () => {
  const session = client.session();
  const tools = await switchboardTools(session, { only: ["read_file"] });
  assert.deepEqual(Object.keys(tools), ["read_file"]);
  const a = scripted([[["read_file", { path: "missing.txt" }]], "done"]);
  await generateText({ model: a.model, tools, prompt: "go", stopWhen: stepCountIs(3) });
  const [res] = toolResults(a.prompts[1]);
  assert.match(String(res.output.value), /^Error \[/);

  const throwing = await switchboardTools(session, { only: ["read_file"], errors: "throw" });
  const b = scripted([[["read_file", { path: "missing.txt" }]], "done"], "again");
  await generateText({ model: b.model, tools: throwing, prompt: "go", stopWhen: stepCountIs(3) });
  const [err] = toolResults(b.prompts[1]);
  assert.equal(err.output.type, "error-text");
  assert.match(err.output.value, /^Error \[/);
  await assert.rejects(switchboardTools(session, { only: ["nope"] }), /not in the session's catalog: nope/);
  await session.close();
});

test("the AI SDK's abortSignal cancels the turn on the server", async () => {
  const session = client.session();
  let entered;
  const started = new Promise((r) => (entered = r));
  session.tool({
    name: "slow",
    execute: (_i, ctx) => new Promise((resolve) => (entered(), ctx.signal.addEventListener("abort", () => resolve("late")))),
  });
  const tools = await switchboardTools(session, { only: ["slow"] });
  const controller = new AbortController();
  const { model } = scripted([[["slow", {}]], "done"]);
  const run = generateText({ model, tools, prompt: "go", stopWhen: stepCountIs(3), abortSignal: controller.signal });
  await started;
  controller.abort();
  await assert.rejects(run); // the AI SDK rejects an aborted generation
  // The turn was cancelled on the server (its call answered `cancelled`), not left running.
  assert.ok(await until(async () => (await session.info()).in_flight === 0));
  await session.close();
});
