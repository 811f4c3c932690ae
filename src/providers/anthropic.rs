//! The Anthropic Messages API (`POST {ANTHROPIC_BASE_URL}/v1/messages`), streaming or not.
//!
//! The request is the loop's own state as it is: `model`, `max_tokens`, `system`, the
//! Anthropic-shaped history as `messages`, the registry catalog as `tools`. A streamed answer
//! is rebuilt block by block from `content_block_start` / `content_block_delta` /
//! `content_block_stop`: text, thinking (with its signature) and citations are concatenated,
//! `input_json_delta` fragments are assembled and parsed at `content_block_stop`, and the
//! complete block is reported at once. `message_delta` carries the stop reason; `message_stop`
//! ends the answer; an `error` event fails it (retried like its HTTP status when no block was
//! reported yet).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::assemble::{ArgumentBuffer, tool_use_block};
use super::sse::SseEvent;
use super::{Failure, Http, HttpConfig, StreamDecoder};
use crate::provider::{
    EventSink, ModelRequest, ModelResponse, Provider, ProviderError, StreamEvent,
};

/// The `anthropic-version` header sent.
pub const API_VERSION: &str = "2023-06-01";
/// The variable holding the key.
pub const KEY_VARIABLE: &str = "ANTHROPIC_API_KEY";

/// An Anthropic Messages API client.
pub struct AnthropicProvider {
    http: Http,
    url: String,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("url", &self.url)
            .finish()
    }
}

impl AnthropicProvider {
    /// A client for `config.base_url` (e.g. [`super::ANTHROPIC_BASE_URL`]). The key is required.
    pub fn new(config: HttpConfig) -> Result<Self, ProviderError> {
        if config.api_key.is_none() {
            return Err(ProviderError::MissingKey(KEY_VARIABLE.into()));
        }
        let http = Http::new("anthropic", KEY_VARIABLE, config)?;
        let url = format!("{}/v1/messages", http.config.base_url);
        Ok(AnthropicProvider { http, url })
    }

    /// The request body for `request`.
    pub fn request_body(request: &ModelRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), request.model.clone().into());
        body.insert("max_tokens".into(), request.max_tokens.into());
        if !request.system.is_empty() {
            body.insert("system".into(), request.system.clone().into());
        }
        body.insert("messages".into(), Value::Array(request.messages.clone()));
        if !request.tools.is_empty() {
            body.insert("tools".into(), Value::Array(request.tools.clone()));
        }
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
        let body = serde_json::to_vec(&Self::request_body(request, sink.is_some()))
            .map_err(|e| ProviderError::BadResponse(format!("cannot encode the request: {e}")))?;
        let key = self.http.config.api_key.clone().unwrap_or_default();
        let accept = if sink.is_some() {
            "text/event-stream"
        } else {
            "application/json"
        };
        let headers = [
            ("x-api-key", key.as_str()),
            ("anthropic-version", API_VERSION),
            ("accept", accept),
        ];
        self.http
            .exchange::<AnthropicStream>(
                &self.url,
                &headers,
                &body,
                sink.as_ref(),
                ModelResponse::from_json,
            )
            .await
    }
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
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

/// A block between its start and its stop.
struct OpenBlock {
    block: Value,
    arguments: Option<ArgumentBuffer>,
}

/// The state of one streamed answer.
#[derive(Default)]
pub(crate) struct AnthropicStream {
    open: BTreeMap<u64, OpenBlock>,
    done: BTreeMap<u64, Value>,
    stop_reason: Option<String>,
    started: bool,
    stopped: bool,
    emitted: bool,
}

fn bad(detail: impl Into<String>) -> Failure {
    Failure::fatal(ProviderError::BadResponse(format!(
        "anthropic stream: {}",
        detail.into()
    )))
}

fn append(block: &mut Value, key: &str, text: &str) {
    if let Value::Object(obj) = block {
        match obj.get_mut(key) {
            Some(Value::String(s)) => s.push_str(text),
            _ => {
                obj.insert(key.into(), text.into());
            }
        }
    }
}

impl AnthropicStream {
    fn close(&mut self, index: u64, sink: Option<&EventSink>) {
        let Some(OpenBlock {
            mut block,
            arguments,
        }) = self.open.remove(&index)
        else {
            return;
        };
        if let Some(arguments) = arguments {
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            if kind == "tool_use" {
                let id = block.get("id").and_then(Value::as_str).unwrap_or("");
                let name = block.get("name").and_then(Value::as_str).unwrap_or("");
                let input = if arguments.as_str().trim().is_empty() {
                    Ok(block.get("input").cloned().unwrap_or_else(|| json!({})))
                } else {
                    arguments.parse()
                };
                let mut rebuilt = tool_use_block(id, name, input);
                // Keep any other member the API sent (e.g. `cache_control`).
                if let (Value::Object(orig), Value::Object(new)) = (&block, &mut rebuilt) {
                    for (k, v) in orig {
                        new.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
                block = rebuilt;
            } else if let Ok(input) = arguments.parse() {
                // Server tools (`server_tool_use`, …): not run here, kept for the history.
                block["input"] = input;
            }
        }
        if let Some(sink) = sink {
            let _ = sink.send(StreamEvent::BlockComplete(block.clone()));
            self.emitted = true;
        }
        self.done.insert(index, block);
    }
}

impl StreamDecoder for AnthropicStream {
    fn event(&mut self, event: SseEvent, sink: &EventSink) -> Result<bool, Failure> {
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|e| bad(format!("event data is not JSON ({e}): {}", event.data)))?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or("");
        let index = || data.get("index").and_then(Value::as_u64);
        match kind {
            "message_start" => self.started = true,
            "content_block_start" => {
                let index = index().ok_or_else(|| bad("content_block_start without index"))?;
                let block = data
                    .get("content_block")
                    .cloned()
                    .ok_or_else(|| bad("content_block_start without content_block"))?;
                let takes_json = matches!(
                    block.get("type").and_then(Value::as_str),
                    Some("tool_use" | "server_tool_use" | "mcp_tool_use")
                );
                self.open.insert(
                    index,
                    OpenBlock {
                        block,
                        arguments: takes_json.then(ArgumentBuffer::new),
                    },
                );
            }
            "content_block_delta" => {
                let index = index().ok_or_else(|| bad("content_block_delta without index"))?;
                let open = self
                    .open
                    .get_mut(&index)
                    .ok_or_else(|| bad(format!("delta for block {index}, which is not open")))?;
                let delta = data.get("delta").cloned().unwrap_or(Value::Null);
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                match delta.get("type").and_then(Value::as_str).unwrap_or("") {
                    "input_json_delta" => {
                        open.arguments
                            .get_or_insert_with(ArgumentBuffer::new)
                            .push(text("partial_json"));
                    }
                    "text_delta" => append(&mut open.block, "text", text("text")),
                    "thinking_delta" => append(&mut open.block, "thinking", text("thinking")),
                    "signature_delta" => {
                        open.block["signature"] = text("signature").into();
                    }
                    "citations_delta" => {
                        if let (Some(citation), Value::Object(obj)) =
                            (delta.get("citation"), &mut open.block)
                        {
                            let list = obj
                                .entry("citations")
                                .or_insert_with(|| Value::Array(Vec::new()));
                            if !list.is_array() {
                                *list = Value::Array(Vec::new());
                            }
                            if let Value::Array(list) = list {
                                list.push(citation.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = index().ok_or_else(|| bad("content_block_stop without index"))?;
                self.close(index, Some(sink));
            }
            "message_delta" => {
                if let Some(reason) = data
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_string());
                }
            }
            "message_stop" => {
                self.stopped = true;
                return Ok(true);
            }
            "error" => {
                let error = data.get("error").cloned().unwrap_or(Value::Null);
                let error_type = error.get("type").and_then(Value::as_str).unwrap_or("error");
                let message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("(no message)");
                // The status the same error has when it comes before the stream.
                let status = match error_type {
                    "overloaded_error" => 529,
                    "api_error" => 500,
                    "rate_limit_error" => 429,
                    "authentication_error" => 401,
                    "permission_error" => 403,
                    "not_found_error" => 404,
                    "request_too_large" => 413,
                    _ => 400,
                };
                return Err(Failure {
                    error: ProviderError::Status {
                        provider: "anthropic".into(),
                        status,
                        message: format!("{error_type}: {message} (in the stream)"),
                        attempts: 1,
                    },
                    retryable: super::retry::is_retryable_status(status) && !self.emitted,
                    retry_after: None,
                });
            }
            // `ping` and event types added later.
            _ => {}
        }
        Ok(false)
    }

    fn emitted(&self) -> bool {
        self.emitted
    }

    fn finish(&mut self) -> Result<ModelResponse, Failure> {
        if !self.stopped {
            return Err(Failure {
                error: ProviderError::Request(
                    "anthropic: the stream ended before message_stop".into(),
                ),
                retryable: !self.emitted,
                retry_after: None,
            });
        }
        if !self.started {
            return Err(bad("no message_start"));
        }
        let open: Vec<u64> = self.open.keys().copied().collect();
        for index in open {
            self.close(index, None);
        }
        Ok(ModelResponse {
            content: std::mem::take(&mut self.done).into_values().collect(),
            stop_reason: self.stop_reason.take(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::MALFORMED_INPUT_KEY;
    use crate::providers::sse::SseParser;

    fn sse(events: &[Value]) -> String {
        events
            .iter()
            .map(|e| format!("event: {}\ndata: {}\n\n", e["type"].as_str().unwrap(), e))
            .collect()
    }

    fn stream(fragments: &[&str]) -> String {
        let mut events = vec![
            json!({"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"stop_reason":null}}),
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me "}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"look."}}),
            json!({"type":"content_block_stop","index":0}),
            json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"read_file","input":{}}}),
        ];
        for f in fragments {
            events.push(json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":f}}));
        }
        events.push(json!({"type":"content_block_stop","index":1}));
        events.push(json!({"type":"ping"}));
        events.push(json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}));
        events.push(json!({"type":"message_stop"}));
        sse(&events)
    }

    fn decode(text: &str, cut: usize) -> (Result<ModelResponse, Failure>, Vec<StreamEvent>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut parser = SseParser::new();
        let mut decoder = AnthropicStream::default();
        let bytes = text.as_bytes();
        let mut result = None;
        'outer: for piece in [&bytes[..cut], &bytes[cut..]] {
            for ev in parser.push(piece).unwrap() {
                match decoder.event(ev, &tx) {
                    Ok(true) => {
                        result = Some(decoder.finish());
                        break 'outer;
                    }
                    Ok(false) => {}
                    Err(f) => {
                        result = Some(Err(f));
                        break 'outer;
                    }
                }
            }
        }
        let result = result.unwrap_or_else(|| decoder.finish());
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        (result, events)
    }

    #[test]
    fn a_streamed_answer_rebuilds_text_and_tool_use_at_every_byte_split() {
        let args = r#"{"path":"caf\u00e9/\"q\" 😀","limit":3}"#;
        let fragments: Vec<String> = args.chars().map(|c| c.to_string()).collect();
        let fragments: Vec<&str> = fragments.iter().map(String::as_str).collect();
        let text = stream(&fragments);
        for cut in 0..=text.len() {
            let (result, events) = decode(&text, cut);
            let response = result.unwrap();
            assert_eq!(response.stop_reason.as_deref(), Some("tool_use"));
            assert_eq!(
                response.content[0],
                json!({"type":"text","text":"Let me look."})
            );
            assert_eq!(
                response.content[1],
                json!({"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"café/\"q\" 😀","limit":3}})
            );
            assert_eq!(events.len(), 2);
            assert_eq!(
                events[1],
                StreamEvent::BlockComplete(response.content[1].clone())
            );
        }
    }

    #[test]
    fn bad_json_arguments_mark_the_block_malformed() {
        let (result, _) = decode(&stream(&["{\"path\":", " \"a"]), 0);
        let block = &result.unwrap().content[1];
        assert_eq!(block["input"], json!({}));
        assert!(
            block[MALFORMED_INPUT_KEY]
                .as_str()
                .unwrap()
                .contains("not valid JSON")
        );
    }

    #[test]
    fn no_fragments_keep_the_start_input() {
        let (result, _) = decode(&stream(&[]), 0);
        assert_eq!(result.unwrap().content[1]["input"], json!({}));
    }

    #[test]
    fn an_error_event_fails_with_its_status_and_a_cut_stream_is_an_error() {
        let text = sse(&[
            json!({"type":"message_start","message":{}}),
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
        ]);
        let (result, _) = decode(&text, 0);
        let failure = result.unwrap_err();
        assert!(failure.retryable);
        assert!(matches!(
            failure.error,
            ProviderError::Status { status: 529, .. }
        ));
        let whole = stream(&["{}"]);
        let cut = &whole[..whole.find("message_delta").unwrap()];
        let (result, events) = decode(cut, 0);
        let failure = result.unwrap_err();
        assert!(!failure.retryable, "blocks were reported already");
        assert_eq!(events.len(), 2);
    }

    #[test]
    fn the_request_body_is_the_loop_state() {
        let request = ModelRequest {
            model: "m".into(),
            system: "sys".into(),
            messages: vec![json!({"role":"user","content":"hi"})],
            tools: vec![json!({"name":"t","description":"d","input_schema":{"type":"object"}})],
            revealed: vec![],
            max_tokens: 8000,
        };
        assert_eq!(
            AnthropicProvider::request_body(&request, true),
            json!({"model":"m","max_tokens":8000,"system":"sys","messages":[{"role":"user","content":"hi"}],
                   "tools":[{"name":"t","description":"d","input_schema":{"type":"object"}}],"stream":true})
        );
    }
}
