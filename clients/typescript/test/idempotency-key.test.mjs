// Every client-tool call carries its idempotency key in `ctx.idempotencyKey`: the key of the
// session and the tool_use_id (the server's derivation, `idempotencyKey`), the one bash sees in
// SWITCHBOARD_IDEMPOTENCY_KEY, another for another id or another session, and a turn sent again
// runs nothing.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, idempotencyKey, turnIdOf } from "../dist/index.js";
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

test("the key is the server's derivation", () => {
  // The values the engine's own unit test pins (src/tool/idempotency.rs).
  assert.equal(idempotencyKey("s1", "toolu_01"), "sb1-5101c8b18443bad9a910fa8df6d0bf15");
  assert.equal(idempotencyKey("s1", "toolu_01", "turn-7"), "sb1-a3ae66e59b6a98861d3c286fc5657a5b");
  assert.equal(idempotencyKey("a", ""), "sb1-581994b12e108d90279611240e90f9fa");
});

test("a client tool gets its call's key; bash gets the same derivation; another session another", async () => {
  let runs = 0;
  const charge = {
    name: "charge",
    description: "Charges an order.",
    inputSchema: { type: "object", properties: { order_id: { type: "string" } }, required: ["order_id"] },
    execute: (_input, ctx) => {
      runs += 1;
      return ctx.idempotencyKey;
    },
  };
  await client.withSession({ tools: [charge] }, async (one) => {
    await client.withSession({ tools: [charge] }, async (two) => {
      const message = assistant(
        toolUse("t1", "charge", { order_id: "A-1" }),
        toolUse("t2", "charge", { order_id: "A-2" }),
        toolUse("t3", "bash", { command: 'printf %s "$SWITCHBOARD_IDEMPOTENCY_KEY"' }),
      );
      const answer = await one.dispatch(message, { turnId: "turn-1" });
      const keys = answer.content.map((b) => b.content);
      assert.deepEqual(keys, ["t1", "t2", "t3"].map((id) => idempotencyKey(one.id, id, "turn-1")));
      assert.equal(new Set(keys).size, 3);
      assert.equal(runs, 2);

      const other = await two.dispatch(assistant(toolUse("t1", "charge", { order_id: "A-1" })), { turnId: "turn-1" });
      assert.equal(other.content[0].content, idempotencyKey(two.id, "t1", "turn-1"));
      assert.notEqual(other.content[0].content, keys[0]);

      // The turn sent again: the stored answer, the function not run again.
      assert.deepEqual(await one.dispatch(message, { turnId: "turn-1" }), answer);
      assert.equal(runs, 3);

      // Without a turn id the client names the turn after the message: sent twice, one turn,
      // and the key the tool saw is the one of that turn.
      const plain = assistant(toolUse("t9", "charge", { order_id: "A-9" }));
      const first = await one.dispatch(plain);
      assert.deepEqual(await one.dispatch(plain), first);
      assert.equal(runs, 4);
      assert.equal(first.content[0].content, idempotencyKey(one.id, "t9", turnIdOf(JSON.stringify(plain))));
    });
  });
});
