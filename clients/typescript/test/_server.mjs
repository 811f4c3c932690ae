// Starts the real `switchboard serve` on a free loopback port for the tests: the binary is
// $SWITCHBOARD_BIN, else target/release/switchboard of this repository.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const TOKEN = "typescript-client-test-token";
const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

export function binary() {
  const path = process.env.SWITCHBOARD_BIN || join(REPO, "target", "release", "switchboard");
  if (!existsSync(path)) {
    throw new Error(`no switchboard binary at ${path}: build it (cargo build --release) or set SWITCHBOARD_BIN`);
  }
  return path;
}

/** A running server: `baseUrl`, `root` (the workspace root), `stop()` (SIGTERM; resolves
 * with the exit code). */
export async function startServer(extra = []) {
  const dir = mkdtempSync(join(tmpdir(), "switchboard-ts-"));
  const env = { ...process.env, SWITCHBOARD_TOKEN: TOKEN };
  for (const k of ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]) delete env[k];
  const proc = spawn(binary(), ["serve", "--listen", "127.0.0.1:0", "--workspace-root", join(dir, "ws"), ...extra], {
    stdio: ["ignore", "ignore", "pipe"],
    env,
  });
  const exited = new Promise((resolve) => proc.once("exit", (code, signal) => resolve(code ?? signal)));
  const baseUrl = await new Promise((resolve, reject) => {
    let seen = "";
    const onData = (chunk) => {
      seen += chunk.toString();
      const m = /listening on (\S+)/.exec(seen);
      if (m) {
        proc.stderr.off("data", onData);
        proc.stderr.resume(); // keep draining
        resolve(m[1]);
      }
    };
    proc.stderr.on("data", onData);
    exited.then((code) => reject(new Error(`switchboard serve exited (${code}) before listening: ${seen}`)));
  });
  return {
    baseUrl,
    root: join(dir, "ws"),
    pid: proc.pid,
    async stop() {
      proc.kill("SIGTERM");
      const code = await exited;
      rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

export const toolUse = (id, name, input) => ({ type: "tool_use", id, name, input });
export const assistant = (...blocks) => ({ role: "assistant", content: blocks });

export function assertCancelled(assert, answer) {
  for (const block of answer.content) {
    assert.equal(block.is_error, true);
    assert.ok(block.content.startsWith("Error [cancelled]"), block.content);
  }
}

/** Polls `check` every 10 ms, at most `tries` times (a bound, not a timed assertion). */
export async function until(check, tries = 2000) {
  for (let i = 0; i < tries; i++) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 10));
  }
  return false;
}
