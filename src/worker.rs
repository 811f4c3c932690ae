//! Worker actors: run the batches of calls they are given.
//!
//! A batch — calls of one turn that may start together: every call of a turn none of whose calls
//! waits for another, or the calls one answer released (see [`crate::scheduler`]) — arrives as
//! **one** message ([`RunStage`]) carrying all its calls. Calls whose handler
//! runs in place (inline) run right here; the rest of the stage goes to one spawned task, where
//! every call goes through the per-call layer stack of [`crate::execute`] and the stage's async
//! handlers are polled together, so the worker itself never waits on a handler and keeps taking
//! stages. The pool ([`WorkerPool`]) hands stages out round-robin and replaces a worker found
//! dead.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use futures::future::join_all;
use kameo::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use crate::execute::{self, CallEnv};
use crate::limiter::Limiter;
use crate::metrics::EngineMetrics;
use crate::plan::Planned;
use crate::policy::Policy;
use crate::protocol::ToolDispatchResult;
use crate::registry::RegisteredTool;
use crate::tool::SessionScope;

/// A worker. Stateless apart from the shared global concurrency cap.
#[derive(Actor)]
pub struct Worker {
    limiter: Arc<Limiter>,
    metrics: Arc<EngineMetrics>,
}

impl Worker {
    /// A worker drawing on the shared global limiter.
    pub fn new(limiter: Arc<Limiter>, metrics: Arc<EngineMetrics>) -> Self {
        Worker { limiter, metrics }
    }
}

/// Run one stage: all of its calls, concurrently (a concurrent stage holds several; a serial stage
/// holds one). Replies with `(index, result)` pairs.
#[derive(Debug)]
pub struct RunStage {
    /// The calls.
    pub calls: Vec<Planned>,
    /// When the turn reached the scheduler (queue wait is measured from here).
    pub arrived: Instant,
    /// The turn's cancellation.
    pub cancel: CancellationToken,
    /// The turn's span (parent of the call spans).
    pub span: Span,
    /// The session the turn belongs to.
    pub scope: Arc<SessionScope>,
    /// The engine's permission policy, if any.
    pub policy: Option<Arc<Policy>>,
    /// What guarded calls pass right before they start (the session's journal), if anything.
    pub gate: Option<Arc<dyn crate::execute::StartGate>>,
    /// Where the calls report live progress, when somebody listens.
    pub listener: Option<crate::tool::ProgressSink>,
    /// When set, each waiting call's answer goes here as soon as it comes, and the reply holds
    /// only the rest (the turn is streamed).
    pub progress: Option<StageProgress>,
}

/// A stage's answers: `(index in the turn, result, the tool that answered)`.
pub type StageResults = Vec<(usize, ToolDispatchResult, Arc<RegisteredTool>)>;

/// Where a stage's waiting calls send each answer the moment it comes (for a streamed turn).
pub type StageProgress =
    tokio::sync::mpsc::UnboundedSender<(usize, ToolDispatchResult, Arc<RegisteredTool>)>;

impl Message<RunStage> for Worker {
    type Reply = DelegatedReply<StageResults>;

    async fn handle(&mut self, msg: RunStage, ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        let RunStage {
            calls,
            arrived,
            cancel,
            span,
            scope,
            policy,
            gate,
            listener,
            progress,
        } = msg;
        let mut done = Vec::with_capacity(calls.len());
        let mut waiting = Vec::new();
        for planned in calls {
            if execute::runs_in_place(&planned, policy.as_deref()) {
                let env = CallEnv {
                    arrived,
                    cancel: &cancel,
                    limiter: &self.limiter,
                    metrics: &self.metrics,
                    span: &span,
                    scope: &scope,
                    policy: policy.as_deref(),
                    gate: gate.as_deref(),
                    listener: listener.as_ref(),
                };
                done.push(execute::run_in_place(planned, env));
            } else {
                waiting.push(planned);
            }
        }
        if waiting.is_empty() {
            return ctx.reply(done);
        }
        let limiter = Arc::clone(&self.limiter);
        let metrics = Arc::clone(&self.metrics);
        ctx.spawn(async move {
            let env = CallEnv {
                arrived,
                cancel: &cancel,
                limiter: &limiter,
                metrics: &metrics,
                span: &span,
                scope: &scope,
                policy: policy.as_deref(),
                gate: gate.as_deref(),
                listener: listener.as_ref(),
            };
            let runs = waiting.into_iter().map(|p| {
                let progress = progress.clone();
                async move {
                    let answer = execute::run(p, env).await;
                    match progress {
                        Some(tx) => tx.send(answer).err().map(|unsent| unsent.0),
                        None => Some(answer),
                    }
                }
            });
            done.extend(join_all(runs).await.into_iter().flatten());
            done
        })
    }
}

/// The worker pool: a fixed number of worker actors, handed stages round-robin. A worker found
/// dead is replaced (and counted in `switchboard_worker_restarts_total`); the stage that found it
/// dead is still answered, once.
#[derive(Clone)]
pub struct WorkerPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    slots: Box<[RwLock<ActorRef<Worker>>]>,
    next: AtomicUsize,
    limiter: Arc<Limiter>,
    metrics: Arc<EngineMetrics>,
}

impl WorkerPool {
    /// Spawns `size` workers sharing `limiter` (must run inside a tokio runtime).
    pub fn spawn(size: usize, limiter: Arc<Limiter>, metrics: Arc<EngineMetrics>) -> Self {
        let slots = (0..size.max(1))
            .map(|_| {
                RwLock::new(Worker::spawn(Worker::new(
                    Arc::clone(&limiter),
                    Arc::clone(&metrics),
                )))
            })
            .collect();
        WorkerPool {
            inner: Arc::new(PoolInner {
                slots,
                next: AtomicUsize::new(0),
                limiter,
                metrics,
            }),
        }
    }

    /// The next worker in turn (replaced first if it is dead), with its slot number.
    pub fn pick(&self) -> (usize, ActorRef<Worker>) {
        let slot = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.slots.len();
        let worker = self.inner.slots[slot]
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if worker.is_alive() {
            return (slot, worker);
        }
        (slot, self.replace_if_dead(slot))
    }

    /// Replaces the worker of `slot` if it is no longer running; returns the slot's worker.
    pub fn replace_if_dead(&self, slot: usize) -> ActorRef<Worker> {
        let mut worker = self.inner.slots[slot]
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if !worker.is_alive() {
            *worker = Worker::spawn(Worker::new(
                Arc::clone(&self.inner.limiter),
                Arc::clone(&self.inner.metrics),
            ));
            self.inner.metrics.worker_restarted();
            tracing::warn!(slot, "worker replaced");
        }
        worker.clone()
    }

    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    /// Kills the worker of `slot` at once (fault injection for tests and soak runs). The next
    /// stage that lands on the slot gets a fresh worker.
    pub fn kill(&self, slot: usize) {
        if let Some(lock) = self.inner.slots.get(slot) {
            lock.read().unwrap_or_else(|p| p.into_inner()).kill();
        }
    }

    /// The engine's global concurrency cap, shared by every worker.
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// How many workers.
    pub fn len(&self) -> usize {
        self.inner.slots.len()
    }

    /// Stops every worker after the stages already queued.
    pub async fn stop(&self) {
        let workers: Vec<_> = self
            .inner
            .slots
            .iter()
            .map(|lock| lock.read().unwrap_or_else(|p| p.into_inner()).clone())
            .collect();
        for w in &workers {
            let _ = w.stop_gracefully().await;
        }
        for w in &workers {
            w.wait_for_shutdown().await;
        }
    }
}
