//! Worker actors: run the calls of the stages they are given, each under its deadline,
//! cancellation and output cap, and turn a panic into a result.
//!
//! A stage arrives as **one** message ([`RunStage`]) carrying all its calls. Inline handlers run
//! right here; the rest of the stage goes to one spawned task, where async handlers are polled
//! together and blocking ones are handed to tokio's blocking pool, so the worker itself never
//! waits on a handler and keeps taking stages. Every call passes through the same short stack,
//! defined in [`run_call`]: per-tool cap → global cap (bounded waiting lines) → deadline and
//! cancellation (with [`STOP_GRACE`] for partial output) → handler (panic caught and counted by
//! the tool's breaker) → output cap. The pool ([`WorkerPool`]) hands stages out round-robin and
//! replaces a worker found dead.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use kameo::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use crate::limiter::{Limiter, Refusal};
use crate::metrics::EngineMetrics;
use crate::observe;

use crate::protocol::{ErrorCode, Timing, ToolDispatchResult};
use crate::registry::RegisteredTool;
use crate::tool::{Handler, ToolContext, ToolError, ToolOutcome, cap_output};

/// A call that passed lookup and validation, ready to run.
#[derive(Debug)]
pub struct Planned {
    /// Position of the call in its turn.
    pub index: usize,
    /// The call (its arguments are moved into the handler).
    pub call: crate::protocol::ToolCall,
    /// The resolved tool.
    pub tool: Arc<RegisteredTool>,
}

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
}

/// A stage's answers: `(index in the turn, result, the tool that answered)`.
pub type StageResults = Vec<(usize, ToolDispatchResult, Arc<RegisteredTool>)>;

impl Message<RunStage> for Worker {
    type Reply = DelegatedReply<StageResults>;

    async fn handle(&mut self, msg: RunStage, ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        let RunStage {
            calls,
            arrived,
            cancel,
            span,
        } = msg;
        let mut done = Vec::with_capacity(calls.len());
        let mut waiting = Vec::new();
        for planned in calls {
            if planned.tool.handler.is_inline() {
                let result = run_inline(planned.call, &planned.tool, arrived, &cancel, &span);
                done.push((planned.index, result, planned.tool));
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
            let runs = waiting.into_iter().map(|p| {
                let stage = Stage {
                    arrived,
                    cancel: &cancel,
                    limiter: &limiter,
                    metrics: &metrics,
                    span: &span,
                };
                async move {
                    let (index, tool) = (p.index, Arc::clone(&p.tool));
                    (index, run_call(p, stage).await, tool)
                }
            });
            done.extend(join_all(runs).await);
            done
        })
    }
}

/// Runs an inline handler in place: panic caught, output capped. Inline handlers are not
/// interruptible, so their timeout is not enforced (see [`Handler::Inline`]).
pub fn run_inline(
    call: crate::protocol::ToolCall,
    tool: &RegisteredTool,
    arrived: Instant,
    cancel: &CancellationToken,
    turn_span: &Span,
) -> ToolDispatchResult {
    let Handler::Inline(f) = &tool.handler else {
        unreachable!("run_inline is only called for inline handlers")
    };
    if cancel.is_cancelled() {
        return not_started(call, ErrorCode::Cancelled, "cancelled before it started");
    }
    let started = Instant::now();
    let ctx = ToolContext {
        call_id: Arc::clone(&call.id),
        deadline: started + tool.policy.timeout,
        cancel: cancel.clone(),
    };
    let span = observe::call_span(turn_span, &call);
    let outcome = span
        .in_scope(|| catch_unwind(AssertUnwindSafe(|| f(&call.arguments, &ctx))))
        .unwrap_or_else(|panic| {
            tool.breaker.record_panic();
            Err(panicked(&*panic))
        });
    let timing = Timing::measured(arrived, started);
    let result = to_result(call, tool.policy.output_cap, outcome, timing);
    observe::call_finished(&span, &result);
    result
}

/// What every waiting call of one stage shares.
#[derive(Clone, Copy)]
pub struct Stage<'a> {
    /// When the turn reached the scheduler.
    pub arrived: Instant,
    /// The turn's cancellation.
    pub cancel: &'a CancellationToken,
    /// The global concurrency cap.
    pub limiter: &'a Limiter,
    /// The engine's metric handles.
    pub metrics: &'a EngineMetrics,
    /// The turn's span.
    pub span: &'a Span,
}

/// How long a handler that was told to stop (deadline passed, turn cancelled) may take to answer
/// with its partial output before its task is aborted.
pub const STOP_GRACE: Duration = Duration::from_millis(250);

/// Runs an async or blocking handler through the stack: tool cap → global cap (each a bounded
/// waiting line; full → `overloaded`) → deadline and cancellation → handler (panic caught) →
/// output cap.
///
/// At the deadline, or when the turn is cancelled, the call's own token is cancelled so the
/// handler can stop and answer with what it has (bash returns its partial output); after
/// [`STOP_GRACE`] its task is aborted, which drops its future and kills what it started. Either
/// way the call is answered `timeout` / `cancelled`; a success that arrives after the deadline is
/// kept only as partial output of a `timeout`.
pub async fn run_call(planned: Planned, stage: Stage<'_>) -> ToolDispatchResult {
    let Stage {
        arrived,
        cancel,
        limiter,
        metrics,
        span: turn_span,
    } = stage;
    let Planned { mut call, tool, .. } = planned;
    if matches!(tool.handler, Handler::Inline(_)) {
        return run_inline(call, &tool, arrived, cancel, turn_span);
    }
    let tool_place = match &tool.limiter {
        Some(tool_limiter) => match tool_limiter.acquire(cancel).await {
            Ok(place) => Some(place),
            Err(refusal) => return refused(call, refusal, &format!("tool {}", tool.name)),
        },
        None => None,
    };
    let place = match limiter.acquire(cancel).await {
        Ok(place) => place,
        Err(refusal) => return refused(call, refusal, "the engine"),
    };
    // Held for the whole call (async handlers), or handed to the blocking thread.
    let mut places = Some((tool_place, place));
    let started = Instant::now();
    let deadline = started + tool.policy.timeout;
    let stop = cancel.child_token();
    let ctx = ToolContext {
        call_id: Arc::clone(&call.id),
        deadline,
        cancel: stop.clone(),
    };
    let span = observe::call_span(turn_span, &call);
    // Async handlers run on this stage's task (no spawn per call; the calls of a concurrent stage
    // are polled together); blocking ones go to the blocking pool. Dropping `running` drops the
    // handler's future, which kills whatever it started.
    let running: BoxFuture<'static, Joined> = match &tool.handler {
        Handler::Async(f) => {
            let args = std::mem::take(&mut call.arguments);
            AssertUnwindSafe(f(args, ctx))
                .catch_unwind()
                .instrument(span.clone())
                .boxed()
        }
        Handler::Blocking(f) => {
            let f = Arc::clone(f);
            let args = std::mem::take(&mut call.arguments);
            let span = span.clone();
            // The thread keeps its places until it really ends: one that outlives its call
            // (timed out, cannot be aborted) still counts against the caps.
            let held = places.take();
            let handle = tokio::task::spawn_blocking(move || {
                let _held = held;
                span.in_scope(|| catch_unwind(AssertUnwindSafe(|| f(&args, &ctx))))
            });
            async move {
                handle.await.unwrap_or_else(|e| {
                    Ok(Err(ToolError::execution(format!(
                        "handler thread failed: {e}"
                    ))))
                })
            }
            .boxed()
        }
        Handler::Inline(_) => unreachable!("inline handlers returned above"),
    };
    let mut running = std::pin::pin!(running);
    metrics.in_flight(1.0);
    let stopped = tokio::select! {
        joined = &mut running => Ok(joined),
        _ = tokio::time::sleep_until(deadline.into()) => Err(ErrorCode::Timeout),
        _ = cancel.cancelled() => Err(ErrorCode::Cancelled),
    };
    let outcome = match stopped {
        Ok(joined) => joined_outcome(joined, &tool),
        Err(code) => {
            stop.cancel();
            let late = tokio::time::timeout(STOP_GRACE, &mut running).await;
            let what = match code {
                ErrorCode::Timeout => {
                    format!("timed out after {}", human_duration(tool.policy.timeout))
                }
                _ => "cancelled while running".to_string(),
            };
            match late.map(|joined| joined_outcome(joined, &tool)) {
                // The handler answered for itself (e.g. bash with its partial output).
                Ok(Err(e)) if e.code == code => Err(e),
                Ok(Ok(text)) | Ok(Err(ToolError { detail: text, .. })) if !text.is_empty() => Err(
                    ToolError::new(code, format!("{what}; partial output:\n{text}")),
                ),
                _ => Err(ToolError::new(code, what)),
            }
        }
    };
    metrics.in_flight(-1.0);
    let timing = Timing::measured(arrived, started);
    let result = to_result(call, tool.policy.output_cap, outcome, timing);
    observe::call_finished(&span, &result);
    result
}

/// A handler's end: its outcome, or the payload of its panic.
type Joined = Result<ToolOutcome, Box<dyn std::any::Any + Send>>;

fn joined_outcome(joined: Joined, tool: &RegisteredTool) -> ToolOutcome {
    joined.unwrap_or_else(|panic| {
        tool.breaker.record_panic();
        Err(panicked(&*panic))
    })
}

fn refused(call: crate::protocol::ToolCall, refusal: Refusal, whose: &str) -> ToolDispatchResult {
    match refusal {
        Refusal::Overloaded => not_started(
            call,
            ErrorCode::Overloaded,
            &format!("too many calls waiting for {whose}; nothing ran, retry later"),
        ),
        Refusal::Cancelled => {
            not_started(call, ErrorCode::Cancelled, "cancelled before it started")
        }
        Refusal::Closed => not_started(call, ErrorCode::Cancelled, "the engine is shut down"),
    }
}

/// A handler's outcome as the call's result, its output (or error detail) capped at
/// `output_cap` bytes. Shared with the direct baseline.
pub(crate) fn to_result(
    call: crate::protocol::ToolCall,
    output_cap: usize,
    outcome: ToolOutcome,
    timing: Timing,
) -> ToolDispatchResult {
    match outcome {
        Ok(text) => {
            ToolDispatchResult::ok(call.id, call.name, cap_output(text, output_cap), timing)
        }
        Err(e) => ToolDispatchResult::error(
            call.id,
            call.name,
            e.code,
            &cap_output(e.detail, output_cap),
            timing,
        ),
    }
}

fn not_started(
    call: crate::protocol::ToolCall,
    code: ErrorCode,
    detail: &str,
) -> ToolDispatchResult {
    ToolDispatchResult::error(call.id, call.name, code, detail, Timing::default())
}

/// A panic payload as an `execution_error` (`handler panicked: …`). Shared with the baseline.
pub(crate) fn panicked(payload: &(dyn std::any::Any + Send)) -> ToolError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into());
    ToolError::execution(format!("handler panicked: {message}"))
}

fn human_duration(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
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

    /// Kills the worker of `slot` at once (fault injection for tests and soak runs). The next
    /// stage that lands on the slot gets a fresh worker.
    pub fn kill(&self, slot: usize) {
        if let Some(lock) = self.inner.slots.get(slot) {
            lock.read().unwrap_or_else(|p| p.into_inner()).kill();
        }
    }

    /// How many workers.
    pub fn len(&self) -> usize {
        self.inner.slots.len()
    }

    /// Never true (a pool has at least one worker).
    pub fn is_empty(&self) -> bool {
        self.inner.slots.is_empty()
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
