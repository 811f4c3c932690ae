//! The Agent loop actor: one per session; owns the message history.
//!
//! Each [`RunPrompt`] appends the user's text, then loops: ask the model (the registry catalog as
//! `tools`), append its answer, hand its `tool_use` blocks to the session's scheduler, append all
//! of the turn's `tool_result`s as one user message — until the model gives a final answer, stops
//! on `max_tokens` with no tool calls, or `max_turns` model calls have been made. The loop knows
//! nothing about any tool: schemas, handlers and policies all live in the registry.
//!
//! **Eager dispatch.** With streaming on ([`StreamOptions`]), a `tool_use` block is admitted as
//! soon as the provider reports it complete — by `plan::admit` over the engine's cached
//! registry snapshot, exactly as a whole turn's calls are, with no registry message per block.
//! It starts at once, as a one-call turn of the session, while the rest of the answer is still
//! streaming, when its tool is concurrency-safe (a call with effects never starts before the
//! answer is complete) and every earlier call of the same answer it conflicts with
//! (`crate::plan`'s rule: the calls' accesses) has already finished. The other calls run as one
//! ordinary turn after the stream ended and every eager call finished, so a serial call still
//! waits for everything before it, and an eager call never overtakes an earlier call it
//! conflicts with. Results are merged in call order and the user message carries every result,
//! in order, exactly as without eager dispatch.
//!
//! A duplicate `tool_use_id` cannot un-run a call that already started. So eager dispatch stops
//! at the first block whose id is empty or repeats an earlier one; calls already started keep
//! their real results; and if the answer turns out to hold a duplicate id, every call that had
//! not started is answered `invalid_arguments` without running (the engine's rule for a
//! duplicate, applied to the calls it can still apply to).
//!
//! If the stream fails after eager calls started, the loop waits for them to finish before it
//! returns the error (nothing outlives the prompt), and the HTTP providers do not retry a stream
//! that already reported a block.

use std::collections::HashSet;
use std::sync::Arc;

use kameo::prelude::*;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::engine::EngineError;
use crate::engine::Session;
use crate::plan;
use crate::protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult, encode_anthropic};
use crate::provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, StreamEvent, history_content,
    tool_call_of, tool_calls_of,
};
use crate::registry::CatalogFormat;
use crate::tool::Access;

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

/// How the loop reads the model's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// Ask for a streamed answer ([`Provider::complete_streaming`]).
    pub stream: bool,
    /// While streaming, start concurrency-safe calls as soon as their block is complete.
    pub eager: bool,
}

impl Default for StreamOptions {
    /// Not streaming; eager dispatch on (it applies once streaming is turned on).
    fn default() -> Self {
        StreamOptions {
            stream: false,
            eager: true,
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
    /// For each dispatched turn, how many of its calls were started eagerly, while the answer
    /// was still streaming.
    pub eager: Vec<usize>,
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
    /// The engine could not serve the catalog or a turn (shut down, an actor gone).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The Agent loop actor's state.
#[derive(Actor)]
pub struct AgentLoop {
    session: Session,
    provider: Arc<dyn Provider>,
    config: LoopConfig,
    history: Vec<Value>,
    stream: StreamOptions,
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
            stream: StreamOptions::default(),
        })
    }

    /// Streaming and eager dispatch settings (default: not streaming).
    pub fn with_stream(mut self, options: StreamOptions) -> Self {
        self.stream = options;
        self
    }

    /// The streaming settings.
    pub fn stream_options(&self) -> StreamOptions {
        self.stream
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
        let mut eager_counts = Vec::new();
        let mut turn = 0;
        loop {
            turn += 1;
            let request = ModelRequest {
                model: self.config.model.clone(),
                system: self.config.system.clone(),
                messages: self.history.clone(),
                tools: self.session.catalog(CatalogFormat::Anthropic).await?,
                revealed: self
                    .session
                    .revealed()
                    .iter()
                    .map(|n| n.to_string())
                    .collect(),
                max_tokens: self.config.max_tokens,
            };
            let (response, eager) = if self.stream.stream {
                self.call_streaming(&request).await?
            } else {
                (self.provider.complete(&request).await?, Eager::new(false))
            };
            self.history.push(json!({
                "role": "assistant",
                "content": history_content(&response.content),
            }));
            let calls = tool_calls_of(&response.content);
            if calls.is_empty() {
                eager.join().await?;
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
                    eager: eager_counts,
                });
            }
            tool_calls += calls.len();
            let (results, eager_n) = eager.finish(calls, &self.session).await?;
            self.history.push(encode_anthropic(&results));
            dispatches.push(results);
            eager_counts.push(eager_n);
            if turn == self.config.max_turns {
                return Ok(LoopResult {
                    stop_reason: StopReason::MaxTurns,
                    turns: turn,
                    tool_calls,
                    final_text: joined_text(&response.content),
                    provider_stop_reason: response.stop_reason,
                    dispatches,
                    eager: eager_counts,
                });
            }
        }
    }

    /// One streamed model call; completed blocks go to eager dispatch while it streams.
    async fn call_streaming(
        &self,
        request: &ModelRequest,
    ) -> Result<(ModelResponse, Eager), AgentError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut eager = Eager::new(self.stream.eager);
        let result = {
            let answer = self.provider.complete_streaming(request, tx);
            tokio::pin!(answer);
            loop {
                tokio::select! {
                    biased;
                    Some(StreamEvent::BlockComplete(block)) = rx.recv() => {
                        eager.on_block(&block, &self.session).await;
                    }
                    result = &mut answer => break result,
                }
            }
        };
        // Blocks reported in the stream's last moment are not started eagerly: the stream has
        // ended, so they run with the rest of the turn.
        match result {
            Ok(response) => Ok((response, eager)),
            Err(e) => {
                // The provider's error ends the prompt; the eager calls are still awaited so
                // nothing keeps running behind it (an engine fault among them adds nothing).
                let _ = eager.join().await;
                Err(e.into())
            }
        }
    }
}

/// The calls of one answer started while it was still streaming.
struct Eager {
    open: bool,
    ids: HashSet<Arc<str>>,
    /// The access of every call seen so far, in order (`none` for a call the engine answers
    /// without running it).
    seen: Vec<Access>,
    started: Vec<Started>,
}

/// One call started eagerly: its position in the answer, its identity and its one-call turn.
struct Started {
    position: usize,
    id: Arc<str>,
    name: Arc<str>,
    turn: JoinHandle<Result<Vec<ToolDispatchResult>, EngineError>>,
}

impl Eager {
    fn new(enabled: bool) -> Self {
        Eager {
            open: enabled,
            ids: HashSet::new(),
            seen: Vec::new(),
            started: Vec::new(),
        }
    }

    /// A block is complete: start its call now if it qualifies.
    async fn on_block(&mut self, block: &Value, session: &Session) {
        let Some(call) = tool_call_of(block) else {
            return;
        };
        let position = self.seen.len();
        if !self.open {
            self.seen.push(Access::Exclusive);
            return;
        }
        if call.id.is_empty() || !self.ids.insert(Arc::clone(&call.id)) || session.is_cancelled() {
            self.open = false;
            self.seen.push(Access::Exclusive);
            return;
        }
        // The same cached snapshot and the same admission as a whole turn (no registry message).
        let snapshot = session.engine().snapshot().await;
        let Ok(tool) = plan::admit(&snapshot, &call) else {
            // Answered without running (unknown tool, bad id, invalid arguments, a tool switched
            // off) with the rest of the turn, touching nothing.
            self.seen.push(Access::none());
            return;
        };
        let access = plan::access(tool, &call, session.workspace());
        let free = self.seen.iter().enumerate().all(|(i, earlier)| {
            !earlier.conflicts(&access)
                || self
                    .started
                    .iter()
                    .any(|s| s.position == i && s.turn.is_finished())
        });
        self.seen.push(access);
        if !tool.policy.concurrency_safe || !free {
            return;
        }
        tracing::debug!(tool = %call.name, id = %call.id, "started while the answer streams");
        let (id, name) = (Arc::clone(&call.id), Arc::clone(&call.name));
        let session = session.clone();
        self.started.push(Started {
            position,
            id,
            name,
            turn: tokio::spawn(async move { session.dispatch(vec![call]).await }),
        });
    }

    /// Waits for every eager call; one result each, in call order (an engine fault is the
    /// loop's error).
    async fn join(self) -> Result<Vec<(usize, ToolDispatchResult)>, EngineError> {
        let mut results = Vec::with_capacity(self.started.len());
        for Started {
            position,
            id,
            name,
            turn,
        } in self.started
        {
            let result = match turn.await {
                Ok(Ok(mut r)) if r.len() == 1 => r.pop(),
                Ok(Err(e)) => return Err(e),
                _ => None,
            };
            results.push((
                position,
                result.unwrap_or_else(|| {
                    ToolDispatchResult::error(
                        id,
                        name,
                        ErrorCode::ExecutionError,
                        "the call's dispatch task failed",
                        Timing::default(),
                    )
                }),
            ));
        }
        Ok(results)
    }

    /// Runs the calls not started yet (after the eager ones finished) and merges the results in
    /// call order. Returns them with the number of eager calls.
    async fn finish(
        self,
        calls: Vec<ToolCall>,
        session: &Session,
    ) -> Result<(Vec<ToolDispatchResult>, usize), EngineError> {
        if self.started.is_empty() {
            return Ok((session.dispatch(calls).await?, 0));
        }
        let eager = self.join().await?;
        // Keep only eager results that answer the final answer's call at their position; if the
        // streamed blocks and the final answer disagree, those calls run now (results of eager
        // calls the answer does not hold are dropped).
        let mut slots: Vec<Option<ToolDispatchResult>> = calls.iter().map(|_| None).collect();
        let mut disagree = false;
        for (position, result) in eager {
            match calls.get(position) {
                Some(c) if c.id == result.tool_use_id => slots[position] = Some(result),
                _ => disagree = true,
            }
        }
        if disagree {
            tracing::warn!("the streamed blocks and the final answer disagree on the tool calls");
        }
        let n = slots.iter().filter(|s| s.is_some()).count();
        let rest: Vec<ToolCall> = calls
            .iter()
            .zip(&slots)
            .filter(|(_, s)| s.is_none())
            .map(|(c, _)| c.clone())
            .collect();
        let duplicate = {
            let mut seen = HashSet::new();
            calls
                .iter()
                .find(|c| !c.id.is_empty() && !seen.insert(&*c.id))
                .map(|c| c.id.to_string())
        };
        let rest_results = match duplicate {
            Some(dup) => rest
                .iter()
                .map(|c| {
                    ToolDispatchResult::error(
                        Arc::clone(&c.id),
                        Arc::clone(&c.name),
                        ErrorCode::InvalidArguments,
                        &format!(
                            "duplicate tool_use_id in this turn: {dup}; the calls not started while the answer streamed were not run"
                        ),
                        Timing::default(),
                    )
                })
                .collect(),
            None => session.dispatch(rest).await?,
        };
        let mut rest_results = rest_results.into_iter();
        let results = slots
            .into_iter()
            .zip(&calls)
            .map(|(slot, c)| {
                slot.or_else(|| rest_results.next()).unwrap_or_else(|| {
                    ToolDispatchResult::error(
                        Arc::clone(&c.id),
                        Arc::clone(&c.name),
                        ErrorCode::ExecutionError,
                        "the call's dispatch returned no result",
                        Timing::default(),
                    )
                })
            })
            .collect();
        Ok((results, n))
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
