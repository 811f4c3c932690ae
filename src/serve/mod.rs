//! `switchboard serve`: the engine as a long-running HTTP sidecar, for harnesses in any language.
//!
//! A front end like the CLI: it owns sessions and HTTP and dispatches through the same
//! `Session` API and the same document handling as `switchboard dispatch`
//! ([`crate::document::dispatch_document_with`]), adding no second path through the engine.
//!
//! | file | owns |
//! | --- | --- |
//! | `app.rs` | the shared `app::App` state and the request helpers handlers share |
//! | `routes.rs` | the route table, the small handlers, the token check, request metrics |
//! | `dispatch.rs` | one turn over HTTP: ordering, cancellation, a session's share of turns and the server's places for running ones |
//! | `sse.rs` | the streamed answer (`event: result` per call, then `event: done`) |
//! | `sessions.rs` | the sessions table, workspaces (private ones under `@sessions/`), each session's turn share, idle expiry, sessions restored from the journal (or kept there until they can be reopened) |
//! | `auth.rs` | the bearer token |
//! | `cluster.rs` | cluster mode: each session's requests served by its owner, takeover, placement, drain |
//! | `errors.rs` | the JSON error answers and their codes |
//! | `openapi.json` | the OpenAPI 3.1 description, served as is |
//!
//! This file: the flags and configuration, binding (the session cap the open-file limit allows),
//! and the accept loop (hyper's HTTP/1 with a header-read timeout).
//!
//! Lifecycle ([`Server::run`]): it serves until its shutdown future resolves (SIGTERM or SIGINT
//! for the CLI, or stdin's end with `--stop-on-stdin-close`; its launcher learns the address
//! from `--ready-fd`/`--ready-file`: `ready`), then stops taking work (new sessions and turns are answered `shutting_down`),
//! lets turns in flight finish for the grace period, cancels what still runs (answered
//! `cancelled`), closes the listener, lets every request in flight write its complete answer,
//! and returns.

mod app;
pub(crate) mod auth;
mod client_tools;
mod cluster;
mod dispatch;
mod errors;
mod ready;
mod routes;
mod sessions;
mod sse;
mod turns;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::TypedValueParser;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use crate::cluster::{ClusterArgs, ClusterError, DEFAULT_LEASE_TTL, DEFAULT_REPLICAS};
use crate::engine::Engine;
use crate::metrics::HttpMetrics;
use crate::tools::builtin_tools;
use app::App;
pub use auth::{Auth, TOKEN_ENV};
pub use errors::{ServeError, TokenProblem};
pub use ready::ReadyArgs;
pub use routes::{OPENAPI_JSON, RouteDef, route_table};
use sessions::SessionTable;
pub use sessions::{PolicyFileProblem, SessionPolicies, SessionPolicyError};

/// Default `--listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";
/// Default `--max-sessions`.
pub const DEFAULT_MAX_SESSIONS: usize = 10_000;
/// Default `--session-idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default `--max-body` (8 MiB).
pub const DEFAULT_MAX_BODY: usize = 8 * 1024 * 1024;
/// Default `--grace`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// Default `--max-requests`: turns running at once, across sessions.
pub const DEFAULT_MAX_REQUESTS: usize = 1_024;
/// Default `--read-timeout`: how long a request's headers, and then its body, may take to arrive.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Open files kept for everything but sessions (listener, journal, logs, MCP servers, hooks).
const RESERVED_FILES: u64 = 256;
/// Open files budgeted per session: its workspace directory, its client's connection, and the
/// pipes of a running call.
const FILES_PER_SESSION: u64 = 4;
/// How long connections may take to write their last answers after the engine has stopped.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long each load tool `sleep` call sleeps with `--with-load-tools`.
const LOAD_SLEEP: Duration = Duration::from_millis(10);

/// Flags of `switchboard serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Directory under which every session's workspace lives (created if missing).
    #[arg(long, value_name = "DIR")]
    pub workspace_root: PathBuf,
    /// File whose first line is the bearer token (otherwise the SWITCHBOARD_TOKEN variable).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve without a token (only on a loopback address).
    #[arg(long)]
    pub no_auth: bool,
    /// Most sessions open at once (beyond: too_many_sessions, 429).
    #[arg(long, default_value_t = DEFAULT_MAX_SESSIONS, value_parser = clap::value_parser!(u64).range(1..=10_000_000).map(|n| n as usize))]
    pub max_sessions: usize,
    /// Close a session after this long without a request (its workspace stays).
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub session_idle_timeout: Duration,
    /// Largest request body in bytes (beyond: payload_too_large, 413).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY, value_parser = clap::value_parser!(u64).range(1..=1 << 32).map(|n| n as usize))]
    pub max_body: usize,
    /// On SIGTERM/SIGINT, how long turns in flight may finish before they are cancelled.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// Most turns running at once across sessions; a session runs one turn at a time (beyond:
    /// overloaded, 503, nothing runs).
    #[arg(long, default_value_t = DEFAULT_MAX_REQUESTS, value_parser = clap::value_parser!(u64).range(1..=1_000_000).map(|n| n as usize))]
    pub max_requests: usize,
    /// Most turns one session may have running or waiting (beyond: overloaded, 503, nothing
    /// runs): a session flooded with turns cannot crowd out the others.
    #[arg(long, default_value_t = sessions::DEFAULT_TURN_SHARE, value_parser = clap::value_parser!(u64).range(1..=1_000_000).map(|n| n as usize))]
    pub max_session_turns: usize,
    /// How long a request's headers may take to arrive, and then its body (beyond: the
    /// connection is closed, or request_timeout, 408).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub read_timeout: Duration,
    /// Also register the load generator's workload tools (noop, sleep, cpu and their serial
    /// variants), for benchmarks.
    #[arg(long)]
    pub with_load_tools: bool,
    /// Let `read_file` follow files with several hard links in session workspaces (off by
    /// default: such a file may be the same as one outside the workspace).
    #[arg(long)]
    pub allow_hard_links: bool,
    /// Most client tools one session may declare at creation (beyond: bad_request, 400).
    #[arg(long, default_value_t = client_tools::DEFAULT_MAX_TOOLS, value_name = "N")]
    pub max_client_tools: usize,
    /// Largest input schema of one client tool, in bytes of JSON (beyond: bad_request, 400).
    #[arg(long, default_value_t = client_tools::DEFAULT_MAX_SCHEMA_BYTES, value_name = "BYTES")]
    pub max_client_schema_bytes: usize,
    /// Permission policy and audit log; `ask` is answered by the client (an `approval_required`
    /// event on the turn's stream, then `POST …/approvals/{approval_id}`).
    #[command(flatten)]
    pub policy: crate::command::PolicyArgs,
    /// A stricter policy a session may choose by name (`"policy": "NAME"` when it is created): a
    /// JSON file whose `permissions` (allow and deny rules and a default; no ask, no hooks)
    /// narrow `--policy` for that session. Repeatable.
    #[arg(long = "session-policy", value_name = "NAME=FILE")]
    pub session_policy: Vec<String>,
    /// How the sessions' commands are confined (a session may narrow it, never widen it).
    #[command(flatten)]
    pub sandbox: crate::command::SandboxArgs,
    /// MCP servers whose tools every session sees.
    #[command(flatten)]
    pub mcp: crate::mcp::command::McpArgs,
    /// The call journal.
    #[command(flatten)]
    pub journal: crate::command::JournalArgs,
    /// Cluster mode: nodes sharing sessions through NATS JetStream.
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
    /// Metrics on an address of their own, and a file written at exit (`/metrics` on the
    /// server's own address is always there).
    #[command(flatten)]
    pub telemetry: crate::command::TelemetryArgs,
    /// For a launcher: a ready line on a descriptor or in a file, and a stop when stdin closes.
    #[command(flatten)]
    pub ready: ready::ReadyArgs,
}

/// How a [`Server`] is set up (the library side of [`ServeArgs`]).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on (port 0: any free port; see [`Server::local_addr`]).
    pub listen: SocketAddr,
    /// Directory under which workspaces live (created if missing).
    pub workspace_root: PathBuf,
    /// Authentication of `/v1`.
    pub auth: Auth,
    /// Most sessions open at once.
    pub max_sessions: usize,
    /// Idle time after which a session is closed.
    pub idle_timeout: Duration,
    /// Largest request body in bytes.
    pub max_body: usize,
    /// Grace period of shutdown.
    pub grace: Duration,
    /// Most turns running at once across sessions.
    pub max_requests: usize,
    /// Most turns one session may have running or waiting.
    pub max_session_turns: usize,
    /// How long a request's headers, and then its body, may take to arrive.
    pub read_timeout: Duration,
    /// Register the load workload tools too.
    pub load_tools: bool,
    /// Engine workers (default: the engine's own).
    pub workers: Option<usize>,
    /// The installed Prometheus recorder, rendered at `/metrics` (empty without one).
    pub prometheus: Option<crate::exporter::MetricsHandle>,
    /// Permission policy and audit log (default: none).
    pub policy: crate::command::PolicyArgs,
    /// The stricter policies a session may choose (default: none).
    pub session_policies: SessionPolicies,
    /// The sandbox of the sessions' commands (default: `workspace-write`).
    pub sandbox: crate::sandbox::SandboxConfig,
    /// MCP servers (default: none); the server starts serving once each is up or has failed.
    pub mcp: crate::mcp::McpConfig,
    /// When a session's catalog defers tools marked `auto`.
    pub deferral: crate::registry::DeferralConfig,
    /// Let `read_file` follow multiply-linked files in workspaces.
    pub allow_hard_links: bool,
    /// Limits on client tools.
    pub client_tools: ClientToolLimits,
    /// The call journal (default: none): sessions and their answers survive a restart.
    pub journal: crate::command::JournalArgs,
    /// Cluster mode (default: a single node): `cluster.cluster` names the NATS servers.
    pub cluster: crate::cluster::ClusterArgs,
}

/// Limits on the client tools a session declares.
#[derive(Debug, Clone, Copy)]
pub struct ClientToolLimits {
    /// Most client tools per session.
    pub max_tools: usize,
    /// Largest input schema of one, in bytes of JSON.
    pub max_schema_bytes: usize,
}

impl Default for ClientToolLimits {
    fn default() -> Self {
        ClientToolLimits {
            max_tools: client_tools::DEFAULT_MAX_TOOLS,
            max_schema_bytes: client_tools::DEFAULT_MAX_SCHEMA_BYTES,
        }
    }
}

impl ServeConfig {
    /// The defaults of the CLI, on `listen` with workspaces under `workspace_root`.
    pub fn new(listen: SocketAddr, workspace_root: impl Into<PathBuf>, auth: Auth) -> Self {
        ServeConfig {
            listen,
            workspace_root: workspace_root.into(),
            auth,
            max_sessions: DEFAULT_MAX_SESSIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_body: DEFAULT_MAX_BODY,
            grace: DEFAULT_GRACE,
            max_requests: DEFAULT_MAX_REQUESTS,
            max_session_turns: sessions::DEFAULT_TURN_SHARE,
            read_timeout: DEFAULT_READ_TIMEOUT,
            load_tools: false,
            workers: None,
            prometheus: None,
            policy: crate::command::PolicyArgs::default(),
            session_policies: SessionPolicies::default(),
            sandbox: crate::sandbox::SandboxConfig::default(),
            mcp: crate::mcp::McpConfig::default(),
            deferral: crate::registry::DeferralConfig::default(),
            allow_hard_links: false,
            client_tools: ClientToolLimits::default(),
            journal: crate::command::JournalArgs::default(),
            cluster: crate::cluster::ClusterArgs::default(),
        }
    }
}

/// A bound server, not serving yet.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    grace: Duration,
    read_timeout: Duration,
    local_addr: SocketAddr,
    /// Cluster mode: ids of the sessions whose journal writes were refused (another node took
    /// them over), to close here.
    fenced: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
}

impl Server {
    /// Creates the workspace root, builds the engine with the built-in tools (and the load
    /// tools if asked) and binds the address. Must run inside a tokio runtime.
    pub async fn bind(config: ServeConfig) -> Result<Server, ServeError> {
        let root_error = |action, source| ServeError::WorkspaceRoot {
            action,
            path: config.workspace_root.clone(),
            source,
        };
        let root_was_there = config.workspace_root.is_dir();
        std::fs::create_dir_all(&config.workspace_root).map_err(|e| root_error("create", e))?;
        let root =
            std::fs::canonicalize(&config.workspace_root).map_err(|e| root_error("resolve", e))?;
        std::fs::create_dir_all(root.join(sessions::FRESH_DIR))
            .map_err(|e| root_error("create", e))?;
        let mut tools = builtin_tools();
        if config.load_tools {
            tools.extend(crate::testing::load_tools(LOAD_SLEEP));
        }
        let mut builder = Engine::builder()
            .tools(tools)
            .sandbox(config.sandbox.clone())
            .deferral(config.deferral);
        if let Some(w) = config.workers {
            builder = builder.workers(w);
        }
        let approvals = crate::policy::Approvals::new();
        let policy = match config.policy.policy(Arc::new(approvals.clone())) {
            Ok(Some(policy)) => Some(policy),
            // Session policies narrow a policy: without `--policy` it is the one allowing all.
            Ok(None) if !config.session_policies.is_empty() => Some(
                crate::policy::Policy::allow_all()
                    .approver(Arc::new(approvals.clone()))
                    .approval_timeout(config.policy.approval_timeout),
            ),
            Ok(None) => None,
            Err(e) => return Err(ServeError::Policy(e)),
        };
        if let Some(policy) = policy {
            builder = builder.policy(policy);
        }
        let listen_error = |source| ServeError::Listen {
            addr: config.listen,
            source,
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(listen_error)?;
        let local_addr = listener.local_addr().map_err(listen_error)?;
        builder = config.journal.apply(builder);
        let mut fenced = None;
        let cluster = match &config.cluster.cluster {
            None => None,
            Some(_) => {
                if config.journal.journal.is_some() {
                    return Err(ServeError::Cluster(crate::cluster::ClusterError::new(
                        "--cluster keeps the journal in NATS JetStream; drop --journal",
                    )));
                }
                let node = config
                    .cluster
                    .node_id
                    .clone()
                    .unwrap_or_else(|| crate::cluster::default_node_id(local_addr.port()));
                let cluster = crate::cluster::Cluster::connect(
                    &config.cluster,
                    &node,
                    &local_addr.to_string(),
                    &config.auth.cluster_digest(),
                )
                .await?;
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                fenced = Some(rx);
                let journal = cluster
                    .open_journal(
                        match config.cluster.cluster_retention {
                            r if r.is_zero() => crate::journal::DEFAULT_RETENTION,
                            r => r,
                        },
                        Box::new(move |id: &str| {
                            let _ = tx.send(id.to_string());
                        }),
                    )
                    .await?;
                journal.spawn_snapshots();
                builder = builder.journal_store(crate::journal::Journal::replicated(journal));
                Some(Arc::new(cluster))
            }
        };
        let engine = if config.mcp.servers.is_empty() {
            builder.build()?
        } else {
            builder.mcp_config(config.mcp.clone()).start().await?
        };
        let (max_sessions, max_by) = session_cap(config.max_sessions.max(1), open_file_limit());
        if max_by != "--max-sessions" {
            // With the default --max-sessions, the lower cap is the machine's, not a surprise:
            // said at info level (a warning on every default start taught users to ignore it).
            if config.max_sessions == DEFAULT_MAX_SESSIONS {
                tracing::info!(
                    sessions = max_sessions,
                    "serve: the open-file limit (ulimit -n) caps the sessions below the default --max-sessions"
                );
            } else {
                tracing::warn!(
                    sessions = max_sessions,
                    "serve: the open-file limit allows fewer sessions than --max-sessions"
                );
            }
        }
        let mut table = SessionTable::new(
            engine.clone(),
            root,
            config.idle_timeout,
            config.sandbox.clone(),
            client_tools::Limits {
                max_tools: config.client_tools.max_tools,
                max_schema_bytes: config.client_tools.max_schema_bytes,
            },
            config.allow_hard_links,
        )
        .with_policies(config.session_policies.clone())
        .with_max(max_sessions, max_by)
        .with_turn_share(config.max_session_turns);
        if let Some(cluster) = &cluster {
            table = table.with_cluster(Arc::clone(cluster));
        }
        let sessions = Arc::new(table);
        // With a journal, the sessions of the last run are back under their ids; those that
        // cannot be reopened now stay in the journal, to be reopened when a request names them.
        let restored = sessions.restore().await;
        if restored > 0 {
            tracing::info!(sessions = restored, "journal: sessions reopened");
        }
        if !root_was_there && sessions.dormant() > 0 {
            tracing::warn!(
                root = %config.workspace_root.display(),
                "serve: the workspace root did not exist and was created empty; the journal's sessions wait for their workspaces (put the root back: a session is reopened at its next request)"
            );
        }
        let app = Arc::new(App {
            engine,
            sessions,
            auth: config.auth,
            max_body: config.max_body,
            requests: Arc::new(Semaphore::new(config.max_requests.max(1))),
            read_timeout: config.read_timeout,
            stopping: CancellationToken::new(),
            prometheus: config.prometheus,
            http_metrics: HttpMetrics::new(&routes::route_templates()),
            approvals,
            cluster,
            draining: std::sync::atomic::AtomicBool::new(false),
        });
        if let Some(cluster) = &app.cluster {
            // Seen alive before the first request can be taken.
            cluster.heartbeat(app.cluster_load()).await?;
        }
        Ok(Server {
            listener,
            app,
            grace: config.grace,
            read_timeout: config.read_timeout,
            local_addr,
            fenced,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The engine the sessions dispatch through.
    pub fn engine(&self) -> &Engine {
        &self.app.engine
    }

    /// Serves until `shutdown` resolves, then shuts down cleanly (see the module docs) and
    /// returns once every connection has had its answers written (or after a 5 s drain limit).
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Server {
            listener,
            app,
            grace,
            read_timeout,
            fenced,
            ..
        } = self;
        let stop_accepting = CancellationToken::new();
        let reaper = tokio::spawn(reap_idle(Arc::clone(&app.sessions), stop_accepting.clone()));
        let router = routes::router(Arc::clone(&app));
        let stop_cluster = CancellationToken::new();
        let mut heartbeats = None;
        if let Some(cluster) = &app.cluster {
            let for_load = Arc::clone(&app);
            heartbeats = Some(tokio::spawn(
                Arc::clone(cluster)
                    .keep_alive(move || for_load.cluster_load(), stop_cluster.clone()),
            ));
            let relay_router = router.clone();
            let handler: crate::cluster::forward::Handler = Arc::new(move |request| {
                let router = relay_router.clone();
                Box::pin(async move {
                    use tower::ServiceExt;
                    match router.oneshot(request).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }
                })
            });
            let client = cluster.client().clone();
            let node = cluster.node().to_string();
            let stop = stop_accepting.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::cluster::forward::serve(client, node, handler, stop).await {
                    tracing::error!(error = %e, "cluster: relayed requests cannot be taken");
                }
            });
        }
        if let Some(cluster) = app.cluster.clone() {
            tokio::spawn(cluster::fence_when_stale(
                cluster,
                Arc::clone(&app.sessions),
                stop_cluster.clone(),
            ));
        }
        if let (Some(cluster), Some(mut fenced)) = (app.cluster.clone(), fenced) {
            let sessions = Arc::clone(&app.sessions);
            tokio::spawn(async move {
                while let Some(id) = fenced.recv().await {
                    cluster.metrics().fenced();
                    sessions.drop_local(&id);
                }
            });
        }
        let mut serving = tokio::spawn(serve_connections(
            listener,
            router,
            read_timeout,
            stop_accepting.clone(),
        ));
        tokio::select! {
            () = shutdown => {}
            ended = &mut serving => {
                reaper.abort();
                return match ended {
                    Ok(()) => Ok(()),
                    Err(e) => Err(ServeError::Stopped(e)),
                };
            }
        }
        // New sessions and turns are refused `shutting_down` from now on (connections are
        // still accepted, so a client gets that answer rather than a reset); turns in flight
        // get the grace period, then are cancelled and answered; then the listener closes and
        // the connections write their last answers.
        app.stopping.cancel();
        app.drain();
        if let Some(cluster) = &app.cluster {
            let _ = cluster.heartbeat(app.cluster_load()).await;
        }
        app.engine.shutdown(grace).await;
        // Cluster mode: the heartbeat goes, so other nodes take this node's sessions over at
        // once (their journals hold every answer given here).
        stop_cluster.cancel();
        if let Some(heartbeats) = heartbeats {
            let _ = heartbeats.await;
        }
        stop_accepting.cancel();
        reaper.abort();
        match tokio::time::timeout(DRAIN_LIMIT, &mut serving).await {
            Ok(_) => Ok(()),
            Err(_) => {
                serving.abort();
                tracing::warn!("connections still open {DRAIN_LIMIT:?} after shutdown; closed");
                Ok(())
            }
        }
    }
}

/// Accepts connections until `stop`, serving each with HTTP/1.1 whose request headers must
/// arrive within `read_timeout` (else the connection is closed), then lets every open connection
/// finish the request it is on and returns.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    read_timeout: Duration,
    stop: CancellationToken,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors or memory for a moment: wait rather than spin; the
                    // connections already open are served meanwhile.
                    tracing::warn!(error = %e, "serve: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        let connection =
            builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The most sessions the server may hold: `--max-sessions`, or fewer when the open-file limit
/// (`limit`, `None` for none) cannot give each session its budget of descriptors — with what set
/// it.
fn session_cap(max_sessions: usize, limit: Option<u64>) -> (usize, &'static str) {
    let Some(limit) = limit else {
        return (max_sessions, "--max-sessions");
    };
    let by_files = (limit.saturating_sub(RESERVED_FILES) / FILES_PER_SESSION).max(1);
    if by_files < max_sessions as u64 {
        (by_files as usize, "the open-file limit, ulimit -n")
    } else {
        (max_sessions, "--max-sessions")
    }
}

/// The process's soft open-file limit (`None`: unlimited).
fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Raises the soft open-file limit to the hard one (systemd's soft default of 1,024 would hold
/// only a few hundred sessions); a failure leaves the limit as it was, and the session cap
/// follows whatever it is.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "serve: cannot raise the open-file limit");
        }
    }
}

/// Closes idle sessions every quarter of the idle timeout (between 10 ms and 30 s).
async fn reap_idle(sessions: Arc<SessionTable>, stop: CancellationToken) {
    let period =
        (sessions.idle_timeout() / 4).clamp(Duration::from_millis(10), Duration::from_secs(30));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        let closed = sessions.expire_idle();
        if closed > 0 {
            tracing::info!(closed, "idle sessions closed");
        }
    }
}

/// Resolves on SIGTERM or SIGINT (installed at once, so a signal right after is not lost).
fn termination() -> Result<impl Future<Output = ()> + Send + 'static, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch SIGINT: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Runs `switchboard serve`: 0 after a clean shutdown, 2 for bad flags or an address that
/// cannot be bound, 1 if the server fails.
pub async fn run(args: ServeArgs) -> ExitCode {
    let fail = |code, message: &str| crate::command::fail(code, format!("serve: {message}"));
    raise_open_file_limit();
    let ready = match ready::Ready::claim(&args.ready) {
        Ok(ready) => ready,
        Err(e) => return fail(2, &e),
    };
    let auth = match Auth::resolve(
        args.listen,
        args.token_file.as_deref(),
        std::env::var(auth::TOKEN_ENV).ok(),
        args.no_auth,
    ) {
        Ok(auth) => auth,
        Err(e) => return fail(2, &e),
    };
    let mcp = match args.mcp.config() {
        Ok(mcp) => mcp,
        Err(e) => return fail(2, &e.to_string()),
    };
    let session_policies = match SessionPolicies::load(&args.session_policy) {
        Ok(policies) => policies,
        Err(e) => return fail(2, &e.to_string()),
    };
    // `--metrics-addr`/`--metrics-file` install the recorder with their endpoint; otherwise it
    // is installed here, for the server's own `/metrics`.
    let telemetry = match crate::exporter::Telemetry::start(
        args.telemetry.metrics_addr,
        args.telemetry.metrics_file.clone(),
    )
    .await
    {
        Ok(telemetry) => telemetry,
        Err(e) => return fail(2, &e.to_string()),
    };
    let prometheus = match telemetry.handle() {
        Some(handle) => handle,
        None => match crate::exporter::install_recorder() {
            Ok(installed) => installed,
            Err(e) => return fail(1, &e.to_string()),
        },
    };
    let config = ServeConfig {
        max_sessions: args.max_sessions,
        idle_timeout: args.session_idle_timeout,
        max_body: args.max_body,
        grace: args.grace,
        max_requests: args.max_requests,
        max_session_turns: args.max_session_turns,
        read_timeout: args.read_timeout,
        load_tools: args.with_load_tools,
        prometheus: Some(prometheus),
        policy: args.policy,
        session_policies,
        sandbox: args.sandbox.config(),
        deferral: args.mcp.deferral(),
        mcp,
        allow_hard_links: args.allow_hard_links,
        client_tools: ClientToolLimits {
            max_tools: args.max_client_tools,
            max_schema_bytes: args.max_client_schema_bytes,
        },
        journal: args.journal,
        cluster: args.cluster,
        ..ServeConfig::new(args.listen, args.workspace_root, auth)
    };
    let server = match Server::bind(config).await {
        Ok(server) => server,
        Err(ServeError::Engine(e)) => return fail(2, &crate::command::engine_error(&e)),
        Err(e) => return fail(2, &e.to_string()),
    };
    for s in server.engine().mcp_status() {
        if let crate::mcp::ServerState::Failed { reason } = &s.state {
            crate::command::say(&format!("MCP server {} failed: {reason}", s.name));
        }
    }
    let shutdown = match termination() {
        Ok(s) => s,
        Err(e) => return fail(1, &e),
    };
    let stdin_closed = args.ready.stop_on_stdin_close.then(ready::stdin_closed);
    let shutdown = async move {
        match stdin_closed {
            Some(closed) => tokio::select! {
                () = shutdown => {}
                () = closed => tracing::info!("serve: stdin closed (--stop-on-stdin-close); stopping"),
            },
            None => shutdown.await,
        }
    };
    crate::command::say(&format!(
        "serve: listening on http://{}",
        server.local_addr()
    ));
    if let Err(e) = ready.announce(server.local_addr()) {
        return fail(1, &e);
    }
    let result = server.run(shutdown).await;
    let written = telemetry.finish().await;
    match (result, written) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(e), _) => fail(1, &e.to_string()),
        (Ok(()), Err(e)) => fail(1, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::session_cap;

    #[test]
    fn sessions_are_capped_by_the_open_file_limit() {
        assert_eq!(session_cap(10_000, None), (10_000, "--max-sessions"));
        assert_eq!(
            session_cap(10_000, Some(1 << 20)),
            (10_000, "--max-sessions")
        );
        let (n, by) = session_cap(10_000, Some(1024));
        assert_eq!(n, (1024 - 256) / 4);
        assert!(by.contains("open-file"), "{by}");
        assert_eq!(session_cap(10_000, Some(10)).0, 1);
    }
}
