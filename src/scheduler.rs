//! The Scheduler actor: turns one turn's calls into a plan and runs it, stage by stage.
//!
//! For each turn (one [`DispatchTurn`] message) it:
//! 1. refreshes its cached registry [`Snapshot`] if the registry's version moved (at most one
//!    registry message per turn, usually none);
//! 2. answers, without occupying a worker, every call that cannot run: duplicate or missing
//!    `tool_use_id`s, unknown tools, undecodable or schema-invalid arguments;
//! 3. splits the rest with the pure [`partition`]: a run of consecutive concurrency-safe calls is
//!    one concurrent stage, every other call a serial stage of its own; stages run in model order;
//! 4. runs each stage — in place when every handler is inline (one hop for a typical cheap turn),
//!    otherwise as one message to a worker — and collects the answers in call order.
//!
//! When any stage must wait, the rest of the turn runs on a spawned task, so one scheduler can
//! serve many sessions' turns at once and never blocks on a handler.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kameo::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use crate::collector::Collector;
use crate::observe;
use crate::protocol::{ErrorCode, ToolCall, ToolDispatchResult};
use crate::registry::{GetSnapshot, Registry, Snapshot};
use crate::validation;
use crate::worker::{Planned, RunStage, WorkerPool, run_inline};

/// How a stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageMode {
    /// Calls of the stage run at the same time.
    Concurrent,
    /// A single call that runs alone.
    Serial,
}

impl StageMode {
    /// `concurrent` or `serial`.
    pub fn as_str(self) -> &'static str {
        match self {
            StageMode::Concurrent => "concurrent",
            StageMode::Serial => "serial",
        }
    }
}

/// A contiguous slice of a turn's runnable calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Concurrent or serial.
    pub mode: StageMode,
    /// Positions in the runnable-call list.
    pub calls: Range<usize>,
}

/// Splits calls into stages from their concurrency safety, in model order: a maximal run of
/// consecutive safe calls becomes one concurrent stage; every unsafe call is a serial stage of its
/// own. Pure; the order of stages is the order of the calls.
pub fn partition(safe: &[bool]) -> Vec<Stage> {
    let mut stages = Vec::new();
    let mut i = 0;
    while i < safe.len() {
        if safe[i] {
            let start = i;
            while i < safe.len() && safe[i] {
                i += 1;
            }
            stages.push(Stage {
                mode: StageMode::Concurrent,
                calls: start..i,
            });
        } else {
            stages.push(Stage {
                mode: StageMode::Serial,
                calls: i..i + 1,
            });
            i += 1;
        }
    }
    stages
}

/// A turn after lookup and validation: the collector (with rejected calls already answered), the
/// runnable calls in model order and their stages.
#[derive(Debug)]
pub struct TurnPlan {
    /// One slot per call of the turn.
    pub collector: Collector,
    /// Calls that will run, in model order.
    pub runnable: Vec<Planned>,
    /// How they run.
    pub stages: Vec<Stage>,
    /// When the turn arrived.
    pub arrived: Instant,
    /// The turn's tracing span (parent of every call span).
    pub span: Span,
}

/// Looks up, validates and partitions a turn against a registry snapshot.
pub fn plan(snapshot: &Arc<Snapshot>, calls: Vec<ToolCall>, arrived: Instant) -> TurnPlan {
    let identities = calls
        .iter()
        .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name)))
        .collect();
    let span = observe::turn_span(calls.len());
    let mut collector = Collector::new(identities, Arc::clone(snapshot));
    if let Some(dup) = duplicate_id(&calls) {
        collector.fill_open(
            ErrorCode::InvalidArguments,
            &format!("duplicate tool_use_id in this turn: {dup}; no call of the turn was run"),
        );
        return TurnPlan {
            collector,
            runnable: Vec::new(),
            stages: Vec::new(),
            arrived,
            span,
        };
    }
    let mut runnable = Vec::with_capacity(calls.len());
    for (index, call) in calls.into_iter().enumerate() {
        if call.id.is_empty() {
            collector.fill_error(
                index,
                ErrorCode::InvalidArguments,
                "missing or empty tool_use_id",
            );
            continue;
        }
        let Some(tool) = snapshot.get(&call.name) else {
            let shown = if call.name.is_empty() {
                "<empty>".to_string()
            } else {
                clamp(&call.name, 200)
            };
            collector.fill_error(
                index,
                ErrorCode::UnknownTool,
                &format!("tool is not registered: {shown}"),
            );
            continue;
        };
        if let Some(left) = tool.breaker.tripped() {
            let (max, window) = tool.breaker.limit();
            collector.fill_error(
                index,
                ErrorCode::ExecutionError,
                &format!(
                    "tool {} is disabled: its handler panicked more than {max} times within {}s; \
                     it is retried in {}s",
                    tool.name,
                    window.as_secs(),
                    left.as_secs().max(1)
                ),
            );
            continue;
        }
        if let Some(detail) = &call.malformed {
            collector.fill_error(index, ErrorCode::InvalidArguments, detail);
            continue;
        }
        if let Err(detail) = validation::check(&tool.validator, &call.arguments) {
            collector.fill_error(index, ErrorCode::InvalidArguments, &detail);
            continue;
        }
        runnable.push(Planned {
            index,
            call,
            tool: Arc::clone(tool),
        });
    }
    let safe: Vec<bool> = runnable
        .iter()
        .map(|p| p.tool.policy.concurrency_safe)
        .collect();
    TurnPlan {
        collector,
        stages: partition(&safe),
        runnable,
        arrived,
        span,
    }
}

/// The first `tool_use_id` that occurs twice in the turn (empty ids are not duplicates).
pub(crate) fn duplicate_id(calls: &[ToolCall]) -> Option<&str> {
    if calls.len() < 2 {
        return None;
    }
    if calls.len() <= 16 {
        for (i, a) in calls.iter().enumerate() {
            if !a.id.is_empty() && calls[i + 1..].iter().any(|b| b.id == a.id) {
                return Some(&a.id);
            }
        }
        return None;
    }
    let mut seen = HashSet::with_capacity(calls.len());
    calls
        .iter()
        .find(|c| !c.id.is_empty() && !seen.insert(&*c.id))
        .map(|c| &*c.id)
}

/// At most `max` bytes of `s` (on a character boundary), noting the full length when cut.
pub(crate) fn clamp(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

impl TurnPlan {
    /// True when every runnable call has an inline handler (the turn can run in place).
    pub fn all_inline(&self) -> bool {
        self.runnable.iter().all(|p| p.tool.handler.is_inline())
    }

    /// Runs an all-inline plan in place.
    pub fn run_inline(mut self, cancel: &CancellationToken) -> Vec<ToolDispatchResult> {
        observe::stages_started(&self.stages, &self.collector.snapshot().metrics);
        for p in std::mem::take(&mut self.runnable) {
            let result = run_inline(p.call, &p.tool, self.arrived, cancel, &self.span);
            self.collector.fill_with(p.index, result, &p.tool.metrics);
        }
        self.finish()
    }

    /// Runs the plan stage by stage, sending each stage that must wait to a worker.
    pub async fn run(
        mut self,
        workers: &WorkerPool,
        cancel: &CancellationToken,
    ) -> Vec<ToolDispatchResult> {
        let mut runnable = std::mem::take(&mut self.runnable).into_iter();
        for stage in std::mem::take(&mut self.stages) {
            let calls: Vec<Planned> = runnable.by_ref().take(stage.calls.len()).collect();
            if cancel.is_cancelled() {
                for p in &calls {
                    self.collector.fill_error(
                        p.index,
                        ErrorCode::Cancelled,
                        "cancelled before it started",
                    );
                }
                continue;
            }
            observe::stage_started(stage.mode, calls.len(), &self.collector.snapshot().metrics);
            if calls.iter().all(|p| p.tool.handler.is_inline()) {
                for p in calls {
                    let result = run_inline(p.call, &p.tool, self.arrived, cancel, &self.span);
                    self.collector.fill_with(p.index, result, &p.tool.metrics);
                }
                continue;
            }
            let indices: Vec<usize> = calls.iter().map(|p| p.index).collect();
            let (slot, worker) = workers.pick();
            let reply = worker
                .ask(RunStage {
                    calls,
                    arrived: self.arrived,
                    cancel: cancel.clone(),
                    span: self.span.clone(),
                })
                .await;
            match reply {
                Ok(results) => {
                    for (index, result, tool) in results {
                        self.collector.fill_with(index, result, &tool.metrics);
                    }
                }
                Err(e) => {
                    // The worker is gone: its calls are still answered, once, and it is replaced.
                    workers.replace_if_dead(slot);
                    let detail = format!("worker unavailable: {e}");
                    for index in indices {
                        self.collector
                            .fill_error(index, ErrorCode::ExecutionError, &detail);
                    }
                }
            }
        }
        self.finish()
    }

    fn finish(self) -> Vec<ToolDispatchResult> {
        observe::turn_dispatched(
            self.collector.len(),
            self.arrived.elapsed(),
            &self.collector.snapshot().metrics,
        );
        self.collector.finish()
    }
}

/// The Scheduler actor's state: a cached registry snapshot and the worker pool.
#[derive(Actor)]
pub struct Scheduler {
    registry: ActorRef<Registry>,
    version: Arc<AtomicU64>,
    snapshot: Arc<Snapshot>,
    workers: WorkerPool,
}

impl Scheduler {
    /// A scheduler reading `registry` (whose version is published in `version`).
    pub fn new(
        registry: ActorRef<Registry>,
        version: Arc<AtomicU64>,
        snapshot: Arc<Snapshot>,
        workers: WorkerPool,
    ) -> Self {
        Scheduler {
            registry,
            version,
            snapshot,
            workers,
        }
    }

    async fn refresh(&mut self) {
        if self.version.load(Ordering::Acquire) != self.snapshot.version
            && let Ok(snapshot) = self.registry.ask(GetSnapshot).await
        {
            self.snapshot = snapshot;
        }
    }
}

/// Dispatch one turn; the reply is one result per call, in call order.
#[derive(Debug)]
pub struct DispatchTurn {
    /// The turn's calls, in model order.
    pub calls: Vec<ToolCall>,
    /// Cancelling it answers the turn's open calls `cancelled`.
    pub cancel: CancellationToken,
}

impl Message<DispatchTurn> for Scheduler {
    type Reply = DelegatedReply<Vec<ToolDispatchResult>>;

    async fn handle(
        &mut self,
        msg: DispatchTurn,
        ctx: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        let arrived = Instant::now();
        self.refresh().await;
        let plan = plan(&self.snapshot, msg.calls, arrived);
        if plan.all_inline() {
            return ctx.reply(plan.run_inline(&msg.cancel));
        }
        let workers = self.workers.clone();
        ctx.spawn(async move { plan.run(&workers, &msg.cancel).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(safe: &[bool]) -> Vec<(StageMode, Range<usize>)> {
        partition(safe)
            .into_iter()
            .map(|s| (s.mode, s.calls))
            .collect()
    }

    #[test]
    fn consecutive_safe_calls_form_one_concurrent_stage() {
        use StageMode::*;
        assert_eq!(modes(&[true, true, true]), vec![(Concurrent, 0..3)]);
        assert_eq!(
            modes(&[true, true, false, true]),
            vec![(Concurrent, 0..2), (Serial, 2..3), (Concurrent, 3..4)]
        );
    }

    #[test]
    fn every_unsafe_call_is_a_serial_stage_of_its_own() {
        use StageMode::*;
        assert_eq!(modes(&[false, false]), vec![(Serial, 0..1), (Serial, 1..2)]);
        assert!(partition(&[]).is_empty());
    }

    #[test]
    fn stages_cover_every_call_once_in_order() {
        for mask in 0u32..256 {
            let safe: Vec<bool> = (0..8).map(|i| mask & (1 << i) != 0).collect();
            let stages = partition(&safe);
            let mut next = 0;
            for s in &stages {
                assert_eq!(s.calls.start, next);
                assert!(!s.calls.is_empty());
                if s.mode == StageMode::Serial {
                    assert_eq!(s.calls.len(), 1);
                    assert!(!safe[s.calls.start]);
                } else {
                    assert!(safe[s.calls.clone()].iter().all(|&x| x));
                }
                next = s.calls.end;
            }
            assert_eq!(next, 8);
        }
    }
}
