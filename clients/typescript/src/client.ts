// The client: one `Client` per server, a `Session` per conversation, on Node's `fetch`.

import {
  DEFAULT_BASE_URL,
  LATE_ANSWER_CODES,
  Retries,
  SwitchboardError,
  TOKEN_ENV,
  TURN_HEADER,
  answerBody,
  connectionError,
  describe,
  errorAnswerBody,
  errorBody,
  errorFrom,
  lostConnection,
  turnIdOf,
  prepare,
  type Format,
} from "./common.js";
import type { ApprovalRequest, ClientCall, ProgressEvent } from "./stream.js";
import { DispatchStream, Turn } from "./turn.js";
import {
  ToolRegistry,
  noFunction,
  toolEntry,
  type ClientTool,
  type ToolCallContext,
  type ToolFunction,
  type ToolSpec,
} from "./tools.js";
import {
  checkAnswer,
  checkCatalog,
  checkFields,
  checkInfo,
  checkObject,
  parseJson,
  snippet,
  type AnswerOf,
  type ApprovalAnswer,
  type CatalogFormat,
  type CatalogOf,
  type CreatedSession,
  type Health,
  type SessionInfo,
} from "./wire.js";

/** Where the client reports what it cannot throw to anyone: a client tool's answer the server
 * refused, a failed approval callback. */
export interface Logger {
  warn(message: string): void;
}

export interface ClientOptions {
  /** The server's address (default `http://127.0.0.1:7420`). */
  baseUrl?: string;
  /** The bearer token (default: the `SWITCHBOARD_TOKEN` environment variable). */
  token?: string;
  /** How many times a request is sent again (default 5): after `overloaded` or a cluster's
   * `node_unreachable`, `session_moved` and `cluster_unavailable`, and after a connection lost
   * before any answer (the same turn id: the server answers a turn it has seen from memory). */
  maxRetries?: number;
  /** The most time the retries of one request may take, in ms (default 30,000). */
  retryBudgetMs?: number;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** Extra `fetch` options for every request, such as an undici `dispatcher`. */
  fetchOptions?: Record<string, unknown>;
  /** Where warnings go (default: `process.emitWarning`). */
  logger?: Logger;
}

export interface SessionOptions {
  /** The workspace directory's name under the server's root (default: a fresh directory). */
  workspace?: string;
  /** Client tools: `{name, description, inputSchema, execute}` objects or ready declarations. */
  tools?: Array<ClientTool<unknown> | ToolSpec>;
  /** A narrower sandbox: a mode name or `{mode, allow_network}`. */
  sandbox?: string | Record<string, unknown>;
  /** A stricter policy the server offers (`--session-policy NAME=FILE`). */
  policy?: string;
}

/** Decides a call held for approval: `true` allows it. */
export type ApprovalCallback = (request: ApprovalRequest) => boolean | Promise<boolean>;

export interface DispatchOptions {
  /** `anthropic` or `openai` (default: detected from the message). */
  format?: Format;
  /** The turn's id (default: `m-` and a digest of the message, `turnIdOf`). */
  turnId?: string;
  /** Aborting it cancels the turn on the server, wherever it is; the dispatch then resolves
   * with the answer, the cancelled calls saying so. */
  signal?: AbortSignal;
  /** Decides calls held for approval (a server policy's `ask` rules); without it they are
   * denied. Giving it streams the turn. */
  onApproval?: ApprovalCallback;
  /** Gets each running call's live progress (a command's output as it is written, an MCP
   * server's progress), each call's before its result; the answer is the same. Giving it
   * streams the turn. */
  onProgress?: ProgressCallback;
}

/** Gets a running call's live progress event. */
export type ProgressCallback = (event: ProgressEvent) => void | Promise<void>;

/** The answer of `POST /v1/sessions/{id}/turns/{turn_id}/cancel`. */
export interface CancelAnswer {
  turn_id: string;
  state: "running" | "queued" | "early" | "finished";
}

/** How `Client._request` sends one request and reads its answer. */
export interface RequestOptions<T> {
  body?: string;
  headers?: Record<string, string>;
  /** The answer's JSON as `T`, or throws `bad_response` (default: any JSON). */
  check?: (value: unknown, status: number) => T;
  /** Send the request again when its connection is lost before any answer (default `true`;
   * `false` for a request that is not safe to repeat, which is still sent again when its
   * connection was refused: then nothing reached the server). */
  resend?: boolean;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A connection pool to one Switchboard server. */
export class Client {
  readonly baseUrl: string;
  readonly maxRetries: number;
  readonly retryBudgetMs: number;
  /** @internal */ readonly _headers: Record<string, string>;
  /** @internal */ readonly _jsonHeaders: Record<string, string>;
  /** @internal */ readonly _streamHeaders: Record<string, string>;
  private readonly fetch: typeof fetch;
  private readonly fetchOptions: Record<string, unknown>;
  private readonly logger: Logger | undefined;
  /** @internal The turns in flight through this client (what `LocalClient.close()` cancels
   * before it stops its server). */
  readonly _turns = new Set<{ session: Session; turnId: string }>();

  constructor(baseUrl?: string | ClientOptions, options: ClientOptions = {}) {
    if (typeof baseUrl === "object" && baseUrl !== null) options = baseUrl;
    else if (typeof baseUrl === "string") options = { ...options, baseUrl };
    this.baseUrl = (options.baseUrl ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
    const token = options.token ?? process.env[TOKEN_ENV];
    this._headers = token ? { authorization: `Bearer ${token}` } : {};
    this._jsonHeaders = { ...this._headers, "content-type": "application/json" };
    this._streamHeaders = { ...this._jsonHeaders, accept: "text/event-stream" };
    this.maxRetries = options.maxRetries ?? 5;
    this.retryBudgetMs = options.retryBudgetMs ?? 30_000;
    this.fetch = options.fetch ?? globalThis.fetch;
    this.fetchOptions = options.fetchOptions ?? {};
    this.logger = options.logger;
    if (typeof this.fetch !== "function") throw new TypeError("no fetch: switchboard-client needs Node 18 or newer");
  }

  // --- transport ---

  /** @internal Reports what cannot be thrown to anyone. Never throws. */
  _warn(message: string): void {
    try {
      if (this.logger) this.logger.warn(message);
      else process.emitWarning(message, "SwitchboardWarning");
    } catch {
      // a logger that throws loses the message, not the call
    }
  }

  /** @internal Runs `fn`, turn `turnId` of `session`, counted in `_turns` while it runs. */
  async _inFlight<T>(session: Session, turnId: string, fn: () => Promise<T>): Promise<T> {
    const turn = { session, turnId };
    this._turns.add(turn);
    try {
      return await fn();
    } finally {
      this._turns.delete(turn);
    }
  }

  /** @internal Sends one request, retrying `overloaded`, a refused connection, and (unless
   * `resend` is false) a connection lost before any answer, with the same body and headers — the
   * same turn id, so the server answers a turn it has seen from its memory; returns the
   * response (status < 400). */
  async _open(method: string, path: string, body: string | undefined, headers: Record<string, string>, resend = true): Promise<Response> {
    const url = this.baseUrl + path;
    let retries: Retries | undefined;
    for (;;) {
      let resp: Response;
      try {
        resp = await this.fetch(url, { ...this.fetchOptions, method, body, headers });
      } catch (e) {
        retries ??= new Retries(this.maxRetries, this.retryBudgetMs);
        const how = lostConnection(e);
        const delay = how === "refused" || (how === "lost" && resend) ? retries.resend() : null;
        if (delay === null) throw connectionError(e);
        await sleep(delay);
        continue;
      }
      if (resp.status < 400) return resp;
      let text = "";
      try {
        text = await resp.text();
      } catch {
        // the error's body is lost; its status stays
      }
      const err = errorFrom(resp.status, resp.statusText, resp.headers.get("retry-after"), text);
      retries ??= new Retries(this.maxRetries, this.retryBudgetMs);
      const delay = retries.delay(err);
      if (delay === null) throw err;
      await sleep(delay);
    }
  }

  /** @internal A request whose answer is JSON (or empty: `null`), checked by `options.check`. */
  async _request<T = unknown>(method: string, path: string, options: RequestOptions<T> = {}): Promise<T> {
    const { body, check, resend } = options;
    const headers = options.headers ?? (body !== undefined ? this._jsonHeaders : this._headers);
    const resp = await this._open(method, path, body, headers, resend);
    let text: string;
    try {
      text = await resp.text();
    } catch (e) {
      throw connectionError(e);
    }
    const value = text ? parseJson(text, `the answer to ${method} ${path.split("?")[0]} (HTTP ${resp.status}, ${resp.headers.get("content-type") ?? "no content type"})`, resp.status) : null;
    return check ? check(value, resp.status) : (value as T);
  }

  // --- API ---

  /** A session, created on the server on first use (`dispatch`, `stream`, `tools`, `info`,
   * `create`); its client tools are fixed then. `close()` deletes it. */
  session(options: SessionOptions | string = {}): Session {
    return new Session(this, typeof options === "string" ? { workspace: options } : options);
  }

  /** Runs `fn` with a session and closes the session afterwards, whatever happens. */
  async withSession<T>(options: SessionOptions | string, fn: (session: Session) => Promise<T> | T): Promise<T> {
    const session = this.session(options);
    try {
      return await fn(session);
    } finally {
      await session.close();
    }
  }

  /** The server's catalog (built-in and MCP tools). */
  tools<F extends CatalogFormat = "anthropic">(format: F = "anthropic" as F): Promise<CatalogOf<F>> {
    return this._request("GET", `/v1/tools?format=${format}`, { check: checkCatalog<F> });
  }

  /** `GET /healthz`: `{"status": "ok", "sandbox": {...}}`. */
  health(): Promise<Health> {
    return this._request("GET", "/healthz", { check: (v, status) => checkFields<Health>(v, ["status"], "the health answer", status) });
  }
}

/** One conversation's session. Created on the server on first use; `id` and `workspace` are
 * known once it is (`await session.create()`). */
export class Session {
  private _id: string | undefined;
  private _workspace: string | undefined;
  private _base = "";
  private _creating: Promise<string> | undefined;
  private _closed = false;
  /** @internal */ readonly _registry = new ToolRegistry();

  constructor(
    /** @internal */ readonly _client: Client,
    private readonly options: SessionOptions = {},
  ) {
    for (const t of options.tools ?? []) this._registry.add(toolEntry(t));
  }

  // --- creation ---

  /** Creates the server session now (otherwise the first use does). */
  async create(): Promise<this> {
    await this._ensure();
    return this;
  }

  /** @internal */
  _ensure(): Promise<string> {
    if (this._id !== undefined) return Promise.resolve(this._id);
    if (this._closed) return Promise.reject(new SwitchboardError("unknown_session", "the session is closed", 404));
    this._creating ??= this._create().catch((e) => {
      this._creating = undefined; // a failed creation is tried again by the next use
      throw e;
    });
    return this._creating;
  }

  private async _create(): Promise<string> {
    const body: Record<string, unknown> = {};
    const o = this.options;
    if (o.workspace !== undefined) body.workspace = o.workspace;
    if (this._registry.size) body.tools = await this._registry.specs();
    if (o.sandbox !== undefined) body.sandbox = o.sandbox;
    if (o.policy !== undefined) body.policy = o.policy;
    // Not sent again on a lost connection: a second session could be made, and left behind.
    const created = await this._client._request("POST", "/v1/sessions", {
      body: JSON.stringify(body),
      resend: false,
      check: (v, status) => checkFields<CreatedSession>(v, ["session_id"], "the new session", status),
    });
    this._workspace = created.workspace;
    this._base = `/v1/sessions/${created.session_id}`;
    this._id = created.session_id;
    return created.session_id;
  }

  private need(): void {
    if (this._id === undefined) {
      throw new Error("the session is created on first use: `await session.create()` (or dispatch, info, tools) first");
    }
  }

  /** The server's session id (throws before the session is created). */
  get id(): string {
    this.need();
    return this._id!;
  }

  /** The session's workspace directory on the server (throws before it is created). */
  get workspace(): string {
    this.need();
    return this._workspace!;
  }

  get created(): boolean {
    return this._id !== undefined;
  }

  // --- client tools ---

  /** Declares a client tool (before the session is first used) and returns it. */
  tool<S>(tool: ClientTool<S>, execute?: ClientTool<S>["execute"]): ClientTool<S>;
  /** Declares a ready declaration (Anthropic or OpenAI shape) with its function. */
  tool<T extends ToolSpec>(tool: T, execute?: ToolFunction): T;
  tool(tool: ClientTool<unknown> | ToolSpec, execute?: ToolFunction): ClientTool<unknown> | ToolSpec {
    if (this._id !== undefined || this._creating !== undefined || this._closed) {
      throw new Error(
        "client tools must be registered before the session is first used: the server fixes a " +
          "session's client tools when it creates it (on the first dispatch, stream, start, info " +
          "or tools call). Register them first, or open a new session.",
      );
    }
    this._registry.add(toolEntry(tool, execute));
    return tool;
  }

  /** The declarations of this session's client tools (a zod schema shows as `{}` until the
   * session is created). */
  get clientTools(): ToolSpec[] {
    return [...this._registry.entries.values()].map((e) => e.declared);
  }

  /** @internal Runs a client call and answers it. Never throws. */
  async _runCall(call: ClientCall, signal: AbortSignal): Promise<void> {
    const reports = new Reporter((body) =>
      this._client._request("POST", `${this._base}/calls/${encodeURIComponent(call.call_id)}/progress`, { body }).then(
        () => undefined,
        () => undefined, // the call was answered meanwhile: the report no longer counts
      ),
    );
    try {
      const body = await this.callAnswer(call, signal, reports);
      if (signal.aborted) return; // the turn's stream has ended: the call is closed
      // The call's last progress reports go before its answer (a moment at most).
      await reports.idle(REPORTS_BEFORE_ANSWER_MS);
      await this.postAnswer(call, body);
    } catch (e) {
      this._client._warn(`switchboard: client call ${call.call_id} (${call.name}): ${describe(e)}`);
    }
  }

  /** What the call's function answers: its value, or the error it threw, as an answer body. */
  private async callAnswer(call: ClientCall, signal: AbortSignal, reports: Reporter): Promise<string> {
    const entry = this._registry.entries.get(call.name);
    if (entry?.execute === undefined) return errorBody(noFunction(call.name));
    const context: ToolCallContext = {
      callId: call.call_id,
      toolUseId: call.tool_use_id,
      name: call.name,
      deadlineMs: call.deadline_ms,
      idempotencyKey: call.idempotency_key,
      signal,
      progress: (progress, total, message) => {
        if (!signal.aborted) reports.value({ progress, ...(total === undefined ? {} : { total }), ...(message === undefined ? {} : { message }) });
      },
      output: (text, stream = "stdout") => {
        if (!signal.aborted) reports.text(String(text), stream === "stderr" ? "stderr" : "stdout");
      },
    };
    let value: unknown;
    try {
      const input = await entry.input(call.input);
      value = await entry.execute(input, context);
    } catch (e) {
      return errorAnswerBody(e);
    }
    return answerBody(value, call.name);
  }

  /** Posts a call's answer. An answer the server refuses (4xx: over `--max-body`, a bad
   * block) is replaced at once by an error naming why, so the model hears the reason now, not
   * `timeout` at the call's deadline. */
  private async postAnswer(call: ClientCall, body: string): Promise<void> {
    const path = `${this._base}/calls/${encodeURIComponent(call.call_id)}`;
    const client = this._client;
    const late = (e: unknown) => e instanceof SwitchboardError && LATE_ANSWER_CODES.includes(e.code);
    try {
      await client._request("POST", path, { body });
      return;
    } catch (e) {
      if (late(e)) return;
      if (!(e instanceof SwitchboardError && e.status !== undefined && e.status >= 400 && e.status < 500)) {
        client._warn(`switchboard: answering client call ${call.call_id} (${call.name}) failed: ${describe(e)}`);
        return;
      }
      const hint = e.code === "payload_too_large" ? "; return less, or start the server with a larger --max-body" : "";
      const why =
        `the server refused the answer of client tool ${JSON.stringify(call.name)} ` +
        `(${e.code}, HTTP ${e.status}: ${snippet(e.detail)})${hint}`;
      client._warn(`switchboard: ${why}; call ${call.call_id} is answered with this error instead`);
      try {
        await client._request("POST", path, { body: errorBody(`SwitchboardError: ${why}`) });
      } catch (again) {
        if (!late(again)) client._warn(`switchboard: answering client call ${call.call_id} with the refusal failed: ${describe(again)}`);
      }
    }
  }

  // --- dispatch ---

  /**
   * Dispatches one model answer and resolves with the message(s) to append — the Anthropic
   * `tool_result` user message, or the array of OpenAI tool messages — or `null` when the
   * message calls no tool (nothing is sent). Aborting `signal` cancels the turn on the server;
   * the dispatch still resolves with the answer (the cancelled calls say so).
   */
  async dispatch<M>(message: M, options: DispatchOptions = {}): Promise<AnswerOf<M> | null> {
    const prepared = prepare(message, options.format);
    if (prepared.names !== undefined && prepared.names.length === 0) return null;
    const turnId = options.turnId ?? turnIdOf(prepared.body);
    return this._withAbort(turnId, options.signal, async () => {
      if (this._id === undefined) await this._ensure();
      if (options.onApproval || options.onProgress || this._registry.streams(prepared.names)) {
        const stream = new DispatchStream(this, prepared, turnId, options.onApproval, undefined, options.onProgress);
        for await (const _ of stream) {
          // results come in the answer
        }
        return stream.answer as AnswerOf<M>;
      }
      const headers = { ...this._client._jsonHeaders, [TURN_HEADER]: turnId };
      const answer = await this._client._inFlight(this, turnId, () =>
        this._client._request("POST", `${this._base}/dispatch?format=${prepared.format}`, {
          body: prepared.body,
          headers,
          check: (v, status) => checkAnswer(v, prepared.format, status),
        }),
      );
      return answer as AnswerOf<M>;
    });
  }

  /** Runs the dispatch in the background: `await turn` (or `turn.result`) is its answer,
   * `turn.cancel()` cancels it on the server, even before it arrived there. */
  start<M>(message: M, options: Omit<DispatchOptions, "signal"> = {}): Turn<AnswerOf<M>> {
    return new Turn<AnswerOf<M>>(this, message, options);
  }

  /** The dispatch with the results as they come: `for await (const {index, result} of
   * session.stream(msg))`, then `stream.answer`. */
  stream<M>(message: M, options: DispatchOptions = {}): DispatchStream<AnswerOf<M>> {
    const prepared = prepare(message, options.format);
    return new DispatchStream<AnswerOf<M>>(
      this,
      prepared,
      options.turnId ?? turnIdOf(prepared.body),
      options.onApproval,
      options.signal,
      options.onProgress,
    );
  }

  /** @internal Runs `fn` with `signal` wired to the cancel of the turn. */
  async _withAbort<T>(turnId: string, signal: AbortSignal | undefined, fn: () => Promise<T>): Promise<T> {
    if (!signal) return fn();
    let cancelling: Promise<unknown> | undefined;
    const onAbort = () => {
      cancelling ??= this.cancelTurn(turnId).catch(() => undefined);
    };
    if (signal.aborted) {
      onAbort();
      await cancelling; // the cancel first: the turn, when it arrives, runs nothing
    } else {
      signal.addEventListener("abort", onAbort, { once: true });
    }
    try {
      return await fn();
    } finally {
      signal.removeEventListener("abort", onAbort);
      if (cancelling) await cancelling;
    }
  }

  /** The session's catalog: the server's tools, then its client tools, for `tools:`. While
   * tools are deferred, the Anthropic shape starts with `tool_search` and marks each deferred
   * tool `defer_loading: true`; the OpenAI shape lists `tool_search`, the tools not deferred,
   * then the deferred ones the session has been shown (ask again before each request). */
  async tools<F extends CatalogFormat = "anthropic">(format: F = "anthropic" as F): Promise<CatalogOf<F>> {
    await this._ensure();
    return this._client._request("GET", `${this._base}/tools?format=${format}`, { check: checkCatalog<F> });
  }

  /** Answers an `approval_required` event. */
  async approve(approvalId: string, allow: boolean): Promise<ApprovalAnswer> {
    await this._ensure();
    return this._client._request("POST", `${this._base}/approvals/${encodeURIComponent(approvalId)}`, {
      body: JSON.stringify({ allow: Boolean(allow) }),
      check: (v, status) => checkObject<ApprovalAnswer>(v, "the approval answer", status),
    });
  }

  /** `{"session_id", "workspace", "turns", "calls", "in_flight"}`. */
  async info(): Promise<SessionInfo> {
    await this._ensure();
    return this._client._request("GET", this._base, { check: checkInfo });
  }

  /** Cancels whatever the session runs now: its info after the cancel (`null` if it was never
   * created). */
  async cancel(): Promise<SessionInfo | null> {
    if (this._id === undefined) return null;
    return this._client._request("POST", `${this._base}/cancel`, { check: checkInfo });
  }

  /** Cancels the turn `turnId` wherever it is — even before its dispatch arrived. */
  async cancelTurn(turnId: string): Promise<CancelAnswer> {
    await this._ensure();
    return this._client._request("POST", `${this._base}/turns/${encodeURIComponent(turnId)}/cancel`, {
      check: (v, status) => checkFields<CancelAnswer>(v, ["turn_id", "state"], "the cancel answer", status),
    });
  }

  /** Deletes the server session (its workspace stays); later uses throw `unknown_session`. */
  async close(): Promise<void> {
    this._closed = true;
    if (this._id === undefined && this._creating !== undefined) {
      try {
        await this._creating;
      } catch {
        // never created
      }
    }
    if (this._id === undefined) return;
    try {
      await this._client._request("DELETE", this._base);
    } catch (e) {
      if (!(e instanceof SwitchboardError && e.code === "unknown_session")) throw e;
    }
  }

  /** @internal */
  get _path(): string {
    return this._base;
  }
}

// `await using session = client.session()` where the runtime has `Symbol.asyncDispose`.
const asyncDispose = (Symbol as unknown as { asyncDispose?: symbol }).asyncDispose;
if (asyncDispose) {
  Object.defineProperty(Session.prototype, asyncDispose, {
    value: function (this: Session) {
      return this.close();
    },
  });
}

/** How long a client call's answer waits for its progress reports still on their way. */
const REPORTS_BEFORE_ANSWER_MS = 1000;
/** The most unsent output text one call's reports hold; more is left out. */
const REPORT_PENDING = 64 * 1024;

/** Sends one client call's progress reports one at a time: what comes while one is on its way
 * is joined — text appended (at most `REPORT_PENDING` characters unsent), a value replaced by
 * the newest. */
class Reporter {
  private text_: Record<"stdout" | "stderr", string> = { stdout: "", stderr: "" };
  private value_: Record<string, unknown> | undefined;
  private sending: Promise<void> | undefined;

  constructor(private readonly send: (body: string) => Promise<void>) {}

  text(text: string, stream: "stdout" | "stderr"): void {
    const room = REPORT_PENDING - this.text_.stdout.length - this.text_.stderr.length;
    this.text_[stream] += text.slice(0, Math.max(room, 0));
    this.kick();
  }

  value(body: Record<string, unknown>): void {
    this.value_ = body;
    this.kick();
  }

  /** Resolves once every report made so far was sent, or after `ms`. */
  async idle(ms: number): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), ms)));
    while (this.sending) {
      if ((await Promise.race([this.sending, late])) === "late") break;
    }
    clearTimeout(timer);
  }

  private kick(): void {
    if (this.sending) return;
    this.sending = this.drain().finally(() => {
      this.sending = undefined;
      // Reported after the last look but before this ran: send it too.
      if (this.value_ || this.text_.stdout || this.text_.stderr) this.kick();
    });
  }

  private async drain(): Promise<void> {
    for (;;) {
      const bodies: string[] = [];
      if (this.value_) bodies.push(JSON.stringify(this.value_));
      for (const stream of ["stdout", "stderr"] as const) {
        if (this.text_[stream]) bodies.push(JSON.stringify({ text: this.text_[stream], stream }));
      }
      this.value_ = undefined;
      this.text_ = { stdout: "", stderr: "" };
      if (!bodies.length) return;
      for (const body of bodies) await this.send(body);
    }
  }
}
