//! The `switchboard` command line (clap derive): `dispatch`, `tools`, `demo`, and the wiring of
//! `run`/`chat` ([`crate::run_cmd`]) and `load` ([`crate::load`]).
//!
//! Exit codes: 0 when the input had the right shape (even if every call failed — failures are
//! results), 2 for input that is not JSON or not an accepted shape, or for a bad flag, 1 for an
//! internal failure (a metrics file that cannot be written, a broken runtime); a workspace
//! that cannot be opened is a usage error (2). Logs go to stderr (`RUST_LOG` filters
//! them), so `dispatch`'s stdout holds only protocol JSON.

use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::demo;
use crate::engine::Engine;
use crate::exporter::{LogFormat, Telemetry, init_logging};
use crate::mcp::command::{McpArgs, start_engine};
use crate::protocol::{self, WireFormat};
use crate::registry::CatalogFormat;
use crate::tools::builtin_tools;
use crate::workspace::Workspace;

/// Switchboard: the tool-dispatch engine of LLM agent harnesses.
#[derive(Debug, Parser)]
#[command(name = "switchboard", version, about)]
pub struct Cli {
    /// Log format on stderr (filter with RUST_LOG).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Metrics flags of the long-running commands.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TelemetryArgs {
    /// Serve Prometheus metrics on ADDR (`/metrics`, `/healthz`), e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Write the final Prometheus exposition to PATH when the command ends.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one prompt through the agent loop (Anthropic, an OpenAI-compatible server, or an
    /// offline script) and print the final text and the stop reason.
    Run(crate::run_cmd::RunArgs),
    /// Chat with the model interactively, keeping one history (q, exit or an empty line quits).
    Chat(crate::run_cmd::ChatArgs),
    /// Read one provider turn (JSON) on stdin, run its tool calls, print the message(s) to append.
    Dispatch {
        /// Workspace the built-in tools are confined to (default: the current directory).
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// Wire format of input and output.
        #[arg(long, value_enum, default_value_t = Format::Anthropic)]
        format: Format,
        /// One JSON document per line in, one per line out (for piping many turns).
        #[arg(long)]
        lines: bool,
        /// MCP servers.
        #[command(flatten)]
        mcp: McpArgs,
        /// Metrics.
        #[command(flatten)]
        telemetry: TelemetryArgs,
    },
    /// Print the tool catalog.
    Tools {
        /// Catalog shape.
        #[arg(long, value_enum, default_value_t = CatalogShape::Anthropic)]
        format: CatalogShape,
        /// MCP servers.
        #[command(flatten)]
        mcp: McpArgs,
    },
    /// Run N scripted agent sessions at once on a fresh temporary workspace (offline, no key).
    Demo {
        /// How many sessions run at once.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        sessions: u32,
        /// Use this directory instead of a fresh temporary one (it must exist).
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// Keep running rounds of sessions until this much time has passed (e.g. `20s`); the
        /// report lists the first round in full and sums up all of them.
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
        /// MCP servers (started with the engine; their tools join the catalog).
        #[command(flatten)]
        mcp: McpArgs,
        /// Metrics.
        #[command(flatten)]
        telemetry: TelemetryArgs,
    },
    /// Drive the engine with many concurrent sessions and report throughput, latency and memory,
    /// optionally beside the direct in-process baseline (`--baseline direct`).
    Load(crate::load::LoadArgs),
    /// MCP servers: `mcp list --mcp-config FILE [--json]`.
    #[command(subcommand)]
    Mcp(crate::mcp::command::McpCommand),
    /// Serve the built-in tools as an MCP server over stdio.
    McpServe(crate::mcp::command::ServeArgs),
}

/// `--format` of `dispatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Chat Completions.
    Openai,
}

impl From<Format> for WireFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::Anthropic => WireFormat::Anthropic,
            Format::Openai => WireFormat::OpenAi,
        }
    }
}

/// `--format` of `tools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CatalogShape {
    /// `{name, description, input_schema}`.
    Anthropic,
    /// `{type: "function", function: {…}}`.
    Openai,
    /// `{name, description, inputSchema}`.
    Mcp,
}

impl From<CatalogShape> for CatalogFormat {
    fn from(f: CatalogShape) -> Self {
        match f {
            CatalogShape::Anthropic => CatalogFormat::Anthropic,
            CatalogShape::Openai => CatalogFormat::OpenAi,
            CatalogShape::Mcp => CatalogFormat::Mcp,
        }
    }
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    if let Err(e) = crate::process_guard::harden_current_process() {
        tracing::warn!("cannot mark the process non-dumpable: {e}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(1, &format!("cannot start the async runtime: {e}")),
    };
    let code = runtime.block_on(run(cli));
    // Don't wait for a blocking stdin read that an interrupt left behind.
    runtime.shutdown_timeout(Duration::from_millis(200));
    code
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run(args) => crate::run_cmd::run(args).await,
        Command::Chat(args) => crate::run_cmd::chat(args).await,
        Command::Dispatch {
            workspace,
            format,
            lines,
            mcp,
            telemetry,
        } => {
            let telemetry = match start_telemetry(telemetry).await {
                Ok(t) => t,
                Err(code) => return code,
            };
            let engine = match engine_for(workspace, &mcp).await {
                Ok(engine) => engine,
                Err(code) => return code,
            };
            let code = if lines {
                dispatch_lines(&engine, format.into()).await
            } else {
                dispatch_one(&engine, format.into()).await
            };
            engine.shutdown(Duration::from_secs(1)).await;
            finish_telemetry(telemetry, code).await
        }
        Command::Tools { format, mcp } => {
            let engine = match engine_for(None, &mcp).await {
                Ok(engine) => engine,
                Err(code) => return code,
            };
            let catalog = engine.catalog(format.into()).await;
            engine.shutdown(Duration::from_secs(1)).await;
            match catalog {
                Ok(catalog) => {
                    print_line(
                        &serde_json::to_string_pretty(&Value::Array(catalog))
                            .unwrap_or_else(|_| "[]".into()),
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(1, &e.to_string()),
            }
        }
        Command::Demo {
            sessions,
            workspace,
            duration,
            mcp,
            telemetry,
        } => {
            let telemetry = match start_telemetry(telemetry).await {
                Ok(t) => t,
                Err(code) => return code,
            };
            let code = match demo::run(sessions as usize, workspace, duration, &mcp).await {
                Ok(report) => {
                    print!("{report}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(1, &e),
            };
            finish_telemetry(telemetry, code).await
        }
        Command::Load(args) => crate::load::run(args).await,
        Command::Mcp(cmd) => crate::mcp::command::mcp_command(cmd).await,
        Command::McpServe(args) => crate::mcp::command::mcp_serve(args).await,
    }
}

async fn start_telemetry(args: TelemetryArgs) -> Result<Telemetry, ExitCode> {
    Telemetry::start(args.metrics_addr, args.metrics_file)
        .await
        .map_err(|e| fail(2, &e))
}

async fn finish_telemetry(telemetry: Telemetry, code: ExitCode) -> ExitCode {
    match telemetry.finish().await {
        Ok(()) => code,
        Err(e) => fail(1, &e),
    }
}

async fn engine_for(workspace: Option<PathBuf>, mcp: &McpArgs) -> Result<Engine, ExitCode> {
    let root = workspace.unwrap_or_else(|| PathBuf::from("."));
    let ws = Workspace::open(&root)
        .map_err(|e| fail(2, &format!("cannot open workspace {}: {e}", root.display())))?;
    start_engine(Engine::builder().tools(builtin_tools(&ws)), mcp)
        .await
        .map_err(|e| fail(2, &e))
}

/// Exit code after ctrl-c (128 + SIGINT), as shells report it.
const INTERRUPTED: u8 = 130;

/// Cancelled on ctrl-c. Installing it means ctrl-c no longer kills the process: the command
/// answers every call of the turn in flight (`cancelled`, with partial output), prints the
/// answer, and exits 130.
fn interrupt_token() -> CancellationToken {
    let token = CancellationToken::new();
    let on_signal = token.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    token
}

async fn dispatch_one(engine: &Engine, format: WireFormat) -> ExitCode {
    let interrupt = interrupt_token();
    let read = tokio::task::spawn_blocking(|| {
        let mut input = String::new();
        std::io::stdin().read_to_string(&mut input).map(|_| input)
    });
    let input = tokio::select! {
        read = read => match read {
            Ok(Ok(input)) => input,
            Ok(Err(e)) => return fail(2, &format!("cannot read stdin: {e}")),
            Err(e) => return fail(1, &format!("cannot read stdin: {e}")),
        },
        _ = interrupt.cancelled() => return fail(INTERRUPTED, "interrupted before any input"),
    };
    match dispatch_document(engine, format, &input, interrupt.child_token()).await {
        Ok(out) => {
            print_line(&out);
            if interrupt.is_cancelled() {
                ExitCode::from(INTERRUPTED)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(2, &e),
    }
}

async fn dispatch_lines(engine: &Engine, format: WireFormat) -> ExitCode {
    let interrupt = interrupt_token();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<String>>(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let mut bad = 0usize;
    let mut n = 0usize;
    loop {
        let line = tokio::select! {
            line = rx.recv() => line,
            _ = interrupt.cancelled() => return fail(INTERRUPTED, "interrupted"),
        };
        let Some(line) = line else { break };
        n += 1;
        let line = match line {
            Ok(line) => line,
            Err(e) => return fail(2, &format!("cannot read stdin: {e}")),
        };
        if line.trim().is_empty() {
            continue;
        }
        match dispatch_document(engine, format, &line, interrupt.child_token()).await {
            Ok(out) => print_line(&out),
            Err(e) => {
                bad += 1;
                say(&format!("line {n}: {e}"));
            }
        }
        if interrupt.is_cancelled() {
            return fail(INTERRUPTED, "interrupted; the turn in flight was answered");
        }
    }
    if bad > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// Decodes one document, dispatches its calls (cancelled with `cancel`), encodes the answer.
/// `Err` is a one-line reason.
pub async fn dispatch_document(
    engine: &Engine,
    format: WireFormat,
    text: &str,
    cancel: CancellationToken,
) -> Result<String, String> {
    let doc: Value =
        serde_json::from_str(text).map_err(|e| format!("input is not valid JSON: {e}"))?;
    let calls =
        protocol::decode(format, &doc).map_err(|e| format!("unexpected input shape: {e}"))?;
    let results = engine.dispatch_with_cancel(calls, cancel).await;
    let mut out = Vec::with_capacity(256);
    protocol::write_json(format, &results, &mut out)
        .map_err(|e| format!("cannot encode the results: {e}"))?;
    String::from_utf8(out).map_err(|e| format!("cannot encode the results: {e}"))
}

fn print_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Says `switchboard: <message>` on stderr (a closed stderr is ignored, never a panic).
pub(crate) fn say(message: &str) {
    let _ = writeln!(std::io::stderr(), "switchboard: {message}");
}

/// Says why the command failed and gives its exit code.
pub(crate) fn fail(code: u8, message: &str) -> ExitCode {
    say(message);
    ExitCode::from(code)
}
