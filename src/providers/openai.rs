//! OpenAI Chat Completions–compatible servers (`POST {OPENAI_BASE_URL}/chat/completions`):
//! OpenAI itself and the local servers that speak the format (llama.cpp, vLLM, Ollama, …).
//!
//! The loop keeps an Anthropic-shaped history; this provider converts it on the way out — the
//! system prompt becomes a `system` message, an assistant message's `tool_use` blocks become
//! `tool_calls` (with `function.arguments` as a JSON *string*), each `tool_result` becomes a
//! `{"role":"tool","tool_call_id":…}` message, in order — and the catalog becomes
//! `tools: [{type: "function", function: {name, description, parameters}}]`. Answers come back
//! as Anthropic-shaped blocks: a `text` block, then one `tool_use` block per call; a call whose
//! `arguments` do not parse is marked malformed (answered `invalid_arguments`). `finish_reason`
//! maps to stop reasons: `stop` → `end_turn`, `length` → `max_tokens`, `tool_calls` →
//! `tool_use`. Streamed `tool_calls` deltas are assembled per `index`; a call is complete (and
//! reported) when the next call starts or the choice finishes.

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::assemble::{ArgumentBuffer, parse_arguments, tool_use_block};
use super::sse::SseEvent;
use super::{Failure, Http, HttpConfig, OPENAI_BASE_URL, StreamDecoder};
use crate::protocol::image_note;
use crate::provider::{
    EventSink, ModelRequest, ModelResponse, Provider, ProviderError, StreamEvent,
};

/// The variable holding the key.
pub const KEY_VARIABLE: &str = "OPENAI_API_KEY";

/// An OpenAI Chat Completions client.
pub struct OpenAiProvider {
    http: Http,
    url: String,
    /// `max_completion_tokens` (OpenAI's current name) rather than `max_tokens` (what local
    /// servers understand): chosen for the public endpoint.
    completion_tokens_field: bool,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("url", &self.url)
            .finish()
    }
}

impl OpenAiProvider {
    /// A client for `config.base_url` (e.g. [`OPENAI_BASE_URL`]). The public endpoint needs a
    /// key; a custom base URL (a local server) may go without one.
    pub fn new(config: HttpConfig) -> Result<Self, ProviderError> {
        let public = config.base_url.trim_end_matches('/') == OPENAI_BASE_URL;
        if public && config.api_key.is_none() {
            return Err(ProviderError::MissingKey(KEY_VARIABLE.into()));
        }
        let http = Http::new("openai", KEY_VARIABLE, config)?;
        let url = format!("{}/chat/completions", http.config.base_url);
        Ok(OpenAiProvider {
            http,
            url,
            completion_tokens_field: public,
        })
    }

    /// The request body for `request`.
    pub fn request_body(&self, request: &ModelRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), request.model.clone().into());
        body.insert(
            "messages".into(),
            Value::Array(chat_messages(
                &request.system,
                &request.messages,
                &request.tools,
            )),
        );
        if !request.tools.is_empty() {
            body.insert(
                "tools".into(),
                Value::Array(chat_tools(&request.tools, &request.revealed)),
            );
        }
        let tokens = if self.completion_tokens_field {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        body.insert(tokens.into(), request.max_tokens.into());
        if stream {
            body.insert("stream".into(), true.into());
        }
        Value::Object(body)
    }

    async fn call(
        &self,
        request: &ModelRequest,
        sink: Option<EventSink>,
    ) -> Result<ModelResponse, ProviderError> {
        let body = serde_json::to_vec(&self.request_body(request, sink.is_some()))
            .map_err(|e| ProviderError::BadResponse(format!("cannot encode the request: {e}")))?;
        let auth = self
            .http
            .config
            .api_key
            .as_ref()
            .map(|key| format!("Bearer {key}"));
        let accept = if sink.is_some() {
            "text/event-stream"
        } else {
            "application/json"
        };
        let mut headers = vec![("accept", accept)];
        if let Some(auth) = &auth {
            headers.push(("authorization", auth.as_str()));
        }
        self.http
            .exchange::<OpenAiStream>(
                &self.url,
                &headers,
                &body,
                sink.as_ref(),
                response_from_completion,
            )
            .await
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(self.call(request, None))
    }

    fn complete_streaming<'a>(
        &'a self,
        request: &'a ModelRequest,
        events: EventSink,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(self.call(request, Some(events)))
    }
}

/// True for a catalog entry the Anthropic shape marks `defer_loading: true`.
fn deferred(tool: &Value) -> bool {
    tool.get("defer_loading").and_then(Value::as_bool) == Some(true)
}

/// The Anthropic catalog (`{name, description, input_schema}`) as Chat Completions `tools`. Chat
/// Completions has no deferred loading: a tool marked `defer_loading` is left out until the
/// session has been shown it (`revealed`, in the order shown), and then appended after the
/// others, so the part of the list a prompt cache holds never changes.
pub fn chat_tools(tools: &[Value], revealed: &[String]) -> Vec<Value> {
    let shown = tools.iter().filter(|t| !deferred(t));
    let found = revealed.iter().filter_map(|name| {
        tools
            .iter()
            .find(|t| deferred(t) && t.get("name").and_then(Value::as_str) == Some(name))
    });
    shown
        .chain(found)
        .map(|t| {
            let mut function = Map::new();
            function.insert("name".into(), t.get("name").cloned().unwrap_or(Value::Null));
            if let Some(d) = t.get("description") {
                function.insert("description".into(), d.clone());
            }
            function.insert(
                "parameters".into(),
                t.get("input_schema")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"})),
            );
            json!({"type": "function", "function": Value::Object(function)})
        })
        .collect()
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A `tool_result`'s content as tool-message text: a tool message carries text only, so each
/// image block becomes the same note a dispatched result's OpenAI message carries, and each
/// `tool_reference` block the referenced tool's definition (from `tools`, the catalog).
fn tool_result_text(content: &Value, tools: &[Value]) -> String {
    let Value::Array(blocks) = content else {
        return text_of(content);
    };
    let mut parts = Vec::with_capacity(blocks.len());
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(b["text"].as_str().unwrap_or_default().to_string()),
            Some("image") => {
                let source = &b["source"];
                parts.push(image_note(
                    source["media_type"].as_str().unwrap_or("unknown type"),
                    source["data"].as_str().map_or(0, str::len),
                    None,
                ));
            }
            Some("tool_reference") => {
                let name = b["tool_name"].as_str().unwrap_or_default();
                let definition = tools
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
                    .map(|t| {
                        json!({
                            "name": t["name"], "description": t["description"],
                            "input_schema": t["input_schema"],
                        })
                        .to_string()
                    });
                parts.push(definition.unwrap_or_else(|| format!("[tool loaded: {name}]")));
            }
            _ => {}
        }
    }
    parts.join("\n")
}

/// The system prompt and an Anthropic-shaped history as Chat Completions `messages`; `tools` is
/// the request's catalog (Anthropic shape), for the definitions `tool_reference` blocks name.
pub fn chat_messages(system: &str, history: &[Value], tools: &[Value]) -> Vec<Value> {
    let mut out = Vec::with_capacity(history.len() + 1);
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for message in history {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user");
        let content = message.get("content").cloned().unwrap_or(Value::Null);
        let blocks = match &content {
            Value::Array(blocks) => blocks.as_slice(),
            _ => {
                out.push(json!({"role": role, "content": text_of(&content)}));
                continue;
            }
        };
        if role == "assistant" {
            let text = text_of(&content);
            let calls: Vec<Value> = blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
                .map(|b| {
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    json!({
                        "id": b.get("id").cloned().unwrap_or(Value::Null),
                        "type": "function",
                        "function": {
                            "name": b.get("name").cloned().unwrap_or(Value::Null),
                            "arguments": input.to_string(),
                        },
                    })
                })
                .collect();
            let mut msg = Map::new();
            msg.insert("role".into(), "assistant".into());
            msg.insert(
                "content".into(),
                if text.is_empty() && !calls.is_empty() {
                    Value::Null
                } else {
                    text.into()
                },
            );
            if !calls.is_empty() {
                msg.insert("tool_calls".into(), Value::Array(calls));
            }
            out.push(Value::Object(msg));
            continue;
        }
        // A user message: its tool results first (they must follow the assistant's calls),
        // then any text.
        for b in blocks {
            if b.get("type").and_then(Value::as_str) == Some("tool_result") {
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                    "content": tool_result_text(b.get("content").unwrap_or(&Value::Null), tools),
                }));
            }
        }
        let text = text_of(&content);
        if !text.is_empty() {
            out.push(json!({"role": role, "content": text}));
        }
    }
    out
}

/// `finish_reason` as an Anthropic stop reason.
pub fn stop_reason(finish_reason: &str) -> String {
    match finish_reason {
        "stop" => "end_turn",
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        other => other,
    }
    .to_string()
}

/// Reads a (non-streamed) chat completion.
pub fn response_from_completion(doc: &Value) -> Result<ModelResponse, ProviderError> {
    let choice = doc
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| ProviderError::BadResponse("openai: no `choices[0]`".into()))?;
    let message = choice.get("message").cloned().unwrap_or(Value::Null);
    let mut content = Vec::new();
    let text = text_of(message.get("content").unwrap_or(&Value::Null));
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let id = call.get("id").and_then(Value::as_str).unwrap_or("");
        let function = call.get("function").cloned().unwrap_or(Value::Null);
        let name = function.get("name").and_then(Value::as_str).unwrap_or("");
        let arguments = match function.get("arguments") {
            Some(Value::String(text)) => parse_arguments(text),
            Some(Value::Object(obj)) => Ok(Value::Object(obj.clone())),
            None | Some(Value::Null) => Ok(json!({})),
            Some(other) => Err(format!(
                "function.arguments must be a JSON string, not {other}"
            )),
        };
        content.push(tool_use_block(id, name, arguments));
    }
    Ok(ModelResponse {
        content,
        stop_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(stop_reason),
    })
}

/// One streamed call being assembled.
struct PartialCall {
    index: u64,
    id: String,
    name: String,
    arguments: ArgumentBuffer,
    block: Option<Value>,
}

/// The state of one streamed answer.
#[derive(Default)]
pub(crate) struct OpenAiStream {
    text: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
    done: bool,
    emitted: bool,
}

impl OpenAiStream {
    /// Completes (and reports) every call before position `upto`.
    fn complete_calls(&mut self, upto: usize, sink: &EventSink) {
        for call in self.calls.iter_mut().take(upto) {
            if call.block.is_none() {
                let block = tool_use_block(&call.id, &call.name, call.arguments.parse());
                let _ = sink.send(StreamEvent::BlockComplete(block.clone()));
                self.emitted = true;
                call.block = Some(block);
            }
        }
    }
}

impl StreamDecoder for OpenAiStream {
    fn event(&mut self, event: SseEvent, sink: &EventSink) -> Result<bool, Failure> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            let n = self.calls.len();
            self.complete_calls(n, sink);
            return Ok(true);
        }
        let doc: Value = serde_json::from_str(data).map_err(|e| {
            Failure::fatal(ProviderError::BadResponse(format!(
                "openai stream: event data is not JSON ({e}): {data}"
            )))
        })?;
        if let Some(error) = doc.get("error") {
            return Err(Failure {
                error: ProviderError::Status {
                    provider: "openai".into(),
                    status: 500,
                    message: format!(
                        "{} (in the stream)",
                        super::error_message(&json!({"error": error}).to_string())
                    ),
                    attempts: 1,
                },
                retryable: !self.emitted,
                retry_after: None,
            });
        }
        let Some(choice) = doc.get("choices").and_then(|c| c.get(0)) else {
            return Ok(false); // e.g. a usage-only chunk
        };
        let delta = choice.get("delta").cloned().unwrap_or(Value::Null);
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            self.text.push_str(text);
        }
        for d in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let index = d
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(self.calls.len() as u64);
            let id = d
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty());
            let function = d.get("function").cloned().unwrap_or(Value::Null);
            // The call this delta continues: the last one with this index, unless the delta
            // brings a different id (some servers reuse index 0 for every call).
            let position = self
                .calls
                .iter()
                .rposition(|c| c.index == index)
                .filter(|&p| {
                    let c = &self.calls[p];
                    c.block.is_none() && id.is_none_or(|id| c.id.is_empty() || c.id == id)
                });
            let position = match position {
                Some(p) => p,
                None => {
                    let n = self.calls.len();
                    self.complete_calls(n, sink);
                    self.calls.push(PartialCall {
                        index,
                        id: String::new(),
                        name: String::new(),
                        arguments: ArgumentBuffer::new(),
                        block: None,
                    });
                    n
                }
            };
            let call = &mut self.calls[position];
            if let Some(id) = id {
                call.id = id.to_string();
            }
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                call.name.push_str(name);
            }
            if let Some(args) = function.get("arguments").and_then(Value::as_str) {
                call.arguments.push(args);
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
            let n = self.calls.len();
            self.complete_calls(n, sink);
        }
        Ok(false)
    }

    fn emitted(&self) -> bool {
        self.emitted
    }

    fn finish(&mut self) -> Result<ModelResponse, Failure> {
        if !self.done && self.finish_reason.is_none() {
            return Err(Failure {
                error: ProviderError::Request(
                    "openai: the stream ended before finish_reason or [DONE]".into(),
                ),
                retryable: !self.emitted,
                retry_after: None,
            });
        }
        let mut content = Vec::new();
        if !self.text.is_empty() {
            content.push(json!({"type": "text", "text": std::mem::take(&mut self.text)}));
        }
        for call in self.calls.drain(..) {
            content.push(
                call.block.unwrap_or_else(|| {
                    tool_use_block(&call.id, &call.name, call.arguments.parse())
                }),
            );
        }
        Ok(ModelResponse {
            content,
            stop_reason: self.finish_reason.as_deref().map(stop_reason),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Block, TINY_PNG, Timing, ToolDispatchResult, ToolOutput, encode_openai};
    use crate::provider::MALFORMED_INPUT_KEY;

    #[test]
    fn the_history_converts_to_chat_messages() {
        let results = vec![
            ToolDispatchResult::ok("c1".into(), "glob".into(), "a.rs".into(), Timing::default()),
            ToolDispatchResult::error(
                "c2".into(),
                "nope".into(),
                crate::ErrorCode::UnknownTool,
                "tool is not registered: nope",
                Timing::default(),
            ),
            ToolDispatchResult::from_output(
                "c3".into(),
                "shot".into(),
                ToolOutput::blocks([Block::text("see:"), Block::image("image/png", TINY_PNG)])
                    .capped(50_000),
                Timing::default(),
            ),
        ];
        let history = vec![
            json!({"role":"user","content":"find files"}),
            json!({"role":"assistant","content":[
                {"type":"text","text":"Looking."},
                {"type":"tool_use","id":"c1","name":"glob","input":{"pattern":"*.rs"}},
                {"type":"tool_use","id":"c2","name":"nope","input":{}},
                {"type":"tool_use","id":"c3","name":"shot","input":{}}
            ]}),
            crate::protocol::encode_anthropic(&results),
        ];
        let messages = chat_messages("sys", &history, &[]);
        assert_eq!(messages[0], json!({"role":"system","content":"sys"}));
        assert_eq!(messages[1], json!({"role":"user","content":"find files"}));
        assert_eq!(
            messages[2],
            json!({"role":"assistant","content":"Looking.","tool_calls":[
                {"id":"c1","type":"function","function":{"name":"glob","arguments":"{\"pattern\":\"*.rs\"}"}},
                {"id":"c2","type":"function","function":{"name":"nope","arguments":"{}"}},
                {"id":"c3","type":"function","function":{"name":"shot","arguments":"{}"}}
            ]})
        );
        // The history carries the image as an image block; the tool message carries its note,
        // exactly as a dispatched result's OpenAI message does.
        assert!(history[2]["content"][2]["content"][1]["source"]["data"] == TINY_PNG);
        assert_eq!(
            messages[5]["content"],
            format!(
                "see:\n[image: image/png, {} bytes base64, not shown]",
                TINY_PNG.len()
            )
        );
        assert_eq!(
            Value::Array(messages[3..].to_vec()),
            encode_openai(&results)
        );
    }

    #[test]
    fn the_catalog_converts_to_functions() {
        let tools = vec![json!({"name":"t","description":"d","input_schema":{"type":"object"}})];
        assert_eq!(
            chat_tools(&tools, &[]),
            vec![
                json!({"type":"function","function":{"name":"t","description":"d","parameters":{"type":"object"}}})
            ]
        );
    }

    #[test]
    fn a_completion_becomes_blocks_and_bad_arguments_are_marked() {
        let doc = json!({"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"a","type":"function","function":{"name":"glob","arguments":"{\"pattern\":\"*\"}"}},
            {"id":"b","type":"function","function":{"name":"glob","arguments":"{nope"}}
        ]}}]});
        let r = response_from_completion(&doc).unwrap();
        assert_eq!(r.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(r.content[0]["input"], json!({"pattern":"*"}));
        assert!(r.content[1].get(MALFORMED_INPUT_KEY).is_some());
        let length = json!({"choices":[{"finish_reason":"length","message":{"content":"cut"}}]});
        let r = response_from_completion(&length).unwrap();
        assert_eq!(r.stop_reason.as_deref(), Some("max_tokens"));
        assert_eq!(r.content, vec![json!({"type":"text","text":"cut"})]);
    }

    fn chunk(delta: Value, finish: Option<&str>) -> SseEvent {
        SseEvent {
            event: None,
            data: json!({"choices":[{"index":0,"delta":delta,"finish_reason":finish}]}).to_string(),
        }
    }

    #[test]
    fn streamed_calls_assemble_per_index_and_complete_when_the_next_starts() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut s = OpenAiStream::default();
        let args = r#"{"text":"caf\u00e9 \"q\" 😀"}"#;
        s.event(chunk(json!({"role":"assistant","content":"Hi"}), None), &tx)
            .unwrap();
        s.event(
            chunk(json!({"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"echo","arguments":""}}]}), None),
            &tx,
        )
        .unwrap();
        for c in args.chars() {
            s.event(
                chunk(
                    json!({"tool_calls":[{"index":0,"function":{"arguments":c.to_string()}}]}),
                    None,
                ),
                &tx,
            )
            .unwrap();
        }
        assert!(rx.try_recv().is_err(), "not complete yet");
        s.event(
            chunk(json!({"tool_calls":[{"index":1,"id":"c2","type":"function","function":{"name":"echo","arguments":"{\"text\":"}}]}), None),
            &tx,
        )
        .unwrap();
        let StreamEvent::BlockComplete(first) = rx.try_recv().unwrap();
        assert_eq!(first["input"], json!({"text":"café \"q\" 😀"}));
        s.event(
            chunk(
                json!({"tool_calls":[{"index":1,"function":{"arguments":"\"x\"}"}}]}),
                None,
            ),
            &tx,
        )
        .unwrap();
        s.event(chunk(json!({}), Some("tool_calls")), &tx).unwrap();
        assert!(rx.try_recv().is_ok(), "finish completes the last call");
        assert!(
            s.event(
                SseEvent {
                    event: None,
                    data: "[DONE]".into()
                },
                &tx
            )
            .unwrap()
        );
        let r = s.finish().unwrap();
        assert_eq!(r.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(r.content.len(), 3);
        assert_eq!(r.content[0], json!({"type":"text","text":"Hi"}));
        assert_eq!(r.content[1], first);
        assert_eq!(r.content[2]["input"], json!({"text":"x"}));
    }
}
