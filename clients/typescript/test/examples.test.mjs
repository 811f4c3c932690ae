// The example agent loops (examples/*.mjs), run as written with the real @anthropic-ai/sdk and
// openai packages against a scripted model on loopback and the real server.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { main as anthropicLoop } from "../examples/anthropic-loop.mjs";
import { main as openaiLoop } from "../examples/openai-loop.mjs";
import { scriptedModel } from "./_models.mjs";
import { TOKEN, startServer } from "./_server.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

test("the Anthropic SDK loop", async () => {
  const model = await scriptedModel();
  process.env.ANTHROPIC_BASE_URL = model.url;
  process.env.ANTHROPIC_API_KEY = "test-key";
  try {
    const text = await anthropicLoop({ sidecarUrl: server.baseUrl, token: TOKEN, model: "scripted" });
    assert.equal(text, "Ticket T-42 is open.");
    assert.equal(model.requests.length, 2);
    const first = model.requests[0].body;
    const names = first.tools.map((t) => t.name);
    assert.ok(names.includes("glob") && names.at(-1) === "ticket");
    const [, assistantMsg, results] = model.requests[1].body.messages;
    assert.equal(assistantMsg.role, "assistant");
    assert.equal(results.role, "user");
    const [ticket, glob] = results.content;
    assert.equal(ticket.tool_use_id, "toolu_t");
    assert.deepEqual(JSON.parse(ticket.content), { id: "T-42", title: "Crash on empty input", status: "open" });
    assert.equal(glob.tool_use_id, "toolu_g");
    assert.equal(glob.is_error, undefined);
  } finally {
    delete process.env.ANTHROPIC_BASE_URL;
    await model.close();
  }
});

test("the OpenAI SDK loop (with a zod client tool)", async () => {
  const model = await scriptedModel();
  process.env.OPENAI_BASE_URL = model.url;
  process.env.OPENAI_API_KEY = "test-key";
  try {
    const text = await openaiLoop({ sidecarUrl: server.baseUrl, token: TOKEN, model: "scripted" });
    assert.equal(text, "Ticket T-42 is open.");
    assert.equal(model.requests.length, 2);
    const tools = model.requests[0].body.tools;
    const ticket = tools.find((t) => t.function.name === "ticket");
    assert.equal(ticket.function.parameters.properties.ticket_id.description, "like T-42");
    const msgs = model.requests[1].body.messages;
    const toolMsgs = msgs.filter((m) => m.role === "tool");
    assert.deepEqual(
      toolMsgs.map((m) => m.tool_call_id),
      ["call_t", "call_g"],
    );
    assert.equal(JSON.parse(toolMsgs[0].content).status, "open");
  } finally {
    delete process.env.OPENAI_BASE_URL;
    await model.close();
  }
});
