// Every refusal is immediate and clear: a client tool's answer the server refuses is replaced
// at once by an error naming why (and logged); an answer the client cannot read is a
// `bad_response` SwitchboardError, never a raw SyntaxError; whatever a tool throws or returns
// becomes a result, never a crashed process.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { Client, SwitchboardError } from "../dist/index.js";
import { TOKEN, assistant, startServer, toolUse } from "./_server.mjs";

let server;
before(async () => {
  server = await startServer(["--max-body", "4096"]);
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

/** A client whose warnings are collected in `warnings`. */
function collecting(url = server.baseUrl, token = TOKEN) {
  const warnings = [];
  return { client: new Client(url, { token, logger: { warn: (m) => warnings.push(m) } }), warnings };
}

test("an answer the server refuses (over --max-body) is replaced at once by an error naming why, and logged", { timeout: 30_000 }, async () => {
  const { client, warnings } = collecting();
  const session = client.session();
  // A long deadline: without the immediate error the model would be told `timeout` after it.
  session.tool({ name: "big", timeoutMs: 600_000, execute: () => "x".repeat(20_000) });
  session.tool({ name: "small", execute: () => "fits" });
  const answer = await session.dispatch(assistant(toolUse("b", "big", {}), toolUse("s", "small", {})));
  const [big, small] = answer.content;
  assert.equal(big.is_error, true);
  assert.match(big.content, /^Error \[execution_error\]: SwitchboardError: the server refused the answer of client tool "big" \(payload_too_large, HTTP 413/);
  assert.match(big.content, /--max-body/);
  assert.doesNotMatch(big.content, /timeout/);
  assert.equal(small.content, "fits");
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /refused the answer of client tool "big" \(payload_too_large/);
  await session.close();
});

test("whatever a tool throws or returns becomes a result; what JSON cannot carry is an error saying so", async () => {
  const { client, warnings } = collecting();
  const session = client.session();
  const nullProto = Object.assign(Object.create(null), { why: "no prototype" });
  const badString = { toString: () => { throw new Error("no string for you"); } };
  const cyclic = { name: "loop" };
  cyclic.self = cyclic;
  const tools = {
    throws_null_proto: () => { throw nullProto; },
    throws_bad_to_string: () => { throw badString; },
    throws_bad_message: () => { const e = new Error("x"); Object.defineProperty(e, "message", { get() { throw new Error("no"); } }); throw e; },
    throws_bigint: () => { throw 10n; },
    returns_bigint: () => 10n,
    returns_nested_bigint: () => ({ amount: 10n }),
    returns_cyclic: () => cyclic,
    returns_function: () => () => 1,
    returns_null_proto: () => nullProto,
    returns_bad_to_string: () => ({ ...badString, ok: true }),
  };
  for (const [name, execute] of Object.entries(tools)) session.tool({ name, execute });
  const names = Object.keys(tools);
  const answer = await session.dispatch(assistant(...names.map((n) => toolUse(n, n, {}))));
  const byName = Object.fromEntries(answer.content.map((b, i) => [names[i], b]));
  for (const name of names.filter((n) => !n.startsWith("returns_null_proto") && !n.startsWith("returns_bad_to_string"))) {
    assert.equal(byName[name].is_error, true, `${name}: ${byName[name].content}`);
  }
  assert.match(byName.throws_null_proto.content, /Error: \{"why":"no prototype"\}/);
  assert.match(byName.throws_bad_to_string.content, /^Error \[execution_error\]: Error: /);
  assert.match(byName.throws_bad_message.content, /^Error \[execution_error\]: Error/);
  assert.match(byName.throws_bigint.content, /Error: 10/);
  for (const name of ["returns_bigint", "returns_nested_bigint", "returns_cyclic", "returns_function"]) {
    assert.match(byName[name].content, new RegExp(`client tool "${name}" returned a value that cannot be sent as JSON`));
  }
  assert.match(byName.returns_nested_bigint.content, /BigInt/);
  assert.match(byName.returns_cyclic.content, /circular/);
  assert.deepEqual(JSON.parse(byName.returns_null_proto.content), { why: "no prototype" });
  assert.equal(byName.returns_null_proto.is_error, undefined);
  assert.deepEqual(JSON.parse(byName.returns_bad_to_string.content).ok, true);
  assert.deepEqual(warnings, []);
  await session.close();
});

// --- malformed answers ------------------------------------------------------------------------

/** A fake server answering every route with `routes[path]`: `[status, contentType, body]`. */
async function fake(routes) {
  const httpd = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const path = req.url.split("?")[0];
      const stream = req.url.includes("stream=true");
      const [status, type, body] = routes[stream ? `${path}#stream` : path] ?? [
        path === "/v1/sessions" ? 201 : 200,
        "application/json",
        path === "/v1/sessions" ? '{"session_id":"s1","workspace":"/w","tools":[]}' : "{}",
      ];
      res.writeHead(status, { "content-type": type });
      res.end(body);
    });
  });
  await new Promise((r) => httpd.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${httpd.address().port}`, close: () => new Promise((r) => (httpd.closeAllConnections(), httpd.close(r))) };
}

const badResponse = (pattern) => (e) => {
  assert.ok(e instanceof SwitchboardError, `${e?.name}: ${e?.message}`);
  assert.equal(e.code, "bad_response");
  assert.match(e.message, pattern);
  return true;
};

const DISPATCH = "/v1/sessions/s1/dispatch";
const sse = (...events) => events.map(([event, data]) => `event: ${event}\ndata: ${data}\n\n`).join("");

test("malformed JSON answers are bad_response: an HTML 200, truncated JSON, the wrong shape", async () => {
  const f = await fake({
    "/healthz": [200, "text/html", "<html><body>Welcome to nginx!</body></html>"],
    "/v1/tools": [200, "application/json", '[{"name": "bash", "desc'],
    [DISPATCH]: [200, "application/json", '"not a message"'],
    "/v1/sessions/s1": [200, "application/json", "[1, 2]"],
  });
  const client = new Client(f.url, { token: "t" });
  await assert.rejects(client.health(), badResponse(/the answer to GET \/healthz \(HTTP 200, text\/html\) is not JSON: <html><body>Welcome to nginx!/));
  await assert.rejects(client.tools(), badResponse(/is not JSON: \[\{"name": "bash", "desc/));
  const session = client.session();
  await assert.rejects(session.dispatch(assistant(toolUse("a", "bash", {}))), badResponse(/the dispatch answer is not a tool_result message: "not a message"/));
  await assert.rejects(session.dispatch([{ id: "c", type: "function", function: { name: "bash", arguments: "{}" } }]), badResponse(/not an array of tool messages/));
  await assert.rejects(session.info(), badResponse(/the session's info lacks "session_id"/));
  await f.close();

  const html = await fake({ "/v1/sessions": [200, "text/html; charset=utf-8", "<!doctype html><title>Login</title>"] });
  await assert.rejects(new Client(html.url, { token: "t" }).session().create(), badResponse(/POST \/v1\/sessions \(HTTP 200, text\/html; charset=utf-8\) is not JSON: <!doctype html>/));
  await html.close();
});

test("malformed streams are bad_response: not an event stream, bad event data, a bad final answer", async () => {
  const call = assistant(toolUse("a", "bash", {}));
  const cases = [
    [[200, "text/html", "<html>maintenance</html>"], /not an event stream \(HTTP 200, text\/html\): <html>maintenance<\/html>/],
    [[200, "text/event-stream", sse(["result", "{not json"])], /the `result` event is not JSON: \{not json/],
    [[200, "text/event-stream", sse(["result", '{"index": "zero"}'])], /a result event is not \{"index", "result"\}/],
    [[200, "text/event-stream", sse(["call", "[]"])], /the `call` event lacks "call_id"/],
    [[200, "text/event-stream", sse(["done", '{"role":"user","content":[{"type":"tool_result"'])], /the `done` event is not JSON/],
    [[200, "text/event-stream", sse(["done", "null"])], /the dispatch answer is not a tool_result message: null/],
  ];
  for (const [route, pattern] of cases) {
    const f = await fake({ [`${DISPATCH}#stream`]: route });
    const session = new Client(f.url, { token: "t" }).session();
    const seen = [];
    await assert.rejects(async () => {
      for await (const item of session.stream(call)) seen.push(item);
    }, badResponse(pattern));
    await f.close();
  }
  // The events before a bad one are acted on first.
  const good = JSON.stringify({ index: 0, result: { type: "tool_result", tool_use_id: "a", content: "ok" } });
  const f = await fake({ [`${DISPATCH}#stream`]: [200, "text/event-stream", sse(["result", good], ["result", "{"])] });
  const seen = [];
  await assert.rejects(async () => {
    for await (const item of new Client(f.url, { token: "t" }).session().stream(call)) seen.push(item);
  }, badResponse(/`result` event is not JSON/));
  assert.deepEqual(seen.map((s) => s.result.content), ["ok"]);
  await f.close();
});
