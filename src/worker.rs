//! Worker actors: run the calls of the stages they are given, each under its deadline,
//! cancellation and output cap, and turn a panic into a result.
//!
//! A stage arrives as **one** message ([`RunStage`]) carrying all its calls. Inline handlers run
//! right here; async handlers are spawned as tasks and blocking ones go to tokio's blocking pool, so
//! the worker itself never waits on a handler and keeps taking stages. Every call passes through the
//! same short stack, defined in [`run_call`]: global concurrency permit → deadline and cancellation
//! → handler (panic caught) → output cap. The pool ([`WorkerPool`]) hands stages out round-robin.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::future::join_all;
use kameo::prelude::*;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

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
    permits: Arc<Semaphore>,
    metrics: Arc<EngineMetrics>,
}

impl Worker {
    /// A worker drawing on the shared permit pool.
    pub fn new(permits: Arc<Semaphore>, metrics: Arc<EngineMetrics>) -> Self {
        Worker { permits, metrics }
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

/// A stage's answers: `(index in the turn, result)`.
pub type StageResults = Vec<(usize, ToolDispatchResult)>;

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
                done.push((planned.index, result));
            } else {
                waiting.push(planned);
            }
        }
        if waiting.is_empty() {
            return ctx.reply(done);
        }
        let permits = Arc::clone(&self.permits);
        let metrics = Arc::clone(&self.metrics);
        ctx.spawn(async move {
            let runs = waiting.into_iter().map(|p| {
                let stage = Stage {
                    arrived,
                    cancel: &cancel,
                    permits: &permits,
                    metrics: &metrics,
                    span: &span,
                };
                async move { (p.index, run_call(p, stage).await) }
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
        .unwrap_or_else(|panic| Err(panicked(&*panic)));
    let timing = Timing {
        queued: started.saturating_duration_since(arrived),
        run: started.elapsed(),
    };
    let result = to_result(call, tool, outcome, timing);
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
    pub permits: &'a Arc<Semaphore>,
    /// The engine's metric handles.
    pub metrics: &'a EngineMetrics,
    /// The turn's span.
    pub span: &'a Span,
}

/// Runs an async or blocking handler: waits for a global permit (or cancellation), then races the
/// handler against its deadline and the turn's cancellation. A timed-out or cancelled handler's
/// task is aborted (dropping its future, which kills what it started); its late reply, if any, is
/// dropped.
pub async fn run_call(planned: Planned, stage: Stage<'_>) -> ToolDispatchResult {
    let Stage {
        arrived,
        cancel,
        permits,
        metrics,
        span: turn_span,
    } = stage;
    let Planned { mut call, tool, .. } = planned;
    let _permit = tokio::select! {
        biased;
        _ = cancel.cancelled() => return not_started(call, ErrorCode::Cancelled, "cancelled before it started"),
        permit = Arc::clone(permits).acquire_owned() => match permit {
            Ok(p) => p,
            Err(_) => return not_started(call, ErrorCode::Cancelled, "the engine is shut down"),
        },
    };
    let started = Instant::now();
    let deadline = started + tool.policy.timeout;
    let ctx = ToolContext {
        call_id: Arc::clone(&call.id),
        deadline,
        cancel: cancel.clone(),
    };
    let span = observe::call_span(turn_span, &call);
    let mut handle = match &tool.handler {
        Handler::Async(f) => {
            let args = std::mem::take(&mut call.arguments);
            tokio::spawn(f(args, ctx).instrument(span.clone()))
        }
        Handler::Blocking(f) => {
            let f = Arc::clone(f);
            let args = std::mem::take(&mut call.arguments);
            let span = span.clone();
            tokio::task::spawn_blocking(move || span.in_scope(|| f(&args, &ctx)))
        }
        Handler::Inline(_) => {
            return run_inline(call, &tool, arrived, cancel, turn_span);
        }
    };
    metrics.in_flight(1.0);
    let outcome = tokio::select! {
        joined = &mut handle => match joined {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => Err(panicked(&*e.into_panic())),
            Err(e) => Err(ToolError::execution(format!("handler task failed: {e}"))),
        },
        _ = tokio::time::sleep_until(deadline.into()) => {
            handle.abort();
            Err(ToolError::new(
                ErrorCode::Timeout,
                format!("timed out after {}", human_duration(tool.policy.timeout)),
            ))
        }
        _ = cancel.cancelled() => {
            handle.abort();
            Err(ToolError::new(ErrorCode::Cancelled, "cancelled while running"))
        }
    };
    metrics.in_flight(-1.0);
    let timing = Timing {
        queued: started.saturating_duration_since(arrived),
        run: started.elapsed(),
    };
    let result = to_result(call, &tool, outcome, timing);
    observe::call_finished(&span, &result);
    result
}

fn to_result(
    call: crate::protocol::ToolCall,
    tool: &RegisteredTool,
    outcome: ToolOutcome,
    timing: Timing,
) -> ToolDispatchResult {
    match outcome {
        Ok(text) => ToolDispatchResult::ok(
            call.id,
            call.name,
            cap_output(text, tool.policy.output_cap),
            timing,
        ),
        Err(e) => ToolDispatchResult::error(
            call.id,
            call.name,
            e.code,
            &cap_output(e.detail, tool.policy.output_cap),
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

fn panicked(payload: &(dyn std::any::Any + Send)) -> ToolError {
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

/// The worker pool: a fixed set of worker actors, handed stages round-robin.
#[derive(Clone)]
pub struct WorkerPool {
    workers: Arc<[ActorRef<Worker>]>,
    next: Arc<AtomicUsize>,
}

impl WorkerPool {
    /// Spawns `size` workers sharing `permits` (must run inside a tokio runtime).
    pub fn spawn(size: usize, permits: Arc<Semaphore>, metrics: Arc<EngineMetrics>) -> Self {
        let workers: Vec<_> = (0..size.max(1))
            .map(|_| Worker::spawn(Worker::new(Arc::clone(&permits), Arc::clone(&metrics))))
            .collect();
        WorkerPool {
            workers: workers.into(),
            next: Arc::default(),
        }
    }

    /// The next worker in turn.
    pub fn pick(&self) -> &ActorRef<Worker> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        &self.workers[i]
    }

    /// How many workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Never true (a pool has at least one worker).
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Stops every worker after the stages already queued.
    pub async fn stop(&self) {
        for w in self.workers.iter() {
            let _ = w.stop_gracefully().await;
        }
        for w in self.workers.iter() {
            w.wait_for_shutdown().await;
        }
    }
}
