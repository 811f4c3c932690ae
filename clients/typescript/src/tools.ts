// Client tools: a function with a JSON schema (or a zod schema) as a tool declaration, and the
// call of the function with a call's arguments.

/** A JSON schema (an object). */
export type JsonSchema = Record<string, unknown>;

/** What a zod schema looks like from here (v3 or v4), without depending on zod. */
export interface ZodLike<O = unknown> {
  _output: O;
  safeParse(data: unknown): unknown;
  parseAsync?(data: unknown): Promise<O>;
}

/** The input type of a tool: a zod schema's output type, else an object of unknown values
 * (the engine has checked it against the JSON schema; narrow what you read). */
export type InferInput<S> = S extends { _output: infer O } ? O : Record<string, unknown>;

/** What the function of a client tool gets besides its input. */
export interface ToolCallContext {
  /** The server's id of this call (`event: call`). */
  callId: string;
  /** The model's id of the call (`tool_use.id` / `tool_call.id`). */
  toolUseId: string;
  /** The tool's name. */
  name: string;
  /** Milliseconds left of the call's deadline when it was handed over. */
  deadlineMs: number;
  /**
   * The call's idempotency key (`sb1-` and 32 hex digits): the same for every copy of the call —
   * a turn sent again, a run after a restart of the server — and another for a new `toolUseId`
   * or another session. Send it to the service behind the tool (an `Idempotency-Key` header) so
   * that it can recognise a call it has already seen.
   */
  idempotencyKey: string;
  /** Aborted when the turn's stream has ended (its answer no longer counts). */
  signal: AbortSignal;
  /** Reports how far the call is (`progress` of `total` when known, with what it is doing):
   * the turn's stream shows it as the call's live progress. Never waits for the server and never
   * throws; reports that come faster than they can be sent are joined (the newest value wins). */
  progress(progress: number, total?: number, message?: string): void;
  /** Reports output the call produced (`stream`: `"stdout"`, the default, or `"stderr"`), shown
   * on the turn's stream as it comes; the result is still what the function returns. Text
   * reported faster than it can be sent is joined, up to 64 KiB unsent. */
  output(text: string, stream?: "stdout" | "stderr"): void;
}

/** The access declaration of a client tool, as the scheduler understands it. */
export interface ToolAccess {
  read?: unknown[];
  write?: unknown[];
}

/** When a client tool is left out of the model's context (deferred) until the engine's
 * `tool_search` finds it: `"always"`, `"never"`, or `"auto"` (the server's default: deferred when
 * the session's catalog is large). */
export type DeferMode = "never" | "auto" | "always";

/** The accepted values of `defer`. */
export const DEFER_MODES: readonly DeferMode[] = ["never", "auto", "always"];

/** What running a call of a client tool twice would do: `"read_only"` (changes nothing),
 * `"idempotent"` (a second run leaves the same state as one) or `"side_effect"` (anything else;
 * the server's default). With a call journal, a call cut off by a crash runs again when re-sent
 * unless it is `"side_effect"`: that one is answered `outcome_unknown`. */
export type EffectClass = "read_only" | "idempotent" | "side_effect";

/** The accepted values of `effect`. */
export const EFFECT_CLASSES: readonly EffectClass[] = ["read_only", "idempotent", "side_effect"];

export interface ToolOptions {
  /** `true`: may overlap with the turn's neighbouring concurrency-safe calls. */
  concurrencySafe?: boolean;
  /** What a call touches (`{read: [...], write: [...]}`); overrides `concurrencySafe`. */
  access?: ToolAccess;
  /** The call's deadline from the moment it is handed over (server default 120,000). */
  timeoutMs?: number;
  /** The largest answer content in bytes (server default 50,000). */
  outputCap?: number;
  /** `"always"`: out of the model's context until `tool_search` finds it; `"never"`: always
   * in it; `"auto"` (the server's default when not given): deferred when the catalog is large. */
  defer?: DeferMode;
  /** What running a call twice would do (`"side_effect"`, the server's default, when not
   * given): decides what a call re-sent after a crash gets when the server keeps a journal. */
  effect?: EffectClass;
}

/** A client tool: its name, description, input schema and the function that runs it. */
export interface ClientTool<S = JsonSchema> extends ToolOptions {
  name: string;
  description?: string;
  /** A JSON schema of the input, or a zod object schema (needs `zod` installed). */
  inputSchema?: S;
  /** Alias of `inputSchema` (the name the Vercel AI SDK and OpenAI use). */
  parameters?: S;
  /** Runs a call; its return value is the answer (see the guide). A tool without a function
   * is declared only: its calls are answered with an error. (A method, so that a tool of any
   * schema fits in a `ClientTool<unknown>[]`.) */
  execute?(input: InferInput<S>, context: ToolCallContext): unknown;
}

/** The function of a client tool whose input is not typed (a ready declaration's). */
export type ToolFunction = (input: Record<string, unknown>, context: ToolCallContext) => unknown;

/** A ready tool declaration: Anthropic shape (`name`, `description`, `input_schema`) or OpenAI
 * shape (`{"type": "function", "function": {...}}`), with the optional client-tool keys. */
export type ToolSpec = Record<string, unknown>;

/** Identity, for typing: `defineTool({name, inputSchema: z.object(...), execute})` infers the
 * input type from a zod schema. */
export function defineTool<S>(tool: ClientTool<S>): ClientTool<S> {
  return tool;
}

const NAME = /^[A-Za-z0-9_-]{1,64}$/;

export function isZodSchema(schema: unknown): schema is ZodLike {
  return (
    schema !== null &&
    typeof schema === "object" &&
    ("_def" in schema || "_zod" in schema) &&
    typeof (schema as { safeParse?: unknown }).safeParse === "function"
  );
}

function isSpec(tool: object): boolean {
  const t = tool as Record<string, unknown>;
  return "input_schema" in t || (t.type === "function" && typeof t.function === "object" && t.function !== null);
}

export function specName(spec: ToolSpec): string {
  const fn = spec.function as Record<string, unknown> | undefined;
  if (spec.type === "function" && fn && typeof fn.name === "string") return fn.name;
  if (typeof spec.name === "string") return spec.name;
  throw new TypeError(
    `a tool declaration needs a \`name\` (Anthropic shape) or \`function.name\` (OpenAI shape): ${JSON.stringify(spec)}`,
  );
}

/** What this file calls of an optional module (zod, zod-to-json-schema), found at run time. */
type Converter = (schema: unknown, options: Record<string, unknown>) => unknown;
interface OptionalModule {
  toJSONSchema?: Converter;
  zodToJsonSchema?: Converter;
  default?: Converter;
  z?: OptionalModule;
}

let zodModules: Promise<OptionalModule[]> | undefined;

async function importOptional(name: string): Promise<OptionalModule | undefined> {
  try {
    return (await import(name)) as OptionalModule;
  } catch {
    return undefined;
  }
}

/** The JSON schema of a zod schema: zod v4's `toJSONSchema`, else (zod v3) the
 * `zod-to-json-schema` package when installed. */
export async function zodToJsonSchema(schema: ZodLike, toolName = "tool"): Promise<JsonSchema> {
  const own = (schema as { toJSONSchema?: unknown }).toJSONSchema;
  if (typeof own === "function") return strip(own.call(schema, { io: "input" }));
  zodModules ??= Promise.all(["zod", "zod/v4/core", "zod-to-json-schema"].map(importOptional)).then((mods) =>
    mods.map((m) => m ?? {}),
  );
  const [zod, core, z2j] = await zodModules;
  if ("_zod" in (schema as object)) {
    for (const mod of [zod, zod.z ?? {}, core]) {
      // The input's schema: a field with a default is optional to the model.
      if (typeof mod.toJSONSchema === "function") return strip(mod.toJSONSchema(schema, { io: "input" }));
    }
  }
  const convert = z2j.zodToJsonSchema ?? z2j.default;
  if (typeof convert === "function") return strip(convert(schema, { target: "jsonSchema7", $refStrategy: "none" }));
  throw new TypeError(
    `client tool ${toolName}: its zod schema cannot be converted to a JSON schema: ` +
      "zod v4 converts its own schemas (z.toJSONSchema); with zod v3 install `zod-to-json-schema`, " +
      "or give the tool a JSON schema",
  );
}

function strip(schema: unknown): JsonSchema {
  const s = { ...(schema as JsonSchema) };
  delete s.$schema;
  return s;
}

/** One client tool: its declaration (sent to the server when the session is created) and its
 * function. */
export class ToolEntry {
  constructor(
    readonly name: string,
    /** The declaration, except a zod schema not yet converted. */
    private readonly base: ToolSpec,
    readonly execute: ((input: unknown, context: ToolCallContext) => unknown) | undefined,
    readonly zod: ZodLike | undefined,
  ) {}

  /** The declaration sent to the server. */
  async spec(): Promise<ToolSpec> {
    if (!this.zod) return this.base;
    return { ...this.base, input_schema: await zodToJsonSchema(this.zod, this.name) };
  }

  /** The declaration as known now (a zod schema not converted yet is `{}`). */
  get declared(): ToolSpec {
    return this.base;
  }

  /** The input the function gets: a zod schema parses it (defaults, transforms). */
  async input(raw: unknown): Promise<unknown> {
    const zod = this.zod;
    if (!zod) return raw ?? {};
    if (typeof zod.parseAsync === "function") return zod.parseAsync(raw ?? {});
    const r = zod.safeParse(raw ?? {}) as { success: boolean; data?: unknown; error?: unknown };
    if (!r.success) throw r.error;
    return r.data;
  }
}

function withOptions(spec: ToolSpec, o: ToolOptions): ToolSpec {
  if (o.defer !== undefined && !DEFER_MODES.includes(o.defer)) {
    throw new TypeError(
      `client tool ${String(spec.name)}: defer must be "never", "auto" or "always" (or left out for the ` +
        `server's default, "auto"), not ${JSON.stringify(o.defer) ?? String(o.defer)}`,
    );
  }
  if (o.effect !== undefined && !EFFECT_CLASSES.includes(o.effect)) {
    throw new TypeError(
      `client tool ${String(spec.name)}: effect must be "read_only", "idempotent" or "side_effect" (or left ` +
        `out for the server's default, "side_effect"), not ${JSON.stringify(o.effect) ?? String(o.effect)}`,
    );
  }
  if (o.concurrencySafe) spec.concurrency_safe = true;
  if (o.access !== undefined) spec.access = o.access;
  if (o.timeoutMs !== undefined) spec.timeout_ms = Math.trunc(o.timeoutMs);
  if (o.outputCap !== undefined) spec.output_cap = Math.trunc(o.outputCap);
  if (o.defer !== undefined) spec.defer = o.defer;
  if (o.effect !== undefined) spec.effect = o.effect;
  return spec;
}

/** The entry of a `ClientTool`, or of a ready declaration (with an optional function). */
export function toolEntry(tool: ClientTool<unknown> | ToolSpec, execute?: ToolFunction): ToolEntry {
  if (tool === null || typeof tool !== "object") {
    throw new TypeError(`a client tool is an object {name, inputSchema, execute}, not ${String(tool)}`);
  }
  if (isSpec(tool)) {
    const spec = { ...(tool as ToolSpec) };
    return new ToolEntry(specName(spec), spec, execute as ToolEntry["execute"], undefined);
  }
  const t = tool as ClientTool<unknown>;
  const fn = execute ?? t.execute;
  if (fn !== undefined && typeof fn !== "function") {
    throw new TypeError(`client tool ${t.name}: execute must be a function`);
  }
  if (typeof t.name !== "string" || !NAME.test(t.name)) {
    throw new TypeError(`client tool name ${JSON.stringify(t.name)} must match ^[A-Za-z0-9_-]{1,64}$`);
  }
  const schema = t.inputSchema ?? t.parameters ?? { type: "object", properties: {} };
  const zod = isZodSchema(schema) ? schema : undefined;
  if (!zod && (schema === null || typeof schema !== "object" || Array.isArray(schema))) {
    throw new TypeError(`client tool ${t.name}: inputSchema must be a JSON schema object or a zod schema`);
  }
  const spec = withOptions(
    { name: t.name, description: t.description ?? t.name, input_schema: zod ? {} : { ...(schema as JsonSchema) } },
    t,
  );
  return new ToolEntry(t.name, spec, fn as ToolEntry["execute"], zod);
}

export function noFunction(name: string): string {
  return (
    `SwitchboardError: client tool ${JSON.stringify(name)} has no function in this session ` +
    "(it was declared without one); register it with an execute function"
  );
}

/** A session's client tools, in declaration order. */
export class ToolRegistry {
  readonly entries = new Map<string, ToolEntry>();

  add(entry: ToolEntry): void {
    if (this.entries.has(entry.name)) throw new TypeError(`client tool ${JSON.stringify(entry.name)} is registered twice`);
    this.entries.set(entry.name, entry);
  }

  specs(): Promise<ToolSpec[]> {
    return Promise.all([...this.entries.values()].map((e) => e.spec()));
  }

  get size(): number {
    return this.entries.size;
  }

  /** Whether a dispatch calling `names` (`undefined`: unknown) must stream, because it may
   * call a client tool whose calls come on the stream. */
  streams(names: string[] | undefined): boolean {
    return this.entries.size > 0 && (names === undefined || names.some((n) => this.entries.has(n)));
  }
}
