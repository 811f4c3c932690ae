// An agent loop with the official OpenAI SDK (Chat Completions): the model's tool calls go
// through the Switchboard sidecar, the built-ins and the platform's own `ticket` tool alike.
//
//   SWITCHBOARD_TOKEN=... OPENAI_API_KEY=... MODEL_ID=... node examples/openai-loop.mjs
//
// OPENAI_BASE_URL points the SDK elsewhere (the tests use a scripted model on loopback).
import OpenAI from "openai";
import { Client } from "switchboard-client";
import { z } from "zod";

export async function main({ sidecarUrl = "http://127.0.0.1:7420", token, model = process.env.MODEL_ID } = {}) {
  const openai = new OpenAI(); // OPENAI_API_KEY
  const sidecar = new Client(sidecarUrl, { token });
  return sidecar.withSession("my-repo", async (session) => {
    session.tool({
      name: "ticket",
      description: "Fetches a ticket from the tracker: title, description and status.",
      inputSchema: z.object({ ticket_id: z.string().describe("like T-42") }), // zod works too
      execute: ({ ticket_id }) => ({ id: ticket_id, title: "Crash on empty input", status: "open" }),
    });
    const tools = await session.tools("openai");
    const messages = [
      { role: "system", content: `You are a coding agent at ${session.workspace}. Use tools to solve tasks.` },
      { role: "user", content: "Read ticket T-42 and find the code it is about." },
    ];
    let message;
    for (let i = 0; i < 20; i++) {
      const completion = await openai.chat.completions.create({ model, tools, messages });
      message = completion.choices[0].message;
      messages.push(message);
      const results = await session.dispatch(message); // one tool message per tool call
      if (results === null) break; // no tool call: the model is done
      messages.push(...results);
    }
    return message.content;
  });
}

if (import.meta.url === `file://${process.argv[1]}`) console.log(await main());
