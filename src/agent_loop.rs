//! The Agent loop actor: one per session; owns the message history.
//!
//! Each [`RunPrompt`] appends the user's text, then loops: ask the model (the registry catalog as
//! `tools`), append its answer, hand its `tool_use` blocks to the session's scheduler, append all
//! of the turn's `tool_result`s as one user message — until the model gives a final answer, stops
//! on `max_tokens` with no tool calls, or `max_turns` model calls have been made. The loop knows
//! nothing about any tool: schemas, handlers and policies all live in the registry.

use std::sync::Arc;

use kameo::prelude::*;
use serde_json::{Value, json};

use crate::engine::{EngineUnavailable, Session};
use crate::protocol::{ToolDispatchResult, decode_anthropic, encode_anthropic};
use crate::provider::{ModelRequest, Provider, ProviderError};
use crate::registry::CatalogFormat;

/// The seed's default turn limit.
pub const DEFAULT_MAX_TURNS: usize = 8;
/// The seed's default output budget.
pub const DEFAULT_MAX_TOKENS: u32 = 8000;

/// The seed's system prompt for a workspace.
pub fn default_system_prompt(workspace: &std::path::Path) -> String {
    format!(
        "You are a coding agent at {}. Use tools to solve tasks. Act, don't explain.",
        workspace.display()
    )
}

/// Loop settings.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Model id passed to the provider.
    pub model: String,
    /// System prompt.
    pub system: String,
    /// Output budget per model call.
    pub max_tokens: u32,
    /// Model calls per prompt (≥ 1).
    pub max_turns: usize,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            model: String::new(),
            system: default_system_prompt(std::path::Path::new(".")),
            max_tokens: DEFAULT_MAX_TOKENS,
            max_turns: DEFAULT_MAX_TURNS,
        }
    }
}

/// Why the loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model answered without tool calls.
    FinalAnswer,
    /// The model hit its output budget without tool calls.
    MaxTokens,
    /// `max_turns` model calls were made.
    MaxTurns,
}

impl StopReason {
    /// `final_answer`, `max_tokens` or `max_turns`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::FinalAnswer => "final_answer",
            StopReason::MaxTokens => "max_tokens",
            StopReason::MaxTurns => "max_turns",
        }
    }
}

/// What one prompt produced.
#[derive(Debug, Clone)]
pub struct LoopResult {
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Model calls made.
    pub turns: usize,
    /// Tool calls dispatched.
    pub tool_calls: usize,
    /// The text blocks of the last model answer, joined.
    pub final_text: String,
    /// The provider's own stop reason on the last answer.
    pub provider_stop_reason: Option<String>,
    /// Each dispatched turn's results, in order.
    pub dispatches: Vec<Vec<ToolDispatchResult>>,
}

/// A loop failure that is not a tool failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// `max_turns` was 0.
    #[error("max_turns must be at least 1")]
    InvalidMaxTurns,
    /// The model call failed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The engine could not serve the catalog.
    #[error(transparent)]
    Engine(#[from] EngineUnavailable),
}

/// The Agent loop actor's state.
#[derive(Actor)]
pub struct AgentLoop {
    session: Session,
    provider: Arc<dyn Provider>,
    config: LoopConfig,
    history: Vec<Value>,
}

impl AgentLoop {
    /// A loop for one session. Refuses `max_turns == 0`.
    pub fn new(
        session: Session,
        provider: Arc<dyn Provider>,
        config: LoopConfig,
    ) -> Result<Self, AgentError> {
        if config.max_turns < 1 {
            return Err(AgentError::InvalidMaxTurns);
        }
        Ok(AgentLoop {
            session,
            provider,
            config,
            history: Vec::new(),
        })
    }

    /// The message history so far.
    pub fn history(&self) -> &[Value] {
        &self.history
    }

    /// Runs one prompt to a stop reason (also usable without spawning the actor).
    pub async fn run(&mut self, prompt: &str) -> Result<LoopResult, AgentError> {
        self.history
            .push(json!({"role": "user", "content": prompt}));
        let mut tool_calls = 0;
        let mut dispatches = Vec::new();
        let mut turn = 0;
        loop {
            turn += 1;
            let request = ModelRequest {
                model: self.config.model.clone(),
                system: self.config.system.clone(),
                messages: self.history.clone(),
                tools: self
                    .session
                    .engine()
                    .catalog(CatalogFormat::Anthropic)
                    .await?,
                max_tokens: self.config.max_tokens,
            };
            let asked = std::time::Instant::now();
            let response = self.provider.complete(&request).await;
            let status = match &response {
                Ok(_) => "ok",
                Err(e) => e.status_label(),
            };
            crate::metrics::model_request(self.provider.name(), status, asked.elapsed());
            let response = response?;
            self.history
                .push(json!({"role": "assistant", "content": response.content}));
            let calls = decode_anthropic(&Value::Array(response.content.clone()))
                .map_err(|e| ProviderError::BadResponse(e.0))?;
            if calls.is_empty() {
                let stop_reason = if response.stop_reason.as_deref() == Some("max_tokens") {
                    StopReason::MaxTokens
                } else {
                    StopReason::FinalAnswer
                };
                return Ok(LoopResult {
                    stop_reason,
                    turns: turn,
                    tool_calls,
                    final_text: joined_text(&response.content),
                    provider_stop_reason: response.stop_reason,
                    dispatches,
                });
            }
            tool_calls += calls.len();
            let results = self.session.dispatch(calls).await;
            self.history.push(encode_anthropic(&results));
            dispatches.push(results);
            if turn == self.config.max_turns {
                return Ok(LoopResult {
                    stop_reason: StopReason::MaxTurns,
                    turns: turn,
                    tool_calls,
                    final_text: joined_text(&response.content),
                    provider_stop_reason: response.stop_reason,
                    dispatches,
                });
            }
        }
    }
}

fn joined_text(content: &[Value]) -> String {
    content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Run one prompt through the actor.
#[derive(Debug, Clone)]
pub struct RunPrompt(pub String);

impl Message<RunPrompt> for AgentLoop {
    type Reply = Result<LoopResult, AgentError>;

    async fn handle(&mut self, msg: RunPrompt, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.run(&msg.0).await
    }
}
