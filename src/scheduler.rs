//! The scheduler: turns one turn's calls into a plan and runs it as a dependency graph.
//!
//! For each turn it:
//! 1. takes the engine's cached registry [`Snapshot`] (re-fetched from the Registry actor only
//!    when the registry's version moved, so usually no message at all);
//! 2. answers, without occupying a worker, every call that cannot run: duplicate or missing
//!    `tool_use_id`s, unknown tools, undecodable or schema-invalid arguments ([`prepare`]);
//! 3. plans the rest (the pure planner, [`crate::plan`]): each call's access (what it reads and
//!    writes, or exclusive) gives the earlier calls it conflicts with;
//! 4. starts every call as soon as every earlier call it conflicts with has finished, subject to
//!    the global and per-tool caps (taken in [`crate::execute`]), and collects the answers in
//!    call order, exactly once each ([`TurnPlan::run`], [`TurnPlan::run_inline`]).
//!
//! Steps 1–3, and the whole turn when every handler is inline, run on the caller's task (see
//! [`crate::Engine`]): a cheap turn costs no message and no wake-up of another core. A turn that
//! must wait goes to a [`Scheduler`] actor as one [`RunTurn`] and runs on a task of its own.
//!
//! The rule, for a turn `W(a) W(b) R(a) X R(b)` (W/R: write/read of a path, X: exclusive):
//!
//! ```text
//!   call 0  W(a) ──────┐
//!   call 1  W(b) ────┐ │      calls 0 and 1 start at once (different files)
//!   call 2  R(a) ◄───┼─┘      waits for 0 only (reads what 0 wrote)
//!   call 3  X    ◄───┴─ 0,1,2 waits for everything before it
//!   call 4  R(b) ◄───── 3     waits for 3 only (3 already waited for the rest)
//! ```
//!
//! Read/read never conflicts; paths conflict with their ancestors; an exclusive call conflicts
//! with everything. So the outcome equals running the calls one by one in model order.
//!
//! How the calls run: a turn whose handlers are all inline runs in place, in model order, on the
//! caller's task (no hop; model order satisfies every wait). A turn where no call waits for
//! another goes to one worker as one message. Otherwise the calls that may start together go to a
//! worker as one message; each answer comes back the moment its call ends and releases the calls
//! that waited only for it. Such a turn runs on a task the scheduler actor spawns, so one
//! scheduler serves many sessions' turns at once and never blocks on a handler.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kameo::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use crate::collector::Collector;
use crate::execute::{self, CallEnv, StartGate};
use crate::observe;
use crate::plan::{self, Graph, Planned, Stage};
use crate::policy::Policy;
use crate::protocol::{ErrorCode, ToolCall, ToolDispatchResult};
use crate::registry::{RegisteredTool, Snapshot};
use crate::tool::ProgressSink;
use crate::tool::SessionScope;
use crate::worker::{RunStage, StageResults, WorkerPool};

/// A turn after planning: the collector (with rejected calls already answered), the admitted
/// calls in model order and which earlier ones each waits for.
#[derive(Debug)]
pub struct TurnPlan {
    /// One slot per call of the turn.
    pub collector: Collector,
    /// Calls that will run, in model order.
    pub runnable: Vec<Planned>,
    /// For each runnable call, the earlier runnable calls it waits for.
    pub graph: Graph,
    /// The graph's stages (recorded in the stage metrics).
    pub stages: Vec<Stage>,
    /// When the turn arrived.
    pub arrived: Instant,
    /// The turn's tracing span (parent of every call span).
    pub span: Span,
    /// The session the turn belongs to.
    pub scope: Arc<SessionScope>,
    /// The engine's permission policy, if any.
    pub policy: Option<Arc<Policy>>,
    /// The registry view the turn was planned with (it holds the metric handles).
    pub snapshot: Arc<Snapshot>,
    /// What its guarded calls pass right before they start (the session's journal).
    pub gate: Option<Arc<dyn StartGate>>,
    /// Where its calls report live progress, when somebody listens.
    pub listener: Option<ProgressSink>,
}

/// Plans a turn against a registry snapshot ([`plan::plan`]) and answers the rejected calls.
pub fn prepare(
    snapshot: Arc<Snapshot>,
    calls: Vec<ToolCall>,
    arrived: Instant,
    scope: Arc<SessionScope>,
    policy: Option<Arc<Policy>>,
    gate: Option<Arc<dyn StartGate>>,
) -> TurnPlan {
    let identities = calls
        .iter()
        .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name)))
        .collect();
    let span = observe::turn_span(calls.len(), scope.id());
    let mut collector = Collector::new(identities);
    let mut plan = plan::plan(&snapshot, calls, scope.workspace());
    if let Some(gate) = &gate {
        for p in &mut plan.admitted {
            p.gated = gate.guards(&p.call);
        }
    }
    if let Some(deferral) = snapshot.deferral() {
        // A deferred tool called joins the session's revealed set, searched or not.
        for p in &plan.admitted {
            if deferral.is_deferred(&p.tool) {
                let noted = scope.note_deferred_call(&p.tool.name);
                snapshot
                    .metrics
                    .deferred_call(noted.unrevealed, noted.search_hit);
            }
        }
    }
    for r in &plan.rejected {
        let metrics = collector_metrics(&snapshot, &collector, r.index);
        if let Some(policy) = &policy {
            let (id, name) = collector.identity(r.index);
            policy.record_unanswered(&scope, (id, name), &r.arguments, "admission", r.code);
        }
        collector.fill_error(r.index, r.code, &r.detail, metrics);
    }
    TurnPlan {
        collector,
        runnable: plan.admitted,
        graph: plan.graph,
        stages: plan.stages,
        arrived,
        span,
        scope,
        policy,
        snapshot,
        gate,
        listener: None,
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
            .all(|p| execute::runs_in_place(p, self.policy.as_deref()))
    }

    /// Answers a call the turn's cancellation reached before it started (it never reached the
    /// policy, which audits it all the same).
    fn not_started(&mut self, p: &Planned) {
        if let Some(policy) = &self.policy {
            policy.record_unanswered(
                &self.scope,
                (&p.call.id, &p.call.name),
                &p.call.arguments,
                "cancellation",
                ErrorCode::Cancelled,
            );
        }
        self.collector.fill_error(
            p.index,
            ErrorCode::Cancelled,
            "cancelled before it started",
            &p.tool.metrics,
        );
    }

    /// Runs an all-inline plan in place.
    pub fn run_inline(
        mut self,
        workers: &WorkerPool,
        cancel: &CancellationToken,
    ) -> Vec<ToolDispatchResult> {
        observe::stages_started(&self.stages, &self.snapshot.metrics);
        let calls = std::mem::take(&mut self.runnable);
        if cancel.is_cancelled() {
            // Cancelled before it started (a turn-addressed cancel that came first): nothing runs.
            for p in &calls {
                self.not_started(p);
            }
            return self.finish();
        }
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
            policy: self.policy.as_deref(),
            gate: self.gate.as_deref(),
            listener: self.listener.as_ref(),
        };
        for p in calls {
            let (index, result, tool) = execute::run_in_place(p, env);
            self.collector.fill_with(index, result, &tool.metrics);
        }
    }

    /// Runs the plan: each call starts once every earlier call it conflicts with has finished.
    pub async fn run(
        mut self,
        workers: &WorkerPool,
        cancel: &CancellationToken,
    ) -> Vec<ToolDispatchResult> {
        observe::stages_started(&self.stages, &self.snapshot.metrics);
        let runnable = std::mem::take(&mut self.runnable);
        if self.graph.is_free() {
            // Nothing waits for anything: one batch, as one message.
            if !runnable.is_empty() {
                self.run_batch(runnable, workers, cancel).await;
            }
            return self.finish();
        }
        self.run_graph(runnable, workers, cancel).await;
        self.finish()
    }

    /// Runs calls that may all start now and waits for every answer (the free case).
    async fn run_batch(
        &mut self,
        calls: Vec<Planned>,
        workers: &WorkerPool,
        cancel: &CancellationToken,
    ) {
        if cancel.is_cancelled() {
            for p in &calls {
                self.not_started(p);
            }
            return;
        }
        if calls
            .iter()
            .all(|p| execute::runs_in_place(p, self.policy.as_deref()))
        {
            self.run_in_place(calls, workers, cancel);
            return;
        }
        let answering: Vec<_> = calls
            .iter()
            .map(|p| (p.index, Arc::clone(&p.tool)))
            .collect();
        // A streamed turn fills each slot as its call answers, not when the batch ends.
        let (progress, mut answers) = if self.collector.streams() {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let (slot, worker) = workers.pick();
        let ask = worker
            .ask(self.message(calls, cancel, progress))
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
            Err(e) => self.worker_lost(workers, slot, &e.to_string(), answering),
        }
    }

    /// The message that runs `calls` on a worker.
    fn message(
        &self,
        calls: Vec<Planned>,
        cancel: &CancellationToken,
        progress: Option<crate::worker::StageProgress>,
    ) -> RunStage {
        RunStage {
            calls,
            arrived: self.arrived,
            cancel: cancel.clone(),
            span: self.span.clone(),
            scope: Arc::clone(&self.scope),
            policy: self.policy.clone(),
            gate: self.gate.clone(),
            listener: self.listener.clone(),
            progress,
        }
    }

    /// Sends calls to the next worker as one message; returns the worker's slot and the reply.
    fn send(
        &self,
        calls: Vec<Planned>,
        workers: &WorkerPool,
        cancel: &CancellationToken,
        progress: Option<crate::worker::StageProgress>,
    ) -> (usize, BatchReply) {
        let (slot, worker) = workers.pick();
        let msg = self.message(calls, cancel, progress);
        let reply: BatchReply =
            Box::pin(async move { worker.ask(msg).await.map_err(|e| e.to_string()) });
        (slot, reply)
    }

    /// The worker of `slot` is gone: its open calls are still answered, once, and it is replaced.
    fn worker_lost(
        &mut self,
        workers: &WorkerPool,
        slot: usize,
        error: &str,
        answering: Vec<(usize, Arc<RegisteredTool>)>,
    ) {
        workers.replace_if_dead(slot);
        let detail = format!("worker unavailable: {error}");
        for (index, tool) in answering {
            self.collector
                .fill_error(index, ErrorCode::ExecutionError, &detail, &tool.metrics);
        }
    }

    /// Runs a turn whose calls wait for each other: starts every call whose waits are over, and
    /// on each answer releases the calls that waited for it.
    async fn run_graph(
        &mut self,
        runnable: Vec<Planned>,
        workers: &WorkerPool,
        cancel: &CancellationToken,
    ) {
        let graph = std::mem::take(&mut self.graph);
        let n = runnable.len();
        let mut pending = graph.pending_counts();
        let (offsets, dependants) = graph.dependants();
        // Turn index → position among the runnable calls.
        let mut position = vec![u32::MAX; self.collector.len()];
        for (k, p) in runnable.iter().enumerate() {
            position[p.index] = k as u32;
        }
        let mut waiting: Vec<Option<Planned>> = runnable.into_iter().map(Some).collect();
        let mut finished = vec![false; n];
        let mut ready: Vec<usize> = (0..n).filter(|&k| pending[k] == 0).collect();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut in_flight = FuturesUnordered::new();
        let mut left = n;

        // Marks call `k` finished and queues the calls that waited only for it.
        let mut release =
            |k: usize, finished: &mut Vec<bool>, ready: &mut Vec<usize>, left: &mut usize| {
                if std::mem::replace(&mut finished[k], true) {
                    return;
                }
                *left -= 1;
                for &j in &dependants[offsets[k] as usize..offsets[k + 1] as usize] {
                    let j = j as usize;
                    pending[j] -= 1;
                    if pending[j] == 0 {
                        ready.push(j);
                    }
                }
            };

        while left > 0 {
            while !ready.is_empty() {
                let batch: Vec<Planned> = std::mem::take(&mut ready)
                    .into_iter()
                    .filter_map(|k| waiting[k].take())
                    .collect();
                for p in &batch {
                    if !graph.waits_for(position[p.index] as usize).is_empty() {
                        p.tool.metrics.conflict_waited(self.arrived.elapsed());
                    }
                }
                if cancel.is_cancelled() {
                    for p in batch {
                        self.not_started(&p);
                        release(
                            position[p.index] as usize,
                            &mut finished,
                            &mut ready,
                            &mut left,
                        );
                    }
                    continue;
                }
                if batch
                    .iter()
                    .all(|p| execute::runs_in_place(p, self.policy.as_deref()))
                {
                    let indices: Vec<usize> = batch.iter().map(|p| p.index).collect();
                    self.run_in_place(batch, workers, cancel);
                    for index in indices {
                        release(
                            position[index] as usize,
                            &mut finished,
                            &mut ready,
                            &mut left,
                        );
                    }
                    continue;
                }
                let answering: Vec<_> = batch
                    .iter()
                    .map(|p| (p.index, Arc::clone(&p.tool)))
                    .collect();
                let (slot, reply) = self.send(batch, workers, cancel, Some(tx.clone()));
                in_flight.push(async move { (slot, answering, reply.await) });
            }
            // Answers already in the channel release their dependants before anything waits.
            while let Ok((index, result, tool)) = rx.try_recv() {
                self.collector.fill_with(index, result, &tool.metrics);
                release(
                    position[index] as usize,
                    &mut finished,
                    &mut ready,
                    &mut left,
                );
            }
            if left == 0 || !ready.is_empty() {
                continue;
            }
            tokio::select! {
                Some((index, result, tool)) = rx.recv() => {
                    self.collector.fill_with(index, result, &tool.metrics);
                    release(position[index] as usize, &mut finished, &mut ready, &mut left);
                }
                Some((slot, answering, reply)) = in_flight.next() => {
                    // Progress sent before the reply is in the channel by now.
                    while let Ok((index, result, tool)) = rx.try_recv() {
                        self.collector.fill_with(index, result, &tool.metrics);
                        release(position[index] as usize, &mut finished, &mut ready, &mut left);
                    }
                    match reply {
                        Ok(results) => {
                            for (index, result, tool) in results {
                                self.collector.fill_with(index, result, &tool.metrics);
                                release(position[index] as usize, &mut finished, &mut ready, &mut left);
                            }
                        }
                        Err(e) => {
                            let open: Vec<_> = answering
                                .into_iter()
                                .filter(|(index, _)| !finished[position[*index] as usize])
                                .collect();
                            let indices: Vec<usize> = open.iter().map(|(i, _)| *i).collect();
                            self.worker_lost(workers, slot, &e, open);
                            for index in indices {
                                release(position[index] as usize, &mut finished, &mut ready, &mut left);
                            }
                        }
                    }
                }
            }
        }
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

/// A worker's reply to one batch (its error as text).
type BatchReply =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<StageResults, String>> + Send>>;

/// The Scheduler actor: runs the turns that must wait (for a worker, a handler, or an earlier
/// conflicting call) on a task of their own and replies with their ordered results.
///
/// Planning and all-inline turns never reach it: [`crate::Engine`] plans every turn on the
/// caller's task with the engine's cached registry snapshot, and runs a turn whose handlers are
/// all inline right there ([`TurnPlan::run_inline`]), which saves the round trip to the actor and
/// the wake-up of another core it caused. Only a turn with async or blocking calls, or one whose
/// calls wait for each other, is sent here as one [`RunTurn`] message.
#[derive(Actor)]
pub struct Scheduler {
    workers: WorkerPool,
}

impl Scheduler {
    /// A scheduler running turns on `workers`.
    pub fn new(workers: WorkerPool) -> Self {
        Scheduler { workers }
    }
}

/// Run one planned turn; the reply is one result per call, in call order.
#[derive(Debug)]
pub struct RunTurn {
    /// The planned turn (rejected calls already answered, a sink already attached).
    pub plan: TurnPlan,
    /// Cancelling it answers the turn's open calls `cancelled`.
    pub cancel: CancellationToken,
}

impl Message<RunTurn> for Scheduler {
    type Reply = DelegatedReply<Vec<ToolDispatchResult>>;

    async fn handle(&mut self, msg: RunTurn, ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        let workers = self.workers.clone();
        let RunTurn { plan, cancel } = msg;
        ctx.spawn(async move { plan.run(&workers, &cancel).await })
    }
}
