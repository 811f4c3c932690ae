//! A [`Session`]: one agent conversation's handle on the engine — its own cancellation and its
//! [`SessionScope`] (id and workspace) that every call of the session sees in its
//! [`crate::ToolContext`]. It has no actor of its own, which keeps an idle session under a
//! kilobyte (about 450 bytes on the heap; its answers for retries come on top): a turn is
//! planned on the task that dispatches it, runs there when every handler is inline, and
//! otherwise goes to one of the engine's shared schedulers — the same one for the
//! session's whole life (picked round robin when it opens).
//!
//! Turns of one session are planned in the order they are dispatched; a turn that must wait runs
//! on its own task, so other turns (of this session or others on the same scheduler) do not wait
//! for it. Cancelling a session cancels only its own turns.
//!
//! Sessions are opened here too ([`Engine::session`], [`Engine::session_in`]): this file, a child
//! of `engine`, reads the engine's state, so `engine.rs` never imports the session back.

use std::sync::Arc;

use kameo::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::collector::ResultSink;
use std::sync::atomic::Ordering;

use arc_swap::ArcSwapOption;
use serde_json::Value;

use super::answers::{Answers, Hit, Key, Plan};
use super::{Engine, EngineError};
use crate::protocol::{ToolCall, ToolDispatchResult};
use crate::registry::{CatalogFormat, RegisteredTool, RegistryError, Snapshot};
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::scheduler::Scheduler;
use crate::tool::{ProgressSink, SessionScope, ToolSpec};
use crate::workspace::Workspace;

/// How a session is opened ([`Engine::session_with`]): its id, its workspace, tools of its own and
/// a sandbox of its own. Every field is optional; the default is what [`Engine::session`] opens.
#[derive(Debug, Default)]
pub struct SessionOptions {
    id: Option<String>,
    workspace: Option<Workspace>,
    tools: Vec<ToolSpec>,
    sandbox: Option<SandboxConfig>,
    rules: Option<(String, crate::policy::Rules)>,
}

impl SessionOptions {
    /// Options of a session like [`Engine::session`]'s.
    pub fn new() -> Self {
        SessionOptions::default()
    }

    /// The session's id, as callers know it (an HTTP session id, a conversation id): it is the id
    /// every call of the session carries in its [`crate::ToolContext`], audit line, hook input and
    /// span. Default: `s1`, `s2`, … in the order sessions open (with a journal, `s1-<run>`, …:
    /// unique to this run of the engine). Ids are not checked for uniqueness; give each session
    /// its own. With a journal, the id is what continues a session after a restart.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The workspace its built-in tools are confined to (default: the engine's).
    pub fn workspace(mut self, workspace: Workspace) -> Self {
        self.workspace = Some(workspace);
        self
    }

    /// Tools only this session sees and calls, beside the engine's (validated, planned, policed,
    /// capped and measured like any tool). A name the engine's registry has is refused.
    pub fn tools(mut self, specs: impl IntoIterator<Item = ToolSpec>) -> Self {
        self.tools.extend(specs);
        self
    }

    /// A sandbox of its own for the session's commands, instead of the engine's (the caller
    /// decides whether it is narrower).
    pub fn sandbox(mut self, config: SandboxConfig) -> Self {
        self.sandbox = Some(config);
        self
    }

    /// Permission rules of the session's own, named `name` in denials and audit lines: they
    /// narrow the engine's policy ([`crate::policy::Policy::narrowed`]) — a call runs only if
    /// both allow it. The engine must have a policy ([`crate::EngineBuilder::policy`];
    /// [`crate::policy::Policy::allow_all`] is enough); rules that ask are refused.
    pub fn rules(mut self, name: impl Into<String>, rules: crate::policy::Rules) -> Self {
        self.rules = Some((name.into(), rules));
        self
    }
}

/// A session checked and compiled but not open yet ([`Engine::prepare_session`]): nothing can
/// refuse it any more. Dropping it opens nothing.
#[derive(Debug)]
pub(crate) struct PreparedSession {
    id: Option<String>,
    workspace: Option<Workspace>,
    own: Vec<Arc<RegisteredTool>>,
    sandbox: Arc<Sandbox>,
    policy: Option<Arc<crate::policy::Policy>>,
}

impl PreparedSession {
    /// Its id (see [`SessionOptions::id`]).
    #[cfg(feature = "cli")]
    pub(crate) fn id(mut self, id: String) -> Self {
        self.id = Some(id);
        self
    }

    /// The workspace its built-in tools are confined to.
    #[cfg(feature = "cli")]
    pub(crate) fn workspace(mut self, workspace: Workspace) -> Self {
        self.workspace = Some(workspace);
        self
    }
}

/// Why a session could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// One of its tools was refused (bad name or schema, a duplicate, or a name the engine has).
    #[error(transparent)]
    Tool(#[from] RegistryError),
    /// Its sandbox cannot be enforced here.
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// Its rules were refused (they ask), or the engine has no policy for them to narrow.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
}

/// A session's own tools, and the registry view extended with them (rebuilt when the engine's
/// registry moves).
#[derive(Debug)]
struct OwnTools {
    tools: Vec<Arc<RegisteredTool>>,
    /// The search index of those that may be deferred.
    part: Option<Arc<crate::registry::search::Part>>,
    view: ArcSwapOption<Snapshot>,
}

impl OwnTools {
    /// The engine's view `base` with these tools, cached per registry version.
    fn view(&self, base: Arc<Snapshot>) -> Arc<Snapshot> {
        if let Some(cached) = self.view.load_full()
            && cached.version == base.version
        {
            return cached;
        }
        let view = Arc::new(base.extended(&self.tools, self.part.as_ref()));
        self.view.store(Some(Arc::clone(&view)));
        view
    }
}

/// One agent session's handle. Clones share the session.
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

#[derive(Debug)]
struct SessionInner {
    engine: Engine,
    scheduler: ActorRef<Scheduler>,
    scope: Arc<SessionScope>,
    cancel: CancellationToken,
    /// Boxed: most sessions have none (8 bytes, not 40).
    own: Option<Box<OwnTools>>,
    /// The engine's policy, or the session's narrowing of it.
    policy: Option<Arc<crate::policy::Policy>>,
    /// Every call it answered, for retries.
    answers: Answers,
    /// In cluster mode, this node's lease on the session ([`Session::hold_lease`]).
    lease: std::sync::OnceLock<Arc<crate::journal::lease::Lease>>,
}

/// The calls of a turn registered as running whose answers are not remembered yet (see
/// [`Session::turn`]).
struct Unfinished<'a> {
    answers: &'a Answers,
    ids: Vec<Key>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.ids.is_empty() {
            self.answers.unfinished(&self.ids, true);
        }
    }
}

/// What one session's turns are planned with ([`Engine::dispatch_on`]).
#[derive(Debug, Default)]
pub(crate) struct Turf {
    /// The registry view with the session's own tools (`None`: the engine's).
    pub view: Option<Arc<Snapshot>>,
    /// The session's policy.
    pub policy: Option<Arc<crate::policy::Policy>>,
    /// What the turn's guarded calls pass right before they start (their intents).
    pub gate: Option<Arc<dyn crate::execute::StartGate>>,
    /// Where the turn's calls report live progress, when somebody listens.
    pub listener: Option<crate::tool::ProgressSink>,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        self.engine.session_closed();
    }
}

impl Session {
    pub(crate) fn new(
        engine: Engine,
        scheduler: ActorRef<Scheduler>,
        scope: Arc<SessionScope>,
        cancel: CancellationToken,
        own: Vec<Arc<RegisteredTool>>,
        policy: Option<Arc<crate::policy::Policy>>,
    ) -> Self {
        let own = (!own.is_empty()).then(|| {
            Box::new(OwnTools {
                part: Snapshot::index(&own),
                tools: own,
                view: ArcSwapOption::empty(),
            })
        });
        let answers = Answers::new(
            Arc::clone(scope.shared_id()),
            Arc::clone(&engine.inner.answer_limits),
            engine.inner.journal.clone(),
        );
        Session {
            inner: Arc::new(SessionInner {
                engine,
                scheduler,
                scope,
                cancel,
                own,
                policy,
                answers,
                lease: std::sync::OnceLock::new(),
            }),
        }
    }

    /// In cluster mode: the session is served under `lease` (granted when it was created here
    /// or taken over). A turn that ends after the lease was lost (another node took the
    /// session, or this node fenced itself) is answered [`EngineError::Moved`]: the new owner
    /// answers its calls' copies. Set once; a later lease is ignored.
    pub fn hold_lease(&self, lease: Arc<crate::journal::lease::Lease>) {
        let _ = self.inner.lease.set(lease);
    }

    /// The registry view this session's turns are planned with: the engine's, plus its own tools.
    async fn view(&self) -> Arc<Snapshot> {
        let base = self.inner.engine.snapshot().await;
        match &self.inner.own {
            None => base,
            Some(own) => own.view(base),
        }
    }

    /// True when `name` is one of the session's own tools ([`SessionOptions::tools`]).
    pub fn has_own_tool(&self, name: &str) -> bool {
        self.inner
            .own
            .as_ref()
            .is_some_and(|own| own.tools.iter().any(|t| &*t.name == name))
    }

    /// The session's catalog in `format`: the engine's tools, then its own (an engine tool
    /// registered later under one of the session's names is shadowed), shaped by what the view
    /// defers and what the session has been shown (see `docs/tool-search.md`).
    pub async fn catalog(&self, format: CatalogFormat) -> Result<Vec<Value>, EngineError> {
        if self.inner.engine.is_closed() {
            return Err(EngineError::ShutDown);
        }
        Ok(self.view().await.catalog(&self.inner.scope, format))
    }

    /// Marks `names` as shown to the session (a session reopened after a restart gets back
    /// the deferred tools it had been shown).
    pub fn restore_revealed(&self, names: &[Arc<str>]) {
        self.inner.scope.reveal(names);
    }

    /// How many answers the session keeps now for retries (see [`crate::Retention`]).
    pub fn answers_kept(&self) -> usize {
        self.inner.answers.len()
    }

    /// The deferred tools this session has been shown (by `tool_search` or by calling them), in
    /// the order they were first shown.
    pub fn revealed(&self) -> Vec<Arc<str>> {
        self.inner.scope.revealed()
    }

    /// Dispatches one turn of this session: one result per call, in call order. `Err` only for an
    /// engine fault ([`EngineError`]), when nothing of the turn ran.
    pub async fn dispatch(
        &self,
        calls: Vec<ToolCall>,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.dispatch_with_cancel(calls, self.inner.cancel.clone())
            .await
    }

    /// Like [`Session::dispatch`], cancellable on its own. Make `cancel` with
    /// [`Session::turn_token`] so that cancelling the session (or the engine) cancels it too.
    pub async fn dispatch_with_cancel(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.turn(calls, cancel, None, None).await
    }

    /// Like [`Session::dispatch_with_cancel`], also sending each result to `sink` with its index
    /// in the turn as soon as it is answered (refused and stored answers first, then each call
    /// as it finishes, also within a concurrent stage). The returned answer is the same ordered
    /// one.
    pub async fn dispatch_streaming(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
        sink: ResultSink,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.turn(calls, cancel, Some(sink), None).await
    }

    /// Like [`Session::dispatch_with_cancel`], with each running call's live progress (a
    /// command's output as it is written, a tool's progress values) sent to `listener` while it
    /// runs, and each result to `results` as it is answered when given (as
    /// [`Session::dispatch_streaming`] does). Progress is a side channel: bounded and coalesced
    /// (a reader that does not keep up loses output, counted, never slows a call), each call's
    /// events before its result and none after it, none for a call answered from the session's
    /// memory; the returned answer is exactly the one [`Session::dispatch`] gives. The limits are
    /// in `docs/progress.md`.
    ///
    /// ```no_run
    /// # async fn demo(session: switchboard::Session, calls: Vec<switchboard::ToolCall>) {
    /// use switchboard::tool::ProgressSink;
    ///
    /// let (listener, mut events) = ProgressSink::channel(64);
    /// let printer = tokio::spawn(async move {
    ///     while let Some(event) = events.recv().await {
    ///         println!("{}", event.to_json());
    ///     }
    /// });
    /// let results = session
    ///     .dispatch_with_progress(calls, session.turn_token(), None, listener)
    ///     .await;
    /// printer.await.ok(); // the channel closes once the turn is answered
    /// # let _ = results;
    /// # }
    /// ```
    pub async fn dispatch_with_progress(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
        results: Option<ResultSink>,
        listener: ProgressSink,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.turn(calls, cancel, results, Some(listener)).await
    }

    /// One turn: the session's answers first (a re-sent `tool_use_id` is answered from them),
    /// then the engine for the calls that run — with a journal, each call's intent is made
    /// durable right before that call starts (the turn's start gate) — and their answers
    /// remembered (durable before they leave).
    async fn turn(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
        sink: Option<ResultSink>,
        listener: Option<ProgressSink>,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        let answers = &self.inner.answers;
        if calls.is_empty() || Answers::refused_whole(&calls) {
            let turf = Turf {
                listener,
                ..Turf::default()
            };
            return self.engine_turn(calls, cancel, sink, turf).await;
        }
        // Shutdown waits for the whole turn, journal writes included.
        let Some(_in_flight) = self.inner.engine.enter_turn() else {
            return Err(EngineError::ShutDown);
        };
        let view = self.view().await;
        // Each call's identity: its id, or its turn and id when the client named the turn.
        let keys: Vec<Key> = calls.iter().map(|c| answers.key(c)).collect();
        let plans = answers.plan(&calls, &keys, &view).await;
        // Until every call registered as running here has its answer remembered: if this
        // future is dropped first, those calls are marked abandoned (their copies are answered
        // `outcome_unknown`), never left running forever.
        let mut guard = Unfinished {
            answers,
            ids: plans
                .iter()
                .zip(&keys)
                .filter(|(p, _)| matches!(p, Plan::Run { .. } | Plan::Decided { .. }))
                .map(|(_, key)| key.clone())
                .collect(),
        };
        let journal = answers.journal().cloned();
        // The calls that run, and where each goes back in the turn.
        let mut runs: Vec<usize> = Vec::new();
        let mut out: Vec<Option<ToolDispatchResult>> = Vec::with_capacity(calls.len());
        let mut hits = 0usize;
        for (i, plan) in plans.iter().enumerate() {
            match plan {
                Plan::Answer(result, hit) => {
                    if *hit == Hit::Stored {
                        hits += 1;
                    }
                    if let Some(sink) = &sink {
                        let _ = sink.send((i, (**result).clone()));
                    }
                    out.push(Some((**result).clone()));
                }
                Plan::Run { .. } => {
                    runs.push(i);
                    out.push(None);
                }
                Plan::Decided { .. } | Plan::Wait(_) => out.push(None),
            }
        }
        let metrics = self.inner.engine.metrics();
        // Each call's intent is made durable right before it starts; a call whose intent cannot
        // be recorded does not start ("not run").
        let gate = answers
            .intents(&calls, &plans)
            .map(|g| g as Arc<dyn crate::execute::StartGate>);
        let mut plans = plans;
        // Decided answers (outcome_unknown) are remembered and journaled like answers.
        let mut records = Vec::new();
        for (i, plan) in plans.iter_mut().enumerate() {
            if let Plan::Decided {
                digest,
                effect,
                result,
                ..
            } = plan
            {
                metrics.outcome_unknown();
                records.push(answers.answer_record(&keys[i], result, digest, *effect));
                out[i] = Some((**result).clone());
            }
        }
        let mut calls = calls;
        if !runs.is_empty() {
            // Usually every call is new: the turn goes to the engine as it came.
            let sub: Vec<ToolCall> = if runs.len() == calls.len() {
                std::mem::take(&mut calls)
            } else {
                runs.iter()
                    .map(|&i| std::mem::replace(&mut calls[i], ToolCall::new("", "", Value::Null)))
                    .collect()
            };
            // The engine runs the turn with the view it was planned with.
            let planned = Turf {
                view: Some(view),
                policy: None,
                gate,
                listener,
            };
            let results = match self
                .run_and_record(sub, &keys, cancel, sink.as_ref(), &plans, planned)
                .await
            {
                Ok(results) => results,
                Err(e @ EngineError::Moved(_)) => {
                    // Calls ran, but this node may record none of their answers: the new
                    // owner answers their copies (`outcome_unknown` where it must).
                    answers.unfinished(&std::mem::take(&mut guard.ids), true);
                    return Err(e);
                }
                Err(e) => {
                    // Refused by the engine: nothing of the turn ran.
                    answers.unfinished(&std::mem::take(&mut guard.ids), false);
                    return Err(e);
                }
            };
            for (&i, result) in runs.iter().zip(results) {
                out[i] = Some(result);
            }
        }
        // Answers are durable before any leaves the engine: those of the calls that ran were
        // written as each came (`run_and_record`), the decided ones here.
        if let Some(journal) = &journal {
            match journal.write(records).await {
                Ok(()) => {}
                Err(crate::journal::JournalError::Fenced { session }) => {
                    // The calls ran, but this node may publish nothing more for the session:
                    // the new owner answers their copies (`outcome_unknown` where it must).
                    answers.unfinished(&std::mem::take(&mut guard.ids), true);
                    return Err(EngineError::Moved(session));
                }
                Err(e) => {
                    // Decided answers are `outcome_unknown` already: a copy reads the same from
                    // the journal's intent.
                    tracing::error!(error = %e, "journal: decided answers were not recorded")
                }
            }
        }
        // The answers were written as they came: if one was refused (the lease was lost with
        // it), another node owns the session now and answers for it.
        if self.inner.lease.get().is_some_and(|lease| lease.lost()) {
            answers.unfinished(&std::mem::take(&mut guard.ids), true);
            return Err(EngineError::Moved(self.id().to_string()));
        }
        answers.finish(plans.iter().zip(&keys).zip(&out).filter_map(
            |((plan, key), result)| match (plan, result) {
                (Plan::Run { digest, .. } | Plan::Decided { digest, .. }, Some(result)) => {
                    Some((key, *digest, result))
                }
                _ => None,
            },
        ));
        if let Some(sink) = &sink {
            for (i, plan) in plans.iter().enumerate() {
                if let (Plan::Decided { .. }, Some(result)) = (plan, &out[i]) {
                    let _ = sink.send((i, result.clone()));
                }
            }
        }
        // Copies of calls still running in an earlier copy of the turn.
        guard.ids.clear();
        for (i, plan) in plans.into_iter().enumerate() {
            if let Plan::Wait(digest) = plan {
                hits += 1;
                let call = &calls[i];
                let result = answers
                    .wait(&keys[i], call, digest)
                    .await
                    .ok_or(EngineError::ShutDown)?;
                if let Some(sink) = &sink {
                    let _ = sink.send((i, result.clone()));
                }
                out[i] = Some(result);
            }
        }
        if hits > 0 {
            metrics.dedup_hits(hits);
        }
        Ok(out
            .into_iter()
            .map(|r| r.expect("every call of the turn has its answer"))
            .collect())
    }

    /// Runs the calls `sub` (the turn's calls planned to run; `keys`: the identities of all the
    /// turn's calls) through the engine. With a journal, each answer is recorded as soon as its
    /// call finishes — together with whatever else waits for the writer then, such as the next
    /// call's intent — so that a crash later in the turn leaves the calls that finished answered,
    /// not `outcome_unknown`. When streaming, each result reaches `sink` under its index in the
    /// whole turn, after its answer is durable.
    async fn run_and_record(
        &self,
        sub: Vec<ToolCall>,
        keys: &[Key],
        cancel: CancellationToken,
        sink: Option<&ResultSink>,
        plans: &[Plan],
        planned: Turf,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        let answers = &self.inner.answers;
        let journal = answers.journal();
        if sink.is_none() && journal.is_none() {
            return self.engine_turn(sub, cancel, None, planned).await;
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let n = sub.len();
        // Where each call of `sub` is in the turn: the calls planned to run, in order.
        let runs: Vec<usize> = (0..plans.len())
            .filter(|&i| matches!(plans[i], Plan::Run { .. }))
            .collect();
        let forward = async {
            let mut seen = 0;
            // Answers the journal could not record, as they were sent instead.
            let mut replaced = Vec::new();
            // A write was refused: another node owns the session now.
            let mut fenced = false;
            while seen < n {
                let Some(first) = rx.recv().await else {
                    break;
                };
                // Every answer that came meanwhile goes in the same write.
                let mut batch = vec![first];
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                seen += batch.len();
                if let Some(journal) = journal {
                    let records: Vec<_> = batch
                        .iter()
                        .filter_map(|(j, result)| match &plans[runs[*j]] {
                            Plan::Run { digest, effect } => Some(answers.answer_record(
                                &keys[runs[*j]],
                                result,
                                digest,
                                *effect,
                            )),
                            _ => None,
                        })
                        .collect();
                    match journal.write(records).await {
                        Ok(()) => {}
                        // Fenced: this node may publish nothing more for the session, and none
                        // of the turn's answers leaves it (the new owner answers the copies).
                        Err(crate::journal::JournalError::Fenced { .. }) => {
                            fenced = true;
                            continue;
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "journal: answers were not recorded");
                            for (j, result) in &mut batch {
                                let effect = match &plans[runs[*j]] {
                                    Plan::Run { effect, .. } => *effect,
                                    _ => None,
                                };
                                if unrecorded(result, effect) {
                                    self.inner.engine.metrics().outcome_unknown();
                                    replaced.push((*j, result.clone()));
                                }
                            }
                        }
                    }
                }
                if let Some(outer) = sink {
                    for (j, result) in batch {
                        let _ = outer.send((runs[j], result));
                    }
                }
            }
            (replaced, fenced)
        };
        let (results, (replaced, fenced)) =
            tokio::join!(self.engine_turn(sub, cancel, Some(tx), planned), forward);
        let mut results = results?;
        if fenced {
            return Err(EngineError::Moved(self.id().to_string()));
        }
        for (j, result) in replaced {
            results[j] = result;
        }
        Ok(results)
    }

    /// A turn straight to the engine (no answers remembered). From `planned`: what its guarded
    /// calls pass right before they start (`gate`), and the registry view the turn was planned
    /// with, if it was (`view`; else the session's current one); the policy is the session's.
    async fn engine_turn(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
        sink: Option<ResultSink>,
        planned: Turf,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        let Turf {
            view,
            gate,
            listener,
            ..
        } = planned;
        // The engine's view alone is fetched by `dispatch_on` itself.
        let view = match (view, &self.inner.own) {
            (Some(view), _) => Some(view),
            (None, None) => None,
            (None, Some(_)) => Some(self.view().await),
        };
        self.inner
            .engine
            .dispatch_on(
                &self.inner.scheduler,
                &self.inner.scope,
                calls,
                cancel,
                sink,
                Turf {
                    view,
                    policy: self.inner.policy.clone(),
                    gate,
                    listener,
                },
            )
            .await
    }

    /// A cancellation token for one turn of this session (a child of the session's).
    pub fn turn_token(&self) -> CancellationToken {
        self.inner.cancel.child_token()
    }

    /// Cancels the session: calls running now are answered `cancelled` (their processes are
    /// stopped), calls not started are answered `cancelled` without running, and so is every later
    /// turn of this session.
    pub fn cancel(&self) {
        self.inner.cancel.cancel();
    }

    /// True once [`Session::cancel`] (or engine shutdown) happened.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// The session id (unique within its engine: `s1`, `s2`, …).
    pub fn id(&self) -> &str {
        self.inner.scope.id()
    }

    /// The workspace the session's built-in tools are confined to, if any.
    pub fn workspace(&self) -> Option<&Workspace> {
        self.inner.scope.workspace()
    }

    /// The engine this session belongs to.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// The answer of a call that ran but whose answer the journal could not record: a side-effect
/// call's becomes `outcome_unknown` (what a copy after a crash reads from its intent); a
/// read-only or idempotent call's stays (such a call runs again after a crash). True when
/// replaced.
fn unrecorded(result: &mut ToolDispatchResult, effect: Option<crate::tool::Effect>) -> bool {
    // A call that never started (refused by the policy, its intent not recorded, …) keeps its
    // answer: it did nothing, and no intent of it says otherwise.
    if super::answers::may_run_again(effect) || !result.timing.ran {
        return false;
    }
    *result = super::answers::outcome_unknown_of(
        &result.tool_use_id,
        &result.tool_name,
        super::answers::ENGINE_STOPPED,
    );
    true
}

impl Engine {
    /// A new session in the engine's workspace ([`EngineBuilder::workspace`](super::EngineBuilder::workspace)): its own
    /// cancellation, and one of the engine's shared schedulers for all its turns (no actor of
    /// its own).
    pub fn session(&self) -> Session {
        self.open_session(self.inner.workspace.clone())
    }

    /// A new session whose built-in tools are confined to `workspace`: one engine serves
    /// sessions in different directories.
    pub fn session_in(&self, workspace: Workspace) -> Session {
        self.open_session(Some(workspace))
    }

    /// A new session opened with `options`: its own id, workspace, tools and sandbox.
    pub async fn session_with(&self, options: SessionOptions) -> Result<Session, SessionError> {
        let prepared = self.prepare_session(options).await?;
        Ok(self.open_prepared(prepared))
    }

    /// Everything [`Engine::session_with`] checks, done before the session opens: its rules
    /// narrowed, its own tools named and compiled (one catalog, one schema budget), its sandbox
    /// prepared. A front end that must make something for the session (a workspace directory)
    /// makes it only once nothing can refuse the session any more.
    pub(crate) async fn prepare_session(
        &self,
        options: SessionOptions,
    ) -> Result<PreparedSession, SessionError> {
        let SessionOptions {
            id,
            workspace,
            tools,
            sandbox,
            rules,
        } = options;
        let policy = match rules {
            None => self.inner.policy.clone(),
            Some((name, rules)) => match &self.inner.policy {
                Some(policy) => Some(Arc::new(policy.narrowed(name, rules)?)),
                None => {
                    return Err(crate::policy::PolicyError::new(format!(
                        "session policy {name}: the engine has no policy to narrow (give it one, \
                         e.g. Policy::allow_all())"
                    ))
                    .into());
                }
            },
        };
        let base = self.snapshot().await;
        let mut budget = crate::validation::Budget::catalog();
        let mut own: Vec<Arc<RegisteredTool>> = Vec::with_capacity(tools.len());
        for spec in tools {
            if base.get(&spec.name).is_some() || own.iter().any(|t| *t.name == *spec.name) {
                return Err(RegistryError::Duplicate(spec.name).into());
            }
            own.push(Arc::new(crate::registry::prepare_in(spec, &mut budget)?));
        }
        let sandbox = match sandbox {
            None => Arc::clone(&self.inner.sandbox),
            Some(config) => Arc::new(Sandbox::prepare(config)?),
        };
        Ok(PreparedSession {
            id,
            workspace,
            own,
            sandbox,
            policy,
        })
    }

    /// Opens a session [`Engine::prepare_session`] prepared (in the engine's workspace unless it
    /// has one of its own).
    pub(crate) fn open_prepared(&self, prepared: PreparedSession) -> Session {
        let PreparedSession {
            id,
            workspace,
            own,
            sandbox,
            policy,
        } = prepared;
        let workspace = workspace.or_else(|| self.inner.workspace.clone());
        self.open(id, workspace, sandbox, own, policy)
    }

    fn open_session(&self, workspace: Option<Workspace>) -> Session {
        self.open(
            None,
            workspace,
            Arc::clone(&self.inner.sandbox),
            Vec::new(),
            self.inner.policy.clone(),
        )
    }

    fn open(
        &self,
        id: Option<String>,
        workspace: Option<Workspace>,
        sandbox: Arc<Sandbox>,
        own: Vec<Arc<RegisteredTool>>,
        policy: Option<Arc<crate::policy::Policy>>,
    ) -> Session {
        let n = self.inner.sessions_opened.fetch_add(1, Ordering::Relaxed) + 1;
        // With a journal, an unnamed session's id is unique to this run of the engine: a
        // session of an earlier run is continued only by naming it (`SessionOptions::id`).
        let id = id.unwrap_or_else(|| match &self.inner.journal {
            None => format!("s{n}"),
            Some(_) => format!("s{n}-{}", self.inner.run_tag),
        });
        let scope = Arc::new(SessionScope::new(id, workspace).with_sandbox(sandbox));
        // The session's turns all go through one of the engine's schedulers (the same one for the
        // session's whole life, so they are planned in the order they are dispatched); no actor
        // per session.
        let i = (n as usize) % self.inner.schedulers.len();
        let scheduler = self.inner.schedulers[i].clone();
        self.inner.metrics.sessions(1.0);
        Session::new(
            self.clone(),
            scheduler,
            scope,
            self.inner.root.child_token(),
            own,
            policy,
        )
    }

    /// A session closed (called once per session, when its last handle is dropped).
    pub(crate) fn session_closed(&self) {
        self.inner.metrics.sessions(-1.0);
    }
}
