//! The direct baseline: the engine's per-turn work with no actors, for benchmarks and `load`.
//!
//! A [`DirectDispatcher`] holds the tools of a list of [`ToolSpec`]s (validators compiled once,
//! with [`validation::compile`]) and [`DirectDispatcher::dispatch`]es a turn **in the caller's own
//! task**: no registry, scheduler or worker actor, no message, no spawned task for cheap work. It
//! answers a turn the way the engine does —
//!
//! * the same checks in the same order: a duplicate `tool_use_id` answers every call
//!   `invalid_arguments` and runs nothing; then per call a missing id, an unknown tool
//!   (`tool is not registered: X`), undecodable arguments and schema violations
//!   ([`validation::check`]) become results without running anything;
//! * the same plan: the runnable calls are split by [`scheduler::partition`] — a run of consecutive
//!   concurrency-safe calls is one concurrent stage, every other call a serial stage of its own, and
//!   stages run in model order;
//! * the same execution per handler kind: inline handlers run in place (panic caught); async
//!   handlers are awaited in place — one after the other in serial stages, together
//!   (`futures::future::join_all`) within a concurrent stage; blocking handlers go to tokio's
//!   blocking pool (`spawn_blocking`) and are awaited; a panic becomes `execution_error`;
//! * the same output cap ([`crate::tool::cap_output`]) and one result per call, in call order.
//!
//! What it leaves out, so that it is a lower bound on the engine's cost: actor hops, the global
//! concurrency permit, deadlines (a handler's timeout is only reported in its [`ToolContext`]),
//! cancellation (the token it hands out is never cancelled) and the collector's tracing events.
//! Encoding is the caller's job, as with the engine (e.g. [`crate::protocol::encode_anthropic`]).
//!
//! ```no_run
//! # async fn demo(specs: Vec<switchboard::ToolSpec>, calls: Vec<switchboard::ToolCall>) {
//! use switchboard::baseline::DirectDispatcher;
//! use switchboard::protocol::encode_anthropic;
//!
//! let direct = DirectDispatcher::new(specs).expect("valid tools");
//! let results = direct.dispatch(calls).await;
//! let message = encode_anthropic(&results);
//! # let _ = message;
//! # }
//! ```
//!
//! [`validation::compile`]: crate::validation::compile
//! [`validation::check`]: crate::validation::check
//! [`scheduler::partition`]: crate::scheduler::partition

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use futures::future::join_all;
use jsonschema::Validator;
use tokio_util::sync::CancellationToken;

use crate::protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult};
use crate::registry::{RegistryError, valid_tool_name};
use crate::scheduler::{StageMode, clamp, duplicate_id, partition};
use crate::tool::{Handler, ToolContext, ToolError, ToolOutcome, ToolPolicy, ToolSpec};
use crate::validation;
use crate::worker::{panicked, to_result};

/// One tool as the direct dispatcher keeps it: what it takes to run a call.
struct DirectTool {
    handler: Handler,
    policy: ToolPolicy,
    validator: Validator,
}

/// Dispatches turns in the caller's task, without actors: the baseline the engine is measured
/// against. See the [module docs](self) for what it does and leaves out.
///
/// Immutable once built and `Send + Sync`: share it behind an `Arc` between sessions.
pub struct DirectDispatcher {
    tools: HashMap<Arc<str>, DirectTool>,
    cancel: CancellationToken,
}

impl std::fmt::Debug for DirectDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.tools.keys().map(|n| &**n).collect();
        names.sort_unstable();
        f.debug_struct("DirectDispatcher")
            .field("tools", &names)
            .finish()
    }
}

impl DirectDispatcher {
    /// Builds a dispatcher from tool specs, compiling each input schema once. Refuses what the
    /// registry refuses: an empty, malformed or duplicate name, or a schema that is not an object
    /// schema or does not compile.
    pub fn new(specs: impl IntoIterator<Item = ToolSpec>) -> Result<Self, RegistryError> {
        let mut tools = HashMap::new();
        for spec in specs {
            if spec.name.is_empty() {
                return Err(RegistryError::EmptyName);
            }
            if !valid_tool_name(&spec.name) {
                return Err(RegistryError::InvalidName(spec.name));
            }
            if tools.contains_key(spec.name.as_str()) {
                return Err(RegistryError::Duplicate(spec.name));
            }
            let validator = validation::compile(&spec.input_schema).map_err(|detail| {
                RegistryError::BadSchema {
                    name: spec.name.clone(),
                    detail,
                }
            })?;
            tools.insert(
                Arc::from(spec.name),
                DirectTool {
                    handler: spec.handler,
                    policy: spec.policy,
                    validator,
                },
            );
        }
        Ok(DirectDispatcher {
            tools,
            cancel: CancellationToken::new(),
        })
    }

    /// How many tools it knows.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// True when it knows no tool.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// True when a tool of exactly this name is known (no trimming, no case folding).
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// Dispatches one turn in the calling task: one result per call, in call order, with the same
    /// contents and error codes as [`crate::Engine::dispatch`] gives for the same turn (timings
    /// aside). Never fails: every problem is a result. Needs a tokio runtime only for blocking
    /// handlers.
    pub async fn dispatch(&self, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
        if calls.is_empty() {
            return Vec::new();
        }
        let arrived = Instant::now();
        if let Some(dup) = duplicate_id(&calls) {
            let detail =
                format!("duplicate tool_use_id in this turn: {dup}; no call of the turn was run");
            return calls
                .iter()
                .map(|c| rejected(c, ErrorCode::InvalidArguments, &detail))
                .collect();
        }

        let mut slots: Vec<Option<ToolDispatchResult>> = Vec::with_capacity(calls.len());
        let mut runnable: Vec<(usize, ToolCall, &DirectTool)> = Vec::with_capacity(calls.len());
        for (index, call) in calls.into_iter().enumerate() {
            match self.admit(&call) {
                Ok(tool) => {
                    slots.push(None);
                    runnable.push((index, call, tool));
                }
                Err(result) => slots.push(Some(result)),
            }
        }

        let safe: Vec<bool> = runnable
            .iter()
            .map(|(_, _, tool)| tool.policy.concurrency_safe)
            .collect();
        let stages = partition(&safe);
        let mut runnable = runnable.into_iter();
        for stage in stages {
            let calls = runnable.by_ref().take(stage.calls.len());
            match stage.mode {
                StageMode::Serial => {
                    for (index, call, tool) in calls {
                        let result = if tool.handler.is_inline() {
                            self.run_inline(call, tool, arrived)
                        } else {
                            self.run_waiting(call, tool, arrived).await
                        };
                        slots[index] = Some(result);
                    }
                }
                StageMode::Concurrent => {
                    let mut waiting = Vec::new();
                    for (index, call, tool) in calls {
                        if tool.handler.is_inline() {
                            slots[index] = Some(self.run_inline(call, tool, arrived));
                        } else {
                            waiting.push((index, call, tool));
                        }
                    }
                    if !waiting.is_empty() {
                        let runs = waiting.into_iter().map(|(index, call, tool)| async move {
                            (index, self.run_waiting(call, tool, arrived).await)
                        });
                        for (index, result) in join_all(runs).await {
                            slots[index] = Some(result);
                        }
                    }
                }
            }
        }
        slots.into_iter().flatten().collect()
    }

    /// Lookup and validation of one call: the tool to run it, or the call's error result.
    fn admit(&self, call: &ToolCall) -> Result<&DirectTool, ToolDispatchResult> {
        if call.id.is_empty() {
            return Err(rejected(
                call,
                ErrorCode::InvalidArguments,
                "missing or empty tool_use_id",
            ));
        }
        let Some(tool) = self.tools.get(&*call.name) else {
            let shown = if call.name.is_empty() {
                "<empty>".to_string()
            } else {
                clamp(&call.name, 200)
            };
            return Err(rejected(
                call,
                ErrorCode::UnknownTool,
                &format!("tool is not registered: {shown}"),
            ));
        };
        if let Some(detail) = &call.malformed {
            return Err(rejected(call, ErrorCode::InvalidArguments, detail));
        }
        if let Err(detail) = validation::check(&tool.validator, &call.arguments) {
            return Err(rejected(call, ErrorCode::InvalidArguments, &detail));
        }
        Ok(tool)
    }

    fn context(&self, call: &ToolCall, tool: &DirectTool, started: Instant) -> ToolContext {
        ToolContext {
            call_id: Arc::clone(&call.id),
            deadline: started + tool.policy.timeout,
            cancel: self.cancel.clone(),
        }
    }

    /// Runs an inline handler in place, panic caught.
    fn run_inline(
        &self,
        call: ToolCall,
        tool: &DirectTool,
        arrived: Instant,
    ) -> ToolDispatchResult {
        let Handler::Inline(f) = &tool.handler else {
            unreachable!("run_inline is only called for inline handlers")
        };
        let started = Instant::now();
        let ctx = self.context(&call, tool, started);
        let outcome = catch_unwind(AssertUnwindSafe(|| f(&call.arguments, &ctx)))
            .unwrap_or_else(|panic| Err(panicked(&*panic)));
        finish(call, tool, outcome, arrived, started)
    }

    /// Runs an async handler (awaited in place) or a blocking one (on the blocking pool), panic
    /// caught.
    async fn run_waiting(
        &self,
        mut call: ToolCall,
        tool: &DirectTool,
        arrived: Instant,
    ) -> ToolDispatchResult {
        let started = Instant::now();
        let ctx = self.context(&call, tool, started);
        let args = std::mem::take(&mut call.arguments);
        let outcome = match &tool.handler {
            Handler::Async(f) => {
                // The handler is called inside the future so that a panic while building it is
                // caught too.
                AssertUnwindSafe(async move { f(args, ctx).await })
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| Err(panicked(&*panic)))
            }
            Handler::Blocking(f) => {
                let f = Arc::clone(f);
                match tokio::task::spawn_blocking(move || f(&args, &ctx)).await {
                    Ok(outcome) => outcome,
                    Err(e) if e.is_panic() => Err(panicked(&*e.into_panic())),
                    Err(e) => Err(ToolError::execution(format!("handler task failed: {e}"))),
                }
            }
            Handler::Inline(_) => {
                call.arguments = args;
                return self.run_inline(call, tool, arrived);
            }
        };
        finish(call, tool, outcome, arrived, started)
    }
}

/// A call answered without running: its identity, the error, no timing.
fn rejected(call: &ToolCall, code: ErrorCode, detail: &str) -> ToolDispatchResult {
    ToolDispatchResult::error(
        Arc::clone(&call.id),
        Arc::clone(&call.name),
        code,
        detail,
        Timing::default(),
    )
}

/// A handler's outcome as a result: output (or error detail) capped, timing filled.
fn finish(
    call: ToolCall,
    tool: &DirectTool,
    outcome: ToolOutcome,
    arrived: Instant,
    started: Instant,
) -> ToolDispatchResult {
    let timing = Timing::measured(arrived, started);
    to_result(call, tool.policy.output_cap, outcome, timing)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::Engine;

    fn schema() -> Value {
        json!({"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer","minimum":0}},
               "required":["text","n"],"additionalProperties":false})
    }

    fn text_of(args: &Value) -> String {
        args["text"].as_str().unwrap_or_default().to_string()
    }

    fn specs() -> Vec<ToolSpec> {
        vec![
            ToolSpec::new(
                "noop",
                "d",
                schema(),
                Handler::inline(|a, _| Ok(text_of(a))),
            )
            .concurrency_safe(true),
            ToolSpec::new(
                "noop_serial",
                "d",
                schema(),
                Handler::inline(|a, _| Ok(text_of(a))),
            ),
            ToolSpec::new(
                "sleepy",
                "d",
                schema(),
                Handler::future(|a: Value, _| async move {
                    // Later calls finish first: the order must still be the call order.
                    let n = a["n"].as_u64().unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(20u64.saturating_sub(n))).await;
                    Ok(format!("slept {}", text_of(&a)))
                }),
            )
            .concurrency_safe(true),
            ToolSpec::new(
                "block",
                "d",
                schema(),
                Handler::blocking(|a, _| Ok(format!("blocked {}", text_of(a)))),
            ),
            ToolSpec::new(
                "boom",
                "d",
                schema(),
                Handler::inline(|_, _| panic!("boom")),
            )
            .concurrency_safe(true),
            ToolSpec::new(
                "boom_async",
                "d",
                schema(),
                Handler::future(|_: Value, _| async move { panic!("async boom") }),
            )
            .concurrency_safe(true),
            ToolSpec::new(
                "fails",
                "d",
                schema(),
                Handler::inline(|_, _| Err(ToolError::permission("not here"))),
            ),
            ToolSpec::new(
                "long",
                "d",
                schema(),
                Handler::inline(|_, _| Ok("x".repeat(100))),
            )
            .output_cap(20),
        ]
    }

    fn call(id: &str, name: &str, n: i64) -> ToolCall {
        ToolCall::new(id, name, json!({"text": format!("t{n}"), "n": n}))
    }

    /// What both dispatchers must agree on: identity, content and code (not timings).
    fn contents(
        results: &[ToolDispatchResult],
    ) -> Vec<(String, String, String, Option<ErrorCode>)> {
        results
            .iter()
            .map(|r| {
                (
                    r.tool_use_id.to_string(),
                    r.tool_name.to_string(),
                    r.content.clone(),
                    r.error,
                )
            })
            .collect()
    }

    async fn both(turn: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
        let engine = Engine::builder().tools(specs()).build().unwrap();
        let direct = DirectDispatcher::new(specs()).unwrap();
        let from_engine = engine.dispatch(turn.clone()).await;
        let from_direct = direct.dispatch(turn.clone()).await;
        assert_eq!(from_direct.len(), turn.len());
        assert_eq!(contents(&from_direct), contents(&from_engine));
        let session = engine.session().dispatch(turn).await;
        assert_eq!(contents(&from_direct), contents(&session));
        engine.shutdown(Duration::from_secs(1)).await;
        from_direct
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_unknown_invalid_and_ok_like_the_engine() {
        let malformed = ToolCall::with_malformed_arguments("m", "noop", "not JSON");
        let turn = vec![
            call("a", "noop", 1),
            call("b", "nope", 2),
            call("c", "Noop", 3),
            ToolCall::new("d", "noop", json!({"text": "x", "n": -1})),
            ToolCall::new("e", "noop", json!({"text": "x", "n": "10"})),
            ToolCall::new("f", "noop", json!([1, 2])),
            malformed,
            call("", "noop", 4),
            call("g", "", 5),
            call("h", "noop_serial", 6),
            call("i", "fails", 7),
            call("j", "long", 8),
            call("k", &"z".repeat(300), 9),
        ];
        let results = both(turn).await;
        let codes: Vec<_> = results.iter().map(|r| r.outcome()).collect();
        assert_eq!(
            codes,
            [
                "ok",
                "unknown_tool",
                "unknown_tool",
                "invalid_arguments",
                "invalid_arguments",
                "invalid_arguments",
                "invalid_arguments",
                "invalid_arguments",
                "unknown_tool",
                "ok",
                "permission_denied",
                "ok",
                "unknown_tool",
            ]
        );
        assert_eq!(results[0].content, "t1");
        assert_eq!(
            results[1].content,
            "Error [unknown_tool]: tool is not registered: nope"
        );
        assert!(
            results[3]
                .content
                .starts_with("Error [invalid_arguments]: /n: ")
        );
        assert!(results[11].content.contains("bytes truncated"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_stages_in_order_and_answers_in_call_order_like_the_engine() {
        let turn = vec![
            call("a", "sleepy", 0),
            call("b", "sleepy", 5),
            call("c", "noop", 6),
            call("d", "sleepy", 10),
            call("e", "block", 11),
            call("f", "noop_serial", 12),
            call("g", "boom", 13),
            call("h", "boom_async", 14),
            call("i", "sleepy", 15),
        ];
        let results = both(turn).await;
        let got: Vec<_> = results.iter().map(|r| r.content.as_str()).collect();
        assert_eq!(
            got,
            [
                "slept t0",
                "slept t5",
                "t6",
                "slept t10",
                "blocked t11",
                "t12",
                "Error [execution_error]: handler panicked: boom",
                "Error [execution_error]: handler panicked: async boom",
                "slept t15",
            ]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_duplicate_id_answers_the_whole_turn_like_the_engine() {
        let results = both(vec![
            call("a", "noop", 1),
            call("b", "nope", 2),
            call("a", "noop", 3),
        ])
        .await;
        assert!(
            results
                .iter()
                .all(|r| r.error == Some(ErrorCode::InvalidArguments))
        );
        assert!(both(Vec::new()).await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_concurrent_stage_runs_its_async_calls_together_and_a_serial_one_alone() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let counted = |name: &str, safe: bool| {
            let (running, peak) = (Arc::clone(&running), Arc::clone(&peak));
            ToolSpec::new(
                name,
                "d",
                schema(),
                Handler::future(move |_: Value, _| {
                    let (running, peak) = (Arc::clone(&running), Arc::clone(&peak));
                    async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok(String::new())
                    }
                }),
            )
            .concurrency_safe(safe)
        };
        let direct =
            DirectDispatcher::new([counted("safe", true), counted("serial", false)]).unwrap();
        let turn = |name: &str| -> Vec<ToolCall> {
            (0..8).map(|i| call(&format!("c{i}"), name, i)).collect()
        };
        assert!(
            direct
                .dispatch(turn("safe"))
                .await
                .iter()
                .all(|r| r.is_ok())
        );
        assert_eq!(peak.swap(0, Ordering::SeqCst), 8);
        assert!(
            direct
                .dispatch(turn("serial"))
                .await
                .iter()
                .all(|r| r.is_ok())
        );
        assert_eq!(peak.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn refuses_what_the_registry_refuses() {
        let noop = || Handler::inline(|_, _| Ok(String::new()));
        assert!(matches!(
            DirectDispatcher::new([ToolSpec::new("", "d", schema(), noop())]),
            Err(RegistryError::EmptyName)
        ));
        assert!(matches!(
            DirectDispatcher::new([ToolSpec::new("a b", "d", schema(), noop())]),
            Err(RegistryError::InvalidName(_))
        ));
        assert!(matches!(
            DirectDispatcher::new([
                ToolSpec::new("a", "d", schema(), noop()),
                ToolSpec::new("a", "d", schema(), noop()),
            ]),
            Err(RegistryError::Duplicate(_))
        ));
        assert!(matches!(
            DirectDispatcher::new([ToolSpec::new("a", "d", json!({"type":"string"}), noop())]),
            Err(RegistryError::BadSchema { .. })
        ));
        let d = DirectDispatcher::new(specs()).unwrap();
        assert_eq!(d.len(), specs().len());
        assert!(d.contains("noop") && !d.contains("NOOP") && !d.is_empty());
    }
}
