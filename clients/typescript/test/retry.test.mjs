// `overloaded` (503 + Retry-After: nothing ran) is retried after Retry-After, bounded by
// maxRetries and retryBudgetMs, with the same turn id and body; other errors are thrown.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { Client, SwitchboardError } from "../dist/index.js";
import { TOKEN, assistant, startServer, toolUse } from "./_server.mjs";

const ANSWER = { role: "user", content: [{ type: "tool_result", tool_use_id: "a", content: "x" }] };
const CALL = assistant(toolUse("a", "bash", { command: "echo x" }));

/** A fake server answering the first `refusals` dispatches 503 overloaded, then 200. */
async function fake({ refusals = 2, retryAfter = "0.05", status = 503, code = "overloaded" } = {}) {
  const seen = [];
  const httpd = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const reply = (s, obj, headers = {}) => {
        res.writeHead(s, { "content-type": "application/json", ...headers });
        res.end(JSON.stringify(obj));
      };
      if (req.url === "/v1/sessions") return reply(201, { session_id: "s1", workspace: "/tmp/s1", tools: [] });
      if (req.method === "DELETE") return reply(200, {});
      seen.push({ url: req.url, turnId: req.headers["switchboard-turn-id"], body });
      if (seen.length <= refusals) return reply(status, { error: { code, message: "busy" } }, { "retry-after": retryAfter });
      reply(200, ANSWER, { "switchboard-turn-id": req.headers["switchboard-turn-id"] });
    });
  });
  await new Promise((r) => httpd.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${httpd.address().port}`, seen, close: () => new Promise((r) => httpd.close(r)) };
}

test("overloaded is retried with the same turn id and body", async () => {
  const f = await fake();
  const session = new Client(f.url, { token: "t" }).session();
  assert.deepEqual(await session.dispatch(CALL, { turnId: "retry-me" }), ANSWER);
  assert.equal(f.seen.length, 3);
  assert.deepEqual(new Set(f.seen.map((s) => s.turnId)), new Set(["retry-me"]));
  assert.equal(new Set(f.seen.map((s) => s.body)).size, 1);
  // A generated turn id is kept across retries too.
  f.seen.length = 0;
  await session.dispatch(CALL);
  assert.equal(new Set(f.seen.map((s) => s.turnId)).size, 1);
  await session.close();
  await f.close();
});

for (const code of ["node_unreachable", "session_moved", "cluster_unavailable"]) {
  test(`a cluster's ${code} is retried with the same turn id`, async () => {
    const f = await fake({ code });
    const session = new Client(f.url, { token: "t" }).session();
    assert.deepEqual(await session.dispatch(CALL, { turnId: "moving" }), ANSWER);
    assert.equal(f.seen.length, 3);
    assert.deepEqual(new Set(f.seen.map((s) => s.turnId)), new Set(["moving"]));
    await session.close();
    await f.close();
  });
}

test("past maxRetries the overloaded error is thrown, with retryAfter", async () => {
  const f = await fake({ refusals: 100 });
  const session = new Client(f.url, { token: "t", maxRetries: 2 }).session();
  await assert.rejects(session.dispatch(CALL), (e) => e instanceof SwitchboardError && e.code === "overloaded" && e.status === 503 && e.retryAfter === 0.05);
  assert.equal(f.seen.length, 3); // the first try and 2 retries
  await f.close();
});

test("a Retry-After past the budget is not waited for", async () => {
  const f = await fake({ refusals: 100, retryAfter: "60" });
  const session = new Client(f.url, { token: "t" }).session();
  await assert.rejects(session.dispatch(CALL), (e) => e.code === "overloaded" && e.retryAfter === 60);
  assert.equal(f.seen.length, 1);
  await f.close();
});

test("other errors are not retried", async () => {
  const f = await fake({ refusals: 100, status: 503, code: "shutting_down" });
  await assert.rejects(new Client(f.url, { token: "t" }).session().dispatch(CALL), (e) => e.code === "shutting_down");
  assert.equal(f.seen.length, 1);
  await f.close();
});

describeReal();

function describeReal() {
  let server;
  before(async () => {
    server = await startServer(["--max-requests", "1"]);
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  test("the real server's overloaded (--max-requests 1) is retried until the request gets in", async () => {
    let release;
    const gate = new Promise((r) => (release = r));
    const refusals = [];
    const counting = async (url, init) => {
      const resp = await fetch(url, init);
      if (resp.status === 503) {
        refusals.push(resp.headers.get("retry-after"));
        release(); // the held turn ends: the retry gets in
      }
      return resp;
    };
    const client = new Client(server.baseUrl, { token: TOKEN, fetch: counting });
    const holder = client.session();
    let entered;
    const holding = new Promise((r) => (entered = r));
    holder.tool({ name: "hold", execute: async () => (entered(), await gate, "held") });
    await holder.create();
    const other = await client.session().create();
    const held = holder.dispatch(assistant(toolUse("h", "hold", {})));
    await holding; // its turn is in flight: the other dispatch is refused until it ends
    const answer = await other.dispatch(assistant(toolUse("o", "bash", { command: "echo in" })));
    assert.equal(answer.content[0].content, "in");
    assert.equal((await held).content[0].content, "held");
    assert.ok(refusals.length >= 1);
    assert.equal(refusals[0], "1");
    await holder.close();
    await other.close();
  });
}
