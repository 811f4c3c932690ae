//! One MCP server's connection and its supervisor task.
//!
//! The supervisor owns the connection: it starts the server (spawn or HTTP, `initialize`, the
//! first `tools/list`, all within the startup timeout), registers the server's tools in the
//! registry as one group, re-lists them on `notifications/tools/list_changed` (replacing the group
//! atomically), and, when the server exits or its connection breaks, tells the calls in flight at
//! once and restarts it with backoff (1 s doubling to 30 s; after 5 failures within 5 minutes it
//! stays down and its tools are removed). A server that fails its *first* start is reported and
//! not retried. Shutdown closes the connection (stdin closed, SIGTERM, then SIGKILL).
//!
//! Calls reach the connection through a `watch` of [`Link`]: a call waits (within its own
//! deadline) while the server starts or restarts, and uses the live peer when it is up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kameo::prelude::ActorRef;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::{ServerSpec, Transport, server_name_rule, valid_server_name};
use super::link::{Link, Live, ProgressRoutes, Shared};
pub use super::link::{ServerState, ServerStatus, ToolEntry};
use super::wire::Unread;
use super::{listing, names, tools, transport};
use crate::metrics::McpServerMetrics;
use crate::registry::{Registry, RegistryError, ReplaceGroup};
use crate::sandbox::Containment;

/// First restart delay.
pub const BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// This many failures within [`FAILURE_WINDOW`] and the server stays down.
pub const MAX_FAILURES: usize = 5;
/// See [`MAX_FAILURES`].
pub const FAILURE_WINDOW: Duration = Duration::from_secs(300);
/// A connection that stayed up this long resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long closing a server may take before its process group is killed.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// One configured server: its supervisor task and shared state. Dropping it does not stop the
/// server; [`Server::shutdown`] does.
pub struct Server {
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.shared.name)
            .finish()
    }
}

impl Server {
    /// Starts supervising `name` (in the background; see [`Server::ready`]). Must be called inside
    /// a tokio runtime.
    pub(crate) fn spawn(
        name: String,
        spec: ServerSpec,
        registry: ActorRef<Registry>,
        containment: Arc<Containment>,
    ) -> Server {
        let invalid = (!valid_server_name(&name))
            .then(|| format!("invalid server name {name:?}: {}", server_name_rule()));
        let enabled = spec.enabled && invalid.is_none();
        let (link, _) = watch::channel(match &invalid {
            Some(reason) => Link::Down(reason.clone()),
            None if enabled => Link::Starting,
            None => Link::Down("disabled in the configuration".into()),
        });
        let shared = Arc::new(Shared {
            status: Mutex::new(ServerStatus {
                name: name.clone(),
                transport: spec.transport.kind(),
                state: match invalid {
                    Some(reason) => ServerState::Failed { reason },
                    None if enabled => ServerState::Starting,
                    None => ServerState::Disabled,
                },
                restarts: 0,
                tools: Vec::new(),
                skipped: Vec::new(),
            }),
            metrics: McpServerMetrics::new(&name),
            name,
            spec,
            link,
            shutdown: CancellationToken::new(),
            pid: AtomicU32::new(0),
            containment,
        });
        let task = enabled.then(|| tokio::spawn(supervise(Arc::clone(&shared), registry)));
        Server {
            shared,
            task: Mutex::new(task),
        }
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Waits until the first start has succeeded or failed (each server is bounded by its startup
    /// timeout).
    pub async fn ready(&self) {
        let mut rx = self.shared.link.subscribe();
        let _ = rx.wait_for(|l| !matches!(l, Link::Starting)).await;
    }

    /// The status now.
    pub fn status(&self) -> ServerStatus {
        self.shared
            .status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// The process id of the current stdio server's process group leader (0 if none yet).
    pub fn pid(&self) -> u32 {
        self.shared.pid.load(Ordering::Acquire)
    }

    /// Closes the connection (stdin closed, then SIGTERM, then SIGKILL) and stops supervising.
    pub async fn shutdown(&self) {
        self.shared.shutdown.cancel();
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
        self.shared.link.send_replace(Link::Stopped);
        self.shared.set_state(ServerState::Stopped);
        self.shared.metrics.up(false);
    }
}

/// The client side of one connection: forwards `tools/list_changed`, and each
/// `notifications/progress` to its call's listener (logged at debug either way).
struct ClientSide {
    server: String,
    changed: mpsc::Sender<()>,
    progress: ProgressRoutes,
}

impl ClientHandler for ClientSide {
    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "MCP tools/list_changed");
        let _ = self.changed.try_send(());
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        // Progress extends no deadline; it goes to the call's listener, if it has one.
        tracing::debug!(server = %self.server, progress = params.progress,
            total = ?params.total, message = ?params.message, "MCP progress");
        self.progress.deliver(&params);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("switchboard", env!("CARGO_PKG_VERSION")),
        )
    }
}

type Running = RunningService<RoleClient, ClientSide>;

/// A started connection: the running service, the `list_changed` signal, where unreadable
/// tools of a page are reported, and the first listing (tools, and those skipped).
struct Connected {
    running: Running,
    progress: ProgressRoutes,
    changed: mpsc::Receiver<()>,
    unread: Unread,
    listed: Vec<rmcp::model::Tool>,
    skipped: Vec<(String, String)>,
}

/// Starts the server and lists its tools, within the startup timeout.
async fn connect(shared: &Arc<Shared>) -> Result<Connected, String> {
    let (tx, changed) = mpsc::channel(1);
    let progress = ProgressRoutes::default();
    let handler = ClientSide {
        server: shared.name.clone(),
        changed: tx,
        progress: progress.clone(),
    };
    let start = async {
        let (running, unread) = match &shared.spec.transport {
            t @ Transport::Stdio { command, .. } => {
                let (child, pid) = transport::spawn_stdio(&shared.name, t, &shared.containment)
                    .map_err(|e| format!("cannot start {command:?}: {e}"))?;
                shared.pid.store(pid, Ordering::Release);
                let unread = child.unread();
                let running = handler
                    .serve(child)
                    .await
                    .map_err(|e| format!("initialize failed: {e}"))?;
                (running, unread)
            }
            t @ Transport::Http { url, .. } => {
                let http = transport::http(t)?;
                let running = handler
                    .serve(http)
                    .await
                    .map_err(|e| format!("initialize with {url} failed: {e}"))?;
                (running, Unread::default())
            }
        };
        let (listed, skipped) =
            listing::list_tools(running.peer(), shared.spec.list_limits, &unread).await?;
        Ok::<_, String>(Connected {
            running,
            progress,
            changed,
            unread,
            listed,
            skipped,
        })
    };
    let limit = shared.spec.startup_timeout;
    tokio::select! {
        r = tokio::time::timeout(limit, start) => r.unwrap_or_else(|_| Err(format!(
            "did not start within its startup timeout ({} ms)", limit.as_millis()))),
        _ = shared.shutdown.cancelled() => Err("shut down while starting".into()),
    }
}

/// Registers `listed` as the server's tool group (one version bump) and records the result:
/// the tools registered, and those left out with why (`skipped` holds the ones already left out
/// while listing). Registry names are distinct, so each refusal names exactly one tool.
async fn register(
    shared: &Arc<Shared>,
    registry: &ActorRef<Registry>,
    listed: Vec<rmcp::model::Tool>,
    mut skipped: Vec<(String, String)>,
) {
    let built = tools::build(shared, listed);
    let mut entries = built.entries;
    skipped.extend(built.skipped);
    let refused = registry
        .ask(ReplaceGroup {
            prefix: names::prefix(&shared.name),
            specs: built.specs,
        })
        .await
        .unwrap_or_default();
    for e in refused {
        let text = e.to_string();
        let name = match &e {
            RegistryError::Duplicate(n) | RegistryError::InvalidName(n) => n.as_str(),
            RegistryError::BadSchema { name, .. } => name.as_str(),
            _ => continue,
        };
        if let Some(i) = entries.iter().position(|t| t.name == name) {
            let t = entries.remove(i);
            skipped.push((t.raw_name, text));
        }
    }
    for (raw, why) in &skipped {
        tracing::warn!(server = %shared.name, "MCP tool {raw:?} skipped: {why}");
    }
    if let Ok(mut s) = shared.status.lock() {
        s.tools = entries;
        s.skipped = skipped;
    }
}

async fn unregister_all(shared: &Arc<Shared>, registry: &ActorRef<Registry>) {
    let _ = registry
        .ask(ReplaceGroup {
            prefix: names::prefix(&shared.name),
            specs: Vec::new(),
        })
        .await;
    if let Ok(mut s) = shared.status.lock() {
        s.tools.clear();
    }
}

/// The supervisor: start, serve, restart, give up, or shut down.
async fn supervise(shared: Arc<Shared>, registry: ActorRef<Registry>) {
    let mut failures: VecDeque<Instant> = VecDeque::new();
    let mut backoff = BACKOFF_START;
    let mut first = true;
    loop {
        let reason = match connect(&shared).await {
            Ok(Connected {
                running,
                progress,
                changed,
                unread,
                listed,
                skipped,
            }) => {
                register(&shared, &registry, listed, skipped).await;
                let live = Arc::new(Live {
                    peer: running.peer().clone(),
                    exited: CancellationToken::new(),
                    reason: OnceLock::new(),
                    progress,
                });
                shared.set_state(ServerState::Up);
                shared.metrics.up(true);
                shared.link.send_replace(Link::Up(Arc::clone(&live)));
                tracing::info!(server = %shared.name, "MCP server up");
                first = false;
                let up_since = Instant::now();
                let ended = serve(&shared, &registry, running, changed, &unread).await;
                shared.metrics.up(false);
                let Some(reason) = ended else {
                    return; // shut down
                };
                let _ = live
                    .reason
                    .set(format!("MCP server {} exited: {reason}", shared.name));
                live.exited.cancel();
                if up_since.elapsed() >= STABLE_AFTER {
                    backoff = BACKOFF_START;
                }
                reason
            }
            Err(reason) if first => {
                tracing::warn!(server = %shared.name, "MCP server failed to start: {reason}");
                shared.set_state(ServerState::Failed {
                    reason: reason.clone(),
                });
                shared.link.send_replace(Link::Down(reason));
                return;
            }
            Err(reason) => reason,
        };
        if shared.shutdown.is_cancelled() {
            return;
        }
        let now = Instant::now();
        failures.push_back(now);
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > FAILURE_WINDOW)
        {
            failures.pop_front();
        }
        if failures.len() >= MAX_FAILURES {
            let reason = format!(
                "stays down after {MAX_FAILURES} failures within {} minutes; last: {reason}",
                FAILURE_WINDOW.as_secs() / 60
            );
            tracing::error!(server = %shared.name, "MCP server {reason}");
            unregister_all(&shared, &registry).await;
            shared.set_state(ServerState::Failed {
                reason: reason.clone(),
            });
            shared.link.send_replace(Link::Down(reason));
            return;
        }
        tracing::warn!(server = %shared.name, "MCP server down ({reason}); restarting in {backoff:?}");
        shared.set_state(ServerState::Restarting { reason });
        shared.link.send_replace(Link::Restarting);
        shared.metrics.restarted();
        if let Ok(mut s) = shared.status.lock() {
            s.restarts += 1;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shared.shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Serves one live connection until it ends (`Some(reason)`) or the engine shuts down (`None`).
async fn serve(
    shared: &Arc<Shared>,
    registry: &ActorRef<Registry>,
    running: Running,
    mut changed: mpsc::Receiver<()>,
    unread: &Unread,
) -> Option<String> {
    let peer = running.peer().clone();
    let cancel = running.cancellation_token();
    let mut waiting = std::pin::pin!(running.waiting());
    loop {
        tokio::select! {
            quit = &mut waiting => {
                return Some(match quit {
                    Ok(reason) => format!("{reason:?}").to_lowercase(),
                    Err(e) => e.to_string(),
                });
            }
            Some(()) = changed.recv() => {
                let listing = listing::list_tools(&peer, shared.spec.list_limits, unread);
                match tokio::time::timeout(shared.spec.startup_timeout, listing).await {
                    Ok(Ok((listed, skipped))) => register(shared, registry, listed, skipped).await,
                    Ok(Err(e)) => tracing::warn!(server = %shared.name,
                        "re-listing after list_changed: {e}; the tools it had stay"),
                    Err(_) => tracing::warn!(server = %shared.name,
                        "re-listing after list_changed timed out; the tools it had stay"),
                }
            }
            _ = shared.shutdown.cancelled() => {
                cancel.cancel();
                let _ = tokio::time::timeout(CLOSE_GRACE, &mut waiting).await;
                return None;
            }
        }
    }
}
