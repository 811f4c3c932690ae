// A turn in progress: `DispatchStream`, the streamed dispatch (it reads the events, hands client
// calls to the session, answers approvals, and ends with the answer), and `Turn`, a dispatch
// running in the background under its turn id.

import {
  SwitchboardError,
  TURN_HEADER,
  connectionError,
  describe,
  newTurnId,
  prepare,
  turnIdOf,
  type Prepared,
} from "./common.js";
import type { ApprovalCallback, CancelAnswer, DispatchOptions, ProgressCallback, Session } from "./client.js";
import { StreamState, type ApprovalRequest, type ProgressEvent } from "./stream.js";
import { badResponse, snippet, type DispatchAnswer, type StreamResult } from "./wire.js";

/** What `DispatchStream.events()` yields: a result, or a running call's live progress. */
export type TurnEvent = { kind: "result"; item: StreamResult } | { kind: "progress"; event: ProgressEvent };

/** A streamed dispatch: `for await (const {index, result} of stream)` in the order the calls
 * finish; `answer` (the complete answer, in call order) once it has ended; `events()` for the
 * results and the live progress together. Iterate it once. */
export class DispatchStream<A extends DispatchAnswer = DispatchAnswer> implements AsyncIterable<StreamResult> {
  private readonly state: StreamState;
  private started = false;
  /** Whether the stream asks for progress (for `onProgress` or `events()`). */
  private progress: boolean;

  constructor(
    private readonly session: Session,
    private readonly prepared: Prepared,
    /** The turn's id. */
    readonly turnId: string,
    private readonly onApproval: ApprovalCallback | undefined,
    private readonly signal: AbortSignal | undefined,
    private readonly onProgress?: ProgressCallback,
  ) {
    this.state = new StreamState(prepared.format);
    this.progress = onProgress !== undefined;
  }

  /** The complete answer, in call order (`undefined` until the stream has ended). */
  get answer(): A {
    return this.state.answer as A;
  }

  /** The approval requests seen on the stream. */
  get approvals(): ApprovalRequest[] {
    return this.state.approvals;
  }

  [Symbol.asyncIterator](): AsyncIterator<StreamResult> {
    if (this.started) throw new Error("a dispatch stream can be iterated once");
    this.started = true;
    return this.results();
  }

  /** The results and the live progress together, in the order they come:
   * `{kind: "progress", event}` and `{kind: "result", item}`. */
  events(): AsyncIterable<TurnEvent> {
    if (this.started) throw new Error("a dispatch stream can be iterated once");
    this.started = true;
    this.progress = true;
    return this.run();
  }

  private async *results(): AsyncGenerator<StreamResult> {
    for await (const event of this.run()) {
      if (event.kind === "result") yield event.item;
    }
  }

  private async *run(): AsyncGenerator<TurnEvent> {
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
    const turns = session._client._turns;
    const turn = { session, turnId: this.turnId };
    turns.add(turn);
    try {
      yield* this.read();
    } finally {
      turns.delete(turn);
      signal?.removeEventListener("abort", onAbort);
      if (cancelling) await cancelling;
    }
  }

  private async *read(): AsyncGenerator<TurnEvent> {
    const session = this.session;
    const client = session._client;
    await session._ensure();
    const { format, body } = this.prepared;
    const progress = this.progress ? "" : "&progress=false";
    const resp = await client._open("POST", `${session._path}/dispatch?format=${format}&stream=true${progress}`, body, {
      ...client._streamHeaders,
      [TURN_HEADER]: this.turnId,
    });
    const state = this.state;
    const calls = new AbortController();
    const type = resp.headers.get("content-type") ?? "";
    if (!type.includes("text/event-stream")) {
      const text = await resp.text().catch(() => "");
      throw badResponse(`the streamed dispatch's answer is not an event stream (HTTP ${resp.status}, ${type || "no content type"}): ${snippet(text)}`, resp.status);
    }
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
            case "progress":
              if (this.onProgress) await this.onProgress(event.event);
              yield event;
              break;
            case "result":
              yield event;
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
        this.session._client._warn(`switchboard: the approval callback threw (the call is denied): ${describe(e)}`);
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
export class Turn<A extends DispatchAnswer = DispatchAnswer> implements PromiseLike<A | null> {
  readonly turnId: string;
  /** The answer (what `dispatch` resolves with), or what it rejected with. */
  readonly result: Promise<A | null>;
  private _done = false;

  constructor(
    private readonly session: Session,
    message: unknown,
    options: Omit<DispatchOptions, "signal">,
  ) {
    this.turnId = options.turnId ?? turnIdOfMessage(message, options.format);
    this.result = session.dispatch(message, { ...options, turnId: this.turnId }) as Promise<A | null>;
    // A handle nobody awaits does not crash the process; awaiting it still rejects.
    this.result.then(
      () => (this._done = true),
      () => (this._done = true),
    );
  }

  then<R1 = A | null, R2 = never>(
    onfulfilled?: ((value: A | null) => R1 | PromiseLike<R1>) | null,
    onrejected?: ((reason: unknown) => R2 | PromiseLike<R2>) | null,
  ): Promise<R1 | R2> {
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
