//! The `Engine`: builds the actors, and is the library's front door.
//!
//! `Engine::builder()` → register tools, set pool size and caps → `build()`. The engine owns the
//! Registry actor, a worker pool, a few shared Scheduler actors (session-less dispatch round
//! robin; each session pinned to one) and the registry snapshot every turn is planned with.
//! [`Engine::session`] gives a session its own cancellation and pins it to one scheduler.
//! Everything is reached through the `Engine` value (cheap to clone); there are no globals.
//!
//! A turn is planned on the caller's task ([`crate::scheduler::prepare`]); a turn whose handlers
//! are all inline also runs there, and only a turn that must wait goes to its scheduler actor.
//!
//! MCP servers ([`EngineBuilder::mcp_config`], [`EngineBuilder::mcp_server`]) start with the
//! engine: `build()` starts them in the background (their tools appear as each comes up), and
//! [`EngineBuilder::start`] builds and then waits until every server is up or has failed (each
//! within its startup timeout, all at once), so the first dispatch sees their tools.
//!
//! Shutdown ([`Engine::shutdown`]) stops taking turns, lets in-flight turns finish for a grace
//! period, then cancels what is still running — every call is still answered (`cancelled`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kameo::prelude::*;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::collector::ResultSink;
use crate::limiter::Limiter;
use crate::metrics::EngineMetrics;
use crate::protocol::{ToolCall, ToolDispatchResult};
use crate::registry::{
    CatalogFormat, GetSnapshot, Register, Registry, RegistryError, Snapshot, Unregister,
};
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::scheduler::{self, RunTurn, Scheduler};
use crate::tool::{SessionScope, ToolSpec};
use crate::worker::WorkerPool;

mod answers;
mod session;
use crate::workspace::Workspace;
pub use answers::Retention;
use session::Turf;
pub use session::{Session, SessionError, SessionOptions};

/// Default global cap on calls running at once (async and blocking handlers).
pub const DEFAULT_MAX_CONCURRENCY: usize = 256;
/// Default bound on calls waiting for the global cap; beyond it calls are answered `overloaded`.
pub const DEFAULT_MAX_QUEUED: usize = 10_000;

/// Configures and builds an [`Engine`].
#[derive(Debug, Default)]
pub struct EngineBuilder {
    tools: Vec<ToolSpec>,
    workers: Option<usize>,
    schedulers: Option<usize>,
    max_concurrency: Option<usize>,
    max_queued: Option<usize>,
    workspace: Option<Workspace>,
    sandbox: Option<SandboxConfig>,
    mcp: crate::mcp::McpConfig,
    policy: Option<crate::policy::Policy>,
    hooks: Vec<crate::policy::Hook>,
    deferral: crate::registry::DeferralConfig,
    journal: Option<(std::path::PathBuf, Duration)>,
    /// A journal opened by the caller (cluster mode's replicated one); wins over `journal`.
    journal_store: Option<crate::journal::Journal>,
    retention: Retention,
}

impl EngineBuilder {
    /// Records every session call in a durable journal in directory `dir` (created if missing;
    /// see [`crate::journal`] and `docs/retries.md`): an intent before a side-effect or
    /// idempotent call starts, the answer before it leaves the engine. A session reopened
    /// under the same id after a restart answers retried calls from it. `build` fails if the
    /// journal is damaged or in use.
    pub fn journal(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        let retention = self
            .journal
            .take()
            .map_or(crate::journal::DEFAULT_RETENTION, |(_, r)| r);
        self.journal = Some((dir.into(), retention));
        self
    }

    /// Records every session call in `journal`, opened by the caller (a replicated one, in
    /// cluster mode); replaces [`EngineBuilder::journal`].
    pub fn journal_store(mut self, journal: crate::journal::Journal) -> Self {
        self.journal_store = Some(journal);
        self
    }

    /// How long the journal keeps answered calls (default 24 hours); no effect without
    /// [`EngineBuilder::journal`].
    pub fn journal_retention(mut self, retention: Duration) -> Self {
        if let Some((_, r)) = &mut self.journal {
            *r = retention;
        }
        self
    }

    /// How many answers each session keeps in memory for retries, and how many bytes of them
    /// all sessions keep at most ([`Retention`]).
    pub fn answer_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Adds every server of an MCP configuration (`.mcp.json`); see [`crate::mcp`].
    pub fn mcp_config(mut self, config: crate::mcp::McpConfig) -> Self {
        self.mcp.servers.extend(config.servers);
        self
    }

    /// Adds one MCP server.
    pub fn mcp_server(mut self, name: impl Into<String>, spec: crate::mcp::ServerSpec) -> Self {
        self.mcp.servers.insert(name.into(), spec);
        self
    }

    /// Builds the engine ([`EngineBuilder::build`]) and waits until every MCP server is up or has
    /// failed to start (each within its startup timeout; they start concurrently). A server that
    /// fails is reported ([`Engine::mcp_status`], a warning in the log) and its tools are absent;
    /// the engine runs regardless.
    pub async fn start(self) -> Result<Engine, RegistryError> {
        let engine = self.build()?;
        engine.inner.mcp.ready().await;
        Ok(engine)
    }

    /// Registers a tool at build time.
    pub fn tool(mut self, spec: ToolSpec) -> Self {
        self.tools.push(spec);
        self
    }

    /// Registers several tools at build time.
    pub fn tools(mut self, specs: impl IntoIterator<Item = ToolSpec>) -> Self {
        self.tools.extend(specs);
        self
    }

    /// When tools marked [`Defer::Auto`](crate::Defer::Auto) are deferred (default: above 30
    /// tools, or above 10 % of a 200,000-token context); see `docs/tool-search.md`.
    pub fn deferral(mut self, config: crate::registry::DeferralConfig) -> Self {
        self.deferral = config;
        self
    }

    /// The workspace of [`Engine::dispatch`] and of sessions opened with [`Engine::session`]
    /// (default: none; the built-in tools then answer `execution_error` until a session is
    /// opened with [`Engine::session_in`]).
    pub fn workspace(mut self, workspace: Workspace) -> Self {
        self.workspace = Some(workspace);
        self
    }

    /// The OS sandbox of process-running tools (default: [`SandboxConfig::default`], i.e.
    /// `workspace-write` with no network, the trampoline found automatically). `build` fails if
    /// the mode cannot be enforced on this machine (unless it is `best-effort` or `off`).
    pub fn sandbox(mut self, config: SandboxConfig) -> Self {
        self.sandbox = Some(config);
        self
    }

    /// The permission policy of every call: rules, approver, external hooks, audit log (see
    /// [`crate::policy`]). Default: none, and a call pays one `Option` check for it.
    pub fn policy(mut self, policy: crate::policy::Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Adds an in-process `PreToolUse` or `PostToolUse` hook ([`crate::policy::Hook`]); hooks run
    /// in the order added, before the policy's external hooks. Without a policy, one that allows
    /// every call is made for them.
    pub fn hook(mut self, hook: crate::policy::Hook) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Number of worker actors (default: the number of CPUs, at least 2).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n.max(1));
        self
    }

    /// Number of shared scheduler actors (default: as many as workers). They run the turns that
    /// must wait — session-less ones round robin, a session's always on the one it was pinned to
    /// when it opened; a turn of inline handlers runs on the caller's task and never reaches one.
    pub fn schedulers(mut self, n: usize) -> Self {
        self.schedulers = Some(n.max(1));
        self
    }

    /// Global cap on async/blocking calls running at once (default 256). Calls beyond it wait for a
    /// permit (their queue time shows it).
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = Some(n.max(1));
        self
    }

    /// Bound on calls waiting for the global cap (default 10,000). A call that finds the line
    /// full is answered `overloaded` at once and nothing runs, so a flood cannot grow memory.
    pub fn max_queued(mut self, n: usize) -> Self {
        self.max_queued = Some(n);
        self
    }

    /// Builds the engine: registers the tools (refusing bad ones) and spawns the actors. Must be
    /// called inside a tokio runtime. Metric handles are taken from the recorder installed now
    /// (install one first to export metrics; see [`crate::metrics`]).
    ///
    /// Fails with [`RegistryError::Sandbox`] when the sandbox mode cannot be enforced here.
    pub fn build(self) -> Result<Engine, RegistryError> {
        let journal = match &self.journal {
            _ if self.journal_store.is_some() => self.journal_store.clone(),
            None => None,
            Some((dir, retention)) => Some(
                crate::journal::Journal::open(dir, *retention)
                    .map_err(|e| RegistryError::Journal(e.to_string()))?,
            ),
        };
        let sandbox = Arc::new(
            Sandbox::prepare(self.sandbox.unwrap_or_default()).map_err(RegistryError::Sandbox)?,
        );
        let version = Arc::new(AtomicU64::new(0));
        let metrics = Arc::new(EngineMetrics::new());
        metrics.sandbox_info(sandbox.mode().as_str(), sandbox.status().landlock_abi);
        let mut registry =
            Registry::new(Arc::clone(&version), Arc::clone(&metrics)).with_deferral(self.deferral);
        registry.register_all(self.tools)?;
        let snapshot = registry.snapshot();
        let policy = match (self.policy, self.hooks.is_empty()) {
            (None, true) => None,
            (policy, _) => Some(Arc::new(
                self.hooks
                    .into_iter()
                    .fold(policy.unwrap_or_default(), |p, h| p.hook(h)),
            )),
        };
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let workers_n = self.workers.unwrap_or(cpus.max(2));
        let limiter = Arc::new(Limiter::new(
            self.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY),
            self.max_queued.unwrap_or(DEFAULT_MAX_QUEUED),
        ));
        let registry = Registry::spawn(registry);
        let mcp = crate::mcp::McpServers::spawn(&self.mcp, &registry, &sandbox);
        let workers = WorkerPool::spawn(workers_n, Arc::clone(&limiter), Arc::clone(&metrics));
        let schedulers = (0..self.schedulers.unwrap_or(workers_n))
            .map(|_| Scheduler::spawn(Scheduler::new(workers.clone())))
            .collect();
        Ok(Engine {
            inner: Arc::new(Inner {
                registry,
                version,
                snapshot: ArcSwap::new(snapshot),
                workers,
                schedulers,
                next: AtomicUsize::new(0),
                root: CancellationToken::new(),
                limiter,
                closed: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                idle: Notify::new(),
                metrics,
                scope: Arc::new(
                    SessionScope::new("engine", self.workspace.clone())
                        .with_sandbox(Arc::clone(&sandbox)),
                ),
                policy,
                sandbox,
                workspace: self.workspace,
                sessions_opened: AtomicU64::new(0),
                mcp,
                journal,
                answer_limits: Arc::new(answers::Limits::new(self.retention)),
                run_tag: format!("{:x}", crate::journal::now_ms()),
            }),
        })
    }
}

struct Inner {
    registry: ActorRef<Registry>,
    version: Arc<AtomicU64>,
    /// The registry view turns are planned with, replaced when `version` moves.
    snapshot: ArcSwap<Snapshot>,
    workers: WorkerPool,
    schedulers: Vec<ActorRef<Scheduler>>,
    next: AtomicUsize,
    root: CancellationToken,
    limiter: Arc<Limiter>,
    closed: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
    metrics: Arc<EngineMetrics>,
    /// The scope of session-less dispatch.
    scope: Arc<SessionScope>,
    /// The default workspace of new sessions.
    workspace: Option<Workspace>,
    sessions_opened: AtomicU64,
    /// The OS sandbox every scope of this engine carries.
    sandbox: Arc<Sandbox>,
    mcp: crate::mcp::McpServers,
    /// The permission policy every call of this engine goes through (beside its scope, which
    /// tools see; tools never see the policy).
    policy: Option<Arc<crate::policy::Policy>>,
    /// The durable call journal, if any.
    journal: Option<crate::journal::Journal>,
    /// How many answers each session keeps in memory, and the count of all of them.
    answer_limits: Arc<answers::Limits>,
    /// Tells this run's unnamed sessions from an earlier run's (in the journal).
    run_tag: String,
}

/// The dispatch engine. Clone it freely: clones share the same actors.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("workers", &self.inner.workers.len())
            .field("schedulers", &self.inner.schedulers.len())
            .finish()
    }
}

/// An engine fault: the caller's problem, never the model's. Tool failures are results with an
/// [`ErrorCode`](crate::ErrorCode); these are what can make a *request to the engine* fail, and nothing of the
/// request ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The engine is shutting down or shut down ([`Engine::shutdown`]); the turn was refused.
    #[error("the engine is shut down")]
    ShutDown,
    /// The turn's scheduler actor is gone (its session was closed, or the engine stopped).
    #[error("scheduler unavailable: {0}")]
    SchedulerUnavailable(String),
    /// The registry actor is gone (the engine stopped).
    #[error("registry unavailable: {0}")]
    RegistryUnavailable(String),
    /// Cluster mode: another node owns the session now (its journal refused this node's
    /// write). Nothing of the turn that this node could not record is answered from here.
    #[error("session {0} is owned by another node now")]
    Moved(String),
}

impl Engine {
    /// Starts configuring an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Registers a tool at run time. Turns already planned keep the registry they saw.
    pub async fn register(&self, spec: ToolSpec) -> Result<(), RegistryError> {
        match self.inner.registry.ask(Register(spec)).await {
            Ok(()) => Ok(()),
            Err(SendError::HandlerError(e)) => Err(e),
            Err(e) => Err(RegistryError::Unavailable(e.to_string())),
        }
    }

    /// Unregisters a tool; false if it was not registered.
    pub async fn unregister(&self, name: &str) -> bool {
        self.inner
            .registry
            .ask(Unregister(name.to_string()))
            .await
            .unwrap_or(false)
    }

    /// The catalog in Anthropic, OpenAI or MCP shape, shaped by deferral for the engine's own
    /// session-less dispatch ([`Session::catalog`] for a session's): copies the caller may
    /// change freely. `Err` only when the engine has stopped.
    pub async fn catalog(&self, format: CatalogFormat) -> Result<Vec<Value>, EngineError> {
        if self.is_closed() {
            return Err(EngineError::ShutDown);
        }
        Ok(self.snapshot().await.catalog(&self.inner.scope, format))
    }

    /// True once shutdown began.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// How many tools are registered now.
    pub async fn tool_count(&self) -> usize {
        self.inner
            .registry
            .ask(GetSnapshot)
            .await
            .map_or(0, |s| s.len())
    }

    /// The registry version (bumped by every register/unregister).
    pub fn registry_version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    /// Dispatches one turn on a shared scheduler: one result per call, in call order. Every
    /// problem of a call is a result; only an engine fault ([`EngineError`]: shut down, an actor
    /// gone) is an `Err`, and then nothing of the turn ran. Safe to call from many tasks at once.
    pub async fn dispatch(
        &self,
        calls: Vec<ToolCall>,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.dispatch_with_cancel(calls, self.inner.root.clone())
            .await
    }

    /// Like [`Engine::dispatch`], cancellable on its own: cancelling `cancel` answers the turn's
    /// running and pending calls `cancelled`. Make `cancel` with [`Engine::turn_token`] so engine
    /// shutdown cancels it too.
    pub async fn dispatch_with_cancel(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.schedulers.len();
        let scheduler = &self.inner.schedulers[i];
        let turf = Turf {
            view: None,
            policy: self.inner.policy.clone(),
            gate: None,
            listener: None,
        };
        self.dispatch_on(scheduler, &self.inner.scope, calls, cancel, None, turf)
            .await
    }

    /// A cancellation token for one turn, cancelled also when the engine shuts down.
    pub fn turn_token(&self) -> CancellationToken {
        self.inner.root.child_token()
    }

    /// The permission policy, if the engine has one.
    pub fn policy(&self) -> Option<&crate::policy::Policy> {
        self.inner.policy.as_deref()
    }

    /// The OS sandbox in force for process-running tools.
    pub fn sandbox(&self) -> &Sandbox {
        &self.inner.sandbox
    }

    /// Turns the engine is working on now (every session's, waiting ones included).
    pub fn turns_in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// The engine's call journal, if it has one ([`EngineBuilder::journal`]).
    pub fn journal(&self) -> Option<&crate::journal::Journal> {
        self.inner.journal.as_ref()
    }

    /// Counts a session's turn in flight until the guard drops, so shutdown waits for it (its
    /// answers are journaled after the engine's part of the turn ends). `None` once shutdown
    /// began.
    pub(crate) fn enter_turn(&self) -> Option<impl Drop + '_> {
        let guard = InFlight::enter(&self.inner);
        (!self.is_closed()).then_some(guard)
    }

    pub(crate) fn metrics(&self) -> &EngineMetrics {
        &self.inner.metrics
    }

    /// The MCP servers' status (up, failed with the reason, …) and their registered tools.
    pub fn mcp_status(&self) -> Vec<crate::mcp::ServerStatus> {
        self.inner.mcp.statuses()
    }

    /// The engine's MCP servers.
    pub fn mcp_servers(&self) -> &crate::mcp::McpServers {
        &self.inner.mcp
    }

    /// How many worker actors the engine runs.
    pub fn worker_count(&self) -> usize {
        self.inner.workers.len()
    }

    /// Fault injection for tests (feature `testing`): stops worker `slot` as if it had crashed.
    /// Its calls in flight are answered `execution_error` and a new worker takes its place.
    #[cfg(feature = "testing")]
    pub fn kill_worker(&self, slot: usize) {
        self.inner.workers.kill(slot);
    }

    pub(crate) async fn dispatch_on(
        &self,
        scheduler: &ActorRef<Scheduler>,
        scope: &Arc<SessionScope>,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
        sink: Option<ResultSink>,
        turf: Turf,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        // Counted in flight before the check, so shutdown either sees this turn or refuses it.
        let _guard = InFlight::enter(&self.inner);
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(EngineError::ShutDown);
        }
        let arrived = Instant::now();
        let snapshot = match turf.view {
            Some(view) => view,
            None => self.snapshot().await,
        };
        let mut plan = scheduler::prepare(
            snapshot,
            calls,
            arrived,
            Arc::clone(scope),
            turf.policy,
            turf.gate,
        );
        plan.listener = turf.listener;
        if let Some(sink) = sink {
            plan.collector.attach_sink(sink);
        }
        if plan.all_inline() {
            // Every handler is inline (microseconds, never waiting): the turn runs here, on the
            // caller's task, with the same code and guarantees as on the scheduler, and no hop.
            return Ok(plan.run_inline(&self.inner.workers, &cancel));
        }
        scheduler
            .ask(RunTurn { plan, cancel })
            .await
            .map_err(|e| EngineError::SchedulerUnavailable(e.to_string()))
    }

    /// The registry snapshot to plan a turn with: the cached one while the registry's version has
    /// not moved (one atomic load and one reference count), else a fresh one from the Registry
    /// actor (one message, after a registration or removal). If the registry cannot answer, the
    /// last snapshot is used (the registry is gone only when the engine stops).
    pub(crate) async fn snapshot(&self) -> Arc<Snapshot> {
        let cached = self.inner.snapshot.load_full();
        if cached.version == self.inner.version.load(Ordering::Acquire) {
            return cached;
        }
        match self.inner.registry.ask(GetSnapshot).await {
            Ok(fresh) => {
                // Never replace a newer snapshot with an older one (two turns may refresh at once).
                self.inner.snapshot.rcu(|current| {
                    if current.version >= fresh.version {
                        Arc::clone(current)
                    } else {
                        Arc::clone(&fresh)
                    }
                });
                fresh
            }
            Err(_) => cached,
        }
    }

    /// Shuts down cleanly: new turns are refused ([`EngineError::ShutDown`]); turns in flight get `grace` to
    /// finish, then everything still running is cancelled (and answered). Actors stop afterwards.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.closed.store(true, Ordering::Release);
        let drained = tokio::time::timeout(grace, self.wait_idle()).await.is_ok();
        if !drained {
            self.inner.root.cancel();
            self.wait_idle().await;
        }
        self.inner.root.cancel();
        self.inner.mcp.shutdown().await;
        for s in &self.inner.schedulers {
            let _ = s.stop_gracefully().await;
        }
        self.inner.workers.stop().await;
        let _ = self.inner.registry.stop_gracefully().await;
        self.inner.limiter.close();
        if let Some(journal) = &self.inner.journal {
            journal.close();
        }
        // The audit lines of every answered call reach the file (unless its disk is stuck).
        if let Some(log) = self.policy().and_then(|p| p.audit_log()).cloned() {
            let _ = tokio::task::spawn_blocking(move || log.flush(Duration::from_secs(2))).await;
        }
    }

    async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.inner.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct InFlight<'a>(&'a Inner);

impl<'a> InFlight<'a> {
    fn enter(inner: &'a Inner) -> Self {
        inner.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(inner)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
