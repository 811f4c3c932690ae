//! What the supervisor and a server's tool handlers share: the [`Link`] a call sees (starting,
//! up, restarting, down, stopped), the live connection (with the routes of its calls' progress
//! notifications, [`ProgressRoutes`]), and the server's status as
//! `switchboard mcp list` shows it. The supervisor (`server_conn.rs`) writes it; the tool
//! handlers (`tools.rs`) read it.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, OnceLock};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleClient};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::config::ServerSpec;
use crate::metrics::McpServerMetrics;
use crate::sandbox::Containment;
use crate::tool::Progress;

/// What a call sees of its server.
#[derive(Clone)]
pub(crate) enum Link {
    /// First start in progress.
    Starting,
    /// Connected.
    Up(Arc<Live>),
    /// Exited; a restart is pending.
    Restarting,
    /// Down for good: failed to start, gave up restarting, or disabled.
    Down(String),
    /// Shut down with the engine.
    Stopped,
}

/// A live connection.
pub(crate) struct Live {
    /// The rmcp peer to send requests on.
    pub peer: Peer<RoleClient>,
    /// Cancelled when the connection ends.
    pub exited: CancellationToken,
    pub(super) reason: OnceLock<String>,
    /// Where the connection's `notifications/progress` go: the calls in flight that have a
    /// listener, by the progress token rmcp gave their request.
    pub progress: ProgressRoutes,
}

/// The calls of one connection whose progress somebody listens to, by progress token.
#[derive(Clone, Default)]
pub(crate) struct ProgressRoutes(Arc<Mutex<HashMap<ProgressToken, Progress>>>);

impl ProgressRoutes {
    /// Sends `token`'s notifications to `progress` until the returned guard is dropped.
    pub fn route(&self, token: ProgressToken, progress: Progress) -> RouteGuard {
        crate::locks::lock(&self.0).insert(token.clone(), progress);
        RouteGuard {
            routes: self.clone(),
            token,
        }
    }

    /// A `notifications/progress` of the server: to its call's listener, if it has one.
    pub fn deliver(&self, params: &ProgressNotificationParam) {
        let progress = crate::locks::lock(&self.0)
            .get(&params.progress_token)
            .cloned();
        if let Some(progress) = progress {
            progress.report(params.progress, params.total, params.message.as_deref());
        }
    }
}

/// Removes a call's progress route when the call ends.
pub(crate) struct RouteGuard {
    routes: ProgressRoutes,
    token: ProgressToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        crate::locks::lock(&self.routes.0).remove(&self.token);
    }
}

impl Live {
    /// Why the connection ended (once it has).
    pub fn reason(&self) -> &str {
        self.reason
            .get()
            .map_or("the connection closed", String::as_str)
    }
}

/// A server's state, as `switchboard mcp list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ServerState {
    /// `enabled: false`.
    Disabled,
    /// Starting for the first time.
    Starting,
    /// Connected; its tools are registered.
    Up,
    /// Exited; restarting after a backoff.
    Restarting {
        /// Why it exited.
        reason: String,
    },
    /// Failed to start, or stayed down after repeated failures; its tools are absent.
    Failed {
        /// Why.
        reason: String,
    },
    /// Shut down.
    Stopped,
}

/// One of a server's tools as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolEntry {
    /// The registry name (`mcp__server__tool`).
    pub name: String,
    /// The name the server knows it by.
    pub raw_name: String,
    /// Runs concurrently with neighbouring concurrency-safe calls.
    pub concurrency_safe: bool,
}

/// A server's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerStatus {
    /// The configured name.
    pub name: String,
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// Up, failed, …
    #[serde(flatten)]
    pub state: ServerState,
    /// Restarts so far.
    pub restarts: u32,
    /// Its registered tools.
    pub tools: Vec<ToolEntry>,
    /// Tools it listed that were not registered (raw name, why).
    pub skipped: Vec<(String, String)>,
}

/// State shared by the supervisor, the tools' handlers and the engine.
pub(crate) struct Shared {
    pub name: String,
    pub spec: ServerSpec,
    pub link: watch::Sender<Link>,
    pub metrics: McpServerMetrics,
    pub(super) status: Mutex<ServerStatus>,
    pub(super) shutdown: CancellationToken,
    pub(super) pid: AtomicU32,
    /// The engine's process-tree control, for a stdio server's process.
    pub(super) containment: Arc<Containment>,
}

impl Shared {
    pub(super) fn set_state(&self, state: ServerState) {
        if let Ok(mut s) = self.status.lock() {
            s.state = state;
        }
    }
}
