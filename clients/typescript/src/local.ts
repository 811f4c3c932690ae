// `local()`: the `switchboard` binary started as a private sidecar, with a client connected.
//
// For scripts, tests and single-machine harnesses. The binary is the one the per-platform npm
// package `switchboard-client-linux-<arch>` carries, else `$SWITCHBOARD_BIN`, else `switchboard`
// on `PATH`. The server listens on a free loopback port with a fresh random token (a 0600 file
// in a private temporary directory, removed once the server has read it) and a temporary
// workspace root. It says it is ready on a pipe of its own (`--ready-fd 3`: one JSON line with
// its URL and pid, or end of file if it failed) — never by a line on stderr, which a tool or an
// MCP server could print first; stderr is only kept as a log tail for error messages.
//
// Who stops it: `close()` (it cancels its client's turns in flight, then SIGTERM — with a short
// `--grace` unless one was given — then SIGKILL to its process group after a bounded wait); this
// process's `exit` event (the same, synchronously); and this process dying any other way,
// `kill -9` included: the server holds the read end of a pipe on its stdin that only this
// process writes to, and stops when it reaches end of file (`--stop-on-stdin-close`). Every
// handle is unref'd, so a server nobody closed never keeps Node alive.
//
// Each `LocalServer` owns its child process, its temporary directory and its place in `live`,
// the set the `exit` hook stops; nothing else touches them.

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  accessSync,
  chmodSync,
  closeSync,
  constants,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { createRequire } from "node:module";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, dirname, join, resolve } from "node:path";
import type { Readable } from "node:stream";

import { Client, type ClientOptions } from "./client.js";
import { SwitchboardError } from "./common.js";
import { SERVE_KEYS, durationMs, serveArgs, unknownKeys, type ServeOptions } from "./serve-options.js";

export const BINARY_ENV = "SWITCHBOARD_BIN";

/** What `local()` takes besides the serve options. */
export interface LocalOptions extends ServeOptions, Omit<ClientOptions, "baseUrl" | "token"> {
  /** The binary (default: `findBinary()`). */
  binary?: string;
  /** The workspace root (default: a temporary directory, removed when the server stops). */
  workspaceRoot?: string;
  /** The address to listen on (default `127.0.0.1:0`: a free loopback port). */
  listen?: string;
  /** The bearer token (default: 32 random bytes). */
  token?: string;
  /** The server's environment (default: this process's). */
  env?: Record<string, string | undefined>;
  /** How long the server may take to be ready, in ms (default 30,000). */
  startupTimeoutMs?: number;
  /** How long `close()` waits after SIGTERM before SIGKILL, in ms (default 5,000, plus the
   * `grace` you gave). */
  stopTimeoutMs?: number;
}

const LOCAL_KEYS = ["binary", "workspaceRoot", "listen", "token", "env", "startupTimeoutMs", "stopTimeoutMs"] as const;
const CLIENT_KEYS = ["maxRetries", "retryBudgetMs", "fetch", "fetchOptions", "logger"] as const;
const ALL_KEYS: ReadonlySet<string> = new Set([...SERVE_KEYS, ...LOCAL_KEYS, ...CLIENT_KEYS]);
const STDERR_LINES = 200;
const DEFAULT_GRACE = "1s";

/**
 * The local server could not be found or started. `code` is `binary_not_found`,
 * `server_exited` (it ended before it was ready; `stderr` is what it printed), `start_timeout`
 * or `bad_ready_line` (its ready line was not `{"url", "pid"}`).
 */
export class LocalServerError extends SwitchboardError {
  /** The tail of the server's stderr. */
  readonly stderr: string;

  constructor(code: string, message: string, stderr = "", options?: { cause?: unknown }) {
    super(code, message, undefined, undefined, options);
    this.name = "LocalServerError";
    this.stderr = stderr;
  }
}

// --- the binary ------------------------------------------------------------------------------

function executable(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The npm package that carries the binary for this platform, if there is one. */
function platformPackage(): string | undefined {
  if (process.platform !== "linux" || !["x64", "arm64"].includes(process.arch)) return undefined;
  return `switchboard-client-linux-${process.arch}`;
}

/**
 * The `switchboard` binary `local()` starts: the one in the npm package
 * `switchboard-client-linux-<arch>` (`<package>/bin/switchboard`), else `$SWITCHBOARD_BIN`, else
 * `switchboard` on `PATH`. Throws `LocalServerError` (`binary_not_found`) naming every place
 * searched.
 */
export function findBinary(): string {
  const searched: string[] = [];
  const pkg = platformPackage();
  if (pkg === undefined) {
    searched.push(`an npm package for ${process.platform}-${process.arch} (there is none: the binary is built for linux-x64 and linux-arm64)`);
  } else {
    let path: string | undefined;
    try {
      path = join(dirname(createRequire(import.meta.url).resolve(`${pkg}/package.json`)), "bin", "switchboard");
    } catch {
      // not installed
    }
    if (path !== undefined && executable(path)) return path;
    searched.push(path === undefined ? `the npm package ${pkg} (not installed)` : `the npm package ${pkg}: no executable ${path}`);
  }
  const env = process.env[BINARY_ENV];
  if (env && executable(env)) return resolve(env);
  searched.push(env ? `$${BINARY_ENV}: no executable ${env}` : `$${BINARY_ENV} (unset)`);
  const path = process.env.PATH ?? "";
  for (const dir of path.split(delimiter)) {
    const candidate = join(dir || ".", "switchboard");
    if (executable(candidate)) return resolve(candidate);
  }
  searched.push(`PATH (${path})`);
  throw new LocalServerError(
    "binary_not_found",
    `no switchboard binary found; searched ${searched.join("; ")}. ` +
      `Install ${pkg ?? "the switchboard binary"}, or set $${BINARY_ENV} to the binary`,
  );
}

// --- the process -----------------------------------------------------------------------------

const live = new Set<LocalServer>();
let exitHook = false;

/** Stops every server still running when this process exits: SIGTERM, a bounded synchronous
 * wait, then SIGKILL to what is left; removes the temporary directories. */
function stopAllAtExit(): void {
  for (const server of [...live]) server._stopSync();
}

/** Whether process `pid` still runs (a zombie does not: it has ended, unreaped). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state !== "Z" && state !== "X";
  } catch (e) {
    if ((e as { code?: string }).code !== "ENOENT") {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    }
    return false;
  }
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function killGroup(pid: number): void {
  try {
    process.kill(-pid, "SIGKILL"); // it leads its own process group (detached)
  } catch {
    // nothing left
  }
}

/**
 * The ready line's channel, a FIFO in the private directory `dir`: its write end becomes the
 * server's descriptor 3, its read end is this process's. A real pipe, not the socket pair of
 * `stdio: "pipe"`: the server opens its descriptor anew through `/proc`, which a socket refuses.
 * `undefined` when no FIFO can be made (no `mkfifo`): then `stdio: "pipe"` it is.
 */
function readyFifo(dir: string): { read: number; write: number } | undefined {
  const path = join(dir, "ready");
  let read: number | undefined;
  try {
    execFileSync("mkfifo", ["-m", "600", path], { stdio: "ignore" });
    read = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
    return { read, write: openSync(path, constants.O_WRONLY | constants.O_NONBLOCK) };
  } catch {
    if (read !== undefined) closeSync(read);
    return undefined;
  }
}

/** Removes a directory tree, also where a command left directories without write permission
 * (made writable again first; symbolic links are not followed). What still resists stays. */
function removeTree(path: string): void {
  try {
    rmSync(path, { recursive: true, force: true });
    return;
  } catch {
    // an unwritable directory inside: open it up, then again
  }
  const open = (dir: string): void => {
    try {
      chmodSync(dir, 0o700);
      for (const entry of readdirSync(dir, { withFileTypes: true })) if (entry.isDirectory()) open(join(dir, entry.name));
    } catch {
      // not ours to change
    }
  };
  open(path);
  try {
    rmSync(path, { recursive: true, force: true });
  } catch {
    // left behind
  }
}

/** `promise`, or `fallback` if it has not settled within `ms` (no timer left behind). */
async function within<T, F>(promise: Promise<T>, ms: number, fallback: F): Promise<T | F> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([promise, new Promise<F>((resolve) => (timer = setTimeout(resolve, ms, fallback)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Resolves once `stream` has closed (all it carried read), or after `ms`. */
function closed(stream: Readable | null, ms: number): Promise<void> {
  if (!stream || stream.closed) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    stream.once("close", () => (clearTimeout(timer), resolve()));
  });
}

/** A pipe of the child's, unref'd so that it never keeps Node alive. */
function unref(stream: unknown): void {
  (stream as { unref?: () => void } | null)?.unref?.();
}

/** A `switchboard serve` process `local()` started. `baseUrl`, `token`, `pid`, `binary`,
 * `argv` and `workspaceRoot` describe it; `stderr()` is the tail of its log; `stop()` ends it
 * (idempotent; `LocalClient.close()` calls it). */
export class LocalServer {
  readonly binary: string;
  readonly argv: readonly string[];
  readonly token: string;
  readonly workspaceRoot: string;
  readonly stopTimeoutMs: number;
  /** The server's address, from its ready line. */
  baseUrl = "";
  /** Its exit code, or the signal that ended it, once it has exited. */
  exitStatus: number | string | null = null;
  private readonly child: ChildProcess;
  private readonly readyPipe: Readable | null;
  /** No FIFO could be made (no `mkfifo`): descriptor 3 is Node's socket pair. */
  private readonly noFifo: boolean;
  private readonly lines: string[] = [];
  private partial = "";
  private tmp: string | undefined;
  private readonly exited: Promise<number | string | null>;
  private stopping: Promise<number | string | null> | undefined;

  private constructor(options: LocalOptions, serveOptions: ServeOptions) {
    const extra = serveArgs(serveOptions); // refuses a bad option before anything starts
    if (serveOptions.grace === undefined) extra.push("--grace", DEFAULT_GRACE);
    this.binary = options.binary !== undefined ? resolve(options.binary) : findBinary();
    this.token = options.token ?? randomBytes(32).toString("base64url");
    this.stopTimeoutMs = options.stopTimeoutMs ?? 5_000 + (durationMs(serveOptions.grace) ?? 0);
    this.tmp = mkdtempSync(join(tmpdir(), "switchboard-local-")); // 0700
    this.workspaceRoot = resolve(options.workspaceRoot ?? join(this.tmp, "workspaces"));
    const auth: string[] = [];
    if (!serveOptions.noAuth) {
      const tokenFile = join(this.tmp, "token");
      writeFileSync(tokenFile, `${this.token}\n`, { mode: 0o600 });
      auth.push("--token-file", tokenFile);
    }
    this.argv = [
      this.binary,
      "serve",
      "--listen",
      options.listen ?? "127.0.0.1:0",
      "--workspace-root",
      this.workspaceRoot,
      ...auth,
      ...extra,
      "--ready-fd",
      "3",
      "--stop-on-stdin-close",
    ];
    // Its own process group, so that stragglers can be killed with it; stdin a pipe only this
    // process holds (never written to, never ended: its end of file is this process's end);
    // descriptor 3 the ready line.
    const fifo = readyFifo(this.tmp);
    try {
      this.child = spawn(this.binary, this.argv.slice(1), {
        stdio: ["pipe", "ignore", "pipe", fifo?.write ?? "pipe"],
        env: options.env ?? process.env,
        detached: true,
      });
    } catch (e) {
      if (fifo) [fifo.read, fifo.write].forEach((fd) => closeSync(fd));
      removeTree(this.tmp);
      throw new LocalServerError("server_exited", `could not start ${this.binary}: ${String(e)}`, "", { cause: e });
    }
    if (fifo) {
      closeSync(fifo.write); // the server's now: end of file when it has gone
      rmSync(join(this.tmp, "ready"), { force: true }); // both ends are open: the name is not needed
    }
    this.noFifo = fifo === undefined;
    this.readyPipe = fifo ? new Socket({ fd: fifo.read, readable: true, writable: false }) : (this.child.stdio[3] as Readable | null);
    this.exited = new Promise((resolve) => {
      this.child.once("exit", (code, signal) => resolve((this.exitStatus = code ?? signal)));
      this.child.once("error", () => resolve((this.exitStatus ??= "spawn failed")));
    });
    this.child.stdin?.on("error", () => undefined); // EPIPE once the server has gone
    const stderr = this.child.stderr;
    if (stderr) {
      stderr.setEncoding("utf8");
      stderr.on("data", (chunk: string) => this.log(chunk));
      stderr.on("error", () => undefined);
    }
    live.add(this);
    if (!exitHook) {
      exitHook = true;
      process.on("exit", stopAllAtExit);
    }
  }

  /** @internal Starts the server and resolves once it is ready (use `local()`). */
  static async start(options: LocalOptions, serveOptions: ServeOptions): Promise<LocalServer> {
    const server = new LocalServer(options, serveOptions);
    try {
      await server.ready(options.startupTimeoutMs ?? 30_000);
    } catch (e) {
      await server.stop(1_000);
      throw e;
    }
    return server;
  }

  /** The process id. */
  get pid(): number {
    return this.child.pid ?? -1;
  }

  /** Whether the process still runs. */
  get running(): boolean {
    return this.exitStatus === null && this.child.pid !== undefined;
  }

  /** The last lines the server printed on stderr (its log). */
  stderr(): string {
    return [...this.lines, this.partial].filter(Boolean).join("\n");
  }

  private log(chunk: string): void {
    const parts = (this.partial + chunk).split("\n");
    this.partial = parts.pop() ?? "";
    this.lines.push(...parts);
    if (this.lines.length > STDERR_LINES) this.lines.splice(0, this.lines.length - STDERR_LINES);
    if (this.partial.length > 65_536) this.partial = this.partial.slice(-65_536);
  }

  /** Waits for the ready line on descriptor 3; EOF without one means the server failed. */
  private async ready(timeoutMs: number): Promise<void> {
    const pipe = this.readyPipe;
    let timer: NodeJS.Timeout | undefined;
    const line = await new Promise<string | undefined>((resolve, reject) => {
      let text = "";
      timer = setTimeout(
        () => reject(new LocalServerError("start_timeout", `${this.binary} serve was not ready within ${timeoutMs} ms${this.stderrSuffix()}`, this.stderr())),
        timeoutMs,
      );
      this.child.once("error", (e) =>
        reject(new LocalServerError("server_exited", `could not start ${this.binary}: ${e.message}`, this.stderr(), { cause: e })),
      );
      if (!pipe) return resolve(undefined);
      pipe.setEncoding("utf8");
      pipe.on("data", (chunk: string) => {
        text += chunk;
        const end = text.indexOf("\n");
        if (end >= 0) resolve(text.slice(0, end));
        else if (text.length > 65_536) resolve(text);
      });
      pipe.on("end", () => resolve(text.includes("\n") ? text.slice(0, text.indexOf("\n")) : undefined));
      pipe.on("error", () => resolve(undefined));
    }).finally(() => {
      clearTimeout(timer);
      pipe?.destroy();
    });
    if (line === undefined) {
      // It failed before it was ready: its exit status and all it printed.
      const status = await within(this.exited, 5_000, "still running");
      await closed(this.child.stderr, 2_000);
      const stderr = this.stderr();
      const old = /unexpected argument '--(ready-fd|stop-on-stdin-close)'/.test(stderr)
        ? " (this switchboard binary has no --ready-fd or --stop-on-stdin-close: local() needs a newer one)"
        : this.noFifo && stderr.includes("--ready-fd")
          ? " (local() could not make a FIFO for --ready-fd: is `mkfifo` on PATH?)"
          : "";
      throw new LocalServerError(
        "server_exited",
        `${this.argv.join(" ")} exited with status ${String(status)} before it was ready${old}${this.stderrSuffix()}`,
        this.stderr(),
      );
    }
    let ready: unknown;
    try {
      ready = JSON.parse(line);
    } catch {
      ready = undefined;
    }
    const url = (ready as { url?: unknown } | undefined)?.url;
    if (typeof url !== "string" || !/^https?:\/\//.test(url)) {
      throw new LocalServerError("bad_ready_line", `${this.binary} serve wrote a ready line that is not {"url", "pid"}: ${JSON.stringify(line)}`, this.stderr());
    }
    this.baseUrl = url.replace(/\/+$/, "");
    this.removeToken(); // read at start: nothing needs the file any more
    unref(this.child.stdin);
    unref(this.child.stderr);
    this.child.unref();
  }

  private stderrSuffix(): string {
    const text = this.stderr().trim();
    return text ? `; its stderr:\n${text}` : "; it printed nothing on stderr";
  }

  private removeToken(): void {
    if (this.tmp !== undefined) rmSync(join(this.tmp, "token"), { force: true });
  }

  private cleanUp(): void {
    live.delete(this);
    this.child.stdin?.destroy();
    if (this.tmp !== undefined) removeTree(this.tmp);
    this.tmp = undefined;
  }

  /**
   * Stops the server: SIGTERM (turns in flight get its `--grace`, then are cancelled, their
   * commands killed), SIGKILL to its process group if it has not exited after `timeoutMs`
   * (default `stopTimeoutMs`), then SIGKILL to whatever is left in the group; removes the
   * temporary directory. Resolves with its exit code (or signal). Idempotent.
   */
  stop(timeoutMs = this.stopTimeoutMs): Promise<number | string | null> {
    this.stopping ??= (async () => {
      const pid = this.child.pid;
      if (pid !== undefined && this.exitStatus === null) {
        this.child.kill("SIGTERM");
        if ((await within(this.exited, timeoutMs, "late")) === "late" && this.exitStatus === null) {
          killGroup(pid);
          this.child.kill("SIGKILL");
          await this.exited;
        }
      }
      if (pid !== undefined) killGroup(pid);
      this.cleanUp();
      return this.exitStatus;
    })();
    return this.stopping;
  }

  /** @internal `stop()` for the `exit` event: synchronous, bounded by `stopTimeoutMs`. */
  _stopSync(): void {
    const pid = this.child.pid;
    if (pid !== undefined && this.exitStatus === null) {
      try {
        process.kill(pid, "SIGTERM");
      } catch {
        // gone already
      }
      const deadline = Date.now() + this.stopTimeoutMs;
      while (running(pid) && Date.now() < deadline) sleepSync(10);
    }
    if (pid !== undefined) killGroup(pid);
    this.cleanUp();
  }

  toString(): string {
    return `LocalServer(pid ${this.pid}, ${this.baseUrl || "starting"}, ${this.exitStatus === null ? "running" : `exited ${this.exitStatus}`})`;
  }
}

/** A `Client` connected to a server `local()` started (`server`); `close()` stops that server
 * (`await using client = await local()` does too, where the runtime has `Symbol.asyncDispose`). */
export class LocalClient extends Client {
  readonly server: LocalServer;

  constructor(server: LocalServer, options: Omit<ClientOptions, "baseUrl" | "token"> = {}) {
    super({ ...options, baseUrl: server.baseUrl, token: server.token });
    this.server = server;
  }

  /** Cancels the turns this client has in flight (their calls answered `cancelled`, their
   * commands killed), then stops the server and removes its temporary directory. */
  async close(): Promise<void> {
    const turns = [...this._turns];
    if (turns.length) {
      const cancels = turns.map(({ session, turnId }) => session.cancelTurn(turnId));
      await within(Promise.allSettled(cancels), 2_000, undefined);
    }
    await this.server.stop();
  }
}

const asyncDispose = (Symbol as unknown as { asyncDispose?: symbol }).asyncDispose;
if (asyncDispose) {
  Object.defineProperty(LocalClient.prototype, asyncDispose, {
    value: function (this: LocalClient) {
      return this.close();
    },
  });
}

/**
 * Starts `switchboard serve` on a free loopback port with a fresh random token and a temporary
 * workspace root, waits until it is ready, and resolves with a `Client` connected to it;
 * `close()` stops the server, and so do this process's exit and its death (`kill -9`
 * included):
 *
 * ```js
 * const client = await local({ sandbox: "read-only" });
 * try { await client.withSession("repo", (s) => s.dispatch(message)); } finally { await client.close(); }
 * ```
 *
 * Options: any `serve` option in camelCase (`ServeOptions`: `sandbox`, `allowNetwork`,
 * `sandboxRead`, `policy`, `grace`, …; an unknown one is a `TypeError`), the `LocalOptions`
 * (`binary`, `workspaceRoot`, `listen`, `token`, `env`, `startupTimeoutMs`, `stopTimeoutMs`)
 * and the `Client` options (`maxRetries`, `retryBudgetMs`, `fetch`, `fetchOptions`, `logger`).
 * A server that cannot start rejects with a `LocalServerError` carrying its stderr.
 */
export async function local(options: LocalOptions = {}): Promise<LocalClient> {
  unknownKeys(Object.keys(options), ALL_KEYS);
  const serveOptions: Record<string, unknown> = {};
  const clientOptions: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(options)) {
    if (SERVE_KEYS.has(key)) serveOptions[key] = value;
    else if ((CLIENT_KEYS as readonly string[]).includes(key)) clientOptions[key] = value;
  }
  const server = await LocalServer.start(options, serveOptions as ServeOptions);
  try {
    return new LocalClient(server, clientOptions as Omit<ClientOptions, "baseUrl" | "token">);
  } catch (e) {
    await server.stop();
    throw e;
  }
}
