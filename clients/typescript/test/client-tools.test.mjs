// Client tools: declared with the session, run by the client when the turn's stream hands
// them over, answered once; zod schemas; errors as results.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { z } from "zod";

import { Client, SwitchboardError, ToolError, defineTool, isZodSchema, zodToJsonSchema } from "../dist/index.js";
import { TOKEN, assistant, startServer, toolUse } from "./_server.mjs";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client(server.baseUrl, { token: TOKEN });
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

const lookup = {
  name: "lookup",
  description: "Looks a key up.",
  inputSchema: { type: "object", properties: { key: { type: "string" } }, required: ["key"], additionalProperties: false },
  execute: async ({ key }, ctx) => {
    assert.equal(typeof ctx.callId, "string");
    assert.ok(ctx.deadlineMs > 0);
    return { key, value: key.toUpperCase(), toolUseId: ctx.toolUseId };
  },
};

test("client tools and built-ins answer in call order; the catalog lists them after the server's", async () => {
  const session = client.session({ tools: [lookup] });
  session.tool({
    name: "blocks",
    description: "Content blocks.",
    inputSchema: { type: "object", properties: {} },
    execute: () => [{ type: "text", text: "one" }, { type: "text", text: "two" }],
  });
  session.tool({ name: "nothing", inputSchema: { type: "object" }, execute: () => undefined });
  assert.deepEqual(
    session.clientTools.map((t) => t.name),
    ["lookup", "blocks", "nothing"],
  );
  const answer = await session.dispatch(
    assistant(
      toolUse("a", "lookup", { key: "alpha" }),
      toolUse("b", "bash", { command: "echo built-in" }),
      toolUse("c", "blocks", {}),
      toolUse("d", "nothing", {}),
    ),
  );
  assert.deepEqual(
    answer.content.map((b) => b.tool_use_id),
    ["a", "b", "c", "d"],
  );
  assert.deepEqual(JSON.parse(answer.content[0].content), { key: "alpha", value: "ALPHA", toolUseId: "a" });
  assert.equal(answer.content[1].content, "built-in");
  const blocks = answer.content[2].content;
  assert.ok(Array.isArray(blocks) ? blocks.map((b) => b.text).join() === "one,two" : blocks.includes("one"), JSON.stringify(blocks));
  assert.equal(answer.content[3].content ?? "", "");
  const names = (await session.tools()).map((t) => t.name);
  assert.equal(names.at(-1), "nothing");
  assert.ok(names.indexOf("bash") < names.indexOf("lookup"));
  // Tools are fixed once the session exists.
  assert.throws(() => session.tool({ name: "late", execute: () => "x" }), /before the session is first used/);
  await session.close();
});

test("invalid arguments never reach the function", async () => {
  let called = 0;
  const session = client.session({ tools: [{ ...lookup, execute: () => (called++, "x") }] });
  const answer = await session.dispatch(assistant(toolUse("a", "lookup", { key: 42 })));
  assert.equal(answer.content[0].is_error, true);
  assert.match(answer.content[0].content, /^Error \[invalid_arguments\]/);
  assert.equal(called, 0);
  await session.close();
});

test("a tool that throws is answered '<Name>: message'; a ToolError's message as it is", async () => {
  const session = client.session();
  session.tool({ name: "boom", execute: () => { throw new RangeError("out of range"); } });
  session.tool({ name: "refuse", execute: async () => { throw new ToolError("no order A-1; order numbers look like A-1042"); } });
  session.tool({ name: "weird", execute: () => { throw "a string"; } });
  session.tool({ name: "undeclared_fn", description: "declared only", input_schema: { type: "object" } });
  const answer = await session.dispatch(
    assistant(toolUse("a", "boom", {}), toolUse("b", "refuse", {}), toolUse("c", "weird", {}), toolUse("d", "undeclared_fn", {})),
  );
  const [boom, refuse, weird, undeclared] = answer.content;
  for (const b of answer.content) assert.equal(b.is_error, true);
  assert.match(boom.content, /RangeError: out of range/);
  assert.match(refuse.content, /no order A-1; order numbers look like A-1042$/);
  assert.doesNotMatch(refuse.content, /ToolError/);
  assert.match(weird.content, /Error: a string/);
  assert.match(undeclared.content, /has no function/);
  await session.close();
});

test("calls run concurrently as the server hands them over", async () => {
  let release;
  const gate = new Promise((r) => (release = r));
  let entered = 0;
  const session = client.session();
  session.tool({
    name: "wait",
    concurrencySafe: true,
    inputSchema: { type: "object", properties: { n: { type: "integer" } } },
    execute: async ({ n }) => {
      entered += 1;
      if (entered === 3) release();
      await gate; // every call must be running at once for any to finish
      return `w${n}`;
    },
  });
  const answer = await session.dispatch(assistant(...[0, 1, 2].map((n) => toolUse(`w${n}`, "wait", { n }))));
  assert.deepEqual(
    answer.content.map((b) => b.content),
    ["w0", "w1", "w2"],
  );
  await session.close();
});

test("the OpenAI shape: tool declarations and the stream of client results", async () => {
  const session = client.session({
    tools: [
      {
        type: "function",
        function: { name: "add", description: "Adds.", parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } } } },
      },
    ],
  });
  assert.throws(() => session.tool({ name: "add", execute: () => 0 }), /registered twice/);
  // Declared without a function: give it one by name with the declaration.
  const s2 = client.session();
  s2.tool(
    { type: "function", function: { name: "add", description: "Adds.", parameters: { type: "object" } } },
    ({ a, b }) => a + b,
  );
  const call = { id: "c1", type: "function", function: { name: "add", arguments: '{"a": 2, "b": 3}' } };
  const stream = s2.stream({ role: "assistant", tool_calls: [call] });
  const seen = [];
  for await (const item of stream) seen.push(item);
  assert.equal(seen.length, 1);
  assert.deepEqual(stream.answer, [{ role: "tool", tool_call_id: "c1", content: "5" }]);
  await session.close();
  await s2.close();
});

test("zod schemas: converted to JSON schema, and the input parsed by zod", async () => {
  const Input = z.object({ city: z.string().describe("the city"), days: z.number().int().default(3) });
  assert.ok(isZodSchema(Input));
  assert.equal(isZodSchema({ type: "object" }), false);
  const schema = await zodToJsonSchema(Input);
  assert.equal(schema.type, "object");
  assert.equal(schema.properties.city.description, "the city");
  assert.equal(schema.$schema, undefined);
  const forecast = defineTool({
    name: "forecast",
    description: "The weather.",
    inputSchema: Input,
    execute: ({ city, days }) => `${city}: ${days} days`,
  });
  const session = client.session({ tools: [forecast] });
  const answer = await session.dispatch(assistant(toolUse("f", "forecast", { city: "Oslo" })));
  assert.equal(answer.content[0].content, "Oslo: 3 days"); // the default came from zod
  const catalog = await session.tools();
  const declared = catalog.find((t) => t.name === "forecast");
  assert.equal(declared.input_schema.properties.city.type, "string");
  const refused = await session.dispatch(assistant(toolUse("g", "forecast", { days: 2 })));
  assert.equal(refused.content[0].is_error, true); // the engine validated against the converted schema
  await session.close();
});

test("a refused declaration is bad_request and creates nothing; the next use tries again", async () => {
  const session = client.session({ tools: [{ name: "bash", execute: () => "" }] });
  await assert.rejects(session.create(), (e) => e instanceof SwitchboardError && e.code === "bad_request" && /bash/.test(e.message));
  await assert.rejects(session.create(), (e) => e.code === "bad_request");
  // A failed creation leaves the tools open (as nothing was made).
  session.tool({ name: "x_1", execute: () => "" });
  assert.equal(session.created, false);
});
