//! MCP: tools of Model Context Protocol servers as registry entries, and Switchboard's own tools
//! served over MCP.
//!
//! * `config` — the `.mcp.json` `mcpServers` format plus Switchboard's per-server keys.
//! * `names` — `mcp__<server>__<tool>` registry names within 64 characters, unique.
//! * `lines`, `wire`, `recover` — MCP's stdio framing: bounded lines, an answer for every
//!   request that cannot be read, and what can be kept of a response that does not decode.
//! * `transport` — a stdio child (allowlisted environment, own process group) or Streamable
//!   HTTP.
//! * `listing` — a server's `tools/list`, all pages, within its limits.
//! * `server_conn` — one server's connection and supervisor (start, list, re-list, restart with
//!   backoff, shut down).
//! * `tools` — a listed tool as a [`crate::ToolSpec`] whose handler is a `tools/call`.
//! * `serve` — `switchboard mcp-serve`: the built-in tools over stdio.
//! * `list` — `switchboard mcp list`.
//! * `load` — `switchboard load --mcp-config FILE --mcp-call NAME`.
//! * `command` — the `--mcp-config` flag, `mcp list` and `mcp-serve` commands.
//!
//! [`McpServers`] is the set an engine owns: started by the engine builder, closed by
//! [`crate::Engine::shutdown`].

#[cfg(feature = "cli")]
pub(crate) mod command;
pub(crate) mod config;
mod lines;
mod link;
#[cfg(feature = "cli")]
pub(crate) mod list;
mod listing;
pub(crate) mod names;
mod recover;
#[cfg(feature = "cli")]
pub(crate) mod serve;
mod server_conn;
mod tools;
pub(crate) mod transport;
mod wire;

use futures::future::join_all;
use kameo::prelude::ActorRef;

pub use config::{ConfigError, ListLimits, McpConfig, ServerSpec, Transport, valid_server_name};
pub use names::registry_names;
pub use server_conn::{Server, ServerState, ServerStatus, ToolEntry};
pub use tools::IDEMPOTENCY_META_KEY;

use std::sync::Arc;

use crate::registry::Registry;
use crate::sandbox::{Containment, Sandbox};

/// The MCP servers of one engine.
#[derive(Debug, Default)]
pub struct McpServers {
    servers: Vec<Server>,
}

impl McpServers {
    /// Starts supervising every server of `config` at once (in the background); stdio servers
    /// run under the process-tree control `sandbox`'s machine offers.
    pub(crate) fn spawn(
        config: &McpConfig,
        registry: &ActorRef<Registry>,
        sandbox: &Sandbox,
    ) -> Self {
        let stdio = config
            .servers
            .values()
            .any(|s| s.enabled && matches!(s.transport, Transport::Stdio { .. }));
        // Found once, and only when a stdio server will start.
        let containment = Arc::new(if stdio {
            Containment::find(sandbox)
        } else {
            Containment::default()
        });
        McpServers {
            servers: config
                .servers
                .iter()
                .map(|(name, spec)| {
                    let containment = Arc::clone(&containment);
                    Server::spawn(name.clone(), spec.clone(), registry.clone(), containment)
                })
                .collect(),
        }
    }

    /// Waits until every server's first start has succeeded or failed (they start concurrently,
    /// each within its own startup timeout).
    pub async fn ready(&self) {
        join_all(self.servers.iter().map(Server::ready)).await;
    }

    /// Every server's status, in name order.
    pub fn statuses(&self) -> Vec<ServerStatus> {
        self.servers.iter().map(Server::status).collect()
    }

    /// The server of this name.
    pub fn get(&self, name: &str) -> Option<&Server> {
        self.servers.iter().find(|s| s.name() == name)
    }

    /// True when no server is configured.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Closes every server at once.
    pub async fn shutdown(&self) {
        join_all(self.servers.iter().map(Server::shutdown)).await;
    }
}
