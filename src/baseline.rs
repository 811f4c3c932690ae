//! The direct baseline: the engine's per-turn work with no actors, for benchmarks and `load`.
//!
//! A [`DirectDispatcher`] holds the tools of a list of [`ToolSpec`]s (validators compiled once)
//! and [`DirectDispatcher::dispatch`]es a turn **in the caller's own
//! task**: no registry, scheduler or worker actor, no message, no spawned task for cheap work. It
//! answers a turn the way the engine does —
//!
//! * the same plan, from the same code: [`crate::plan::plan`] over a registry [`Snapshot`] built
//!   with the registry's own checks — duplicate ids, missing ids, unknown tools, tripped breakers,
//!   undecodable arguments and schema violations become results without running anything, and
//!   each admitted call waits for the same earlier conflicting calls (the same dependency graph);
//! * the same per-call layer stack, from the same code: [`crate::execute`] (caps, policy,
//!   deadline and cancellation, handler, output cap); inline handlers run in place; a call
//!   starts as soon as the calls it waits for have finished, and running calls are polled
//!   together (`FuturesUnordered`); blocking handlers go to tokio's blocking pool;
//! * one result per call, in call order.
//!
//! What it leaves out, so that it is a lower bound on the engine's cost: the actors (registry,
//! scheduler and worker hops), the collector (its metrics and tracing events) and any contention
//! on the global cap (its own cap is as large as a semaphore allows). Encoding is the caller's
//! job, as with the engine (e.g. [`crate::protocol::encode_anthropic`]).
//!
//! ```no_run
//! # async fn demo(specs: Vec<switchboard::ToolSpec>, calls: Vec<switchboard::ToolCall>) {
//! use switchboard::testing::DirectDispatcher;
//! use switchboard::protocol::encode_anthropic;
//!
//! let direct = DirectDispatcher::new(specs).expect("valid tools");
//! let results = direct.dispatch(calls).await;
//! let message = encode_anthropic(&results);
//! # let _ = message;
//! # }
//! ```

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use crate::execute::{self, CallEnv};
use crate::limiter::Limiter;
use crate::metrics::EngineMetrics;
use crate::plan::{self, Planned};
use crate::protocol::{ToolCall, ToolDispatchResult};
use crate::registry::{RegistryError, Snapshot};
use crate::tool::{SessionScope, ToolSpec};
use crate::workspace::Workspace;

/// Dispatches turns in the caller's task, without actors: the baseline the engine is measured
/// against. What it does and leaves out is said in `baseline.rs`.
///
/// Immutable once built and `Send + Sync`: share it behind an `Arc` between sessions.
pub struct DirectDispatcher {
    snapshot: Arc<Snapshot>,
    cancel: CancellationToken,
    limiter: Limiter,
    metrics: EngineMetrics,
    scope: Arc<SessionScope>,
}

impl std::fmt::Debug for DirectDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.snapshot.tools().map(|t| &*t.name).collect();
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
        Ok(DirectDispatcher {
            snapshot: Snapshot::from_specs(specs)?,
            cancel: CancellationToken::new(),
            limiter: Limiter::new(tokio::sync::Semaphore::MAX_PERMITS, 0),
            metrics: crate::metrics::detached(EngineMetrics::new),
            scope: Arc::new(SessionScope::new("direct", None)),
        })
    }

    /// The same dispatcher with its calls confined to `workspace` (for the built-in tools).
    pub fn with_workspace(mut self, workspace: Workspace) -> Self {
        self.scope = Arc::new(SessionScope::new("direct", Some(workspace)));
        self
    }

    /// How many tools it knows.
    pub fn len(&self) -> usize {
        self.snapshot.len()
    }

    /// True when it knows no tool.
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_empty()
    }

    /// True when a tool of exactly this name is known (no trimming, no case folding).
    pub fn contains(&self, name: &str) -> bool {
        self.snapshot.get(name).is_some()
    }

    /// Dispatches one turn in the calling task: one result per call, in call order, with the same
    /// contents and error codes as [`crate::Engine::dispatch`] gives for the same turn (timings
    /// aside). Never fails: every problem is a result. Needs a tokio runtime for async and
    /// blocking handlers.
    pub async fn dispatch(&self, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
        if calls.is_empty() {
            return Vec::new();
        }
        let arrived = Instant::now();
        let identities: Vec<(Arc<str>, Arc<str>)> = calls
            .iter()
            .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name)))
            .collect();
        let plan = plan::plan(&self.snapshot, calls, self.scope.workspace());
        let mut slots: Vec<Option<ToolDispatchResult>> = Vec::new();
        slots.resize_with(identities.len(), || None);
        for r in plan.rejected {
            let (id, name) = &identities[r.index];
            slots[r.index] = Some(execute::not_started(
                ToolCall::new(Arc::clone(id), Arc::clone(name), serde_json::Value::Null),
                r.code,
                &r.detail,
            ));
        }
        let span = Span::none();
        let env = CallEnv {
            arrived,
            cancel: &self.cancel,
            limiter: &self.limiter,
            metrics: &self.metrics,
            span: &span,
            scope: &self.scope,
            policy: None,
            gate: None,
            listener: None,
        };
        if plan.graph.is_free() {
            // Nothing waits for anything: inline calls in place, the rest polled together.
            let mut waiting = Vec::new();
            for p in plan.admitted {
                if execute::runs_in_place(&p, env.policy) {
                    let (index, result, _) = execute::run_in_place(p, env);
                    slots[index] = Some(result);
                } else {
                    waiting.push(p);
                }
            }
            if !waiting.is_empty() {
                let runs = waiting.into_iter().map(|p| execute::run(p, env));
                for (index, result, _) in join_all(runs).await {
                    slots[index] = Some(result);
                }
            }
        } else {
            run_graph(plan.admitted, &plan.graph, env, &mut slots).await;
        }
        slots.into_iter().flatten().collect()
    }
}

/// Runs calls that wait for each other: each starts once the calls it waits for have finished.
async fn run_graph(
    admitted: Vec<Planned>,
    graph: &plan::Graph,
    env: CallEnv<'_>,
    slots: &mut [Option<ToolDispatchResult>],
) {
    let mut pending = graph.pending_counts();
    let (offsets, dependants) = graph.dependants();
    let mut position = vec![0usize; slots.len()];
    for (k, p) in admitted.iter().enumerate() {
        position[p.index] = k;
    }
    let mut waiting: Vec<Option<Planned>> = admitted.into_iter().map(Some).collect();
    let mut ready: Vec<usize> = (0..waiting.len()).filter(|&k| pending[k] == 0).collect();
    let mut running = FuturesUnordered::new();
    loop {
        while let Some(k) = ready.pop() {
            let Some(p) = waiting[k].take() else { continue };
            if execute::runs_in_place(&p, env.policy) {
                let (index, result, _) = execute::run_in_place(p, env);
                slots[index] = Some(result);
                release(k, &offsets, &dependants, &mut pending, &mut ready);
            } else {
                running.push(execute::run(p, env));
            }
        }
        let Some((index, result, _)) = running.next().await else {
            break;
        };
        slots[index] = Some(result);
        release(
            position[index],
            &offsets,
            &dependants,
            &mut pending,
            &mut ready,
        );
    }
}

/// Call `k` finished: queues the calls that waited only for it.
fn release(
    k: usize,
    offsets: &[u32],
    dependants: &[u32],
    pending: &mut [u32],
    ready: &mut Vec<usize>,
) {
    for &j in &dependants[offsets[k] as usize..offsets[k + 1] as usize] {
        pending[j as usize] -= 1;
        if pending[j as usize] == 0 {
            ready.push(j as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::Engine;
    use crate::protocol::ErrorCode;
    use crate::tool::{Handler, ToolError};

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
                Handler::inline::<_, String>(|_, _| panic!("boom")),
            )
            .concurrency_safe(true),
            ToolSpec::new(
                "boom_async",
                "d",
                schema(),
                Handler::future::<_, _, String>(|_: Value, _| async move { panic!("async boom") }),
            )
            .concurrency_safe(true),
            ToolSpec::new(
                "fails",
                "d",
                schema(),
                Handler::inline::<_, String>(|_, _| Err(ToolError::permission("not here"))),
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
        let from_engine = engine.dispatch(turn.clone()).await.unwrap();
        let from_direct = direct.dispatch(turn.clone()).await;
        assert_eq!(from_direct.len(), turn.len());
        assert_eq!(contents(&from_direct), contents(&from_engine));
        let session = engine.session().dispatch(turn).await.unwrap();
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
                        // Stay until all eight are inside (or 100 ms pass, as a serial call
                        // must): a loaded machine cannot make overlapping calls look serial.
                        let until = tokio::time::Instant::now() + Duration::from_millis(100);
                        while peak.load(Ordering::SeqCst) < 8 && tokio::time::Instant::now() < until
                        {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
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
