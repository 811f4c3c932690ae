// Deferred client tools: `defer` leaves a client tool out of the model's context until the
// engine's `tool_search` finds it; its calls still run the client's function. The
// `tool_reference` blocks of a search's answer reach the Anthropic API unchanged.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";
import Anthropic from "@anthropic-ai/sdk";

import { Client, DEFER_MODES } from "../dist/index.js";
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

const byName = (catalog) => Object.fromEntries(catalog.map((t) => [t.name, t]));

function vaultLookup(ran) {
  return {
    name: "vault_lookup",
    description: "Reads a secret from the platform's vault.",
    inputSchema: { type: "object", properties: { key: { type: "string" } }, required: ["key"], additionalProperties: false },
    defer: "always",
    execute: ({ key }) => {
      ran.push(key);
      return `secret-of-${key}`;
    },
  };
}

test("a deferred client tool is found by tool_search, then its calls run here", async () => {
  const ran = [];
  const session = client.session({ tools: [vaultLookup(ran)] });
  session.tool({ name: "shout", description: "Upper-cases text.", execute: ({ text }) => String(text).toUpperCase() });
  assert.equal(session.clientTools[0].defer, "always");
  assert.equal("defer" in session.clientTools[1], false);

  const catalog = await session.tools();
  assert.equal(catalog[0].name, "tool_search");
  const tools = byName(catalog);
  assert.equal(tools.vault_lookup.defer_loading, true);
  assert.equal("defer_loading" in tools.shout, false);
  assert.equal("defer_loading" in tools.bash, false);
  // OpenAI shape: not listed until the session has been shown it.
  const openaiNames = (await session.tools("openai")).map((t) => t.function.name);
  assert.equal(openaiNames[0], "tool_search");
  assert.ok(openaiNames.includes("shout") && !openaiNames.includes("vault_lookup"), openaiNames.join());

  const found = await session.dispatch(assistant(toolUse("s1", "tool_search", { query: "select:vault_lookup" })));
  const [result] = found.content;
  assert.equal(result.type, "tool_result");
  assert.equal(result.tool_use_id, "s1");
  assert.equal(result.is_error, undefined);
  assert.equal(result.content[0].type, "text");
  assert.match(result.content[0].text, /vault_lookup/);
  assert.deepEqual(result.content.slice(1), [{ type: "tool_reference", tool_name: "vault_lookup" }]);
  assert.deepEqual(ran, []); // a search runs nothing

  // The model calls it: the call comes over the stream and the function runs here.
  const answer = await session.dispatch(assistant(toolUse("c1", "vault_lookup", { key: "db" }), toolUse("c2", "shout", { text: "ok" })));
  assert.deepEqual(
    answer.content.map((b) => [b.tool_use_id, b.content]),
    [
      ["c1", "secret-of-db"],
      ["c2", "OK"],
    ],
  );
  assert.deepEqual(ran, ["db"]);
  // Its calls are validated like any other's.
  const bad = await session.dispatch(assistant(toolUse("c3", "vault_lookup", { key: 7 })));
  assert.equal(bad.content[0].is_error, true);
  assert.match(bad.content[0].content, /^Error \[invalid_arguments\]/);
  assert.deepEqual(ran, ["db"]);

  // Shown now: the OpenAI catalog appends it; the Anthropic one is unchanged.
  assert.equal((await session.tools("openai")).at(-1).function.name, "vault_lookup");
  assert.deepEqual(await session.tools(), catalog);
  await session.close();
});

test("an invalid defer throws before any request", () => {
  assert.deepEqual([...DEFER_MODES], ["never", "auto", "always"]);
  // Nothing listens here: any request would fail.
  const offline = new Client("http://127.0.0.1:9", { token: TOKEN });
  const session = offline.session();
  for (const bad of ["sometimes", "ALWAYS", "", true, 1, null]) {
    assert.throws(
      () => session.tool({ name: "t", defer: bad, execute: () => "" }),
      (e) => e instanceof TypeError && /defer must be "never", "auto" or "always"/.test(e.message),
    );
    assert.throws(() => offline.session({ tools: [{ name: "t", defer: bad }] }), TypeError);
  }
  assert.deepEqual(session.clientTools, []);
  assert.equal(session.created, false);
});

test("a ready declaration keeps its defer_loading", async () => {
  const archive = {
    name: "archive",
    description: "Archives a record.",
    input_schema: { type: "object", properties: { key: { type: "string" } } },
    defer_loading: true,
  };
  const ping = { type: "function", defer_loading: false, function: { name: "ping", description: "Answers pong.", parameters: { type: "object" } } };
  const session = client.session({ tools: [archive] });
  session.tool(ping, () => "pong");
  assert.deepEqual(session.clientTools, [archive, ping]);
  const tools = byName(await session.tools());
  assert.equal(tools.tool_search.name, "tool_search");
  assert.equal(tools.archive.defer_loading, true);
  assert.equal("defer_loading" in tools.ping, false);
  // A call by exact name shows the deferred tool to the session.
  const answer = await session.dispatch(assistant(toolUse("a", "archive", { key: "k" }), toolUse("p", "ping", {})));
  assert.match(answer.content[0].content, /has no function/);
  assert.equal(answer.content[1].content, "pong");
  assert.equal((await session.tools("openai")).at(-1).function.name, "archive");
  await session.close();
});

/** A Messages API on loopback: records each request and answers from `script`. */
async function scriptedMessages(script) {
  const requests = [];
  const httpd = createServer((req, res) => {
    let text = "";
    req.on("data", (c) => (text += c));
    req.on("end", () => {
      const body = JSON.parse(text);
      requests.push(body);
      const [content, stop] = script[requests.length - 1];
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          id: `msg_${requests.length}`,
          type: "message",
          role: "assistant",
          model: body.model,
          content,
          stop_reason: stop,
          stop_sequence: null,
          usage: { input_tokens: 1, output_tokens: 1 },
        }),
      );
    });
  });
  await new Promise((r) => httpd.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${httpd.address().port}`, requests, close: () => new Promise((r) => httpd.close(r)) };
}

test("tool_reference blocks reach the Anthropic API unchanged (@anthropic-ai/sdk loop)", async () => {
  const model = await scriptedMessages([
    [[toolUse("toolu_s", "tool_search", { query: "vault secret", max_results: 3 })], "tool_use"],
    [[toolUse("toolu_v", "vault_lookup", { key: "api" })], "tool_use"],
    [[{ type: "text", text: "The secret is secret-of-api." }], "end_turn"],
  ]);
  const ran = [];
  const session = client.session({ tools: [vaultLookup(ran)] });
  try {
    const claude = new Anthropic({ baseURL: model.url, apiKey: "test-key", maxRetries: 0 });
    const messages = [{ role: "user", content: "What is the api secret?" }];
    let response;
    for (let i = 0; i < 3; i++) {
      response = await claude.messages.create({ model: "scripted", max_tokens: 100, tools: await session.tools(), messages });
      messages.push({ role: "assistant", content: response.content });
      const results = await session.dispatch(response);
      if (results === null) break;
      messages.push(results);
    }
    assert.equal(response.content[0].text, "The secret is secret-of-api.");
    assert.deepEqual(ran, ["api"]);
    const [first, second, third] = model.requests;
    assert.equal(first.tools[0].name, "tool_search");
    assert.equal(byName(first.tools).vault_lookup.defer_loading, true);
    assert.deepEqual(second.tools, first.tools); // the Anthropic catalog never changes
    const block = second.messages.at(-1).content[0];
    assert.equal(block.type, "tool_result");
    assert.equal(block.tool_use_id, "toolu_s");
    assert.equal(block.content[0].type, "text");
    assert.deepEqual(block.content.slice(1), [{ type: "tool_reference", tool_name: "vault_lookup" }]);
    assert.deepEqual(third.messages.slice(0, 3), second.messages);
    assert.deepEqual(third.messages.at(-1).content, [{ type: "tool_result", tool_use_id: "toolu_v", content: "secret-of-api" }]);
  } finally {
    await session.close();
    await model.close();
  }
});
