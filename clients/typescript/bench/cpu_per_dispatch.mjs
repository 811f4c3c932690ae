// CPU per dispatch of the TypeScript client against raw `fetch` sending the same requests —
// the twin of clients/python/bench/cpu_per_dispatch.py.
//
// N sessions (default 50) each run no-op turns (one `read_file` of a tiny file) back to back,
// concurrently; each side runs `--turns` turns per session per round, alternating which goes
// first, `--rounds` rounds, in one run (no new round past `--max-seconds`). Measured: this
// process's CPU time (process.cpuUsage, user + system) per dispatch and dispatches per second;
// the server runs in its own process.
//
//   npm run build --prefix clients/typescript
//   SWITCHBOARD_BIN=target/release/switchboard node clients/typescript/bench/cpu_per_dispatch.mjs
import { writeFileSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { Client, newTurnId } from "../dist/index.js";
import { TOKEN, startServer } from "../test/_server.mjs";

const { values } = parseArgs({
  options: {
    sessions: { type: "string", default: "50" },
    turns: { type: "string", default: "100" },
    rounds: { type: "string", default: "5" },
    "max-seconds": { type: "string", default: "300" },
  },
});
const SESSIONS = Number(values.sessions);
const TURNS = Number(values.turns);
const ROUNDS = Number(values.rounds);
const deadline = performance.now() + Number(values["max-seconds"]) * 1000;

const noop = { role: "assistant", content: [{ type: "tool_use", id: "toolu_0", name: "read_file", input: { path: "tiny.txt" } }] };
const check = (answer) => {
  if (answer.content[0].content !== "x") throw new Error(JSON.stringify(answer));
};

async function runClient(sessions, turns) {
  await Promise.all(
    sessions.map(async (s) => {
      for (let i = 0; i < turns; i++) check(await s.dispatch(noop));
    }),
  );
}

async function runRaw(urls, headers, turns) {
  const body = JSON.stringify(noop);
  await Promise.all(
    urls.map(async (url) => {
      for (let i = 0; i < turns; i++) {
        const r = await fetch(url, { method: "POST", body, headers: { ...headers, "Switchboard-Turn-Id": newTurnId() } });
        const text = await r.text();
        if (r.status !== 200) throw new Error(text);
        check(JSON.parse(text));
      }
    }),
  );
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

const server = await startServer();
try {
  const client = new Client(server.baseUrl, { token: TOKEN });
  const sessions = [];
  for (let i = 0; i < SESSIONS; i++) {
    const s = await client.session(`bench${i}`).create();
    writeFileSync(join(s.workspace, "tiny.txt"), "x");
    sessions.push(s);
  }
  const urls = sessions.map((s) => `${server.baseUrl}/v1/sessions/${s.id}/dispatch?format=anthropic`);
  const headers = { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" };
  await runClient(sessions, 5); // warm up: connections, JIT
  await runRaw(urls, headers, 5);
  const results = { client: [], raw: [] };
  const dispatches = SESSIONS * TURNS;
  for (let r = 0; r < ROUNDS; r++) {
    const sides = [
      ["client", () => runClient(sessions, TURNS)],
      ["raw", () => runRaw(urls, headers, TURNS)],
    ];
    if (r % 2) sides.reverse();
    for (const [label, fn] of sides) {
      const wall = performance.now();
      const cpu = process.cpuUsage();
      await fn();
      const used = process.cpuUsage(cpu);
      const seconds = (performance.now() - wall) / 1000;
      const m = { cpuUs: (used.user + used.system) / dispatches, perS: dispatches / seconds };
      results[label].push(m);
      console.log(
        `round ${r + 1} ${label.padEnd(6)} ${m.cpuUs.toFixed(1).padStart(7)} us CPU/dispatch  ${m.perS.toFixed(0).padStart(8)} dispatches/s`,
      );
    }
    if (performance.now() > deadline) {
      console.log("(time bound reached)");
      break;
    }
  }
  for (const s of sessions) await s.close();
  const c = median(results.client.map((m) => m.cpuUs));
  const rc = median(results.raw.map((m) => m.cpuUs));
  const cs = median(results.client.map((m) => m.perS));
  const rs = median(results.raw.map((m) => m.perS));
  const load = os.loadavg().map((x) => x.toFixed(2)).join(" ");
  console.log(`\n${new Date().toISOString()}, Node ${process.versions.node}, ${os.cpus().length} CPUs, load average ${load}`);
  console.log(`${SESSIONS} sessions x ${TURNS} turns per round, ${results.client.length} rounds, medians:`);
  console.log(`  ${"Client:".padEnd(12)} ${c.toFixed(1).padStart(7)} us CPU per dispatch, ${cs.toFixed(0).padStart(8)} dispatches/s`);
  console.log(`  ${"raw fetch:".padEnd(12)} ${rc.toFixed(1).padStart(7)} us CPU per dispatch, ${rs.toFixed(0).padStart(8)} dispatches/s`);
  console.log(`  ratio (client / raw CPU): ${(c / rc).toFixed(3)}`);
} finally {
  await server.stop();
}
