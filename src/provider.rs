//! The `Provider` trait: how the agent loop talks to a model, plus the offline scripted provider.
//!
//! A provider takes a [`ModelRequest`] (system prompt, Anthropic-shaped message history, the
//! registry catalog as `tools`, `max_tokens`) and returns a [`ModelResponse`] (content blocks and a
//! stop reason). Whatever the wire format, responses come back as Anthropic-shaped content blocks,
//! so the loop keeps one history shape. The HTTP providers live in [`crate::providers`];
//! [`ScriptedProvider`] replays a fixed list of responses and records every request, for demos
//! and tests, and can simulate a slow stream.
//!
//! Streaming: [`Provider::complete_streaming`] reports each content block on an [`EventSink`] as
//! soon as it is complete (a `tool_use` block with its arguments fully assembled), and returns the
//! whole response at the end. The agent loop uses those events to start concurrency-safe calls
//! while the rest of the answer is still arriving (eager dispatch).
//!
//! Metrics: a provider records each request it makes (each HTTP attempt, retries included) with
//! [`crate::metrics::model_request`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tokio::sync::mpsc::UnboundedSender;

use crate::protocol::{ToolCall, decode_anthropic};

/// What the agent loop sends to the model each turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The model id (may be empty for the scripted provider).
    pub model: String,
    /// The system prompt.
    pub system: String,
    /// The history, Anthropic Messages shape (`{"role":…,"content":…}`).
    pub messages: Vec<Value>,
    /// The catalog, Anthropic shape (`{name, description, input_schema}`, and
    /// `defer_loading: true` on a deferred tool).
    pub tools: Vec<Value>,
    /// The deferred tools the session has been shown, in the order shown: a wire without
    /// deferred loading (OpenAI) sends these and the tools not deferred.
    pub revealed: Vec<String>,
    /// The output budget.
    pub max_tokens: u32,
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// Content blocks (`text`, `tool_use`, …), Anthropic shape. A `tool_use` block whose
    /// arguments did not parse has `input: {}` and a [`MALFORMED_INPUT_KEY`] member.
    pub content: Vec<Value>,
    /// The provider's stop reason (`end_turn`, `tool_use`, `max_tokens`, …).
    pub stop_reason: Option<String>,
}

/// Member of a `tool_use` block whose streamed or string arguments were not valid JSON: the
/// detail the call is answered `invalid_arguments` with. The agent loop removes it before the
/// block enters the history (where `input` is then `{}`).
pub const MALFORMED_INPUT_KEY: &str = "switchboard_malformed_input";

impl ModelResponse {
    /// Reads a Messages API response (`{"content":[…],"stop_reason":…}`) or a bare block array.
    pub fn from_json(doc: &Value) -> Result<Self, ProviderError> {
        let (content, stop_reason) = match doc {
            Value::Array(blocks) => (blocks.clone(), None),
            Value::Object(obj) => (
                obj.get("content")
                    .and_then(Value::as_array)
                    .cloned()
                    .ok_or_else(|| ProviderError::BadResponse("no `content` array".into()))?,
                obj.get("stop_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            ),
            _ => return Err(ProviderError::BadResponse("not an object".into())),
        };
        Ok(ModelResponse {
            content,
            stop_reason,
        })
    }
}

/// A `tool_use` block for arguments that did not parse: `input: {}` plus the detail.
pub fn malformed_tool_use(id: &str, name: &str, detail: String) -> Value {
    let mut block = Map::new();
    block.insert("type".into(), "tool_use".into());
    block.insert("id".into(), id.into());
    block.insert("name".into(), name.into());
    block.insert("input".into(), Value::Object(Map::new()));
    block.insert(MALFORMED_INPUT_KEY.into(), detail.into());
    Value::Object(block)
}

/// The tool call of one `tool_use` block (`None` for other blocks), honouring
/// [`MALFORMED_INPUT_KEY`].
pub fn tool_call_of(block: &Value) -> Option<ToolCall> {
    if block.get("type").and_then(Value::as_str) != Some("tool_use") {
        return None;
    }
    let mut call = decode_anthropic(&Value::Array(vec![block.clone()]))
        .ok()?
        .pop()?;
    if let Some(detail) = block.get(MALFORMED_INPUT_KEY) {
        let detail = detail
            .as_str()
            .map_or_else(|| detail.to_string(), str::to_string);
        call = ToolCall::with_malformed_arguments(call.id, call.name, detail);
    }
    Some(call)
}

/// Every tool call of a response's content, in order.
pub fn tool_calls_of(content: &[Value]) -> Vec<ToolCall> {
    content.iter().filter_map(tool_call_of).collect()
}

/// The content as it goes into the history: [`MALFORMED_INPUT_KEY`] members removed.
pub fn history_content(content: &[Value]) -> Vec<Value> {
    content
        .iter()
        .map(|block| match block {
            Value::Object(obj) if obj.contains_key(MALFORMED_INPUT_KEY) => {
                let mut obj = obj.clone();
                obj.remove(MALFORMED_INPUT_KEY);
                Value::Object(obj)
            }
            other => other.clone(),
        })
        .collect()
}

/// A provider failure (ends the agent loop with an error, unlike tool failures).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The scripted provider has no more responses.
    #[error("scripted provider has no response left for turn {0}")]
    ScriptExhausted(usize),
    /// The response could not be read.
    #[error("bad model response: {0}")]
    BadResponse(String),
    /// Transport failure (connection refused or reset, timeout), after every attempt.
    #[error("model request failed: {0}")]
    Request(String),
    /// The API answered with an error status (after every attempt, if it is retried).
    #[error("{provider}: HTTP {status}{}: {message}", attempts_note(.attempts))]
    Status {
        /// `anthropic` or `openai`.
        provider: String,
        /// The HTTP status code.
        status: u16,
        /// The API's error message (or the start of the body).
        message: String,
        /// How many requests were made.
        attempts: u32,
    },
    /// 401 or 403: the key was refused.
    #[error("{provider}: HTTP {status}: {message} (check {variable})")]
    Auth {
        /// `anthropic` or `openai`.
        provider: String,
        /// 401 or 403.
        status: u16,
        /// The API's error message.
        message: String,
        /// The environment variable holding the key.
        variable: String,
    },
    /// The API key variable is not set.
    #[error("{0} is not set: export it, or use --provider scripted --script FILE to run offline")]
    MissingKey(String),
    /// A setting is missing or wrong (no model, a bad base URL, …).
    #[error("{0}")]
    Config(String),
}

fn attempts_note(attempts: &u32) -> String {
    if *attempts > 1 {
        format!(" after {attempts} attempts")
    } else {
        String::new()
    }
}

impl ProviderError {
    /// The `status` label of `switchboard_model_requests_total` for this failure: the HTTP
    /// status code when there is one, else `error`.
    pub fn status_label(&self) -> String {
        match self {
            ProviderError::Status { status, .. } | ProviderError::Auth { status, .. } => {
                status.to_string()
            }
            _ => "error".to_string(),
        }
    }

    /// True for problems of the setup (missing key, no model): the CLI exits 2 on these.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            ProviderError::MissingKey(_) | ProviderError::Config(_)
        )
    }
}

/// What a streaming provider reports while the answer is still arriving.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// One content block is complete, in its final form (a `tool_use` block with its arguments
    /// assembled, or marked with [`MALFORMED_INPUT_KEY`]). `tool_use` blocks are reported in
    /// the order they have in the final response, each once.
    BlockComplete(Value),
}

/// Where a streaming provider sends its [`StreamEvent`]s. Sending never blocks; a send to a
/// receiver that is gone is ignored.
pub type EventSink = UnboundedSender<StreamEvent>;

/// A model endpoint. Object-safe: the loop holds an `Arc<dyn Provider>`.
pub trait Provider: Send + Sync {
    /// A short name for logs and metrics (`scripted`, `anthropic`, …).
    fn name(&self) -> &str;

    /// One model call.
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>>;

    /// One model call, streamed: every content block is sent on `events` as soon as it is
    /// complete, and the whole response is returned at the end. The default calls
    /// [`Provider::complete`] and reports every block when it returns.
    fn complete_streaming<'a>(
        &'a self,
        request: &'a ModelRequest,
        events: EventSink,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(async move {
            let response = self.complete(request).await?;
            for block in &response.content {
                let _ = events.send(StreamEvent::BlockComplete(block.clone()));
            }
            Ok(response)
        })
    }
}

/// A shared, ordered log of named events, for tests and measurements that prove an order
/// ("handler started" before "stream ended") without a stopwatch.
pub type EventLog = Arc<Mutex<Vec<String>>>;

/// Appends to an [`EventLog`].
pub fn log_event(log: &EventLog, event: impl Into<String>) {
    log.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(event.into());
}

/// Replays a fixed list of responses, in order, and records the requests it received. When
/// streamed it can simulate a slow stream: each block arrives `block_gap` after the previous one
/// and the stream ends `tail` after the last block.
#[derive(Debug, Default)]
pub struct ScriptedProvider {
    responses: Mutex<VecDeque<ModelResponse>>,
    requests: Mutex<Vec<ModelRequest>>,
    block_gap: Duration,
    tail: Duration,
    log: Option<EventLog>,
    hold: Option<(usize, String)>,
}

impl ScriptedProvider {
    /// A provider that will answer with `responses`, one per turn.
    pub fn new(responses: impl IntoIterator<Item = ModelResponse>) -> Self {
        ScriptedProvider {
            responses: Mutex::new(responses.into_iter().collect()),
            ..ScriptedProvider::default()
        }
    }

    /// Builds it from Messages API response documents.
    pub fn from_json(docs: &[Value]) -> Result<Self, ProviderError> {
        let responses = docs
            .iter()
            .map(ModelResponse::from_json)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(responses))
    }

    /// Streams slowly: each block arrives `block_gap` after the previous one (the first
    /// `block_gap` after the request), and the stream ends `tail` after the last block.
    pub fn with_stream_delays(mut self, block_gap: Duration, tail: Duration) -> Self {
        self.block_gap = block_gap;
        self.tail = tail;
        self
    }

    /// Records `block <i> <type>` when a streamed block is reported and `stream ended` when a
    /// streamed answer is complete (just before it is returned).
    pub fn with_log(mut self, log: EventLog) -> Self {
        self.log = Some(log);
        self
    }

    /// After streaming block `index` (of each answer), waits until the log (see
    /// [`ScriptedProvider::with_log`]) has an entry starting with `prefix` — at most 5 s — so a
    /// test can prove by the order of events that something happened before the stream ended.
    pub fn hold_after_block(mut self, index: usize, prefix: impl Into<String>) -> Self {
        self.hold = Some((index, prefix.into()));
        self
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn next(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let turn = {
            let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            requests.push(request.clone());
            requests.len()
        };
        self.responses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .ok_or(ProviderError::ScriptExhausted(turn))
    }
}

async fn wait_for_entry(log: &EventLog, prefix: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let found = log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|e| e.starts_with(prefix));
        if found {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn record(name: &str, started: Instant, result: &Result<ModelResponse, ProviderError>) {
    let status = match result {
        Ok(_) => "ok".to_string(),
        Err(e) => e.status_label(),
    };
    crate::metrics::model_request(name, &status, started.elapsed());
}

impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self.next(request);
            record(self.name(), started, &result);
            result
        })
    }

    fn complete_streaming<'a>(
        &'a self,
        request: &'a ModelRequest,
        events: EventSink,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self.next(request);
            if let Ok(response) = &result {
                for (i, block) in response.content.iter().enumerate() {
                    if !self.block_gap.is_zero() {
                        tokio::time::sleep(self.block_gap).await;
                    }
                    if let Some(log) = &self.log {
                        let kind = block.get("type").and_then(Value::as_str).unwrap_or("?");
                        log_event(log, format!("block {i} {kind}"));
                    }
                    let _ = events.send(StreamEvent::BlockComplete(block.clone()));
                    // A real stream yields between blocks; let the receiver see this one.
                    tokio::task::yield_now().await;
                    if let (Some((at, prefix)), Some(log)) = (&self.hold, &self.log)
                        && *at == i
                    {
                        wait_for_entry(log, prefix, Duration::from_secs(5)).await;
                    }
                }
                if !self.tail.is_zero() {
                    tokio::time::sleep(self.tail).await;
                }
                if let Some(log) = &self.log {
                    log_event(log, "stream ended");
                }
            }
            record(self.name(), started, &result);
            result
        })
    }
}
