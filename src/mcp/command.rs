//! The MCP parts of the command line: the `--mcp-config FILE` flag shared by the engine-running
//! commands, `switchboard mcp list`, and `switchboard mcp-serve`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::command::{engine_error, fail, say};
use crate::engine::{Engine, EngineBuilder};
use crate::mcp::serve::Order;
use crate::mcp::{McpConfig, ServerState, list};
use crate::registry::DeferralConfig;
use crate::tools::builtin_tools;
use crate::workspace::Workspace;

/// `--mcp-config FILE` and when the catalog defers tools.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// MCP servers whose tools join the registry (the `.mcp.json` `mcpServers` format).
    #[arg(long, value_name = "FILE")]
    pub mcp_config: Option<PathBuf>,
    /// Defer tools marked `auto` (MCP and client tools, by default) when the catalog has more
    /// than N tools: the model finds them with `tool_search`.
    #[arg(long, value_name = "N", default_value_t = DeferralConfig::default().auto_above)]
    pub defer_auto_above: usize,
    /// The model's context, in tokens: tools marked `auto` are also deferred when the catalog's
    /// definitions would take more than 10 % of it (about 4 bytes of JSON a token).
    #[arg(long, value_name = "TOKENS", default_value_t = DeferralConfig::default().context_budget)]
    pub context_budget: usize,
}

impl Default for McpArgs {
    fn default() -> Self {
        let deferral = DeferralConfig::default();
        McpArgs {
            mcp_config: None,
            defer_auto_above: deferral.auto_above,
            context_budget: deferral.context_budget,
        }
    }
}

impl McpArgs {
    /// When the catalog defers `auto` tools, per the flags.
    pub fn deferral(&self) -> DeferralConfig {
        DeferralConfig {
            auto_above: self.defer_auto_above,
            context_budget: self.context_budget,
        }
    }

    /// The configuration named by the flag (empty without it).
    pub fn config(&self) -> Result<McpConfig, super::ConfigError> {
        match &self.mcp_config {
            None => Ok(McpConfig::default()),
            Some(path) => McpConfig::load(path),
        }
    }
}

/// Builds the engine; with `--mcp-config`, starts its servers and waits until each is up or
/// failed (a failed server is reported on stderr; the engine runs without its tools). `Err` is a
/// one-line reason (a bad configuration, or an engine that cannot be built).
pub async fn start_engine(builder: EngineBuilder, mcp: &McpArgs) -> Result<Engine, String> {
    let config = mcp.config().map_err(|e| e.to_string())?;
    let builder = builder.deferral(mcp.deferral());
    if config.servers.is_empty() {
        return builder.build().map_err(|e| engine_error(&e));
    }
    let engine = builder
        .mcp_config(config)
        .start()
        .await
        .map_err(|e| engine_error(&e))?;
    for s in engine.mcp_status() {
        if let ServerState::Failed { reason } = &s.state {
            say(&format!("MCP server {} failed: {reason}", s.name));
        }
    }
    Ok(engine)
}

/// `switchboard mcp …`.
#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Start each configured server and show its transport, status and tools (registry names and
    /// concurrency policy). Exits 1 when an enabled server is not up.
    List {
        /// The configuration (`.mcp.json` format).
        #[arg(long, value_name = "FILE")]
        mcp_config: PathBuf,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `switchboard mcp …`.
pub async fn mcp_command(cmd: McpCommand) -> ExitCode {
    match cmd {
        McpCommand::List { mcp_config, json } => {
            let config = match McpConfig::load(&mcp_config) {
                Ok(c) => c,
                Err(e) => return fail(2, e.to_string()),
            };
            let engine = match Engine::builder().mcp_config(config).start().await {
                Ok(e) => e,
                Err(e) => return fail(1, e.to_string()),
            };
            let statuses = engine.mcp_status();
            engine.shutdown(Duration::from_secs(1)).await;
            let text = if json {
                serde_json::to_string_pretty(&list::render_json(&statuses)).unwrap_or_default()
                    + "\n"
            } else {
                list::render_text(&statuses)
            };
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
            if list::any_failed(&statuses) {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

/// `switchboard mcp-serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Workspace the built-in tools are confined to (default: the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Sandbox of bash commands.
    #[command(flatten)]
    pub sandbox: crate::command::SandboxArgs,
    /// Permission policy and audit log (ask is deny: nobody can approve over stdio).
    #[command(flatten)]
    pub policy: crate::command::PolicyArgs,
    /// Order of the calls a client has in flight at once (each is a turn of its own).
    #[arg(long, value_enum, value_name = "ORDER", default_value_t = Order::Concurrent)]
    pub order: Order,
}

/// Serves the built-in tools over MCP on stdin/stdout until the client closes stdin (or ctrl-c).
pub async fn mcp_serve(args: ServeArgs) -> ExitCode {
    let root = args.workspace.unwrap_or_else(|| PathBuf::from("."));
    let ws = match Workspace::open(&root) {
        Ok(ws) => ws,
        Err(e) => return fail(2, format!("cannot open workspace {}: {e}", root.display())),
    };
    let specs = builtin_tools();
    let builder = Engine::builder()
        .tools(specs.clone())
        .workspace(ws.clone())
        .sandbox(args.sandbox.config());
    let builder = match args.policy.apply(builder) {
        Ok(b) => b,
        Err(e) => return fail(2, &e),
    };
    let engine = match builder.build() {
        Ok(e) => e,
        Err(e) => return fail(1, engine_error(&e)),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let served =
        super::serve::serve_stdio(engine.clone(), &specs, args.order, Some(ws), stop).await;
    engine.shutdown(Duration::from_secs(1)).await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(1, &e),
    }
}
