//! The `Engine`: builds the actors, and is the library's front door.
//!
//! `Engine::builder()` → register tools, set pool size and caps → `build()`. The engine owns the
//! Registry actor, a worker pool, and a few shared Scheduler actors for session-less dispatch;
//! [`Engine::session`] gives a session its own scheduler. Everything is reached through the
//! `Engine` value (cheap to clone); there are no globals.
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
use std::time::Duration;

use kameo::prelude::*;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::limiter::Limiter;
use crate::metrics::EngineMetrics;
use crate::protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult};
use crate::registry::{
    CatalogFormat, GetCatalog, GetSnapshot, Register, RegisteredTool, Registry, RegistryError,
    Resolve, Unregister,
};
use crate::scheduler::{DispatchTurn, Scheduler};
use crate::tool::ToolSpec;
use crate::worker::WorkerPool;

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
    mcp: crate::mcp::McpConfig,
}

impl EngineBuilder {
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

    /// Number of worker actors (default: the number of CPUs, at least 2).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n.max(1));
        self
    }

    /// Number of shared scheduler actors used by [`Engine::dispatch`] (default: as many as workers).
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
    pub fn build(self) -> Result<Engine, RegistryError> {
        let version = Arc::new(AtomicU64::new(0));
        let metrics = Arc::new(EngineMetrics::new());
        let mut registry = Registry::new(Arc::clone(&version), Arc::clone(&metrics));
        for spec in self.tools {
            registry.register(spec)?;
        }
        let snapshot = registry.snapshot();
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let workers_n = self.workers.unwrap_or(cpus.max(2));
        let limiter = Arc::new(Limiter::new(
            self.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY),
            self.max_queued.unwrap_or(DEFAULT_MAX_QUEUED),
        ));
        let registry = Registry::spawn(registry);
        let mcp = crate::mcp::McpServers::spawn(&self.mcp, &registry);
        let workers = WorkerPool::spawn(workers_n, Arc::clone(&limiter), Arc::clone(&metrics));
        let schedulers = (0..self.schedulers.unwrap_or(workers_n))
            .map(|_| {
                Scheduler::spawn(Scheduler::new(
                    registry.clone(),
                    Arc::clone(&version),
                    Arc::clone(&snapshot),
                    workers.clone(),
                ))
            })
            .collect();
        Ok(Engine {
            inner: Arc::new(Inner {
                registry,
                version,
                workers,
                schedulers,
                next: AtomicUsize::new(0),
                root: CancellationToken::new(),
                limiter,
                closed: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                idle: Notify::new(),
                metrics,
                mcp,
            }),
        })
    }
}

struct Inner {
    registry: ActorRef<Registry>,
    version: Arc<AtomicU64>,
    workers: WorkerPool,
    schedulers: Vec<ActorRef<Scheduler>>,
    next: AtomicUsize,
    root: CancellationToken,
    limiter: Arc<Limiter>,
    closed: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
    metrics: Arc<EngineMetrics>,
    mcp: crate::mcp::McpServers,
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

/// The reason an engine-level request (not a tool call) failed: the registry actor is gone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("engine unavailable: {0}")]
pub struct EngineUnavailable(pub String);

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

    /// The catalog in Anthropic, OpenAI or MCP shape: copies the caller may change freely.
    pub async fn catalog(&self, format: CatalogFormat) -> Result<Vec<Value>, EngineUnavailable> {
        self.inner
            .registry
            .ask(GetCatalog(format))
            .await
            .map_err(|e| EngineUnavailable(e.to_string()))
    }

    /// Resolves every name of a turn in one registry message.
    pub async fn resolve(
        &self,
        names: Vec<Arc<str>>,
    ) -> Result<Vec<Option<Arc<RegisteredTool>>>, EngineUnavailable> {
        self.inner
            .registry
            .ask(Resolve(names))
            .await
            .map_err(|e| EngineUnavailable(e.to_string()))
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

    /// Dispatches one turn on a shared scheduler: one result per call, in call order. Never fails:
    /// every problem is a result. Safe to call from many tasks at once.
    pub async fn dispatch(&self, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
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
    ) -> Vec<ToolDispatchResult> {
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.schedulers.len();
        let scheduler = &self.inner.schedulers[i];
        self.dispatch_on(scheduler, calls, cancel).await
    }

    /// A cancellation token for one turn, cancelled also when the engine shuts down.
    pub fn turn_token(&self) -> CancellationToken {
        self.inner.root.child_token()
    }

    /// The MCP servers' status (up, failed with the reason, …) and their registered tools.
    pub fn mcp_status(&self) -> Vec<crate::mcp::ServerStatus> {
        self.inner.mcp.statuses()
    }

    /// The engine's MCP servers.
    pub fn mcp_servers(&self) -> &crate::mcp::McpServers {
        &self.inner.mcp
    }

    /// The worker pool (for diagnostics and fault injection: [`WorkerPool::kill`]).
    pub fn workers(&self) -> &WorkerPool {
        &self.inner.workers
    }

    /// A new session: its own scheduler and its own cancellation. The scheduler stops when the
    /// last clone of the session is dropped.
    pub fn session(&self) -> Session {
        let snapshot = Arc::new(crate::registry::Snapshot::default());
        let scheduler = Scheduler::spawn(Scheduler::new(
            self.inner.registry.clone(),
            Arc::clone(&self.inner.version),
            snapshot,
            self.inner.workers.clone(),
        ));
        self.inner.metrics.sessions(1.0);
        Session {
            inner: Arc::new(SessionInner {
                engine: self.clone(),
                scheduler,
                cancel: self.inner.root.child_token(),
            }),
        }
    }

    async fn dispatch_on(
        &self,
        scheduler: &ActorRef<Scheduler>,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> Vec<ToolDispatchResult> {
        if calls.is_empty() {
            return Vec::new();
        }
        // Counted in flight before the check, so shutdown either sees this turn or refuses it.
        let _guard = InFlight::enter(&self.inner);
        if self.inner.closed.load(Ordering::Acquire) {
            return answer_all(&calls, ErrorCode::Cancelled, "the engine is shutting down");
        }
        let identities: Vec<_> = calls
            .iter()
            .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name)))
            .collect();
        match scheduler.ask(DispatchTurn { calls, cancel }).await {
            Ok(results) => results,
            Err(e) => identities
                .into_iter()
                .map(|(id, name)| {
                    ToolDispatchResult::error(
                        id,
                        name,
                        ErrorCode::ExecutionError,
                        &format!("scheduler unavailable: {e}"),
                        Timing::default(),
                    )
                })
                .collect(),
        }
    }

    /// Shuts down cleanly: new turns are answered `cancelled`; turns in flight get `grace` to
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

fn answer_all(calls: &[ToolCall], code: ErrorCode, detail: &str) -> Vec<ToolDispatchResult> {
    calls
        .iter()
        .map(|c| {
            ToolDispatchResult::error(
                Arc::clone(&c.id),
                Arc::clone(&c.name),
                code,
                detail,
                Timing::default(),
            )
        })
        .collect()
}

/// One agent session's handle: its own scheduler actor (stopped when the last handle is dropped)
/// and its own cancellation token. Clones share the session.
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

#[derive(Debug)]
struct SessionInner {
    engine: Engine,
    scheduler: ActorRef<Scheduler>,
    cancel: CancellationToken,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        self.engine.inner.metrics.sessions(-1.0);
    }
}

impl Session {
    /// Dispatches one turn of this session: one result per call, in call order.
    pub async fn dispatch(&self, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
        self.dispatch_with_cancel(calls, self.inner.cancel.clone())
            .await
    }

    /// Like [`Session::dispatch`], cancellable on its own. Make `cancel` with
    /// [`Session::turn_token`] so that cancelling the session (or the engine) cancels it too.
    pub async fn dispatch_with_cancel(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> Vec<ToolDispatchResult> {
        self.inner
            .engine
            .dispatch_on(&self.inner.scheduler, calls, cancel)
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

    /// The engine this session belongs to.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}
