// switchboard-client: the TypeScript client of `switchboard serve`.

export { Client, Session } from "./client.js";
export { DispatchStream, Turn } from "./turn.js";
export type { TurnEvent } from "./turn.js";
export type {
  ClientOptions,
  SessionOptions,
  DispatchOptions,
  ApprovalCallback,
  ProgressCallback,
  CancelAnswer,
  Logger,
} from "./client.js";
export { BINARY_ENV, LocalClient, LocalServer, LocalServerError, findBinary, local } from "./local.js";
export type { LocalOptions } from "./local.js";
export { SERVE_OPTIONS, serveArgs } from "./serve-options.js";
export type { Duration, ServeOptions } from "./serve-options.js";
export {
  SwitchboardError,
  ToolError,
  DEFAULT_BASE_URL,
  TOKEN_ENV,
  TURN_HEADER,
  detectFormat,
  calledTools,
  idempotencyKey,
  newTurnId,
  turnIdOf,
} from "./common.js";
export type { Format } from "./common.js";
export { SseDecoder } from "./stream.js";
export type { ApprovalRequest, ClientCall, ProgressEvent } from "./stream.js";
export type {
  AnswerOf,
  AnthropicAnswer,
  AnthropicTool,
  ApprovalAnswer,
  CatalogFormat,
  CatalogOf,
  DispatchAnswer,
  Health,
  ImageBlock,
  McpTool,
  OpenAIAnswer,
  OpenAITool,
  OpenAIToolMessage,
  SessionInfo,
  StreamResult,
  TextBlock,
  ToolReferenceBlock,
  ToolResultBlock,
} from "./wire.js";
export { DEFER_MODES, EFFECT_CLASSES, defineTool, isZodSchema, zodToJsonSchema } from "./tools.js";
export type {
  ClientTool,
  DeferMode,
  EffectClass,
  InferInput,
  JsonSchema,
  ToolAccess,
  ToolCallContext,
  ToolFunction,
  ToolOptions,
  ToolSpec,
  ZodLike,
} from "./tools.js";
