// switchboard-client: the TypeScript client of `switchboard serve`.

export { Client, Session, DispatchStream, Turn } from "./client.js";
export type {
  ClientOptions,
  SessionOptions,
  DispatchOptions,
  DispatchAnswer,
  ApprovalCallback,
  CancelAnswer,
} from "./client.js";
export {
  SwitchboardError,
  ToolError,
  SseDecoder,
  DEFAULT_BASE_URL,
  TOKEN_ENV,
  TURN_HEADER,
  detectFormat,
  calledTools,
  idempotencyKey,
  newTurnId,
  turnIdOf,
} from "./common.js";
export type { ApprovalRequest, ClientCall, Format, StreamResult } from "./common.js";
export { DEFER_MODES, EFFECT_CLASSES, defineTool, isZodSchema, zodToJsonSchema } from "./tools.js";
export type {
  ClientTool,
  DeferMode,
  EffectClass,
  InferInput,
  JsonSchema,
  ToolAccess,
  ToolCallContext,
  ToolOptions,
  ToolSpec,
  ZodLike,
} from "./tools.js";
