// The Vercel AI SDK adapter (`switchboard-client/ai-sdk`): a session's catalog as an AI SDK
// `ToolSet` whose `execute` goes through the engine. Needs the `ai` package (v5 or newer).

import { jsonSchema, tool, type ToolSet } from "ai";

import type { Session } from "./client.js";
import { SwitchboardError } from "./common.js";
import type { ToolResultBlock } from "./wire.js";

export interface SwitchboardToolsOptions {
  /** Only these tools of the session's catalog (default: all of them). */
  only?: string[];
  /**
   * How a call that failed is given to the model: `"result"` (default) returns the engine's
   * `Error [code]: …` text as the tool's output, as the engine means it; `"throw"` throws
   * it, and the AI SDK turns it into a `tool-error` part.
   */
  errors?: "result" | "throw";
}

interface Pending {
  id: string;
  name: string;
  input: unknown;
  resolve: (block: ToolResultBlock) => void;
  reject: (e: unknown) => void;
}

/** Collects the calls the AI SDK starts together (one step's tool calls, started in one
 * tick) into one Switchboard turn, so the engine schedules them as a batch. The turn's id is
 * derived from the message, whose `tool_use` ids are the SDK's `toolCallId`s: the same step
 * sent again (a lost connection, a replayed run) is the same turn, answered from the engine's
 * memory. */
class Batcher {
  private pending: Pending[] = [];
  private signal: AbortSignal | undefined;
  private scheduled = false;

  constructor(private readonly session: Session) {}

  call(id: string, name: string, input: unknown, signal: AbortSignal | undefined): Promise<ToolResultBlock> {
    return new Promise((resolve, reject) => {
      this.pending.push({ id, name, input, resolve, reject });
      this.signal ??= signal;
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => void this.flush());
      }
    });
  }

  private async flush(): Promise<void> {
    const batch = this.pending;
    const signal = this.signal;
    this.pending = [];
    this.signal = undefined;
    this.scheduled = false;
    const message = {
      role: "assistant",
      content: batch.map((p) => ({ type: "tool_use", id: p.id, name: p.name, input: p.input ?? {} })),
    };
    try {
      const answer = await this.session.dispatch(message, { format: "anthropic", signal });
      const byId = new Map<string, ToolResultBlock>((answer?.content ?? []).map((b) => [b.tool_use_id, b]));
      for (const p of batch) {
        const block = byId.get(p.id);
        if (block) p.resolve(block);
        else p.reject(new SwitchboardError("internal", `no result for tool call ${p.id}`));
      }
    } catch (e) {
      for (const p of batch) p.reject(e);
    }
  }
}

/** A tool result's content as the AI SDK tool's output: text as is, text blocks joined. */
function output(block: ToolResultBlock): unknown {
  const content = block.content;
  if (typeof content === "string" || content === undefined) return content ?? "";
  if (content.every((b) => b?.type === "text")) return content.map((b) => (b.type === "text" ? b.text : "")).join("\n");
  return content;
}

/**
 * The session's tools — the server's built-ins and MCP tools, then the session's client tools
 * — as an AI SDK `ToolSet` for `generateText` / `streamText` / agents. Each call goes through
 * the engine (validation, scheduling, policy, sandbox); the calls of one step become one
 * turn. Creates the session (declare its client tools first).
 */
export async function switchboardTools(session: Session, options: SwitchboardToolsOptions = {}): Promise<ToolSet> {
  const catalog = await session.tools("anthropic");
  const only = options.only ? new Set(options.only) : undefined;
  const batcher = new Batcher(session);
  const tools: ToolSet = {};
  for (const spec of catalog) {
    if (only && !only.has(spec.name)) continue;
    tools[spec.name] = tool<unknown, unknown>({
      description: spec.description,
      inputSchema: jsonSchema<unknown>(spec.input_schema ?? { type: "object" }),
      execute: async (input, { toolCallId, abortSignal }) => {
        const block = await batcher.call(toolCallId, spec.name, input, abortSignal);
        if (block.is_error && options.errors === "throw") {
          throw new Error(typeof block.content === "string" ? block.content : JSON.stringify(block.content));
        }
        return output(block);
      },
    });
  }
  if (only) {
    const missing = [...only].filter((n) => !(n in tools));
    if (missing.length) throw new TypeError(`not in the session's catalog: ${missing.join(", ")}`);
  }
  return tools;
}
