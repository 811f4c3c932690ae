// Effect classes of client tools: `effect` says what running a call twice would do
// ("read_only", "idempotent", "side_effect"). It is sent in the tool's declaration, checked here
// before any request and by the server when the session is made; a call re-sent with its
// tool_use_id is answered from the session's answers, whatever its class.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, EFFECT_CLASSES, SwitchboardError } from "../dist/index.js";
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

const KEY_SCHEMA = { type: "object", properties: { key: { type: "string" } }, required: ["key"], additionalProperties: false };

function recording(ran, name, effect, answer) {
  return {
    name,
    description: `${name} (${effect ?? "no effect given"})`,
    inputSchema: KEY_SCHEMA,
    ...(effect === undefined ? {} : { effect }),
    execute: ({ key }) => {
      ran.push([name, key]);
      return `${answer} ${key}`;
    },
  };
}

test("each effect is sent and its tool runs here; a re-sent turn runs nothing twice", async () => {
  const ran = [];
  const session = client.session({
    tools: [recording(ran, "lookup", "read_only", "value of"), recording(ran, "put", "idempotent", "stored")],
  });
  session.tool(recording(ran, "pay", "side_effect", "paid"));
  session.tool(recording(ran, "note", undefined, "noted"));
  try {
    assert.deepEqual(
      session.clientTools.map((t) => [t.name, t.effect]),
      [["lookup", "read_only"], ["put", "idempotent"], ["pay", "side_effect"], ["note", undefined]],
    );
    assert.equal("effect" in session.clientTools[3], false); // not given: not sent, the server's side_effect

    const turn = assistant(
      toolUse("e1", "lookup", { key: "a" }),
      toolUse("e2", "put", { key: "b" }),
      toolUse("e3", "pay", { key: "c" }),
      toolUse("e4", "note", { key: "d" }),
    );
    const answer = await session.dispatch(turn); // the server made the session: it took every class
    assert.deepEqual(
      answer.content.map((b) => [b.tool_use_id, b.content, b.is_error]),
      [
        ["e1", "value of a", undefined],
        ["e2", "stored b", undefined],
        ["e3", "paid c", undefined],
        ["e4", "noted d", undefined],
      ],
    );
    assert.deepEqual(ran.map(([n]) => n).sort(), ["lookup", "note", "pay", "put"]);

    // The same turn again (a harness retrying after a lost response): every call is answered
    // from the session's answers and nothing runs twice, whatever its class.
    const again = await session.dispatch(turn);
    assert.deepEqual(again.content, answer.content);
    assert.equal(ran.length, 4);
    // The catalog is what the model sees: the definitions, without the engine's options.
    const pay = (await session.tools()).find((t) => t.name === "pay");
    assert.equal("effect" in pay, false);
  } finally {
    await session.close();
  }
});

test("an invalid effect throws before any request", () => {
  assert.deepEqual([...EFFECT_CLASSES], ["read_only", "idempotent", "side_effect"]);
  // Nothing listens here: any request would fail.
  const offline = new Client("http://127.0.0.1:9", { token: TOKEN });
  const session = offline.session();
  for (const bad of ["readonly", "READ_ONLY", "side-effect", "", true, 1, null, ["read_only"]]) {
    assert.throws(
      () => session.tool({ name: "t", effect: bad, execute: () => "" }),
      (e) =>
        e instanceof TypeError &&
        /client tool t: effect must be "read_only", "idempotent" or "side_effect"/.test(e.message) &&
        e.message.endsWith(`not ${JSON.stringify(bad)}`),
    );
    assert.throws(() => offline.session({ tools: [{ name: "t", effect: bad }] }), TypeError);
  }
  assert.deepEqual(session.clientTools, []);
  assert.equal(session.created, false);
});

test("a ready declaration keeps its effect and MCP annotations", async () => {
  const archive = { name: "archive", description: "Archives a record.", input_schema: KEY_SCHEMA, effect: "idempotent" };
  const ping = {
    type: "function",
    annotations: { readOnlyHint: true, title: "Ping" },
    function: { name: "ping", description: "Answers pong.", parameters: { type: "object", properties: {} } },
  };
  const session = client.session({ tools: [archive] });
  session.tool(ping, () => "pong");
  try {
    assert.deepEqual(session.clientTools, [archive, ping]);
    const answer = await session.dispatch(assistant(toolUse("p1", "ping", {})));
    assert.deepEqual(answer.content, [{ type: "tool_result", tool_use_id: "p1", content: "pong" }]);
  } finally {
    await session.close();
  }
});

const VALUES = 'client tool `refund`: `effect` must be "read_only", "idempotent" or "side_effect"';
for (const [label, tool, says] of [
  ["an unknown effect", { name: "refund", input_schema: KEY_SCHEMA, effect: "sometimes" }, VALUES],
  ["a non-string effect", { name: "refund", input_schema: KEY_SCHEMA, effect: false }, VALUES],
  [
    "an OpenAI-shape tool's effect",
    { type: "function", effect: "readOnly", function: { name: "refund", parameters: KEY_SCHEMA } },
    VALUES,
  ],
  [
    "a hint that is not a boolean",
    { name: "refund", input_schema: KEY_SCHEMA, annotations: { readOnlyHint: "yes" } },
    "client tool `refund`: `annotations`: `readOnlyHint` must be true or false",
  ],
  [
    "an unknown annotation",
    { name: "refund", input_schema: KEY_SCHEMA, annotations: { readonlyhint: true } },
    "client tool `refund`: `annotations`: unknown key `readonlyhint`",
  ],
]) {
  test(`the server refuses ${label} in a ready declaration: 400 bad_request naming the tool`, async () => {
    const session = client.session({ tools: [tool] });
    await assert.rejects(
      session.create(),
      (e) => e instanceof SwitchboardError && e.code === "bad_request" && e.status === 400 && e.detail.includes(says),
    );
    assert.equal(session.created, false);
  });
}
