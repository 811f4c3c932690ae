// A turn whose connection fails before any answer (a kept-alive connection the server closed,
// ECONNRESET, socket hang up) is sent again with the same turn id and body, at most maxRetries
// times: the engine answers a turn it has seen from its memory. A request that is not safe to
// repeat (creating a session) is not sent again.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { Client, SwitchboardError, turnIdOf } from "../dist/index.js";
import { switchboardTools } from "../dist/ai-sdk.js";
import { assistant, toolUse } from "./_server.mjs";

const CALL = assistant(toolUse("a", "bash", { command: "echo x" }));

/** A fake server that drops the connection of the first `drops` requests to `dropped` (a
 * pattern of the path) without answering — half of them reset (RST), half closed. */
async function dropping({ drops = 2, dropped = /\/dispatch/, onDispatch, port = 0 } = {}) {
  const seen = [];
  let creations = 0;
  const httpd = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const reply = (status, obj, headers = {}) => {
        res.writeHead(status, { "content-type": "application/json", ...headers });
        res.end(JSON.stringify(obj));
      };
      if (dropped.test(req.url)) {
        seen.push({ url: req.url, turnId: req.headers["switchboard-turn-id"], body });
        if (seen.length <= drops) {
          if (seen.length % 2) req.socket.resetAndDestroy();
          else req.socket.destroy();
          return;
        }
      }
      if (req.url === "/v1/sessions") return reply(201, { session_id: "s1", workspace: "/tmp/s1", tools: [], n: ++creations });
      if (req.url.startsWith("/v1/sessions/s1/tools")) return reply(200, [{ name: "bash", description: "Runs.", input_schema: { type: "object" } }]);
      if (req.url.includes("/dispatch")) {
        const doc = JSON.parse(body);
        const content = doc.content.map((b) => ({ type: "tool_result", tool_use_id: b.id, content: `ran ${b.id}` }));
        onDispatch?.(req);
        return reply(200, { role: "user", content }, { "switchboard-turn-id": req.headers["switchboard-turn-id"] });
      }
      reply(200, {});
    });
  });
  await new Promise((r) => httpd.listen(port, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${httpd.address().port}`,
    seen,
    creations: () => creations,
    close: () => new Promise((r) => (httpd.closeAllConnections(), httpd.close(r))),
  };
}

test("a turn whose connection is dropped before any answer is sent again, same turn id and body", async () => {
  const f = await dropping({ drops: 2 });
  const session = new Client(f.url, { token: "t" }).session();
  const answer = await session.dispatch(CALL, { turnId: "resend-me" });
  assert.equal(answer.content[0].content, "ran a");
  assert.equal(f.seen.length, 3); // two dropped, the third answered
  assert.deepEqual(new Set(f.seen.map((s) => s.turnId)), new Set(["resend-me"]));
  assert.equal(new Set(f.seen.map((s) => s.body)).size, 1);
  // A derived turn id is kept across the copies too.
  f.seen.length = 0;
  const again = await new Client(f.url, { token: "t" }).session().dispatch(CALL);
  assert.equal(again.content[0].content, "ran a");
  assert.deepEqual(new Set(f.seen.map((s) => s.turnId)), new Set([turnIdOf(JSON.stringify(CALL))]));
  await f.close();
});

test("a streamed turn (client tools) is sent again the same way", async () => {
  const f = await dropping({ drops: 1 });
  const session = new Client(f.url, { token: "t" }).session();
  session.tool({ name: "lookup", execute: () => "x" });
  // The fake answers JSON, not a stream: a bad_response — after the dropped copy was sent again.
  await assert.rejects(session.dispatch(assistant(toolUse("l", "lookup", {})), { turnId: "streamed" }), (e) => e.code === "bad_response");
  assert.equal(f.seen.length, 2);
  assert.deepEqual(new Set(f.seen.map((s) => s.turnId)), new Set(["streamed"]));
  await f.close();
});

test("the copies are bounded by maxRetries; then connection_error", async () => {
  const f = await dropping({ drops: 100 });
  const session = new Client(f.url, { token: "t", maxRetries: 3 }).session();
  await assert.rejects(session.dispatch(CALL), (e) => e instanceof SwitchboardError && e.code === "connection_error" && e.status === undefined);
  assert.equal(f.seen.length, 4); // the first try and 3 copies
  await f.close();
});

test("a refused connection is tried again, creating a session too: nothing reached the server", async () => {
  const f = await dropping({ drops: 0 });
  const port = Number(new URL(f.url).port);
  await f.close();
  // Nothing listens on the port for 150 ms, then the fake does again.
  let again;
  const reopened = new Promise((r) => setTimeout(async () => {
    again = await dropping({ drops: 0, port });
    r();
  }, 150));
  const session = await new Client(f.url, { token: "t", maxRetries: 8 }).session().create();
  await reopened;
  assert.equal(session.id, "s1");
  assert.equal(again.creations(), 1);
  await again.close();
  const nobody = new Client(f.url, { token: "t", maxRetries: 2 });
  await assert.rejects(nobody.health(), (e) => e.code === "connection_error" && /ECONNREFUSED/.test(e.message));
});

test("creating a session is not sent again after a lost connection (a second session would be left behind)", async () => {
  const f = await dropping({ drops: 1, dropped: /^\/v1\/sessions$/ });
  const session = new Client(f.url, { token: "t" }).session();
  await assert.rejects(session.create(), (e) => e.code === "connection_error");
  assert.equal(f.seen.length, 1);
  await session.create(); // the next use tries again
  assert.equal(f.creations(), 1);
  await f.close();
});

test("the AI SDK adapter's turn is named after the SDK's tool-call ids, and sent again under that name", async () => {
  const f = await dropping({ drops: 1 });
  const session = new Client(f.url, { token: "t" }).session();
  const tools = await switchboardTools(session);
  const output = await tools.bash.execute({ command: "echo x" }, { toolCallId: "call_sdk_1", messages: [] });
  assert.equal(output, "ran call_sdk_1");
  assert.equal(f.seen.length, 2);
  const message = { role: "assistant", content: [{ type: "tool_use", id: "call_sdk_1", name: "bash", input: { command: "echo x" } }] };
  assert.deepEqual(new Set(f.seen.map((s) => s.turnId)), new Set([turnIdOf(JSON.stringify(message))]));
  await f.close();
});
