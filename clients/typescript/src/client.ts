// The client: one `Client` per server, a `Session` per conversation, on Node's `fetch`.

import {
  DEFAULT_BASE_URL,
  LATE_ANSWER_CODES,
  Retries,
  StreamState,
  SwitchboardError,
  TOKEN_ENV,
  TURN_HEADER,
  answerBody,
  connectionError,
  errorAnswerBody,
  errorBody,
  errorFrom,
  newTurnId,
  turnIdOf,
  prepare,
  type ApprovalRequest,
  type ClientCall,
  type Format,
  type Prepared,
  type StreamResult,
} from "./common.js";
import { ToolRegistry, noFunction, toolEntry, type ClientTool, type ToolCallContext, type ToolSpec } from "./tools.js";

export interface ClientOptions {
  /** The server's address (default `http://127.0.0.1:7420`). */
  baseUrl?: string;
  /** The bearer token (default: the `SWITCHBOARD_TOKEN` environment variable). */
  token?: string;
  /** How many times a refused request is retried: `overloaded`, and a cluster's `node_unreachable`, `session_moved` and `cluster_unavailable` (default 5). */
  maxRetries?: number;
  /** The most time the retries of one request may wait, in ms (default 30,000). */
  retryBudgetMs?: number;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** Extra `fetch` options for every request, such as an undici `dispatcher`. */
  fetchOptions?: Record<string, unknown>;
}

export interface SessionOptions {
  /** The workspace directory's name under the server's root (default: a fresh directory). */
  workspace?: string;
  /** Client tools: `{name, description, inputSchema, execute}` objects or ready declarations. */
  tools?: Array<ClientTool<any> | ToolSpec>;
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
  /** The turn's id (default `ts-` and 16 hex digits). */
  turnId?: string;
  /** Aborting it cancels the turn on the server, wherever it is; the dispatch then resolves
   * with the answer, the cancelled calls saying so. */
  signal?: AbortSignal;
  /** Decides calls held for approval (a server policy's `ask` rules); without it they are
   * denied. Giving it streams the turn. */
  onApproval?: ApprovalCallback;
}

/** The answer of `POST /v1/sessions/{id}/turns/{turn_id}/cancel`. */
export interface CancelAnswer {
  turn_id: string;
  state: "running" | "queued" | "early" | "finished";
}

/** The message(s) to append: the Anthropic `tool_result` user message, or the array of OpenAI
 * tool messages. */
export type DispatchAnswer = any;

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
    if (typeof this.fetch !== "function") throw new TypeError("no fetch: switchboard-client needs Node 18 or newer");
  }

  // --- transport ---

  /** @internal Sends one request, retrying `overloaded`; returns the response (status < 400). */
  async _open(method: string, path: string, body: string | undefined, headers: Record<string, string>): Promise<Response> {
    const url = this.baseUrl + path;
    let retries: Retries | undefined;
    for (;;) {
      let resp: Response;
      try {
        resp = await this.fetch(url, { ...this.fetchOptions, method, body, headers });
      } catch (e) {
        throw connectionError(e);
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

  /** @internal A request whose answer is JSON (or empty). */
  async _request(method: string, path: string, body?: string, headers?: Record<string, string>): Promise<any> {
    const resp = await this._open(method, path, body, headers ?? (body !== undefined ? this._jsonHeaders : this._headers));
    let text: string;
    try {
      text = await resp.text();
    } catch (e) {
      throw connectionError(e);
    }
    return text ? JSON.parse(text) : null;
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
  tools(format: Format | "mcp" = "anthropic"): Promise<any[]> {
    return this._request("GET", `/v1/tools?format=${format}`);
  }

  /** `GET /healthz`: `{"status": "ok", "sandbox": {...}}`. */
  health(): Promise<any> {
    return this._request("GET", "/healthz");
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
    const created = await this._client._request("POST", "/v1/sessions", JSON.stringify(body));
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
  tool<T extends ClientTool<any> | ToolSpec>(tool: T, execute?: ClientTool["execute"]): T {
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
    const entry = this._registry.entries.get(call.name);
    let body: string;
    if (entry?.execute === undefined) {
      body = errorBody(noFunction(call.name));
    } else {
      const context: ToolCallContext = {
        callId: call.call_id,
        toolUseId: call.tool_use_id,
        name: call.name,
        deadlineMs: call.deadline_ms,
        idempotencyKey: call.idempotency_key,
        signal,
      };
      try {
        const input = await entry.input(call.input);
        body = answerBody(await entry.execute(input, context));
      } catch (e) {
        body = errorAnswerBody(e);
      }
    }
    if (signal.aborted) return; // the turn's stream has ended: the call is closed
    try {
      await this._client._request("POST", `${this._base}/calls/${encodeURIComponent(call.call_id)}`, body);
    } catch (e) {
      if (!(e instanceof SwitchboardError && LATE_ANSWER_CODES.includes(e.code))) {
        process.emitWarning(`switchboard: answering client call ${call.call_id} failed: ${String(e)}`);
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
  async dispatch(message: unknown, options: DispatchOptions = {}): Promise<DispatchAnswer | null> {
    const prepared = prepare(message, options.format);
    if (prepared.names !== undefined && prepared.names.length === 0) return null;
    const turnId = options.turnId ?? turnIdOf(prepared.body);
    return this._withAbort(turnId, options.signal, async () => {
      if (this._id === undefined) await this._ensure();
      if (options.onApproval || this._registry.streams(prepared.names)) {
        const stream = new DispatchStream(this, prepared, turnId, options.onApproval, undefined);
        for await (const _ of stream) {
          // results come in the answer
        }
        return stream.answer;
      }
      const headers = { ...this._client._jsonHeaders, [TURN_HEADER]: turnId };
      return this._client._request("POST", `${this._base}/dispatch?format=${prepared.format}`, prepared.body, headers);
    });
  }

  /** Runs the dispatch in the background: `await turn` (or `turn.result`) is its answer,
   * `turn.cancel()` cancels it on the server, even before it arrived there. */
  start(message: unknown, options: Omit<DispatchOptions, "signal"> = {}): Turn {
    return new Turn(this, message, options);
  }

  /** The dispatch with the results as they come: `for await (const {index, result} of
   * session.stream(msg))`, then `stream.answer`. */
  stream(message: unknown, options: DispatchOptions = {}): DispatchStream {
    const prepared = prepare(message, options.format);
    return new DispatchStream(this, prepared, options.turnId ?? turnIdOf(prepared.body), options.onApproval, options.signal);
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
  async tools(format: Format | "mcp" = "anthropic"): Promise<any[]> {
    await this._ensure();
    return this._client._request("GET", `${this._base}/tools?format=${format}`);
  }

  /** Answers an `approval_required` event. */
  async approve(approvalId: string, allow: boolean): Promise<any> {
    await this._ensure();
    return this._client._request("POST", `${this._base}/approvals/${encodeURIComponent(approvalId)}`, JSON.stringify({ allow: Boolean(allow) }));
  }

  /** `{"session_id", "workspace", "turns", "calls", "in_flight"}`. */
  async info(): Promise<any> {
    await this._ensure();
    return this._client._request("GET", this._base);
  }

  /** Cancels whatever the session runs now (`null` if it was never created). */
  async cancel(): Promise<any> {
    if (this._id === undefined) return null;
    return this._client._request("POST", `${this._base}/cancel`);
  }

  /** Cancels the turn `turnId` wherever it is — even before its dispatch arrived. */
  async cancelTurn(turnId: string): Promise<CancelAnswer> {
    await this._ensure();
    return this._client._request("POST", `${this._base}/turns/${encodeURIComponent(turnId)}/cancel`);
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

/** A streamed dispatch: `for await (const {index, result} of stream)` in the order the calls
 * finish; `answer` (the complete answer, in call order) once it has ended. Iterate it once. */
export class DispatchStream implements AsyncIterable<StreamResult> {
  private readonly state = new StreamState();
  private started = false;

  constructor(
    private readonly session: Session,
    private readonly prepared: Prepared,
    /** The turn's id. */
    readonly turnId: string,
    private readonly onApproval: ApprovalCallback | undefined,
    private readonly signal: AbortSignal | undefined,
  ) {}

  /** The complete answer, in call order (set once the stream has ended). */
  get answer(): DispatchAnswer {
    return this.state.answer;
  }

  /** The approval requests seen on the stream. */
  get approvals(): ApprovalRequest[] {
    return this.state.approvals;
  }

  [Symbol.asyncIterator](): AsyncIterator<StreamResult> {
    if (this.started) throw new Error("a dispatch stream can be iterated once");
    this.started = true;
    return this.run();
  }

  private async *run(): AsyncGenerator<StreamResult> {
    const session = this.session;
    const signal = this.signal;
    let cancelling: Promise<unknown> | undefined;
    const onAbort = () => {
      cancelling ??= session.cancelTurn(this.turnId).catch(() => undefined);
    };
    if (signal?.aborted) {
      onAbort();
      await cancelling;
    } else signal?.addEventListener("abort", onAbort, { once: true });
    try {
      yield* this.events();
    } finally {
      signal?.removeEventListener("abort", onAbort);
      if (cancelling) await cancelling;
    }
  }

  private async *events(): AsyncGenerator<StreamResult> {
    const session = this.session;
    const client = session._client;
    await session._ensure();
    const { format, body } = this.prepared;
    const resp = await client._open("POST", `${session._path}/dispatch?format=${format}&stream=true`, body, {
      ...client._streamHeaders,
      [TURN_HEADER]: this.turnId,
    });
    const state = this.state;
    const calls = new AbortController();
    if (!resp.body) throw new SwitchboardError("connection_error", "the stream has no body");
    const reader = resp.body.getReader();
    try {
      for (;;) {
        let chunk: ReadableStreamReadResult<Uint8Array>;
        try {
          chunk = await reader.read();
        } catch (e) {
          throw connectionError(e);
        }
        if (chunk.done) break;
        for (const event of state.feed(chunk.value)) {
          switch (event.kind) {
            case "call":
              void session._runCall(event.call, calls.signal);
              break;
            case "approval":
              await this.approve(event.request);
              break;
            case "error":
              throw event.error;
            case "result":
              yield event.item;
              break;
          }
        }
      }
    } finally {
      // Every call is answered once the stream has ended (by us, or by the server:
      // `cancelled`); a tool still running has nothing left to answer.
      calls.abort();
      if (!state.done) await reader.cancel().catch(() => undefined);
      reader.releaseLock();
    }
    if (!state.done) throw new SwitchboardError("connection_error", "the stream ended before `done`");
  }

  private async approve(request: ApprovalRequest): Promise<void> {
    let allow = false;
    if (this.onApproval) {
      try {
        allow = Boolean(await this.onApproval(request));
      } catch (e) {
        process.emitWarning(`switchboard: the approval callback threw (the call is denied): ${String(e)}`);
      }
    }
    try {
      await this.session.approve(request.approval_id, allow);
    } catch (e) {
      if (!(e instanceof SwitchboardError && e.code === "unknown_approval")) throw e;
    }
  }
}

/** A dispatch running in the background under a turn id the client chose. */
export class Turn implements PromiseLike<DispatchAnswer | null> {
  readonly turnId: string;
  /** The answer (what `dispatch` resolves with), or what it rejected with. */
  readonly result: Promise<DispatchAnswer | null>;
  private _done = false;

  constructor(
    private readonly session: Session,
    message: unknown,
    options: Omit<DispatchOptions, "signal">,
  ) {
    this.turnId = options.turnId ?? turnIdOfMessage(message, options.format);
    this.result = session.dispatch(message, { ...options, turnId: this.turnId });
    // A handle nobody awaits does not crash the process; awaiting it still rejects.
    this.result.then(
      () => (this._done = true),
      () => (this._done = true),
    );
  }

  then<A = DispatchAnswer | null, B = never>(
    onfulfilled?: ((value: DispatchAnswer | null) => A | PromiseLike<A>) | null,
    onrejected?: ((reason: any) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    return this.result.then(onfulfilled, onrejected);
  }

  /** Cancels the turn on the server wherever it is (even before its dispatch arrived);
   * resolves with `{"turn_id", "state"}`. The turn's answer says which calls were cancelled. */
  cancel(): Promise<CancelAnswer> {
    return this.session.cancelTurn(this.turnId);
  }

  /** Whether the dispatch has settled. */
  get done(): boolean {
    return this._done;
  }
}

/** The turn id `dispatch` derives for `message` (a fresh one when the message does not even
 * prepare: the dispatch then says what is wrong with it). */
function turnIdOfMessage(message: unknown, format?: string): string {
  try {
    return turnIdOf(prepare(message, format).body);
  } catch {
    return newTurnId();
  }
}
