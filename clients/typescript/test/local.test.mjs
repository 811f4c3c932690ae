// local(): the binary started as a private sidecar — found in the per-platform npm package,
// $SWITCHBOARD_BIN or PATH; ready when it says so on its own descriptor (never a stderr line);
// stopped by close(), by this process's exit, and by this process's death (kill -9).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import { LocalClient, LocalServerError, SERVE_OPTIONS, findBinary, local, serveArgs } from "../dist/index.js";
import { assistant, binary, toolUse, until } from "./_server.mjs";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const INDEX = pathToFileURL(join(PACKAGE, "dist", "index.js")).href;
const scratch = mkdtempSync(join(tmpdir(), "switchboard-ts-local-"));
after(() => rmSync(scratch, { recursive: true, force: true }));

/** Whether process `pid` still runs (a zombie waiting for its reaper does not). */
function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !["Z", "X"].includes(stat[stat.lastIndexOf(")") + 2]);
  } catch {
    return false;
  }
}

/** An executable shell script in the scratch directory. */
function script(name, text) {
  const path = join(scratch, name);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `#!/bin/sh\n${text}\n`);
  chmodSync(path, 0o755);
  return path;
}

/** Runs `code` (an ES module importing local() as `local`) in a child Node process; resolves
 * with the child and its first line of output, parsed. */
async function childNode(code) {
  const file = join(scratch, `child-${Math.random().toString(16).slice(2)}.mjs`);
  writeFileSync(file, `import { local } from ${JSON.stringify(INDEX)};\n${code}\n`);
  const child = spawn(process.execPath, [file], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, SWITCHBOARD_BIN: binary() } });
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal)));
  const line = await new Promise((resolve, reject) => {
    let text = "";
    child.stdout.on("data", (chunk) => {
      text += chunk;
      if (text.includes("\n")) resolve(JSON.parse(text.slice(0, text.indexOf("\n"))));
    });
    exited.then((code) => reject(new Error(`the child exited (${code}) before it wrote a line: ${text}`)));
  });
  return { child, exited, line };
}

test("local() starts the server, dispatches through it, and close() stops it and removes its directory", async () => {
  const client = await local({ binary: binary(), sandbox: "off", maxRetries: 2 });
  assert.ok(client instanceof LocalClient);
  const server = client.server;
  assert.match(client.baseUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(client.maxRetries, 2);
  assert.ok(alive(server.pid));
  assert.ok(server.argv.includes("--ready-fd") && server.argv.includes("--stop-on-stdin-close"));
  assert.deepEqual(server.argv.slice(server.argv.indexOf("--grace"), server.argv.indexOf("--grace") + 2), ["--grace", "1s"]);
  // The token went by a file, removed once the server had read it; it is nowhere on the command line.
  assert.ok(!server.argv.includes(server.token));
  const tokenFile = server.argv[server.argv.indexOf("--token-file") + 1];
  assert.equal(existsSync(tokenFile), false);
  const answer = await client.withSession("demo", async (session) => {
    await session.create();
    assert.ok(session.workspace.startsWith(server.workspaceRoot));
    // A directory left without write permission does not keep the temporary directory behind.
    return session.dispatch(assistant(toolUse("t1", "bash", { command: "mkdir -p ro/d && touch ro/d/f && chmod 500 ro/d ro && echo local" })));
  });
  assert.equal(answer.content[0].content, "local");
  await client.close();
  assert.equal(server.exitStatus, 0);
  assert.equal(alive(server.pid), false);
  assert.equal(existsSync(server.workspaceRoot), false);
  await client.close(); // twice is fine
});

test("close() cancels the turns in flight, streamed or not, and returns promptly", { timeout: 30_000 }, async () => {
  const client = await local({ binary: binary(), sandbox: "off" });
  const session = await client.session().create();
  const pending = session.dispatch(assistant(toolUse("s", "bash", { command: "touch started; sleep 60; echo done" })));
  const other = client.session();
  let entered;
  const running = new Promise((r) => (entered = r));
  other.tool({ name: "wait", execute: (_input, ctx) => new Promise((r) => (entered(), ctx.signal.addEventListener("abort", () => r("late")))) });
  const streamed = other.dispatch(assistant(toolUse("w", "wait", {})));
  assert.ok(await until(() => existsSync(join(session.workspace, "started"))));
  await running;
  await client.close(); // the commands would run 60 s; the tool until its stream ends
  assert.match((await pending).content[0].content, /^Error \[cancelled\]/);
  assert.match((await streamed).content[0].content, /^Error \[cancelled\]/);
  assert.equal(client._turns.size, 0);
});

test("process.exit() mid-turn without close(): the exit hook stops the server (the turn gets --grace, 1 s)", async () => {
  const { exited, line } = await childNode(
    `const client = await local({ sandbox: "off" });\n` +
      `const session = await client.session().create();\n` +
      `void session.dispatch({ role: "assistant", content: [{ type: "tool_use", id: "s", name: "bash", input: { command: "sleep 60" } }] });\n` +
      `await new Promise((r) => setTimeout(r, 300));\n` +
      `console.log(JSON.stringify({ pid: client.server.pid }));\n` +
      `process.exit(0);`,
  );
  assert.equal(await exited, 0);
  assert.equal(alive(line.pid), false);
});

test("a fake 'listening on' line on stderr does not fool local(): it waits for the ready line", async () => {
  const fake = script("fake/switchboard", `echo "switchboard: serve: listening on http://127.0.0.1:1" >&2\nexec ${JSON.stringify(binary())} "$@"`);
  const client = await local({ binary: fake, sandbox: "off" });
  try {
    assert.notEqual(client.baseUrl, "http://127.0.0.1:1");
    assert.equal((await client.health()).status, "ok");
    assert.match(client.server.stderr(), /listening on http:\/\/127\.0\.0\.1:1\b/);
  } finally {
    await client.close();
  }
});

test("a server that fails to start rejects with its stderr tail", async () => {
  const failing = script("failing/switchboard", 'echo "switchboard: serve: cannot read the policy: no such file" >&2\nexit 3');
  await assert.rejects(local({ binary: failing }), (e) => {
    assert.ok(e instanceof LocalServerError);
    assert.equal(e.code, "server_exited");
    assert.match(e.message, /exited with status 3 before it was ready/);
    assert.match(e.message, /cannot read the policy: no such file/);
    assert.match(e.stderr, /cannot read the policy/);
    return true;
  });
  // The real server refusing its flags: what it said is in the error.
  await assert.rejects(local({ binary: binary(), policy: join(scratch, "missing-policy.json") }), (e) => {
    assert.equal(e.code, "server_exited");
    assert.match(e.stderr, /missing-policy\.json/);
    return true;
  });
});

test("a server that is never ready is stopped and rejects start_timeout", async () => {
  const silent = script("silent/switchboard", 'echo "starting" >&2\nexec sleep 60');
  const started = Date.now();
  await assert.rejects(local({ binary: silent, startupTimeoutMs: 300, stopTimeoutMs: 1000 }), (e) => {
    assert.equal(e.code, "start_timeout");
    assert.match(e.message, /starting/);
    return true;
  });
  assert.ok(Date.now() - started < 10_000);
});

test("the Node process killed with SIGKILL: its sidecar stops within seconds", async (t) => {
  const { child, exited, line } = await childNode(
    `const client = await local({ sandbox: "off" });\n` +
      `console.log(JSON.stringify({ pid: client.server.pid, url: client.baseUrl, root: client.server.workspaceRoot }));\n` +
      `setInterval(() => {}, 1000);`,
  );
  t.after(() => rmSync(dirname(line.root), { recursive: true, force: true })); // what a killed Node leaves
  assert.ok(alive(line.pid));
  assert.equal((await (await fetch(`${line.url}/healthz`)).json()).status, "ok");
  child.kill("SIGKILL");
  assert.equal(await exited, "SIGKILL");
  assert.ok(await until(() => !alive(line.pid), 1000), `the sidecar ${line.pid} still runs 10 s after its Node process was killed`);
});

test("a script that ends without close(): Node exits by itself, and the exit hook stops the server", async () => {
  const { exited, line } = await childNode(
    `const client = await local({ sandbox: "off" });\n` +
      `await client.withSession({}, (s) => s.create());\n` +
      `console.log(JSON.stringify({ pid: client.server.pid, root: client.server.workspaceRoot }));`,
  );
  assert.equal(await exited, 0); // nothing of the server kept the event loop alive
  assert.equal(alive(line.pid), false);
  assert.equal(existsSync(line.root), false);
});

test("serve options: camelCase keys become flags; an unknown key is refused before anything starts", async () => {
  assert.deepEqual(
    serveArgs({ sandbox: "read-only", allowNetwork: true, auditArgs: false, sandboxRead: ["/opt/a", "/opt/b"], grace: 1.5, readTimeout: "2s", maxBody: 4096 }),
    ["--sandbox", "read-only", "--allow-network", "--sandbox-read", "/opt/a", "--sandbox-read", "/opt/b", "--grace", "1500ms", "--read-timeout", "2s", "--max-body", "4096"],
  );
  assert.deepEqual(serveArgs({ sessionPolicy: { reviewer: "r.json" } }), ["--session-policy", "reviewer=r.json"]);
  assert.throws(() => serveArgs({ allowNetwork: "yes" }), /allowNetwork is a switch/);
  assert.throws(() => serveArgs({ grace: -1 }), /grace must be a duration/);
  await assert.rejects(local({ binary: "/nonexistent", sandboxx: "off" }), (e) => e instanceof TypeError && /unknown option\(s\) sandboxx/.test(e.message));
  await assert.rejects(local({ max_body: 1 }), /max_body: the option is maxBody/);
  await assert.rejects(local({ tokenFile: "t" }), /tokenFile: local\(\) chooses the token/);
  await assert.rejects(local({ readyFd: 4 }), /readyFd: local\(\) learns that the server is ready/);
});

test("every serve option of the table, and every flag local() sets, is one `switchboard serve --help` lists", () => {
  const help = execFileSync(binary(), ["serve", "--help"], { encoding: "utf8" });
  const flags = new Set(help.match(/--[a-z][a-z0-9-]*/g));
  for (const [key, [flag]] of Object.entries(SERVE_OPTIONS)) assert.ok(flags.has(flag), `${key}: ${flag} is not in serve --help`);
  for (const flag of ["--listen", "--workspace-root", "--token-file", "--grace", "--ready-fd", "--stop-on-stdin-close"]) {
    assert.ok(flags.has(flag), `${flag} is not in serve --help`);
  }
});

test("the binary: the per-platform npm package first, then $SWITCHBOARD_BIN, then PATH; else an error naming each", async (t) => {
  if (process.platform !== "linux" || !["x64", "arm64"].includes(process.arch)) return t.skip("no platform package here");
  const saved = { bin: process.env.SWITCHBOARD_BIN, path: process.env.PATH };
  t.after(() => {
    if (saved.bin === undefined) delete process.env.SWITCHBOARD_BIN;
    else process.env.SWITCHBOARD_BIN = saved.bin;
    process.env.PATH = saved.path;
  });
  const onPath = script("path/switchboard", "exit 0");
  const fromEnv = script("env/switchboard", "exit 0");

  // A project with this package and the platform package installed side by side.
  const project = join(scratch, "project");
  const modules = join(project, "node_modules");
  cpSync(join(PACKAGE, "dist"), join(modules, "switchboard-client", "dist"), { recursive: true });
  cpSync(join(PACKAGE, "package.json"), join(modules, "switchboard-client", "package.json"));
  const platform = join(modules, `switchboard-client-linux-${process.arch}`);
  mkdirSync(join(platform, "bin"), { recursive: true });
  writeFileSync(join(platform, "package.json"), JSON.stringify({ name: `switchboard-client-linux-${process.arch}`, version: "0.1.0" }));
  symlinkSync(binary(), join(platform, "bin", "switchboard"));
  const installed = await import(pathToFileURL(join(modules, "switchboard-client", "dist", "index.js")).href);

  process.env.SWITCHBOARD_BIN = fromEnv;
  process.env.PATH = dirname(onPath);
  assert.equal(installed.findBinary(), join(platform, "bin", "switchboard"));
  assert.equal(findBinary(), fromEnv); // this checkout has no platform package
  delete process.env.SWITCHBOARD_BIN;
  assert.equal(findBinary(), onPath);
  process.env.PATH = join(scratch, "nowhere");
  assert.throws(findBinary, (e) => {
    assert.ok(e instanceof LocalServerError);
    assert.equal(e.code, "binary_not_found");
    assert.match(e.message, new RegExp(`the npm package switchboard-client-linux-${process.arch} \\(not installed\\)`));
    assert.match(e.message, /\$SWITCHBOARD_BIN \(unset\)/);
    assert.match(e.message, /PATH \(.*nowhere\)/);
    return true;
  });
  // The platform package's server is the one local() starts.
  process.env.PATH = saved.path;
  const client = await installed.local({ sandbox: "off" });
  try {
    assert.equal(client.server.binary, join(platform, "bin", "switchboard"));
    assert.equal((await client.health()).status, "ok");
  } finally {
    await client.close();
  }
});
