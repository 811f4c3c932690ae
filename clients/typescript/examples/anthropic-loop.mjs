// An agent loop with the official Anthropic SDK: the model's tool calls go through the
// Switchboard sidecar, the built-ins and the platform's own `ticket` tool alike.
//
//   SWITCHBOARD_TOKEN=... ANTHROPIC_API_KEY=... MODEL_ID=... node examples/anthropic-loop.mjs
//
// ANTHROPIC_BASE_URL points the SDK elsewhere (the tests use a scripted model on loopback).
import Anthropic from "@anthropic-ai/sdk";
import { Client } from "switchboard-client";

export async function main({ sidecarUrl = "http://127.0.0.1:7420", token, model = process.env.MODEL_ID } = {}) {
  const claude = new Anthropic(); // ANTHROPIC_API_KEY
  const sidecar = new Client(sidecarUrl, { token }); // the token defaults to SWITCHBOARD_TOKEN
  return sidecar.withSession("my-repo", async (session) => {
    session.tool({
      name: "ticket",
      description: "Fetches a ticket from the tracker: title, description and status.",
      inputSchema: { type: "object", properties: { ticket_id: { type: "string" } }, required: ["ticket_id"] },
      execute: ({ ticket_id }) => ({ id: ticket_id, title: "Crash on empty input", status: "open" }),
    });
    const tools = await session.tools(); // built-ins, then `ticket`
    const system = `You are a coding agent at ${session.workspace}. Use tools to solve tasks.`;
    const messages = [{ role: "user", content: "Read ticket T-42 and find the code it is about." }];
    let response;
    for (let i = 0; i < 20; i++) {
      response = await claude.messages.create({ model, max_tokens: 8000, system, tools, messages });
      messages.push({ role: "assistant", content: response.content });
      const results = await session.dispatch(response); // one tool_result per tool_use
      if (results === null) break; // no tool call: the model is done
      messages.push(results);
    }
    return response.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  });
}

if (import.meta.url === `file://${process.argv[1]}`) console.log(await main());
