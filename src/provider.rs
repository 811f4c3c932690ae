//! The `Provider` trait: how the agent loop talks to a model, plus the offline scripted provider.
//!
//! A provider takes a [`ModelRequest`] (system prompt, Anthropic-shaped message history, the
//! registry catalog as `tools`, `max_tokens`) and returns a [`ModelResponse`] (content blocks and a
//! stop reason). Real HTTP providers implement the same trait; [`ScriptedProvider`] replays a fixed
//! list of responses and records every request, for demos and tests.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures::future::BoxFuture;
use serde_json::Value;

/// What the agent loop sends to the model each turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The model id (may be empty for the scripted provider).
    pub model: String,
    /// The system prompt.
    pub system: String,
    /// The history, Anthropic Messages shape (`{"role":…,"content":…}`).
    pub messages: Vec<Value>,
    /// The catalog, Anthropic shape (`{name, description, input_schema}`).
    pub tools: Vec<Value>,
    /// The output budget.
    pub max_tokens: u32,
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// Content blocks (`text`, `tool_use`, …).
    pub content: Vec<Value>,
    /// The provider's stop reason (`end_turn`, `tool_use`, `max_tokens`, …).
    pub stop_reason: Option<String>,
}

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

/// A provider failure (ends the agent loop with an error, unlike tool failures).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The scripted provider has no more responses.
    #[error("scripted provider has no response left for turn {0}")]
    ScriptExhausted(usize),
    /// The response could not be read.
    #[error("bad model response: {0}")]
    BadResponse(String),
    /// Transport or API failure.
    #[error("model request failed: {0}")]
    Request(String),
}

impl ProviderError {
    /// The `status` label of `switchboard_model_requests_total` for this failure.
    pub fn status_label(&self) -> &'static str {
        match self {
            ProviderError::ScriptExhausted(_) => "script_exhausted",
            ProviderError::BadResponse(_) => "bad_response",
            ProviderError::Request(_) => "error",
        }
    }
}

/// A model endpoint.
pub trait Provider: Send + Sync {
    /// A short name for logs and metrics (`scripted`, `anthropic`, …).
    fn name(&self) -> &str;
    /// One model call.
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>>;
}

/// Replays a fixed list of responses, in order, and records the requests it received.
#[derive(Debug, Default)]
pub struct ScriptedProvider {
    responses: Mutex<VecDeque<ModelResponse>>,
    requests: Mutex<Vec<ModelRequest>>,
}

impl ScriptedProvider {
    /// A provider that will answer with `responses`, one per turn.
    pub fn new(responses: impl IntoIterator<Item = ModelResponse>) -> Self {
        ScriptedProvider {
            responses: Mutex::new(responses.into_iter().collect()),
            requests: Mutex::default(),
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

    /// Every request received so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
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
        })
    }
}
