// What the client's I/O builds on: the error types, format detection, the incremental SSE
// decoder and the stream's events, client-tool answers, the retry rule. No I/O here.

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
 * the refusal `err`, or `null` to give up. The refusals in `RETRIED` are retried, after their
 * `Retry-After`, at most `maxRetries` times within `budgetMs`. */
export class Retries {
  private attempt = 0;
  private started = 0;
  constructor(
    private readonly maxRetries: number,
    private readonly budgetMs: number,
  ) {}

  delay(err: SwitchboardError): number | null {
    if (this.attempt === 0) this.started = performance.now();
    if (!RETRIED.includes(err.code) || this.attempt >= this.maxRetries) return null;
    const delay = Math.max(0, (err.retryAfter ?? 1) * 1000);
    if (performance.now() - this.started + delay > this.budgetMs) return null;
    this.attempt += 1;
    return delay;
  }
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

// --- server-sent events ----------------------------------------------------------------------

/** Turns the text of an SSE body, as it arrives, into `[event, data]` pairs. */
export class SseDecoder {
  private buf = "";
  private readonly text = new TextDecoder();

  feed(chunk: Uint8Array | string): Array<[string, string]> {
    const piece = typeof chunk === "string" ? chunk : this.text.decode(chunk, { stream: true });
    let buf = this.buf ? this.buf + piece : piece;
    if (buf.includes("\r")) buf = buf.replace(/\r\n?/g, "\n");
    const out: Array<[string, string]> = [];
    let start = 0;
    for (;;) {
      const end = buf.indexOf("\n\n", start);
      if (end < 0) break;
      const event = parseBlock(buf.slice(start, end));
      start = end + 2;
      if (event) out.push(event);
    }
    this.buf = start ? buf.slice(start) : buf;
    return out;
  }
}

function parseBlock(block: string): [string, string] | undefined {
  let event = "message";
  const data: string[] = [];
  for (const line of block.split("\n")) {
    if (!line || line[0] === ":") continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length && event === "message") return undefined;
  return [event, data.join("\n")];
}

/** A client-tool call handed over on a turn's stream (`event: call`). */
export interface ClientCall {
  call_id: string;
  tool_use_id: string;
  name: string;
  input: unknown;
  deadline_ms: number;
  /** The call's idempotency key (`ToolCallContext.idempotencyKey`). */
  idempotency_key: string;
}

/** A call held for approval (`event: approval_required`). */
export interface ApprovalRequest {
  approval_id: string;
  tool_use_id: string;
  tool_name: string;
  tool_input: unknown;
  subject?: unknown;
  rule?: unknown;
  [key: string]: unknown;
}

export interface StreamResult {
  /** The call's position in the model's message. */
  index: number;
  /** The `tool_result` block (Anthropic) or tool message (OpenAI). */
  result: any;
}

export type StreamEvent =
  | { kind: "call"; call: ClientCall }
  | { kind: "approval"; request: ApprovalRequest }
  | { kind: "result"; item: StreamResult }
  | { kind: "error"; error: SwitchboardError };

/** Interprets the events of a streamed dispatch: `result` items are returned, `done` sets
 * `answer`, `error` throws; `call` and `approval_required` are returned for the client. */
export class StreamState {
  answer: any = undefined;
  done = false;
  readonly approvals: ApprovalRequest[] = [];
  private readonly decoder = new SseDecoder();

  feed(chunk: Uint8Array | string): StreamEvent[] {
    const out: StreamEvent[] = [];
    for (const [event, data] of this.decoder.feed(chunk)) {
      switch (event) {
        case "call":
          out.push({ kind: "call", call: JSON.parse(data) });
          break;
        case "approval_required": {
          const request = JSON.parse(data);
          this.approvals.push(request);
          out.push({ kind: "approval", request });
          break;
        }
        case "result": {
          const item = JSON.parse(data);
          out.push({ kind: "result", item: { index: item.index, result: item.result } });
          break;
        }
        case "done":
          this.answer = JSON.parse(data);
          this.done = true;
          break;
        case "error": {
          let err: { code?: string; message?: string } = {};
          try {
            err = JSON.parse(data).error ?? {};
          } catch {
            // keep the raw text
          }
          // Act on the events before it, then throw.
          out.push({ kind: "error", error: new SwitchboardError(err.code ?? "internal", err.message ?? data, 200) });
          break;
        }
        default:
          break;
      }
    }
    return out;
  }
}

// --- client-tool answers ---------------------------------------------------------------------

const BLOCK_TYPES = new Set(["text", "image"]);

/** A tool function's return value as the `content` of a call's answer: a string as is,
 * `undefined`/`null` as `""`, a non-empty array of content blocks (text, image) as is,
 * bytes as UTF-8 text, anything else as JSON text. */
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
  try {
    const text = JSON.stringify(value);
    return text === undefined ? String(value) : text;
  } catch {
    return String(value);
  }
}

export function answerBody(value: unknown): string {
  return JSON.stringify({ content: answerContent(value), is_error: false });
}

/** The answer of a tool that threw: a `ToolError`'s message as it is, else `"<Name>: message"`. */
export function errorAnswerBody(error: unknown): string {
  if (error instanceof ToolError) return errorBody(error.message);
  if (error instanceof Error) {
    const name = error.name || error.constructor?.name || "Error";
    return errorBody(error.message ? `${name}: ${error.message}` : name);
  }
  return errorBody(`Error: ${String(error)}`);
}

export function errorBody(text: string): string {
  return JSON.stringify({ content: text, is_error: true });
}
