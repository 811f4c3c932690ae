// Live progress through the TypeScript client against the real server: a 4-second command that
// prints a line every 200 ms reaches `onProgress` and `stream.events()` line by line, before its
// result, with the answer unchanged; a retry answered from the session's memory reports none.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client } from "../dist/index.js";
import { TOKEN, assistant, startServer, toolUse } from "./_server.mjs";

const LOOP = "for i in $(seq 1 20); do echo line $i; sleep 0.2; done";
const LINES = Array.from({ length: 20 }, (_, i) => `line ${i + 1}\n`).join("");

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client(server.baseUrl, { token: TOKEN });
});
after(async () => {
  assert.equal(await server.stop(), 0, "the server exits 0 on SIGTERM");
});

const output = (events, stream = "stdout") =>
  events
    .filter((e) => e.kind === "output" && e.stream === stream)
    .map((e) => e.text)
    .join("");

test("onProgress gets a running command's lines before the answer", async () => {
  await client.withSession({}, async (session) => {
    const message = assistant(toolUse("loop", "bash", { command: `${LOOP}; echo warn >&2` }));
    const events = [];
    const answer = await session.dispatch(message, {
      onProgress: async (event) => {
        await Promise.resolve();
        events.push(event);
      },
    });
    assert.ok(events.length >= 15, `${events.length} events`);
    assert.deepEqual(
      events.map((e) => e.seq),
      events.map((_, i) => i + 1),
    );
    assert.ok(events.every((e) => e.tool_use_id === "loop"));
    assert.equal(output(events), LINES);
    assert.equal(output(events, "stderr"), "warn\n");
    const content = answer.content[0].content;
    assert.ok(content.startsWith("line 1\n") && content.endsWith("warn"), content);
    // The same turn again: answered from the session's memory, nothing ran, no progress.
    const again = [];
    assert.deepEqual(await session.dispatch(message, { onProgress: (e) => void again.push(e) }), answer);
    assert.deepEqual(again, []);
    // Without onProgress: a plain request, the same answer.
    assert.deepEqual(await session.dispatch(message), answer);
  });
});

test("stream.events() interleaves progress and results, each call's progress first", async () => {
  await client.withSession({}, async (session) => {
    const stream = session.stream(
      assistant(toolUse("quick", "glob", { pattern: "*" }), toolUse("loop", "bash", { command: "echo one; sleep 0.3; echo two" })),
    );
    const seen = [];
    for await (const event of stream.events()) seen.push(event);
    const loopResult = seen.findIndex((e) => e.kind === "result" && e.item.index === 1);
    const progress = seen.flatMap((e, i) => (e.kind === "progress" ? [i] : []));
    assert.ok(progress.length > 0 && Math.max(...progress) < loopResult, JSON.stringify(seen));
    assert.equal(output(seen.filter((e) => e.kind === "progress").map((e) => e.event)), "one\ntwo\n");
    assert.equal(stream.answer.content[1].content, "one\ntwo");
    assert.throws(() => stream.events(), /iterated once/);
    // Iterated for its results alone, a stream asks for no progress and yields results only.
    const plain = session.stream(assistant(toolUse("p", "bash", { command: "echo p" })));
    const results = [];
    for await (const r of plain) results.push(r.result.tool_use_id);
    assert.deepEqual(results, ["p"]);
  });
});

test("a background turn passes onProgress on", async () => {
  await client.withSession({}, async (session) => {
    const events = [];
    const turn = session.start(assistant(toolUse("t", "bash", { command: LOOP })), {
      onProgress: (e) => void events.push(e),
    });
    const answer = await turn;
    assert.ok(events.length >= 15, `${events.length} events`);
    assert.equal(output(events), LINES);
    assert.ok(answer.content[0].content.endsWith("line 20"));
  });
});

test("a client tool reports its progress through its context", async () => {
  const session = client.session({
    tools: [
      {
        name: "build",
        description: "Builds a target.",
        inputSchema: { type: "object", properties: { target: { type: "string" } }, required: ["target"] },
        execute: async ({ target }, ctx) => {
          for (let i = 1; i <= 3; i++) {
            ctx.output(`step ${i} of ${target}\n`);
            ctx.progress(i, 3, `step ${i}`);
            await new Promise((r) => setTimeout(r, 100));
          }
          ctx.output("a warning\n", "stderr");
          return `built ${target}`;
        },
      },
    ],
  });
  try {
    const events = [];
    const answer = await session.dispatch(assistant(toolUse("b", "build", { target: "app" })), {
      onProgress: (e) => void events.push(e),
    });
    assert.equal(answer.content[0].content, "built app");
    assert.deepEqual([...new Set(events.map((e) => e.tool_use_id))], ["b"]);
    assert.equal(output(events), "step 1 of app\nstep 2 of app\nstep 3 of app\n");
    assert.equal(output(events, "stderr"), "a warning\n");
    const values = events.filter((e) => e.kind === "progress").map((e) => e.progress);
    assert.ok(values.length > 0 && values.at(-1) === 3, JSON.stringify(events));
  } finally {
    await session.close();
  }
});
