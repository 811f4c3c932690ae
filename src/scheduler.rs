//! The Scheduler actor: turns one turn's calls into a plan and runs it, stage by stage.
//!
//! For each turn (one [`DispatchTurn`] message) it:
//! 1. refreshes its cached registry [`Snapshot`] if the registry's version moved (at most one
//!    registry message per turn, usually none);
//! 2. answers, without occupying a worker, every call that cannot run: duplicate or missing
//!    `tool_use_id`s, unknown tools, undecodable or schema-invalid arguments;
//! 3. splits the rest into stages (the pure planner, [`crate::plan`]): a run of consecutive
//!    concurrency-safe calls is one concurrent stage, every other call a serial stage of its own;
//!    stages run in model order;
//! 4. runs each stage — in place when every handler is inline (one hop for a typical cheap turn),
//!    otherwise as one message to a worker — and collects the answers in call order.
//!
//! When any stage must wait, the rest of the turn runs on a spawned task, so one scheduler can
//! serve many sessions' turns at once and never blocks on a handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kameo::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use crate::collector::{Collector, ResultSink};
use crate::execute::{self, CallEnv};
use crate::observe;
use crate::plan::{self, Planned, Stage};
use crate::protocol::{ErrorCode, ToolCall, ToolDispatchResult};
use crate::registry::{GetSnapshot, Registry, Snapshot};
use crate::tool::SessionScope;
use crate::worker::{RunStage, WorkerPool};

/// A turn after planning: the collector (with rejected calls already answered), the admitted
/// calls in model order and their stages.
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
    /// The session the turn belongs to.
    pub scope: Arc<SessionScope>,
    /// The registry view the turn was planned with (it holds the metric handles).
    pub snapshot: Arc<Snapshot>,
}

/// Plans a turn against a registry snapshot ([`plan::plan`]) and answers the rejected calls.
pub fn prepare(
    snapshot: &Arc<Snapshot>,
    calls: Vec<ToolCall>,
    arrived: Instant,
    scope: Arc<SessionScope>,
) -> TurnPlan {
    let identities = calls
        .iter()
        .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name)))
        .collect();
    let span = observe::turn_span(calls.len());
    let mut collector = Collector::new(identities);
    let plan = plan::plan(snapshot, calls);
    for r in &plan.rejected {
        let metrics = collector_metrics(snapshot, &collector, r.index);
        collector.fill_error(r.index, r.code, &r.detail, metrics);
    }
    TurnPlan {
        collector,
        runnable: plan.admitted,
        stages: plan.stages,
        arrived,
        span,
        scope,
        snapshot: Arc::clone(snapshot),
    }
}

/// The metric handles of call `index` of the turn (its tool's, or the `_unknown` label's).
fn collector_metrics<'s>(
    snapshot: &'s Snapshot,
    collector: &Collector,
    index: usize,
) -> &'s crate::metrics::ToolMetrics {
    snapshot.tool_metrics(collector.name(index).as_deref().unwrap_or_default())
}

impl TurnPlan {
    /// True when every runnable call has an inline handler (the turn can run in place).
    pub fn all_inline(&self) -> bool {
        self.runnable
            .iter()
            .all(|p| execute::runs_in_place(&p.tool, &self.scope))
    }

    /// Runs an all-inline plan in place.
    pub fn run_inline(
        mut self,
        workers: &WorkerPool,
        cancel: &CancellationToken,
    ) -> Vec<ToolDispatchResult> {
        observe::stages_started(&self.stages, &self.snapshot.metrics);
        let calls = std::mem::take(&mut self.runnable);
        self.run_in_place(calls, workers, cancel);
        self.finish()
    }

    /// Runs inline calls here, one after the other, answering each in its slot.
    fn run_in_place(
        &mut self,
        calls: Vec<Planned>,
        workers: &WorkerPool,
        cancel: &CancellationToken,
    ) {
        let env = CallEnv {
            arrived: self.arrived,
            cancel,
            limiter: workers.limiter(),
            metrics: &self.snapshot.metrics,
            span: &self.span,
            scope: &self.scope,
        };
        for p in calls {
            let (index, result, tool) = execute::run_in_place(p, env);
            self.collector.fill_with(index, result, &tool.metrics);
        }
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
                        &p.tool.metrics,
                    );
                }
                continue;
            }
            observe::stage_started(stage.mode, calls.len(), &self.snapshot.metrics);
            if calls
                .iter()
                .all(|p| execute::runs_in_place(&p.tool, &self.scope))
            {
                self.run_in_place(calls, workers, cancel);
                continue;
            }
            let answering: Vec<_> = calls
                .iter()
                .map(|p| (p.index, Arc::clone(&p.tool)))
                .collect();
            let (slot, worker) = workers.pick();
            // A streamed turn fills each slot as its call answers, not when the stage ends.
            let (progress, mut answers) = if self.collector.streams() {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                (Some(tx), Some(rx))
            } else {
                (None, None)
            };
            let ask = worker
                .ask(RunStage {
                    calls,
                    arrived: self.arrived,
                    cancel: cancel.clone(),
                    span: self.span.clone(),
                    scope: Arc::clone(&self.scope),
                    progress,
                })
                .into_future();
            let reply = match answers.as_mut() {
                None => ask.await,
                Some(rx) => {
                    tokio::pin!(ask);
                    loop {
                        tokio::select! {
                            reply = &mut ask => break reply,
                            Some((index, result, tool)) = rx.recv() => {
                                self.collector.fill_with(index, result, &tool.metrics);
                            }
                        }
                    }
                }
            };
            // Answers sent before the reply are all in the channel by now.
            if let Some(rx) = answers.as_mut() {
                while let Ok((index, result, tool)) = rx.try_recv() {
                    self.collector.fill_with(index, result, &tool.metrics);
                }
            }
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
                    for (index, tool) in answering {
                        self.collector.fill_error(
                            index,
                            ErrorCode::ExecutionError,
                            &detail,
                            &tool.metrics,
                        );
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
            &self.snapshot.metrics,
        );
        let snapshot = self.snapshot;
        self.collector.finish(|name| snapshot.tool_metrics(name))
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
    /// The session the turn belongs to.
    pub scope: Arc<SessionScope>,
    /// Where each result also goes as soon as it is answered (streaming), if anywhere.
    pub sink: Option<ResultSink>,
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
        let mut plan = prepare(&self.snapshot, msg.calls, arrived, msg.scope);
        if let Some(sink) = msg.sink {
            plan.collector.attach_sink(sink);
        }
        if plan.all_inline() {
            return ctx.reply(plan.run_inline(&self.workers, &msg.cancel));
        }
        let workers = self.workers.clone();
        ctx.spawn(async move { plan.run(&workers, &msg.cancel).await })
    }
}
