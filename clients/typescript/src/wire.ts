// What the server answers: the shapes of its JSON bodies as types, and the checks that turn a
// body of another shape into a `bad_response` error instead of a `TypeError` later on. No I/O.

import { SwitchboardError } from "./common.js";

// --- results ---------------------------------------------------------------------------------

/** A text block of a result. */
export interface TextBlock {
  type: "text";
  text: string;
}

/** An image block of a result (only these four types pass the engine). */
export interface ImageBlock {
  type: "image";
  source: { type: "base64"; media_type: "image/png" | "image/jpeg" | "image/gif" | "image/webp"; data: string };
}

/** A deferred tool a `tool_search` found (Anthropic wire). Pass it back unchanged. */
export interface ToolReferenceBlock {
  type: "tool_reference";
  tool_name: string;
}

/** An Anthropic `tool_result` block: the text, or blocks when the result has an image or a
 * tool reference; `is_error` only on failure (`Error [code]: …`). */
export interface ToolResultBlock {
  type: "tool_result";
  tool_use_id: string;
  content: string | Array<TextBlock | ImageBlock | ToolReferenceBlock>;
  is_error?: boolean;
}

/** What an Anthropic dispatch answers: the user message to append. */
export interface AnthropicAnswer {
  role: "user";
  content: ToolResultBlock[];
}

/** An OpenAI tool message (always text). */
export interface OpenAIToolMessage {
  role: "tool";
  tool_call_id: string;
  content: string;
}

/** What an OpenAI dispatch answers: the tool messages to append, in call order. */
export type OpenAIAnswer = OpenAIToolMessage[];

/** The message(s) to append: the Anthropic `tool_result` user message, or the array of OpenAI
 * tool messages. */
export type DispatchAnswer = AnthropicAnswer | OpenAIAnswer;

/**
 * The answer a dispatch of a message of type `M` resolves with: `OpenAIAnswer` for an OpenAI
 * message, completion or `tool_calls` array, `AnthropicAnswer` for any other object or array,
 * and `DispatchAnswer` (either; tell them apart with `Array.isArray`) when the type says nothing
 * (`unknown`, a JSON string, bytes).
 */
export type AnswerOf<M> = unknown extends M
  ? DispatchAnswer
  : M extends string | Uint8Array
    ? DispatchAnswer
    : M extends readonly (infer E)[]
      ? [E] extends [{ type: "function" } | { function: unknown }]
        ? OpenAIAnswer
        : AnthropicAnswer
      : "tool_calls" extends keyof M
        ? OpenAIAnswer
        : "choices" extends keyof M
          ? OpenAIAnswer
          : AnthropicAnswer;

/** One result of a streamed dispatch. */
export interface StreamResult {
  /** The call's position in the model's message. */
  index: number;
  /** The `tool_result` block (Anthropic) or tool message (OpenAI). */
  result: ToolResultBlock | OpenAIToolMessage;
}

// --- catalogs and the other answers ----------------------------------------------------------

/** A tool of an Anthropic catalog (`tools:` of `messages.create`). */
export interface AnthropicTool {
  name: string;
  description?: string;
  input_schema: { type: "object"; properties?: Record<string, unknown> | null; required?: string[] | null; [key: string]: unknown };
  /** A deferred tool: left out of the model's context until `tool_search` finds it. */
  defer_loading?: boolean;
}

/** A tool of an OpenAI catalog (`tools:` of `chat.completions.create`). */
export interface OpenAITool {
  type: "function";
  function: { name: string; description?: string; parameters?: Record<string, unknown>; strict?: boolean | null };
}

/** A tool of an MCP catalog (`tools/list`). */
export interface McpTool {
  name: string;
  description?: string;
  inputSchema: Record<string, unknown>;
  [key: string]: unknown;
}

/** A catalog's shape: `anthropic`, `openai` or `mcp`. */
export type CatalogFormat = "anthropic" | "openai" | "mcp";

/** The tools of a catalog in `format`. */
export type CatalogOf<F extends CatalogFormat> = F extends "openai" ? OpenAITool[] : F extends "mcp" ? McpTool[] : AnthropicTool[];

/** `GET /healthz`. */
export interface Health {
  status: string;
  /** The sandbox in force: `{mode, landlock_abi, …}`. */
  sandbox?: Record<string, unknown>;
  /** With `--journal`: `{status: "ok"}`, or `{status: "failing", error}`. */
  journal?: { status: string; error?: string };
  [key: string]: unknown;
}

/** `GET /v1/sessions/{id}` (and the answer of its cancel and delete). */
export interface SessionInfo {
  session_id: string;
  workspace: string | null;
  turns: number;
  calls: number;
  in_flight: number;
  /** Cluster mode: the node that owns the session. */
  node?: string;
  [key: string]: unknown;
}

/** The answer of `POST /v1/sessions/{id}/approvals/{approval_id}`. */
export interface ApprovalAnswer {
  approval_id: string;
  allow: boolean;
  [key: string]: unknown;
}

/** The answer of `POST /v1/sessions`. */
export interface CreatedSession {
  session_id: string;
  workspace: string;
  tools: string[];
  node?: string;
}

// --- checks ----------------------------------------------------------------------------------

const SNIPPET = 200;

/** The start of a body, for an error message. */
export function snippet(text: string): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > SNIPPET ? `${flat.slice(0, SNIPPET)}…` : flat || "(empty)";
}

/** A `bad_response` error: the server (or something in its place) answered what the client
 * cannot read. */
export function badResponse(what: string, status?: number, cause?: unknown): SwitchboardError {
  return new SwitchboardError("bad_response", what, status, undefined, cause === undefined ? undefined : { cause });
}

/** `text` parsed as JSON, or a `bad_response` saying what it was. */
export function parseJson(text: string, what: string, status?: number): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw badResponse(`${what} is not JSON: ${snippet(text)}`, status, e);
  }
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function isResultBlock(v: unknown): boolean {
  return isObject(v) && typeof v.tool_use_id === "string" && (typeof v.content === "string" || Array.isArray(v.content));
}

function isToolMessage(v: unknown): boolean {
  return isObject(v) && typeof v.tool_call_id === "string";
}

/** `value` as a dispatch answer in `format`, or a `bad_response`. */
export function checkAnswer(value: unknown, format: "anthropic" | "openai", status?: number): DispatchAnswer {
  const ok =
    format === "openai"
      ? Array.isArray(value) && value.every(isToolMessage)
      : isObject(value) && Array.isArray(value.content) && value.content.every(isResultBlock);
  if (!ok) throw badResponse(`the dispatch answer is not ${format === "openai" ? "an array of tool messages" : "a tool_result message"}: ${snippet(JSON.stringify(value) ?? "")}`, status);
  return value as DispatchAnswer;
}

/** `value` as a stream's result item, or a `bad_response`. */
export function checkResultItem(value: unknown, format: "anthropic" | "openai"): StreamResult {
  if (!isObject(value) || !Number.isInteger(value.index) || !(format === "openai" ? isToolMessage(value.result) : isResultBlock(value.result))) {
    throw badResponse(`a result event is not {"index", "result"}: ${snippet(JSON.stringify(value) ?? "")}`, 200);
  }
  return { index: value.index as number, result: value.result as StreamResult["result"] };
}

/** `value` as an object with the string fields `keys`, or a `bad_response` naming `what`. */
export function checkFields<T>(value: unknown, keys: readonly string[], what: string, status?: number): T {
  if (!isObject(value) || !keys.every((k) => typeof value[k] === "string")) {
    throw badResponse(`${what} lacks ${keys.map((k) => `"${k}"`).join(", ")}: ${snippet(JSON.stringify(value) ?? "")}`, status);
  }
  return value as T;
}

export function checkObject<T>(value: unknown, what: string, status: number): T {
  if (!isObject(value)) throw badResponse(`${what} is not a JSON object: ${snippet(JSON.stringify(value) ?? "")}`, status);
  return value as T;
}

export function checkInfo(value: unknown, status: number): SessionInfo {
  return checkFields<SessionInfo>(value, ["session_id"], "the session's info", status);
}

export function checkCatalog<F extends CatalogFormat>(value: unknown, status: number): CatalogOf<F> {
  if (!Array.isArray(value) || !value.every(isObject)) {
    throw badResponse(`the catalog is not an array of tools: ${snippet(JSON.stringify(value) ?? "")}`, status);
  }
  return value as CatalogOf<F>;
}
