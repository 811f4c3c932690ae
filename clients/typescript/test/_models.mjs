// A scripted model on loopback, speaking the Anthropic Messages and OpenAI Chat Completions
// wire formats: the first request calls the client tool `ticket` and the built-in `glob`, the
// next answers with text. `requests` keeps every request body.
import { createServer } from "node:http";

export async function scriptedModel() {
  const requests = [];
  const httpd = createServer((req, res) => {
    let text = "";
    req.on("data", (c) => (text += c));
    req.on("end", () => {
      const body = JSON.parse(text);
      requests.push({ path: req.url, body });
      const first = requests.length === 1;
      let answer;
      if (req.url.endsWith("/chat/completions")) {
        const message = first
          ? {
              role: "assistant",
              content: null,
              tool_calls: [
                { id: "call_t", type: "function", function: { name: "ticket", arguments: JSON.stringify({ ticket_id: "T-42" }) } },
                { id: "call_g", type: "function", function: { name: "glob", arguments: JSON.stringify({ pattern: "*" }) } },
              ],
            }
          : { role: "assistant", content: "Ticket T-42 is open." };
        answer = {
          id: "c",
          object: "chat.completion",
          created: 0,
          model: body.model,
          choices: [{ index: 0, message, finish_reason: first ? "tool_calls" : "stop" }],
        };
      } else {
        const content = first
          ? [
              { type: "tool_use", id: "toolu_t", name: "ticket", input: { ticket_id: "T-42" } },
              { type: "tool_use", id: "toolu_g", name: "glob", input: { pattern: "*" } },
            ]
          : [{ type: "text", text: "Ticket T-42 is open." }];
        answer = {
          id: "msg",
          type: "message",
          role: "assistant",
          model: body.model,
          content,
          stop_reason: first ? "tool_use" : "end_turn",
          stop_sequence: null,
          usage: { input_tokens: 1, output_tokens: 1 },
        };
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(answer));
    });
  });
  await new Promise((r) => httpd.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${httpd.address().port}`, requests, close: () => new Promise((r) => httpd.close(r)) };
}
