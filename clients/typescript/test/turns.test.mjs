// Turn ids and turn-addressed cancel: an AbortSignal, a Turn handle, a cancel before the
// dispatch reached the server.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client } from "../dist/index.js";
import { TOKEN, assertCancelled, assistant, startServer, toolUse, until } from "./_server.mjs";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client(server.baseUrl, { token: TOKEN });
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

// Each marker a fresh tool_use_id: a session answers an id it has seen from its answers.
const sleeper = (marker = "started") => assistant(toolUse(`s-${marker}`, "bash", { command: `touch ${marker}; sleep 5; echo done` }));

test("aborting the signal cancels the running turn; dispatch resolves with the cancelled results", async () => {
  const session = await client.session().create();
  const controller = new AbortController();
  const pending = session.dispatch(sleeper("run1"), { signal: controller.signal });
  assert.ok(await until(() => existsSync(join(session.workspace, "run1"))));
  controller.abort();
  assertCancelled(assert, await pending);
  assert.equal((await session.info()).in_flight, 0);
  // The session stays usable.
  const next = await session.dispatch(assistant(toolUse("n", "bash", { command: "echo next" })));
  assert.equal(next.content[0].content, "next");
  await session.close();
});

test("an already aborted signal: the turn runs nothing, even on a session not created yet", async () => {
  const session = client.session();
  const answer = await session.dispatch(
    assistant(toolUse("a", "bash", { command: "touch ran" }), toolUse("b", "write_file", { path: "w.txt", content: "x" })),
    { signal: AbortSignal.abort() },
  );
  assertCancelled(assert, answer);
  assert.equal(existsSync(join(session.workspace, "ran")), false);
  assert.equal(existsSync(join(session.workspace, "w.txt")), false);
  await session.close();
});

test("cancelTurn before the dispatch arrives is remembered (early)", async () => {
  const session = client.session();
  assert.deepEqual(await session.cancelTurn("early-1"), { turn_id: "early-1", state: "early" });
  assertCancelled(assert, await session.dispatch(sleeper(), { turnId: "early-1" }));
  assert.equal(existsSync(join(session.workspace, "started")), false);
  await session.close();
});

test("start: turns cancelled at once run nothing, whatever state the cancel found", async () => {
  const session = await client.session().create();
  const turns = [];
  for (let i = 0; i < 5; i++) {
    const turn = session.start(sleeper(`m${i}`));
    const { state } = await turn.cancel();
    assert.ok(["early", "queued", "running"].includes(state), state);
    turns.push(turn);
  }
  for (const turn of turns) assertCancelled(assert, await turn);
  assert.ok(turns.every((t) => t.done));
  await session.close();
});

test("a dispatch naming a turn in progress is a copy of it, which its cancel reaches too", async () => {
  const session = await client.session().create();
  const turn = session.start(sleeper("busy"), { turnId: "busy-1" });
  assert.equal(turn.turnId, "busy-1");
  assert.ok(await until(() => existsSync(join(session.workspace, "busy"))));
  let copyDone = false;
  const copy = session.dispatch(sleeper("again"), { turnId: "busy-1" }).finally(() => (copyDone = true));
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(copyDone, false);
  await turn.cancel();
  assertCancelled(assert, await turn.result);
  assertCancelled(assert, await copy);
  assert.ok(!existsSync(join(session.workspace, "again")));
  await session.close();
});

test("a client tool's turn aborted while the tool runs: its calls cancelled, the tool's signal aborted", async () => {
  let entered;
  const started = new Promise((r) => (entered = r));
  let toolSignal;
  const session = client.session();
  session.tool({
    name: "slow",
    execute: (_input, ctx) =>
      new Promise((resolve) => {
        toolSignal = ctx.signal;
        entered();
        ctx.signal.addEventListener("abort", () => resolve("late"));
      }),
  });
  const controller = new AbortController();
  const pending = session.dispatch(assistant(toolUse("x", "slow", {})), { signal: controller.signal });
  await started;
  controller.abort();
  assertCancelled(assert, await pending);
  assert.equal(toolSignal.aborted, true);
  assert.ok(await until(async () => (await session.info()).in_flight === 0));
  await session.close();
});

test("stream with a signal: aborting ends the stream with the cancelled answer", async () => {
  const session = await client.session().create();
  const controller = new AbortController();
  const stream = session.stream(sleeper("st"), { signal: controller.signal, turnId: "stream-1" });
  const seen = [];
  const reading = (async () => {
    for await (const item of stream) seen.push(item);
  })();
  assert.ok(await until(() => existsSync(join(session.workspace, "st"))));
  controller.abort();
  await reading;
  assert.equal(seen.length, 1);
  assertCancelled(assert, stream.answer);
  await session.close();
});
