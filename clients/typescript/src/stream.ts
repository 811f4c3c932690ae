// A streamed turn's body: the incremental SSE decoder, and `StreamState`, which turns its events
// into what the client acts on. An event the client cannot read ends the stream with a
// `bad_response` error, after the events before it. No I/O here.

import { SwitchboardError, type Format } from "./common.js";
import {
  badResponse,
  checkAnswer,
  checkFields,
  checkResultItem,
  isObject,
  parseJson,
  snippet,
  type DispatchAnswer,
  type StreamResult,
} from "./wire.js";

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

/** A running call's live progress (`event: progress`): its output as it is written (`kind:
 * "output"`) or a progress value (`kind: "progress"`), each call's before its result. */
export interface ProgressEvent {
  /** The call it belongs to. */
  tool_use_id: string;
  /** 1 for the call's first event, then 2, 3, … */
  seq: number;
  kind: "output" | "progress";
  /** For `output`: which pipe. */
  stream?: "stdout" | "stderr";
  /** For `output`: the text. */
  text?: string;
  /** For `progress`: the value so far, out of `total` when known, with `message`. */
  progress?: number;
  total?: number;
  message?: string;
  /** Bytes of output left out since the call's previous event (a reader that did not keep up). */
  dropped_bytes?: number;
  [key: string]: unknown;
}

export type StreamEvent =
  | { kind: "call"; call: ClientCall }
  | { kind: "approval"; request: ApprovalRequest }
  | { kind: "progress"; event: ProgressEvent }
  | { kind: "result"; item: StreamResult }
  | { kind: "error"; error: SwitchboardError };

/** Interprets the events of a streamed dispatch: `result` items are returned, `done` sets
 * `answer`, `error` (or an event it cannot read: `bad_response`) is returned last, and nothing
 * after it; `call` and `approval_required` are returned for the client. */
export class StreamState {
  answer: DispatchAnswer | undefined = undefined;
  done = false;
  readonly approvals: ApprovalRequest[] = [];
  private readonly decoder = new SseDecoder();
  private failed = false;

  constructor(private readonly format: Format = "anthropic") {}

  feed(chunk: Uint8Array | string): StreamEvent[] {
    const out: StreamEvent[] = [];
    if (this.failed) return out;
    for (const [event, data] of this.decoder.feed(chunk)) {
      try {
        const item = this.event(event, data);
        if (item) out.push(item);
      } catch (e) {
        const error = e instanceof SwitchboardError ? e : badResponse(`the \`${event}\` event cannot be read: ${snippet(data)}`, 200, e);
        out.push({ kind: "error", error });
      }
      if (out.at(-1)?.kind === "error") {
        this.failed = true; // act on the events before it, then throw
        break;
      }
    }
    return out;
  }

  private event(event: string, data: string): StreamEvent | undefined {
    const what = `the \`${event}\` event`;
    switch (event) {
      case "call": {
        const call = checkFields<ClientCall>(parseJson(data, what, 200), ["call_id", "name"], what, 200);
        return { kind: "call", call };
      }
      case "approval_required": {
        const request = checkFields<ApprovalRequest>(parseJson(data, what, 200), ["approval_id"], what, 200);
        this.approvals.push(request);
        return { kind: "approval", request };
      }
      case "progress": {
        const event = checkFields<ProgressEvent>(parseJson(data, what, 200), ["tool_use_id", "kind"], what, 200);
        if (typeof event.seq !== "number") throw badResponse(`${what} has no number \`seq\`: ${snippet(data)}`, 200);
        return { kind: "progress", event };
      }
      case "result":
        return { kind: "result", item: checkResultItem(parseJson(data, what, 200), this.format) };
      case "done":
        this.answer = checkAnswer(parseJson(data, what, 200), this.format, 200);
        this.done = true;
        return undefined;
      case "error": {
        let err: unknown;
        try {
          err = JSON.parse(data)?.error;
        } catch {
          // keep the raw text
        }
        const code = isObject(err) && typeof err.code === "string" ? err.code : "internal";
        const message = isObject(err) && typeof err.message === "string" ? err.message : data;
        return { kind: "error", error: new SwitchboardError(code, message, 200) };
      }
      default:
        return undefined;
    }
  }
}
