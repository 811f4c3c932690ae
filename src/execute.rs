//! `execute`: the per-call layer stack, and the only place that decides how a handler kind runs.
//!
//! Every admitted call — from the scheduler, a worker or the direct baseline — goes through
//! [`run`] (or [`run_in_place`] for a turn of inline handlers). The stack, outermost first:
//!
//! ```text
//! policy ─► per-tool cap ─► global cap ─► start gate ─► deadline & cancellation ─► handler ─► output cap ─► policy (after)
//! (rules, hooks,  (bounded waiting lines,   (the call's     (stop grace, commit gate)   (panic caught)         (PostToolUse hooks,
//!  approvals)      full → `overloaded`)      intent, durable)                                                  audit line)
//! ```
//!
//! Each layer is one small function below with its own unit test: [`check_policy`],
//! [`acquire_places`], the start gate's `pass` ([`StartGate`]: with a journal, the session makes
//! the call's intent durable there, right before the handler), [`supervise`], [`start_handler`],
//! [`to_result`]. The policy layer
//! ([`crate::policy`]) comes first, so a call waiting for an approval or an external hook holds
//! no concurrency place; without a policy it costs one `Option` check. Inline handlers are cheap
//! and cannot be interrupted, so they skip the caps and the deadline: policy → handler → cap, in
//! place — unless the policy or a start gate may make them wait ([`runs_in_place`]): then those
//! are awaited on the waiting path and the handler still runs in place after them (never refused
//! by the caps).
//! The in-flight gauge is held by a guard for as long as a handler may run. When the turn has a
//! progress listener, each call that runs gets a live [`Progress`] handle in its context, flushed
//! and closed when the handler ends, before the result is made (so no progress follows a result).
//!
//! Where each kind runs: inline in place (no task, no spawn); async on the caller's task (a
//! worker's stage task polls a stage's async calls together); blocking on tokio's blocking pool,
//! which keeps its concurrency places until the thread really ends.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use crate::limiter::{Limiter, Refusal};
use crate::metrics::EngineMetrics;
use crate::observe;
use crate::plan::Planned;
use crate::policy::{self, Policy};
use crate::protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult};
use crate::registry::RegisteredTool;
use crate::tool::{
    CommitGate, Handler, Progress, ProgressSink, SessionScope, ToolContext, ToolError, ToolOutcome,
    ToolOutput, cap_output,
};

/// How long a handler that was told to stop (deadline passed, turn cancelled) may take to answer
/// with its partial output before its future is dropped.
pub const STOP_GRACE: Duration = Duration::from_millis(250);

/// How long a handler that has begun committing ([`ToolContext::begin_commit`]) is waited for
/// after its deadline or cancellation. A commit is a rename; only a handler that hangs after
/// beginning one can outlast this, and it is then answered `timeout`/`cancelled` after all.
pub const COMMIT_GRACE: Duration = Duration::from_secs(30);

/// What a call must pass right before it starts, after the policy and the caps: the session's
/// journal makes the call's intent durable there, so that an intent on disk means "this call
/// started" (see `docs/retries.md`). A call the turn's gate guards ([`Planned::gated`]) never
/// runs in place.
pub trait StartGate: Send + Sync + std::fmt::Debug {
    /// True when `call` must pass the gate before it starts.
    fn guards(&self, call: &ToolCall) -> bool;
    /// Waits until `call` may start; `Err(why)` when it must not start (it is then answered
    /// `execution_error`, "not run: why").
    fn open<'a>(&'a self, call: &'a ToolCall) -> BoxFuture<'a, Result<(), String>>;
}

/// What every call of one turn shares.
#[derive(Clone, Copy)]
pub struct CallEnv<'a> {
    /// When the turn reached the scheduler (queue wait is measured from here).
    pub arrived: Instant,
    /// The turn's cancellation.
    pub cancel: &'a CancellationToken,
    /// The engine's global concurrency cap.
    pub limiter: &'a Limiter,
    /// The engine's metric handles.
    pub metrics: &'a EngineMetrics,
    /// The turn's span (parent of every call span).
    pub span: &'a Span,
    /// The session the turn belongs to (what its tools see).
    pub scope: &'a Arc<SessionScope>,
    /// The engine's permission policy, if any (what its tools never see).
    pub policy: Option<&'a Policy>,
    /// What guarded calls pass right before they start (the session's journal), if anything.
    pub gate: Option<&'a dyn StartGate>,
    /// Where the turn's calls report live progress, when somebody listens.
    pub listener: Option<&'a ProgressSink>,
}

/// True when the call runs in place (an inline handler that neither the session's policy nor a
/// start gate makes wait): a turn of such calls needs no task and no worker.
pub fn runs_in_place(planned: &Planned, policy: Option<&Policy>) -> bool {
    let tool = &planned.tool;
    !planned.gated
        && matches!(tool.handler, Handler::Inline(_))
        && policy.is_none_or(|p| !p.waits_for_tool(tool))
}

/// A call's answer: its index in the turn, its result, and its tool (handed back rather than
/// cloned: a tool's `Arc` is shared by every session, and its reference count is a cache line
/// the cores would fight over on every call).
pub type Answered = (usize, ToolDispatchResult, Arc<RegisteredTool>);

/// Runs one call through the stack. Never fails: every outcome is a result.
pub async fn run(planned: Planned, env: CallEnv<'_>) -> Answered {
    if runs_in_place(&planned, env.policy) {
        return run_in_place(planned, env);
    }
    let gate = if planned.gated { env.gate } else { None };
    let Planned {
        index, call, tool, ..
    } = planned;
    let result = match env.policy {
        None => handler(call, &tool, env, gate).await,
        Some(policy) => match check_policy(policy, call, &tool, env).await {
            Ok((call, decided)) => {
                let mut result = handler(call, &tool, env, gate).await;
                decided
                    .finish_waiting(policy, &tool, env, &mut result)
                    .await;
                result
            }
            Err(refused) => refused,
        },
    };
    (index, result, tool)
}

/// The stack below the policy: an inline handler that waited (for the policy or the gate) still
/// runs in place; any other goes through the caps and the deadline.
async fn handler(
    call: ToolCall,
    tool: &RegisteredTool,
    env: CallEnv<'_>,
    gate: Option<&dyn StartGate>,
) -> ToolDispatchResult {
    match tool.handler {
        Handler::Inline(_) => match pass(gate, call, env).await {
            Ok(call) => inline(call, tool, env),
            Err(refused) => refused,
        },
        _ => waiting(call, tool, env, gate).await,
    }
}

/// The start gate, right before the handler: the call back, or its answer when it must not start
/// (the gate refused it, or the turn was cancelled meanwhile).
async fn pass(
    gate: Option<&dyn StartGate>,
    call: ToolCall,
    env: CallEnv<'_>,
) -> Result<ToolCall, ToolDispatchResult> {
    let Some(gate) = gate else {
        return Ok(call);
    };
    if env.cancel.is_cancelled() {
        return Err(not_started(
            call,
            ErrorCode::Cancelled,
            "cancelled before it started",
        ));
    }
    if let Err(why) = gate.open(&call).await {
        return Err(not_started(
            call,
            ErrorCode::ExecutionError,
            &format!("not run: {why}"),
        ));
    }
    Ok(call)
}

/// The stack for an async or blocking call.
async fn waiting(
    call: ToolCall,
    tool: &RegisteredTool,
    env: CallEnv<'_>,
    gate: Option<&dyn StartGate>,
) -> ToolDispatchResult {
    let places = match acquire_places(tool, env.limiter, env.cancel).await {
        Ok(places) => places,
        Err((code, detail)) => return not_started(call, code, &detail),
    };
    // The gate holds the call's places: what it waits for (a journal flush) is short, and the
    // call must not wait for places once its intent says it started.
    let mut call = match pass(gate, call, env).await {
        Ok(call) => call,
        Err(refused) => return refused,
    };
    let started = Instant::now();
    let stop = env.cancel.child_token();
    let mut ctx = context(&call, tool, env.scope, started, stop.clone());
    ctx.commit = CommitGate::guarded();
    let gate = ctx.commit.clone();
    let span = observe::call_span(env.span, &call);
    let progress = progress_of(&call, &span, env);
    ctx.progress = progress.clone();
    let deadline = ctx.deadline;
    let args = std::mem::take(&mut call.arguments);
    let running = start_handler(&tool.handler, args, ctx, places, &span);
    let running = running.map(|joined| joined_outcome(joined, tool));
    let outcome = {
        let _in_flight = env.metrics.in_flight_guard();
        let stopping = Stopping {
            deadline,
            timeout: tool.policy.timeout,
            cancel: env.cancel,
            stop: &stop,
            gate: &gate,
        };
        supervise(std::pin::pin!(running), stopping).await
    };
    // The call's last progress goes before its result, and none after it.
    progress.finish();
    answer(call, tool, outcome, env.arrived, started, &span)
}

/// The call's progress handle: live when the turn has a listener, inert otherwise.
fn progress_of(call: &ToolCall, span: &Span, env: CallEnv<'_>) -> Progress {
    match env.listener {
        Some(sink) => sink.for_call(&call.id, span, &env.metrics.progress),
        None => Progress::default(),
    }
}

/// Runs an inline call in place: policy → handler (panic caught) → output cap. Its timeout is not
/// enforced (an inline handler cannot be interrupted; see [`Handler::Inline`]). Any other kind is
/// answered `execution_error` — callers check [`runs_in_place`] first.
pub fn run_in_place(planned: Planned, env: CallEnv<'_>) -> Answered {
    let Planned {
        index, call, tool, ..
    } = planned;
    let result = match env.policy {
        None => inline(call, &tool, env),
        Some(policy) => match check_policy_now(policy, call, &tool, env) {
            Ok((call, decided)) => {
                let mut result = inline(call, &tool, env);
                decided.finish(policy, &tool, env.scope, &mut result);
                result
            }
            Err(refused) => refused,
        },
    };
    (index, result, tool)
}

fn inline(call: ToolCall, tool: &RegisteredTool, env: CallEnv<'_>) -> ToolDispatchResult {
    let Handler::Inline(f) = &tool.handler else {
        let detail = "internal: a waiting handler was asked to run in place";
        return not_started(call, ErrorCode::ExecutionError, detail);
    };
    if env.cancel.is_cancelled() {
        return not_started(call, ErrorCode::Cancelled, "cancelled before it started");
    }
    let started = Instant::now();
    let mut ctx = context(&call, tool, env.scope, started, env.cancel.clone());
    let span = observe::call_span(env.span, &call);
    if env.listener.is_some() {
        ctx.progress = progress_of(&call, &span, env);
    }
    let outcome = span
        .in_scope(|| catch_unwind(AssertUnwindSafe(|| f(&call.arguments, &ctx))))
        .unwrap_or_else(|panic| Err(record_panic(&*panic, tool)));
    ctx.progress.finish();
    answer(call, tool, outcome, env.arrived, started, &span)
}

/// The handler's outcome as the call's result (output cap applied), marked on its span.
fn answer(
    call: ToolCall,
    tool: &RegisteredTool,
    outcome: ToolOutcome,
    arrived: Instant,
    started: Instant,
    span: &Span,
) -> ToolDispatchResult {
    let timing = Timing::measured(arrived, started);
    let result = to_result(call, tool.policy.output_cap, outcome, timing);
    observe::call_finished(span, &result);
    result
}

fn context(
    call: &ToolCall,
    tool: &RegisteredTool,
    scope: &Arc<SessionScope>,
    started: Instant,
    cancel: CancellationToken,
) -> ToolContext {
    let mut ctx = ToolContext::new(
        Arc::clone(&call.id),
        // The call's own copy of the name (equal to the tool's): no shared reference count.
        Arc::clone(&call.name),
        Arc::clone(scope),
        started + tool.policy.timeout,
        cancel,
    );
    ctx.turn_id.clone_from(&call.turn);
    ctx
}

/// The places a running call holds: in its tool's own cap (if it has one) and in the global cap.
pub type Places = (Option<OwnedSemaphorePermit>, OwnedSemaphorePermit);

/// Layer 2 — caps: a place in the tool's own cap, then in the global cap, each behind a bounded
/// waiting line. `Err` is the call's answer (`overloaded` when a line is full, `cancelled` when
/// the turn is cancelled while waiting or the engine is shut down); nothing ran.
pub async fn acquire_places(
    tool: &RegisteredTool,
    global: &Limiter,
    cancel: &CancellationToken,
) -> Result<Places, (ErrorCode, String)> {
    let own = match &tool.limiter {
        Some(limiter) => Some(
            limiter
                .acquire(cancel)
                .await
                .map_err(|r| refusal(r, &format!("tool {}", tool.name)))?,
        ),
        None => None,
    };
    let place = global
        .acquire(cancel)
        .await
        .map_err(|r| refusal(r, "the engine"))?;
    Ok((own, place))
}

fn refusal(refusal: Refusal, whose: &str) -> (ErrorCode, String) {
    match refusal {
        Refusal::Overloaded => (
            ErrorCode::Overloaded,
            format!("too many calls waiting for {whose}; nothing ran, retry later"),
        ),
        Refusal::Cancelled => (ErrorCode::Cancelled, "cancelled before it started".into()),
        Refusal::Closed => (ErrorCode::Cancelled, "the engine is shut down".into()),
    }
}

/// A call the policy let through: its ticket and the arguments it runs with (for the
/// `PostToolUse` hooks and the audit line).
pub struct Decided {
    ticket: policy::Ticket,
    /// Kept only when the policy reads them afterwards (an audit log, a PostToolUse hook).
    args: Option<serde_json::Value>,
}

impl Decided {
    /// The after-layer: `PostToolUse` hooks, the audit line, the decision metric.
    fn finish(
        self,
        policy: &Policy,
        tool: &RegisteredTool,
        scope: &SessionScope,
        result: &mut ToolDispatchResult,
    ) {
        policy.finish(&self.ticket, scope, tool, self.args.as_ref(), result);
    }

    /// The after-layer of a call that took the waiting stack: also the external `PostToolUse`
    /// hooks (bounded by their timeouts and the turn's cancellation; they hold no place).
    async fn finish_waiting(
        self,
        policy: &Policy,
        tool: &RegisteredTool,
        env: CallEnv<'_>,
        result: &mut ToolDispatchResult,
    ) {
        let args = self.args.as_ref();
        policy
            .finish_waiting(&self.ticket, env.scope, tool, args, env.cancel, result)
            .await;
    }
}

/// Layer 1 — policy: whether this validated call runs, and with which arguments (hooks may
/// replace them). Waits for approvals and external hooks before any concurrency place is taken;
/// the turn's cancellation answers a waiting call `cancelled`. `Err` is the call's answer
/// (`permission_denied`, `invalid_arguments` for rewritten arguments that do not fit the schema,
/// `cancelled`), already audited.
pub async fn check_policy(
    policy: &Policy,
    mut call: ToolCall,
    tool: &RegisteredTool,
    env: CallEnv<'_>,
) -> Result<(ToolCall, Decided), ToolDispatchResult> {
    let decided = policy.decide(&mut call, tool, env.scope, env.cancel).await;
    admitted(policy, call, tool, env.scope, decided)
}

/// [`check_policy`] for a call that runs in place (its policy never makes it wait).
pub fn check_policy_now(
    policy: &Policy,
    mut call: ToolCall,
    tool: &RegisteredTool,
    env: CallEnv<'_>,
) -> Result<(ToolCall, Decided), ToolDispatchResult> {
    let decided = policy.decide_now(&mut call, tool, env.scope);
    admitted(policy, call, tool, env.scope, decided)
}

fn admitted(
    policy: &Policy,
    call: ToolCall,
    tool: &RegisteredTool,
    scope: &SessionScope,
    decided: Result<policy::Ticket, Box<policy::Refused>>,
) -> Result<(ToolCall, Decided), ToolDispatchResult> {
    match decided {
        Ok(ticket) => {
            let args = policy.reads_args().then(|| call.arguments.clone());
            Ok((call, Decided { ticket, args }))
        }
        Err(refused) => {
            let policy::Refused { ticket, error } = *refused;
            let args = policy.reads_args().then(|| call.arguments.clone());
            let mut result = to_result(call, tool.policy.output_cap, Err(error), Timing::default());
            policy.finish(&ticket, scope, tool, args.as_ref(), &mut result);
            Err(result)
        }
    }
}

/// A handler's end: its outcome, or the payload of its panic.
pub type Joined = Result<ToolOutcome, Box<dyn std::any::Any + Send>>;

/// Layer 4 — the handler: starts an async or blocking handler and returns its future (panics
/// caught). Async handlers run on the caller's task; blocking ones on the blocking pool, where
/// the thread keeps `places` until it really ends (one that outlives its call still counts
/// against the caps). Dropping the future drops an async handler, which kills what it started.
pub fn start_handler(
    handler: &Handler,
    args: serde_json::Value,
    ctx: ToolContext,
    places: Places,
    span: &Span,
) -> BoxFuture<'static, Joined> {
    match handler {
        Handler::Async(f) => {
            let running = AssertUnwindSafe(f(args, ctx)).catch_unwind();
            async move {
                let _places = places;
                running.await
            }
            .instrument(span.clone())
            .boxed()
        }
        Handler::Blocking(f) => {
            let f = Arc::clone(f);
            let span = span.clone();
            let handle = tokio::task::spawn_blocking(move || {
                let _places = places;
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
        Handler::Inline(f) => {
            let joined = catch_unwind(AssertUnwindSafe(|| f(&args, &ctx)));
            drop(places);
            futures::future::ready(joined).boxed()
        }
    }
}

/// What the deadline layer watches.
pub struct Stopping<'a> {
    /// When the call must be answered.
    pub deadline: Instant,
    /// The policy timeout (for the message).
    pub timeout: Duration,
    /// The turn's cancellation.
    pub cancel: &'a CancellationToken,
    /// The call's own stop signal (the handler's `ctx.cancel`).
    pub stop: &'a CancellationToken,
    /// The call's commit gate.
    pub gate: &'a CommitGate,
}

/// Layer 3 — deadline and cancellation. Waits for the handler; at the deadline or on
/// cancellation it closes the commit gate and tells the handler to stop, then:
/// * a handler that had begun committing is awaited (up to [`COMMIT_GRACE`]) and its own answer
///   kept — an effect that happened is never reported as `timeout`/`cancelled`;
/// * otherwise the handler has [`STOP_GRACE`] to answer with its partial output; the call is
///   answered `timeout` / `cancelled` (carrying that output) and the future is dropped.
pub async fn supervise<F>(mut running: Pin<&mut F>, s: Stopping<'_>) -> ToolOutcome
where
    F: Future<Output = ToolOutcome>,
{
    let code = tokio::select! {
        outcome = running.as_mut() => return outcome,
        _ = tokio::time::sleep_until(s.deadline.into()) => ErrorCode::Timeout,
        _ = s.cancel.cancelled() => ErrorCode::Cancelled,
    };
    let committing = !s.gate.close();
    s.stop.cancel();
    if committing && let Ok(outcome) = tokio::time::timeout(COMMIT_GRACE, running.as_mut()).await {
        return outcome;
    }
    // Partial output is text (an image in it is its note).
    let late = tokio::time::timeout(STOP_GRACE, running)
        .await
        .map(|outcome| outcome.map(ToolOutput::into_text));
    let what = match code {
        ErrorCode::Timeout => format!("timed out after {}", human_duration(s.timeout)),
        _ => "cancelled while running".to_string(),
    };
    match late {
        // The handler answered for itself (e.g. bash with its partial output).
        Ok(Err(e)) if e.code == code && !e.detail.is_empty() => Err(e),
        Ok(Ok(text)) | Ok(Err(ToolError { detail: text, .. })) if !text.is_empty() => Err(
            ToolError::new(code, format!("{what}; partial output:\n{text}")),
        ),
        _ => Err(ToolError::new(code, what)),
    }
}

fn joined_outcome(joined: Joined, tool: &RegisteredTool) -> ToolOutcome {
    joined.unwrap_or_else(|panic| Err(record_panic(&*panic, tool)))
}

fn record_panic(payload: &(dyn std::any::Any + Send), tool: &RegisteredTool) -> ToolError {
    tool.breaker.record_panic();
    panicked(payload)
}

/// Layer 5 — output cap: a handler's outcome as the call's result, its output (or error detail)
/// capped at `output_cap` bytes.
pub fn to_result(
    call: ToolCall,
    output_cap: usize,
    outcome: ToolOutcome,
    timing: Timing,
) -> ToolDispatchResult {
    match outcome {
        Ok(output) => {
            ToolDispatchResult::from_output(call.id, call.name, output.capped(output_cap), timing)
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

/// A call answered without running its handler.
pub fn not_started(call: ToolCall, code: ErrorCode, detail: &str) -> ToolDispatchResult {
    ToolDispatchResult::error(call.id, call.name, code, detail, Timing::default())
}

/// A panic payload as an `execution_error` (`handler panicked: …`).
pub fn panicked(payload: &(dyn std::any::Any + Send)) -> ToolError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into());
    ToolError::execution(format!("handler panicked: {message}"))
}

fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests;
