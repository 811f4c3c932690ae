// Compiled with `tsc --noEmit -p test/types` (npm test): the declarations a TypeScript user
// gets, including the input type a zod schema gives a client tool.
import type Anthropic from "@anthropic-ai/sdk";
import type OpenAI from "openai";
import { z } from "zod";
import {
  Client,
  DEFER_MODES,
  EFFECT_CLASSES,
  SwitchboardError,
  ToolError,
  defineTool,
  idempotencyKey,
  local,
  LocalServerError,
  type AnthropicAnswer,
  type CancelAnswer,
  type DispatchAnswer,
  type OpenAIAnswer,
  type SessionInfo,
  type DeferMode,
  type EffectClass,
  type StreamResult,
  type ToolOptions,
} from "switchboard-client";
import { switchboardTools } from "switchboard-client/ai-sdk";

const client = new Client({ baseUrl: "http://127.0.0.1:7420", token: "t", maxRetries: 3 });
const forecast = defineTool({
  name: "forecast",
  inputSchema: z.object({ city: z.string(), days: z.number() }),
  execute: ({ city, days }) => {
    const c: string = city;
    const d: number = days;
    if (!c) throw new ToolError("no city");
    return `${c} ${d}`;
  },
});

export async function use(): Promise<void> {
  const session = client.session({ workspace: "w", tools: [forecast], sandbox: "read-only" });
  session.tool({ name: "plain", inputSchema: { type: "object" }, execute: (input, ctx) => [input, ctx.callId, ctx.signal.aborted] });
  session.tool({ name: "keyed", execute: (_input, ctx) => ctx.idempotencyKey.toUpperCase() });
  const key: string = idempotencyKey("s1", "toolu_01", "turn-7");
  const mode: DeferMode = DEFER_MODES[2];
  session.tool(defineTool({ name: "deferred", defer: mode, execute: () => "found" }));
  // @ts-expect-error: defer is "never", "auto" or "always"
  session.tool(defineTool({ name: "bad_defer", defer: "sometimes", execute: () => "" }));
  // @ts-expect-error: the same in a ToolOptions
  const options: ToolOptions = { defer: true };
  const effect: EffectClass = EFFECT_CLASSES[0];
  session.tool(defineTool({ name: "reader", effect, execute: () => "read" }));
  session.tool({ name: "writer", effect: "idempotent", defer: "never", execute: () => "written" });
  // @ts-expect-error: effect is "read_only", "idempotent" or "side_effect"
  session.tool(defineTool({ name: "bad_effect", effect: "readonly", execute: () => "" }));
  // @ts-expect-error: the same in a ToolOptions
  const effectOptions: ToolOptions = { effect: true };
  const answer = await session.dispatch({ role: "assistant", content: [] }, { signal: AbortSignal.abort(), turnId: "x" });
  if (answer !== null) console.log(answer.content);
  const stream = session.stream({}, { onApproval: async (r) => r.tool_name === "bash" });
  for await (const item of stream) {
    const i: StreamResult = item;
    console.log(i.index, stream.answer);
  }
  const turn = session.start({});
  const state: CancelAnswer = await turn.cancel();
  console.log(state.state, await turn, turn.turnId);
  try {
    await session.close();
  } catch (e) {
    if (e instanceof SwitchboardError) console.log(e.code, e.status, e.retryAfter, e.detail);
  }
  const tools = await switchboardTools(session, { only: ["bash"], errors: "throw" });
  console.log(Object.keys(tools), options, effectOptions);
}

// The answers and catalogs fit the SDKs' own types, with no cast.
export async function sdks(session: ReturnType<Client["session"]>, response: Anthropic.Message, completion: OpenAI.ChatCompletion): Promise<void> {
  const history: Anthropic.MessageParam[] = [];
  const catalog: Anthropic.ToolUnion[] = await session.tools();
  const results = await session.dispatch(response);
  if (results !== null) history.push(results);
  const typed: AnthropicAnswer | null = results;

  const chat: OpenAI.ChatCompletionMessageParam[] = [];
  const functions: OpenAI.ChatCompletionTool[] = await session.tools("openai");
  const messages = await session.dispatch(completion.choices[0].message);
  if (messages !== null) chat.push(...messages);
  const fromCompletion: OpenAIAnswer | null = await session.dispatch(completion);

  // A message of unknown shape: either answer, told apart at run time.
  const either: DispatchAnswer | null = await session.dispatch(JSON.parse("{}") as unknown);
  if (either !== null && !Array.isArray(either)) history.push(either);
  const mcp = await session.tools("mcp");
  const info: SessionInfo = await session.info();
  console.log(catalog, typed, functions, fromCompletion, mcp[0].inputSchema, info.in_flight);

  // @ts-expect-error: an untyped JSON schema's input is unknown until narrowed
  session.tool({ name: "untyped", inputSchema: { type: "object" }, execute: ({ key }) => key.toUpperCase() });
  session.tool({ name: "narrowed", inputSchema: { type: "object" }, execute: ({ key }) => String(key).toUpperCase() });
}

export async function sidecar(): Promise<void> {
  const client = await local({ sandbox: "read-only", grace: 2, allowNetwork: false, sandboxRead: ["/opt"], maxRetries: 3 });
  console.log(client.server.pid, client.server.stderr(), client.baseUrl);
  await client.close();
  // @ts-expect-error: serve has no such option
  await local({ sandboxx: "off" });
  // @ts-expect-error: sandbox is one of the modes
  await local({ sandbox: "none" });
  try {
    await local();
  } catch (e) {
    if (e instanceof LocalServerError) console.log(e.code, e.stderr);
  }
}
