//! The `switchboard` command line (clap derive): `dispatch`, `tools`, `demo`, and the wiring of
//! `run`/`chat` (`crate::run_cmd`) and `load` (`crate::load`).
//!
//! Exit codes: 0 when the input had the right shape (even if every call failed — failures are
//! results), 2 for input that is not JSON or not an accepted shape, or for a bad flag, 1 for an
//! internal failure (a metrics file that cannot be written, a broken runtime); a workspace
//! that cannot be opened is a usage error (2). Logs go to stderr (`RUST_LOG` filters
//! them), so `dispatch`'s stdout holds only protocol JSON.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;

/// The `run` and `chat` commands as calls (their flags, and a writer for what they print), for
/// programs and tests that drive them without a process.
pub use crate::command::{JournalArgs, PolicyArgs, PolicyFlagsError, SandboxArgs, TelemetryArgs};
pub use crate::mcp::command::McpArgs;
pub use crate::run_cmd::{ChatArgs, ModelArgs, ProviderChoice, RunArgs, chat_with, run_with};

use crate::command::{Early, INTERRUPTED, Interrupt, fail, remove_stale_temps, say};
use crate::demo;
use crate::document::{dispatch_document, dispatch_document_with};
use crate::engine::Engine;
use crate::exporter::{LogFormat, Telemetry, init_logging};
use crate::mcp::command::start_engine;
use crate::protocol::WireFormat;
use crate::registry::CatalogFormat;
use crate::tools::builtin_tools;
use crate::workspace::Workspace;

/// Switchboard: the tool-dispatch engine of LLM agent harnesses.
#[derive(Debug, Parser)]
#[command(name = "switchboard", version, about)]
pub(crate) struct Cli {
    /// Log format on stderr (filter with RUST_LOG).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
        /// With --lines: also print each running call's live progress (a command's output as
        /// it is written) as JSON lines `{"event": "progress", "tool_use_id", "seq", ...}`
        /// before the turn's answer line.
        #[arg(long, requires = "lines")]
        progress: bool,
        /// Let read_file and edit_file open files with more than one hard link (refused by
        /// default: another name of such a file may be outside the workspace).
        #[arg(long)]
        allow_hard_links: bool,
        /// Sandbox.
        #[command(flatten)]
        sandbox: SandboxArgs,
        /// Permission policy and audit log.
        #[command(flatten)]
        policy: PolicyArgs,
        /// MCP servers.
        #[command(flatten)]
        mcp: McpArgs,
        /// The call journal.
        #[command(flatten)]
        journal: JournalArgs,
        /// The session the turns belong to: with --journal, a turn sent again under the same
        /// session id (in this run or a later one) is answered from the journal.
        #[arg(long, value_name = "ID", default_value = "dispatch")]
        session_id: String,
        /// Metrics.
        #[command(flatten)]
        telemetry: TelemetryArgs,
    },
    /// Print the tool catalog.
    Tools {
        /// Catalog shape.
        #[arg(long, value_enum, default_value_t = CatalogShape::Anthropic)]
        format: CatalogShape,
        /// Print one JSON object: the catalog and the sandbox in force.
        #[arg(long)]
        json: bool,
        /// Sandbox (as the commands that run tools would have it).
        #[command(flatten)]
        sandbox: SandboxArgs,
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
        /// Sandbox.
        #[command(flatten)]
        sandbox: SandboxArgs,
        /// Permission policy and audit log.
        #[command(flatten)]
        policy: PolicyArgs,
        /// MCP servers (started with the engine; their tools join the catalog).
        #[command(flatten)]
        mcp: McpArgs,
        /// The call journal.
        #[command(flatten)]
        journal: JournalArgs,
        /// Metrics.
        #[command(flatten)]
        telemetry: TelemetryArgs,
    },
    /// Drive the engine with many concurrent sessions and report throughput, latency and memory,
    /// optionally beside the direct in-process baseline (`--baseline direct`).
    Load(crate::load::LoadArgs),
    /// Serve the engine over HTTP to harnesses in any language (sessions, streaming, auth).
    Serve(Box<crate::serve::ServeArgs>),
    /// MCP servers: `mcp list --mcp-config FILE [--json]`.
    #[command(subcommand)]
    Mcp(crate::mcp::command::McpCommand),
    /// Serve the built-in tools as an MCP server over stdio.
    McpServe(crate::mcp::command::ServeArgs),
}

/// `--format` of `dispatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
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
pub(crate) enum CatalogShape {
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
///
/// SIGINT and SIGTERM are caught on the first line (noted until the runtime can handle them) —
/// before the command line is even parsed and long before any input is read — so that from the
/// first line of `main` on neither kills the process with calls unanswered: each long-running
/// command watches the `Interrupt` instead.
/// Then every descriptor the process inherited is marked close-on-exec, so none reaches a
/// command, an MCP server or a hook.
pub fn main() -> ExitCode {
    // `switchboard sandbox-exec …`: the sandbox trampoline (hidden; see crate::sandbox::exec),
    // which must keep the default signal actions; it only reads its arguments first.
    if let Some(code) = crate::sandbox::run_if_requested() {
        return code;
    }
    let early = Early::catch();
    crate::process_guard::close_inherited_fds();
    crate::sandbox::this_binary_is_the_trampoline();
    if wants_version(std::env::args_os().skip(1)) {
        println!("{}", version_text());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(1, format!("cannot start the async runtime: {e}")),
    };
    let interrupt = {
        let _context = runtime.enter();
        match Interrupt::install(early) {
            Ok(interrupt) => interrupt,
            Err(e) => return fail(1, format!("cannot install signal handlers: {e}")),
        }
    };
    let cli = Cli::parse();
    init_logging(cli.log_format);
    if let Err(e) = crate::process_guard::harden_current_process() {
        tracing::warn!("cannot mark the process non-dumpable: {e}");
    }
    let code = runtime.block_on(run(cli, interrupt));
    // Don't wait for a blocking stdin read that an interrupt left behind.
    runtime.shutdown_timeout(Duration::from_millis(200));
    code
}

/// `switchboard --version` (or `-V`) alone: answered before the parser, with what only the
/// running machine knows (whether the default sandbox can be enforced here).
fn wants_version(mut args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    matches!((args.next(), args.next()), (Some(a), None) if a == "--version" || a == "-V")
}

/// The features this binary was built with.
fn features() -> Vec<&'static str> {
    let mut on = Vec::new();
    if cfg!(feature = "cli") {
        on.push("cli");
    }
    if cfg!(feature = "testing") {
        on.push("testing");
    }
    on
}

/// The version, the commit, the features, and whether this machine can enforce the default
/// sandbox — and if not, what it lacks.
fn version_text() -> String {
    let config = crate::sandbox::SandboxConfig::default();
    let status = crate::sandbox::SandboxStatus::probe(&config);
    let missing = status.missing(&config);
    let mode = config.mode.as_str();
    let sandbox = if missing.required.is_empty() {
        let mut has = vec![format!("Landlock ABI {}", status.landlock_abi)];
        if status.network_namespace {
            has.push("network namespaces".into());
        }
        if status.limits_processes() {
            has.push("a pids cgroup".into());
        }
        if status.limits_memory() {
            has.push("a memory cgroup".into());
        }
        let mut line = format!("{mode} can be enforced here ({})", has.join(", "));
        if !missing.degraded.is_empty() {
            line.push_str(&format!("; weaker: {}", missing.degraded.join("; ")));
        }
        line
    } else {
        format!(
            "{mode} cannot be enforced here: missing {} (--sandbox best-effort runs with what is \
             there, --sandbox off runs commands unconfined)",
            missing.required.join("; ")
        )
    };
    format!(
        "switchboard {}\ncommit: {}\nfeatures: {}\nsandbox: {sandbox}",
        env!("CARGO_PKG_VERSION"),
        env!("SWITCHBOARD_GIT_COMMIT"),
        features().join(", "),
    )
}

async fn run(cli: Cli, interrupt: Interrupt) -> ExitCode {
    match cli.command {
        Command::Run(args) => crate::run_cmd::run(args, &interrupt).await,
        Command::Chat(args) => crate::run_cmd::chat(args, &interrupt).await,
        Command::Dispatch {
            workspace,
            format,
            lines,
            progress,
            allow_hard_links,
            sandbox,
            policy,
            mcp,
            journal,
            session_id,
            telemetry,
        } => {
            let telemetry = match start_telemetry(telemetry).await {
                Ok(t) => t,
                Err(code) => return code,
            };
            let engine = match engine_for(
                workspace,
                allow_hard_links,
                true,
                &sandbox,
                &policy,
                &mcp,
                &journal,
            )
            .await
            {
                Ok(engine) => engine,
                Err(code) => return code,
            };
            // One session for all the turns: a turn sent again is answered from its answers.
            let session = match engine
                .session_with(crate::SessionOptions::new().id(session_id))
                .await
            {
                Ok(session) => session,
                Err(e) => return fail(1, format!("cannot open the session: {e}")),
            };
            let code = if lines {
                dispatch_lines(&session, format.into(), progress, &interrupt).await
            } else {
                dispatch_one(&session, format.into(), &interrupt).await
            };
            drop(session);
            engine.shutdown(Duration::from_secs(1)).await;
            finish_telemetry(telemetry, code).await
        }
        Command::Tools {
            format,
            json,
            sandbox,
            mcp,
        } => {
            let engine = match engine_for(
                None,
                false,
                false,
                &sandbox,
                &PolicyArgs::default(),
                &mcp,
                &JournalArgs::default(),
            )
            .await
            {
                Ok(engine) => engine,
                Err(code) => return code,
            };
            let catalog = engine.catalog(format.into()).await;
            engine.shutdown(Duration::from_secs(1)).await;
            match catalog {
                Ok(catalog) => {
                    let out = if json {
                        serde_json::json!({
                            "tools": catalog,
                            "sandbox": engine.sandbox().describe(),
                        })
                    } else {
                        Value::Array(catalog)
                    };
                    print_line(&serde_json::to_string_pretty(&out).unwrap_or_else(|_| "[]".into()));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(1, e.to_string()),
            }
        }
        Command::Demo {
            sessions,
            workspace,
            duration,
            sandbox,
            policy,
            mcp,
            journal,
            telemetry,
        } => {
            let telemetry = match start_telemetry(telemetry).await {
                Ok(t) => t,
                Err(code) => return code,
            };
            let stop = interrupt.token().clone();
            let code = match demo::run(
                sessions as usize,
                workspace,
                duration,
                stop,
                demo::EngineFlags {
                    sandbox: sandbox.config(),
                    policy: &policy,
                    mcp: &mcp,
                    journal: &journal,
                },
            )
            .await
            {
                Ok(report) => {
                    crate::command::out(&report);
                    match interrupt.exit_code() {
                        Some(code) => fail(code, "interrupted; the calls in flight were cancelled"),
                        None => ExitCode::SUCCESS,
                    }
                }
                Err(e) => fail(1, &e),
            };
            finish_telemetry(telemetry, code).await
        }
        Command::Load(args) => {
            // A signal stops the run at once: its sessions, tasks and the processes of its
            // calls are dropped (and killed) with the runtime; no report is printed.
            tokio::select! {
                code = crate::load::run(args) => code,
                () = interrupt.cancelled() => {
                    fail(interrupt.exit_code().unwrap_or(INTERRUPTED), "interrupted; the load run was stopped")
                }
            }
        }
        Command::Serve(args) => crate::serve::run(*args).await,
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

/// The engine over the built-in tools on `workspace` (default: the current directory); with
/// `clean`, temp files that killed writers left there are removed first.
async fn engine_for(
    workspace: Option<PathBuf>,
    allow_hard_links: bool,
    clean: bool,
    sandbox: &SandboxArgs,
    policy: &PolicyArgs,
    mcp: &McpArgs,
    journal: &JournalArgs,
) -> Result<Engine, ExitCode> {
    let root = workspace.unwrap_or_else(|| PathBuf::from("."));
    let ws = Workspace::open(&root)
        .map_err(|e| fail(2, format!("cannot open workspace {}: {e}", root.display())))?
        .allow_hard_links(allow_hard_links);
    if clean {
        remove_stale_temps(&ws);
    }
    let builder = Engine::builder()
        .tools(builtin_tools())
        .workspace(ws.clone())
        .sandbox(sandbox.config());
    let builder = journal.apply(builder);
    // A bad policy file is a usage error (2), named with its rule.
    let builder = policy.apply(builder).map_err(|e| fail(2, &e))?;
    // A bad MCP configuration is a usage error (2); an engine that cannot start (a sandbox the
    // kernel cannot enforce, a refused tool) is an internal one (1).
    mcp.config().map_err(|e| fail(2, &e))?;
    start_engine(builder, mcp).await.map_err(|e| fail(1, &e))
}

/// How long `dispatch` still waits for the rest of its input after a signal: a harness that
/// wrote the turn and then signalled still gets every call of it answered.
const INPUT_GRACE: Duration = Duration::from_secs(1);

async fn dispatch_one(
    engine: &crate::Session,
    format: WireFormat,
    interrupt: &Interrupt,
) -> ExitCode {
    let mut read = tokio::task::spawn_blocking(|| {
        let mut input = String::new();
        std::io::stdin().read_to_string(&mut input).map(|_| input)
    });
    let read_result = tokio::select! {
        read = &mut read => read,
        () = interrupt.cancelled() => {
            // Signalled before the whole turn was read: if the rest arrives promptly, every
            // call of it is still answered (`cancelled`, nothing runs).
            match tokio::time::timeout(INPUT_GRACE, &mut read).await {
                Ok(read) => read,
                Err(_) => {
                    let code = interrupt.exit_code().unwrap_or(INTERRUPTED);
                    return fail(code, "interrupted before the whole input was read");
                }
            }
        }
    };
    let input = match read_result {
        Ok(Ok(input)) => input,
        Ok(Err(e)) => return fail(2, format!("cannot read stdin: {e}")),
        Err(e) => return fail(1, format!("cannot read stdin: {e}")),
    };
    match dispatch_document(engine, format, &input, interrupt.token().child_token()).await {
        Ok(out) => {
            print_line(&out);
            match interrupt.exit_code() {
                Some(code) => ExitCode::from(code),
                None => ExitCode::SUCCESS,
            }
        }
        Err(e) => fail(2, e.to_string()),
    }
}

async fn dispatch_lines(
    engine: &crate::Session,
    format: WireFormat,
    progress: bool,
    interrupt: &Interrupt,
) -> ExitCode {
    let stopped = || interrupt.exit_code().unwrap_or(INTERRUPTED);
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
            () = interrupt.cancelled() => return fail(stopped(), "interrupted"),
        };
        let Some(line) = line else { break };
        n += 1;
        let line = match line {
            Ok(line) => line,
            Err(e) => return fail(2, format!("cannot read stdin: {e}")),
        };
        if line.trim().is_empty() {
            continue;
        }
        let cancel = interrupt.token().child_token();
        let answered = if progress {
            dispatch_document_with(format, &line, |calls| {
                with_progress_lines(engine, calls, cancel)
            })
            .await
        } else {
            dispatch_document(engine, format, &line, cancel).await
        };
        match answered {
            Ok(out) => print_line(&out),
            Err(e) => {
                bad += 1;
                say(&format!("line {n}: {e}"));
            }
        }
        if interrupt.token().is_cancelled() {
            return fail(stopped(), "interrupted; the turn in flight was answered");
        }
    }
    if bad > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// One turn of `dispatch --lines --progress`: each progress event printed as a JSON line
/// (`"event": "progress"`) as it comes, all of them before the turn's answer line.
async fn with_progress_lines(
    session: &crate::Session,
    calls: Vec<crate::ToolCall>,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<Vec<crate::ToolDispatchResult>, crate::EngineError> {
    let (listener, mut events) =
        crate::tool::ProgressSink::channel(crate::tool::ProgressSink::DEFAULT_CAPACITY);
    let print = |event: crate::tool::ProgressEvent| {
        let mut doc = event.to_json();
        doc["event"] = "progress".into();
        print_line(&doc.to_string());
    };
    let turn = session.dispatch_with_progress(calls, cancel, None, listener);
    tokio::pin!(turn);
    let results = loop {
        tokio::select! {
            biased;
            Some(event) = events.recv() => print(event),
            results = &mut turn => break results,
        }
    };
    // Every call has ended: what its progress sent is all there, nothing more comes.
    while let Ok(event) = events.try_recv() {
        print(event);
    }
    results
}

fn print_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}
