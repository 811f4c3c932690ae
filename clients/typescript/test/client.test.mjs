// The client against the real server: sessions, dispatch in both formats, stream, errors.
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, SwitchboardError } from "../dist/index.js";
import { TOKEN, assistant, startServer, toolUse } from "./_server.mjs";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client(server.baseUrl, { token: TOKEN });
});
after(async () => {
  assert.equal(await server.stop(), 0, "the server exits 0 on SIGTERM");
});

test("health and the server catalog", async () => {
  assert.equal((await client.health()).status, "ok");
  const tools = await client.tools();
  assert.ok(tools.some((t) => t.name === "bash" && t.input_schema));
  const openai = await client.tools("openai");
  assert.ok(openai.some((t) => t.type === "function" && t.function.name === "read_file"));
});

test("anthropic dispatch returns the tool_result user message, in call order", async () => {
  await client.withSession("demo", async (session) => {
    const answer = await session.dispatch(
      assistant(
        toolUse("t1", "bash", { command: "echo hi" }),
        toolUse("t2", "write_file", { path: "a.txt", content: "A" }),
        toolUse("t3", "read_file", { path: "a.txt" }),
      ),
    );
    assert.equal(answer.role, "user");
    assert.deepEqual(
      answer.content.map((b) => b.tool_use_id),
      ["t1", "t2", "t3"],
    );
    assert.equal(answer.content[0].content, "hi");
    assert.ok(session.workspace.endsWith("/demo"));
    assert.equal(readFileSync(join(session.workspace, "a.txt"), "utf8"), "A");
  });
});

test("openai dispatch returns the tool messages; a completion and a tool_calls array too", async () => {
  const session = client.session();
  const call = { id: "c1", type: "function", function: { name: "bash", arguments: JSON.stringify({ command: "echo oa" }) } };
  const msg = { role: "assistant", content: null, tool_calls: [call] };
  const answer = await session.dispatch(msg);
  assert.deepEqual(answer, [{ role: "tool", tool_call_id: "c1", content: "oa" }]);
  const completion = { id: "x", object: "chat.completion", choices: [{ index: 0, message: msg, finish_reason: "tool_calls" }] };
  assert.deepEqual(await session.dispatch(completion), answer);
  assert.deepEqual(await session.dispatch([call]), answer);
  assert.deepEqual(await session.dispatch(JSON.stringify(msg)), answer);
  await session.close();
});

test("no tool call is null and sends nothing (the session is not even created)", async () => {
  const session = client.session();
  assert.equal(await session.dispatch({ role: "assistant", content: [{ type: "text", text: "done" }] }), null);
  assert.equal(await session.dispatch({ role: "assistant", content: "done" }), null);
  assert.equal(await session.dispatch({ role: "assistant", content: "x", tool_calls: [] }), null);
  assert.equal(await session.dispatch({ role: "assistant", content: "x", tool_calls: null }), null);
  assert.equal(session.created, false);
  assert.throws(() => session.id, /created on first use/);
  await session.close();
});

test("tool failures are results; the session's info and catalog", async () => {
  const session = await client.session().create();
  const answer = await session.dispatch(assistant(toolUse("u", "no_such_tool", {}), toolUse("v", "read_file", { path: "missing" })));
  for (const block of answer.content) {
    assert.equal(block.is_error, true);
    assert.match(block.content, /^Error \[/);
  }
  const info = await session.info();
  assert.equal(info.session_id, session.id);
  assert.equal(info.in_flight, 0);
  assert.ok((await session.tools()).some((t) => t.name === "bash"));
  await session.close();
  await session.close(); // twice is fine
});

test("stream yields each result as it comes, then the answer in call order", async () => {
  await client.withSession({}, async (session) => {
    const stream = session.stream(
      assistant(toolUse("a", "bash", { command: "sleep 0.2; echo slow" }), toolUse("b", "bash", { command: "echo fast" })),
    );
    const seen = [];
    for await (const { index, result } of stream) seen.push([index, result.content]);
    assert.equal(seen.length, 2);
    assert.deepEqual(
      seen.map(([i]) => i).sort(),
      [0, 1],
    );
    assert.deepEqual(
      stream.answer.content.map((b) => b.content),
      ["slow", "fast"],
    );
    assert.match(stream.turnId, /^m-[0-9a-f]{32}$/);
  });
});

test("errors carry the server's code and status", async () => {
  const bad = new Client(server.baseUrl, { token: "wrong" });
  await assert.rejects(bad.session().create(), (e) => e instanceof SwitchboardError && e.code === "unauthorized" && e.status === 401);
  await assert.rejects(client.session({ workspace: ".." }).create(), (e) => e.code === "bad_request" && e.status === 400);
  const session = await client.session().create();
  await session.close();
  await assert.rejects(session.dispatch(assistant(toolUse("a", "bash", { command: "true" }))), (e) => e.code === "unknown_session");
  const gone = new Client("http://127.0.0.1:9", { token: TOKEN });
  await assert.rejects(gone.health(), (e) => e.code === "connection_error" && e.status === undefined);
});

test("the token defaults to SWITCHBOARD_TOKEN", async () => {
  const saved = process.env.SWITCHBOARD_TOKEN;
  process.env.SWITCHBOARD_TOKEN = TOKEN;
  try {
    const session = await new Client({ baseUrl: server.baseUrl }).session().create();
    await session.close();
  } finally {
    if (saved === undefined) delete process.env.SWITCHBOARD_TOKEN;
    else process.env.SWITCHBOARD_TOKEN = saved;
  }
});

test("a session narrows its sandbox", async () => {
  const health = await client.health();
  const session = client.session({ sandbox: "read-only" });
  try {
    await session.create();
    const answer = await session.dispatch(assistant(toolUse("w", "write_file", { path: "x.txt", content: "x" })));
    assert.equal(answer.content[0].is_error, true);
    assert.equal(existsSync(join(session.workspace, "x.txt")), false);
  } catch (e) {
    // A server whose own sandbox is `off` or `best-effort` may refuse nothing narrower; say so.
    assert.ok(e instanceof SwitchboardError, String(e));
    assert.equal(e.code, "bad_request", `${e.message} (server sandbox ${JSON.stringify(health.sandbox)})`);
  } finally {
    await session.close();
  }
});
