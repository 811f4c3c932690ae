// What the client's I/O builds on: the error types, format detection, client-tool answers, the
// retry rules. No I/O here.

import { createHash, randomBytes } from "node:crypto";

export const TOKEN_ENV = "SWITCHBOARD_TOKEN";
export const DEFAULT_BASE_URL = "http://127.0.0.1:7420";
export const TURN_HEADER = "Switchboard-Turn-Id";
export const FORMATS = ["anthropic", "openai"] as const;
export type Format = (typeof FORMATS)[number];

/** What the server answers a client-tool answer that came too late (the call is closed,
 * already answered, or its session is gone): nothing to report. */
export const LATE_ANSWER_CODES = ["call_closed", "already_answered", "unknown_call", "unknown_session"];

/**
 * A request that failed. `code` is the server's error code (`unauthorized`,
 * `unknown_session`, `bad_request`, `payload_too_large`, `too_many_sessions`, `overloaded`,
 * `shutting_down`, `session_moved`, ...), or `connection_error` when the server could not
 * be reached; `status` is the HTTP status (`undefined` for connection errors); `retryAfter`
 * the seconds the server asked to wait (with `overloaded`).
 */
export class SwitchboardError extends Error {
  readonly code: string;
  readonly status: number | undefined;
  readonly retryAfter: number | undefined;
  /** The server's message, without the code in front. */
  readonly detail: string;

  constructor(code: string, message: string, status?: number, retryAfter?: number, options?: { cause?: unknown }) {
    super(`${code}: ${message}`, options);
    this.name = "SwitchboardError";
    this.code = code;
    this.detail = message;
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

/**
 * Thrown by a client tool to choose the error text the model sees: the call is answered
 * `{"content": message, "is_error": true}` with `message` as it is (the engine shows it as
 * `Error [execution_error]: message`). Anything else thrown is answered `"<Name>: <message>"`.
 */
export class ToolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ToolError";
  }
}

export function errorFrom(status: number, statusText: string, retryAfter: string | null, text: string): SwitchboardError {
  let code = "http_error";
  let message = text.trim() || statusText || `HTTP ${status}`;
  try {
    const err = JSON.parse(text).error;
    if (err && typeof err.code === "string") {
      code = err.code;
      message = String(err.message ?? "");
    }
  } catch {
    // not JSON: keep the text
  }
  let retry: number | undefined;
  if (retryAfter != null) {
    const n = Number(retryAfter);
    retry = Number.isFinite(n) ? n : undefined;
  }
  return new SwitchboardError(code, message, status, retry);
}

export function connectionError(e: unknown): SwitchboardError {
  const cause = (e as { cause?: unknown })?.cause;
  const text = [e instanceof Error ? e.message : String(e), cause instanceof Error ? cause.message : ""]
    .filter(Boolean)
    .join(": ");
  return new SwitchboardError("connection_error", text || "connection failed", undefined, undefined, { cause: e });
}

/** The refusals a request is retried after: `overloaded` (nothing ran, the body was not read),
 * and a cluster's `node_unreachable` and `session_moved` (the session is moving to another node;
 * the retry keeps the turn id, so calls that ran are answered from the journal, never run
 * again) and `cluster_unavailable` (its NATS servers had no quorum or leader; nothing ran). */
export const RETRIED: readonly string[] = ["overloaded", "node_unreachable", "session_moved", "cluster_unavailable"];

/** The retries of one request: `delay(err)` is the wait in ms before the next attempt after
 * the refusal `err`, `resend()` the wait before sending it again after its connection failed
 * with no answer; `null` to give up. The refusals in `RETRIED` are retried after their
 * `Retry-After`, a lost connection at once and then after 100 ms, 200 ms, … (at most 2 s); both
 * count toward the same bounds: `maxRetries` attempts within `budgetMs`. */
export class Retries {
  private attempt = 0;
  private resends = 0;
  private started = performance.now();
  constructor(
    private readonly maxRetries: number,
    private readonly budgetMs: number,
  ) {}

  delay(err: SwitchboardError): number | null {
    if (!RETRIED.includes(err.code)) return null;
    return this.next(Math.max(0, (err.retryAfter ?? 1) * 1000));
  }

  resend(): number | null {
    const delay = this.resends === 0 ? 0 : Math.min(100 * 2 ** (this.resends - 1), 2000);
    const next = this.next(delay);
    if (next !== null) this.resends += 1;
    return next;
  }

  private next(delay: number): number | null {
    if (this.attempt >= this.maxRetries) return null;
    if (performance.now() - this.started + delay > this.budgetMs) return null;
    this.attempt += 1;
    return delay;
  }
}

const RESET_CODES = new Set(["ECONNRESET", "EPIPE", "ECONNABORTED", "UND_ERR_SOCKET", "UND_ERR_CLOSED"]);
const RESET_TEXT = /socket hang up|other side closed|ECONNRESET|EPIPE/i;

/**
 * How a failed `fetch` failed before any answer came: `"refused"` (the connection was never
 * made: nothing reached the server), `"lost"` (a kept-alive connection the server had closed,
 * `ECONNRESET`, `socket hang up`: the request may have reached it), or `undefined` (anything
 * else — a DNS failure, a bad URL, an abort — which sending again would not change, or would
 * undo what the caller stopped).
 */
export function lostConnection(e: unknown): "refused" | "lost" | undefined {
  const seen = new Set<unknown>();
  for (let err: unknown = e; err !== null && typeof err === "object" && !seen.has(err); ) {
    seen.add(err);
    const { code, name, message, cause } = err as { code?: unknown; name?: unknown; message?: unknown; cause?: unknown };
    if (name === "AbortError" || name === "TimeoutError") return undefined;
    if (code === "ECONNREFUSED") return "refused";
    if (typeof code === "string" && RESET_CODES.has(code)) return "lost";
    if (typeof message === "string" && RESET_TEXT.test(message)) return "lost";
    err = cause;
  }
  return undefined;
}

/** A fresh random turn id (for a caller that wants one turn per call of `dispatch`). */
export function newTurnId(): string {
  return "ts-" + randomBytes(8).toString("hex");
}

/**
 * The turn id of a dispatch whose caller named none: `m-` and a digest of the message as sent.
 * The turn id is part of each call's identity on the server, so the same model message sent
 * again — a retry, a harness replaying it after a restart — names the same turn and its calls
 * are answered from their first answers, while another model response (its own id, other calls)
 * names another turn, even when its provider reuses the `tool_use_id` values.
 */
export function turnIdOf(body: string): string {
  return "m-" + createHash("sha256").update(body, "utf8").digest("hex").slice(0, 32);
}

/**
 * The idempotency key the server gives call `toolUseId` of session `sessionId`: `sb1-` and the
 * first 32 hex digits of the SHA-256 of `switchboard-idempotency-v1`, NUL, the session id, NUL,
 * the turn id (empty when none), NUL, the `tool_use_id`. Pass the turn id the dispatch named
 * (`turnIdOf(body)` when the caller named none) to get the key the server sends
 * (`ctx.idempotencyKey`).
 */
export function idempotencyKey(sessionId: string, toolUseId: string, turnId?: string): string {
  const data = ["switchboard-idempotency-v1", sessionId, turnId ?? "", toolUseId].join("\0");
  return "sb1-" + createHash("sha256").update(data, "utf8").digest("hex").slice(0, 32);
}

// --- messages ------------------------------------------------------------------------------

/** The top level of a message as an object or array: a JSON string is parsed. */
export function asDocument(message: unknown): unknown {
  if (typeof message === "string") return JSON.parse(message);
  if (message instanceof Uint8Array) return JSON.parse(new TextDecoder().decode(message));
  return message;
}

function get(obj: unknown, key: string): unknown {
  return obj !== null && typeof obj === "object" ? (obj as Record<string, unknown>)[key] : undefined;
}

/** `format` if given, else `openai` for an OpenAI message, completion or `tool_calls` array,
 * else `anthropic`. */
export function detectFormat(document: unknown, format?: string): Format {
  if (format !== undefined) {
    if (!(FORMATS as readonly string[]).includes(format)) {
      throw new TypeError(`format must be one of ${FORMATS.join(", ")}, not ${JSON.stringify(format)}`);
    }
    return format as Format;
  }
  if (Array.isArray(document)) {
    const first = document[0];
    if (document.length && (get(first, "type") === "function" || get(first, "function") != null)) return "openai";
  } else if (document !== null && typeof document === "object") {
    if ("tool_calls" in document || "choices" in document) return "openai";
  }
  return "anthropic";
}

/** The names of the tools a model answer calls, in order: `[]` when it calls none,
 * `undefined` when the shape is not one this function knows (the server then decides). */
export function calledTools(document: unknown, fmt: Format): string[] | undefined {
  if (fmt === "anthropic") {
    let content: unknown;
    if (Array.isArray(document)) content = document;
    else {
      if (document === null || typeof document !== "object" || !("content" in document)) return undefined;
      content = (document as { content: unknown }).content;
    }
    if (typeof content === "string") return [];
    if (!Array.isArray(content)) return undefined;
    return content.filter((b) => get(b, "type") === "tool_use").map((b) => get(b, "name") as string);
  }
  let calls: unknown;
  if (Array.isArray(document)) calls = document;
  else if (document !== null && typeof document === "object") {
    if ("choices" in document) {
      const choices = (document as { choices: unknown }).choices;
      if (!Array.isArray(choices) || !choices.length) return undefined;
      calls = get(get(choices[0], "message"), "tool_calls");
    } else if ("tool_calls" in document) {
      calls = (document as { tool_calls: unknown }).tool_calls;
    } else return undefined;
  } else return undefined;
  if (calls == null) return [];
  if (!Array.isArray(calls)) return undefined;
  return calls.map((c) => get(get(c, "function"), "name") as string);
}

export interface Prepared {
  format: Format;
  /** `[]`: calls no tool; `undefined`: unknown shape. */
  names: string[] | undefined;
  body: string;
}

export function prepare(message: unknown, format?: string): Prepared {
  const document = asDocument(message);
  const fmt = detectFormat(document, format);
  return { format: fmt, names: calledTools(document, fmt), body: JSON.stringify(document) };
}

// --- client-tool answers ---------------------------------------------------------------------
//
// Whatever a tool function returns or throws becomes one answer, and building it never throws:
// a value JSON cannot carry (a BigInt, a cycle, a function) is answered as an error saying so,
// and a thrown value that cannot even be shown (a null-prototype object, a `toString` that
// throws) is described as well as it can be.

const BLOCK_TYPES = new Set(["text", "image"]);

/** A tool function's return value as the `content` of a call's answer: a string as is,
 * `undefined`/`null` as `""`, a non-empty array of content blocks (text, image) as is,
 * bytes as UTF-8 text, anything else as JSON text. Throws a `TypeError` for a value JSON cannot
 * carry. */
export function answerContent(value: unknown): unknown {
  if (typeof value === "string") return value;
  if (value === undefined || value === null) return "";
  if (value instanceof Uint8Array) return new TextDecoder().decode(value);
  if (
    Array.isArray(value) &&
    value.length &&
    value.every((b) => b !== null && typeof b === "object" && BLOCK_TYPES.has((b as { type?: string }).type as string))
  ) {
    return value;
  }
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError(`JSON has no ${typeof value}`);
  return text;
}

/** The answer to post for the value tool `name` returned; an error answer when JSON cannot
 * carry it. Never throws. */
export function answerBody(value: unknown, name = "tool"): string {
  try {
    return JSON.stringify({ content: answerContent(value), is_error: false });
  } catch (e) {
    return errorBody(
      `SwitchboardError: client tool ${JSON.stringify(name)} returned a value that cannot be sent as JSON ` +
        `(${describe(e)}); return a string, content blocks or a JSON-serializable value`,
    );
  }
}

/** The answer of a tool that threw: a `ToolError`'s message as it is, else `"<Name>: message"`.
 * Never throws. */
export function errorAnswerBody(error: unknown): string {
  let text: string;
  try {
    text = error instanceof ToolError ? String(error.message) : describe(error);
  } catch {
    text = describe(error);
  }
  return errorBody(text);
}

/** A thrown or logged value as text: `"<Name>: message"` for an error, `"Error: …"` for
 * anything else (JSON for an object). Never throws, whatever the value. */
export function describe(value: unknown): string {
  try {
    if (value instanceof Error) {
      const name = safeString(value.name) || safeString(value.constructor?.name) || "Error";
      const message = safeString(value.message);
      return message ? `${name}: ${message}` : name;
    }
  } catch {
    // a Proxy, a getter that throws: shown as a value
  }
  return `Error: ${safeString(value)}`;
}

function safeString(value: unknown): string {
  if (typeof value === "string") return value;
  if (value === undefined) return "";
  const attempts: Array<() => unknown> = [
    () => (value !== null && typeof value === "object" ? JSON.stringify(value) : undefined),
    () => String(value),
    () => Object.prototype.toString.call(value),
  ];
  for (const attempt of attempts) {
    try {
      const text = attempt();
      if (typeof text === "string") return text;
    } catch {
      // the next way
    }
  }
  return "(a value that cannot be shown)";
}

export function errorBody(text: string): string {
  return JSON.stringify({ content: text, is_error: true });
}
