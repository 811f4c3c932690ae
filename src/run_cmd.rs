//! `switchboard run` (one prompt, one session) and `switchboard chat` (the seed's interactive
//! loop), against Anthropic, an OpenAI-compatible server, or an offline script.
//!
//! Settings come from flags and the environment: `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`
//! (default <https://api.anthropic.com>), `OPENAI_API_KEY`, `OPENAI_BASE_URL` (default
//! <https://api.openai.com/v1>), `MODEL_ID` (when `--model` is not given) and
//! `SWITCHBOARD_MODEL_TIMEOUT` (when `--timeout` is not given). Exit codes: 0 when the loop
//! stopped for any of its reasons (final answer, max tokens, max turns), 1 when a model request
//! failed, 2 for a setup problem (missing key or model, bad flag, unreadable script or
//! workspace) — each a one-line message on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::agent_loop::{
    AgentError, AgentLoop, DEFAULT_MAX_TOKENS, DEFAULT_MAX_TURNS, LoopConfig, LoopResult,
    StopReason, StreamOptions, default_system_prompt,
};
use crate::command::{INTERRUPTED, Interrupt, TelemetryArgs, fail};
use crate::engine::Engine;
use crate::engine::Session;
use crate::exporter::Telemetry;
use crate::provider::{Provider, ProviderError, ScriptedProvider};
use crate::providers::{
    ANTHROPIC_BASE_URL, AnthropicProvider, HttpConfig, OPENAI_BASE_URL, OpenAiProvider,
    RetryPolicy, env_value,
};
use crate::tools::builtin_tools;
use crate::workspace::Workspace;

/// Looks up an environment variable (tests pass their own).
pub type EnvLookup<'a> = &'a (dyn Fn(&str) -> Option<String> + Send + Sync);

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `--provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ProviderChoice {
    /// Anthropic Messages (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`).
    #[default]
    Anthropic,
    /// OpenAI Chat Completions or a compatible server (`OPENAI_API_KEY`, `OPENAI_BASE_URL`).
    Openai,
    /// Offline: replay `--script FILE`.
    Scripted,
}

/// The model and loop flags shared by `run` and `chat`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model API.
    #[arg(long, value_enum, default_value_t = ProviderChoice::Anthropic)]
    pub provider: ProviderChoice,
    /// Model id (default: $MODEL_ID).
    #[arg(long)]
    pub model: Option<String>,
    /// Workspace the built-in tools are confined to (default: the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Let read_file and edit_file open files with more than one hard link (refused by
    /// default: another name of such a file may be outside the workspace).
    #[arg(long)]
    pub allow_hard_links: bool,
    /// Model calls per prompt.
    #[arg(long, default_value_t = DEFAULT_MAX_TURNS as u32,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_turns: u32,
    /// Output budget per model call.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// System prompt (default: the seed's, naming the workspace).
    #[arg(long)]
    pub system: Option<String>,
    /// Stream answers (the default).
    #[arg(long, overrides_with = "no_stream")]
    pub stream: bool,
    /// Wait for whole answers instead of streaming them.
    #[arg(long, overrides_with = "stream")]
    pub no_stream: bool,
    /// While streaming, do not start concurrency-safe calls before the answer is complete.
    #[arg(long)]
    pub no_eager: bool,
    /// For `--provider scripted`: a JSON array of Messages API responses, one per model call.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Request timeout: the whole answer, or while streaming the wait for each next piece
    /// (default: $SWITCHBOARD_MODEL_TIMEOUT, else 600s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Requests per model call, retries included.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub max_attempts: u32,
    /// Sandbox of the tools' commands.
    #[command(flatten)]
    pub sandbox: crate::command::SandboxArgs,
    /// Permission policy and audit log (`run`: ask is deny; `chat`: asks on the terminal).
    #[command(flatten)]
    pub policy: crate::command::PolicyArgs,
    /// MCP servers whose tools join the catalog.
    #[command(flatten)]
    pub mcp: crate::mcp::command::McpArgs,
    /// The call journal.
    #[command(flatten)]
    pub journal: crate::command::JournalArgs,
}

impl Default for ModelArgs {
    fn default() -> Self {
        ModelArgs {
            provider: ProviderChoice::Anthropic,
            model: None,
            workspace: None,
            allow_hard_links: false,
            max_turns: DEFAULT_MAX_TURNS as u32,
            max_tokens: DEFAULT_MAX_TOKENS,
            system: None,
            stream: false,
            no_stream: false,
            no_eager: false,
            script: None,
            timeout: None,
            max_attempts: 4,
            sandbox: crate::command::SandboxArgs::default(),
            policy: Default::default(),
            mcp: Default::default(),
            journal: Default::default(),
        }
    }
}

impl ModelArgs {
    /// Streaming and eager dispatch as the flags ask.
    pub fn stream_options(&self) -> StreamOptions {
        StreamOptions {
            stream: !self.no_stream,
            eager: !self.no_eager,
        }
    }
}

/// `switchboard run`: one prompt, one session; prints the final text and a stop-reason line.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The user prompt.
    #[arg(long)]
    pub prompt: String,
    /// Print one JSON object: stop_reason, turns, tool_calls, final_text and a per-turn
    /// dispatch summary.
    #[arg(long)]
    pub json: bool,
    /// Model and loop settings.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Metrics.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// `switchboard chat`: the interactive loop; one history across prompts.
#[derive(Debug, Clone, clap::Args)]
pub struct ChatArgs {
    /// Model and loop settings.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Metrics.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// The provider the flags and environment describe, and the model id to ask for.
pub fn build_provider(
    args: &ModelArgs,
    env: EnvLookup<'_>,
) -> Result<(Arc<dyn Provider>, String), ProviderError> {
    let model = args
        .model
        .clone()
        .filter(|m| !m.trim().is_empty())
        .or_else(|| env_value(env, "MODEL_ID"));
    if args.provider == ProviderChoice::Scripted {
        let path = args.script.as_ref().ok_or_else(|| {
            ProviderError::Config("--provider scripted needs --script FILE".into())
        })?;
        let text = std::fs::read_to_string(path).map_err(|e| {
            ProviderError::Config(format!("cannot read script {}: {e}", path.display()))
        })?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| {
            ProviderError::Config(format!("script {} is not JSON: {e}", path.display()))
        })?;
        let docs = match doc {
            Value::Array(docs) => docs,
            other => vec![other],
        };
        let provider = ScriptedProvider::from_json(&docs)
            .map_err(|e| ProviderError::Config(format!("script {}: {e}", path.display())))?;
        return Ok((
            Arc::new(provider),
            model.unwrap_or_else(|| "scripted".into()),
        ));
    }
    let timeout = match args.timeout {
        Some(t) => t,
        None => match env_value(env, "SWITCHBOARD_MODEL_TIMEOUT") {
            Some(text) => humantime::parse_duration(&text).map_err(|e| {
                ProviderError::Config(format!("SWITCHBOARD_MODEL_TIMEOUT={text:?}: {e}"))
            })?,
            None => crate::providers::DEFAULT_TIMEOUT,
        },
    };
    let retry = RetryPolicy {
        max_attempts: args.max_attempts,
        ..RetryPolicy::default()
    };
    let (key_var, url_var, default_url) = match args.provider {
        ProviderChoice::Anthropic => (
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            ANTHROPIC_BASE_URL,
        ),
        _ => ("OPENAI_API_KEY", "OPENAI_BASE_URL", OPENAI_BASE_URL),
    };
    let config = HttpConfig {
        base_url: env_value(env, url_var).unwrap_or_else(|| default_url.into()),
        api_key: env_value(env, key_var),
        timeout,
        retry,
    };
    let provider: Arc<dyn Provider> = match args.provider {
        ProviderChoice::Anthropic => Arc::new(AnthropicProvider::new(config)?),
        _ => Arc::new(OpenAiProvider::new(config)?),
    };
    let model = model
        .ok_or_else(|| ProviderError::Config("no model: pass --model or set MODEL_ID".into()))?;
    Ok((provider, model))
}

/// Everything `run` and `chat` set up before the first prompt.
struct Setup {
    agent: AgentLoop,
    /// The agent's session, kept to cancel it on ctrl-c.
    session: Session,
    engine: Engine,
    telemetry: Telemetry,
}

/// How long a signalled `run`/`chat` lets the turn in flight come back (its calls answered
/// `cancelled`, their processes killed) before it stops waiting. The engine's shutdown after it
/// waits for those calls too; this only lets the agent loop take the answers in.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// Runs `work` until it ends or a signal arrives ([`Interrupt`]). On a signal the session is
/// cancelled — its running calls are answered `cancelled` and the processes they started are
/// killed — `work` gets `grace` to take those answers in, and `None` is returned.
async fn unless_interrupted<T>(
    session: &Session,
    interrupt: &Interrupt,
    grace: Duration,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(work);
    tokio::select! {
        out = &mut work => Some(out),
        () = interrupt.cancelled() => {
            session.cancel();
            let _ = tokio::time::timeout(grace, &mut work).await;
            None
        }
    }
}

/// The exit code and message of a signalled command.
fn interrupted(interrupt: &Interrupt, message: &str) -> ExitCode {
    fail(interrupt.exit_code().unwrap_or(INTERRUPTED), message)
}

async fn setup(
    args: &ModelArgs,
    telemetry: TelemetryArgs,
    env: EnvLookup<'_>,
    approver: std::sync::Arc<dyn crate::policy::Approver>,
) -> Result<Setup, ExitCode> {
    let (provider, model) = build_provider(args, env).map_err(|e| fail(2, e.to_string()))?;
    let root = args.workspace.clone().unwrap_or_else(|| PathBuf::from("."));
    let ws = Workspace::open(&root)
        .map_err(|e| fail(2, format!("cannot open workspace {}: {e}", root.display())))?
        .allow_hard_links(args.allow_hard_links);
    crate::command::remove_stale_temps(&ws);
    let telemetry = Telemetry::start(telemetry.metrics_addr, telemetry.metrics_file)
        .await
        .map_err(|e| fail(2, &e))?;
    let builder = Engine::builder()
        .tools(builtin_tools())
        .workspace(ws.clone())
        .sandbox(args.sandbox.config());
    let builder = args.journal.apply(builder);
    let builder = args
        .policy
        .apply_with(builder, approver)
        .map_err(|e| fail(2, &e))?;
    args.mcp.config().map_err(|e| fail(2, &e))?;
    let engine = crate::mcp::command::start_engine(builder, &args.mcp)
        .await
        .map_err(|e| fail(1, &e))?;
    let config = LoopConfig {
        model,
        system: args
            .system
            .clone()
            .unwrap_or_else(|| default_system_prompt(ws.root())),
        max_tokens: args.max_tokens,
        max_turns: args.max_turns as usize,
    };
    // With a journal, each run is a conversation of its own (a run replays nothing of an
    // earlier one); its calls are recorded durably.
    let session = match &args.journal.journal {
        None => engine.session(),
        Some(_) => {
            let id = format!("run-{}-{}", crate::journal::now_ms(), std::process::id());
            engine
                .session_with(crate::SessionOptions::new().id(id))
                .await
                .map_err(|e| fail(1, format!("cannot open the session: {e}")))?
        }
    };
    let agent = AgentLoop::new(session.clone(), provider, config)
        .map_err(|e| fail(2, e.to_string()))?
        .with_stream(args.stream_options());
    Ok(Setup {
        agent,
        session,
        engine,
        telemetry,
    })
}

async fn teardown(setup: Setup, code: ExitCode) -> ExitCode {
    drop(setup.agent);
    setup.engine.shutdown(Duration::from_secs(1)).await;
    match setup.telemetry.finish().await {
        Ok(()) => code,
        Err(e) => fail(1, &e),
    }
}

/// `switchboard run`, printing to stdout, stopped by `interrupt`.
pub async fn run(args: RunArgs, interrupt: &Interrupt) -> ExitCode {
    let mut out = std::io::stdout();
    run_interruptible(args, &process_env, &mut out, interrupt).await
}

/// `switchboard run` with its environment and output given (no signal stops it).
pub async fn run_with(args: RunArgs, env: EnvLookup<'_>, out: &mut (dyn Write + Send)) -> ExitCode {
    run_interruptible(args, env, out, &Interrupt::never()).await
}

/// [`run_with`], stopped by `interrupt`.
pub async fn run_interruptible(
    args: RunArgs,
    env: EnvLookup<'_>,
    out: &mut (dyn Write + Send),
    interrupt: &Interrupt,
) -> ExitCode {
    let mut setup = match setup(
        &args.model,
        args.telemetry.clone(),
        env,
        std::sync::Arc::new(crate::policy::RefuseAll),
    )
    .await
    {
        Ok(setup) => setup,
        Err(code) => return code,
    };
    let session = setup.session.clone();
    let Some(outcome) = unless_interrupted(
        &session,
        interrupt,
        CANCEL_GRACE,
        setup.agent.run(&args.prompt),
    )
    .await
    else {
        let code = interrupted(interrupt, "interrupted; running tool calls were cancelled");
        return teardown(setup, code).await;
    };
    let code = match outcome {
        Ok(result) => {
            let written = if args.json {
                writeln!(out, "{}", result_json(&result))
            } else {
                write_result(out, &result)
            };
            let _ = out.flush();
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(1, format!("cannot write the answer: {e}")),
            }
        }
        Err(e) => fail(exit_code_of(&e), e.to_string()),
    };
    teardown(setup, code).await
}

fn exit_code_of(e: &AgentError) -> u8 {
    match e {
        AgentError::Provider(p) if p.is_config() => 2,
        AgentError::InvalidMaxTurns => 2,
        _ => 1,
    }
}

fn write_result(out: &mut (dyn Write + Send), r: &LoopResult) -> std::io::Result<()> {
    if !r.final_text.is_empty() {
        writeln!(out, "{}", r.final_text)?;
    }
    writeln!(
        out,
        "stop_reason: {} ({} turns, {} tool calls)",
        r.stop_reason.as_str(),
        r.turns,
        r.tool_calls
    )
}

/// The `--json` document of a run.
pub fn result_json(r: &LoopResult) -> Value {
    let dispatches: Vec<Value> = r
        .dispatches
        .iter()
        .enumerate()
        .map(|(i, results)| {
            json!({
                "turn": i + 1,
                "calls": results.len(),
                "eager": r.eager.get(i).copied().unwrap_or(0),
                "results": results.iter().map(|res| json!({
                    "tool_use_id": &*res.tool_use_id,
                    "tool": &*res.tool_name,
                    "outcome": res.outcome(),
                    "queued_ms": res.timing.queued.as_secs_f64() * 1000.0,
                    "run_ms": res.timing.run.as_secs_f64() * 1000.0,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "stop_reason": r.stop_reason.as_str(),
        "turns": r.turns,
        "tool_calls": r.tool_calls,
        "final_text": r.final_text,
        "provider_stop_reason": r.provider_stop_reason,
        "dispatches": dispatches,
    })
}

/// `switchboard chat` on the terminal: prompts (`>> `) on stderr, answers on stdout.
pub async fn chat(args: ChatArgs, interrupt: &Interrupt) -> ExitCode {
    let mut out = std::io::stdout();
    chat_interruptible(args, &process_env, stdin_lines(), &mut out, interrupt).await
}

/// Lines of stdin, each read (on the blocking pool) only when asked for; `None` at the end.
pub fn stdin_lines() -> impl Stream<Item = std::io::Result<String>> + Unpin {
    Box::pin(futures::stream::unfold((), |()| async {
        let read = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|n| (n, line))
        })
        .await;
        match read {
            Ok(Ok((0, _))) => None,
            Ok(Ok((_, line))) => Some((Ok(line), ())),
            Ok(Err(e)) => Some((Err(e), ())),
            Err(e) => Some((Err(std::io::Error::other(e)), ())),
        }
    }))
}

/// `switchboard chat` with its environment, input lines and output given. `q`, `exit`, an
/// empty line or the end of input quits. A failed model request is reported and the chat goes
/// on, except for a refused or missing key.
pub async fn chat_with(
    args: ChatArgs,
    env: EnvLookup<'_>,
    lines: impl Stream<Item = std::io::Result<String>> + Unpin,
    out: &mut (dyn Write + Send),
) -> ExitCode {
    chat_interruptible(args, env, lines, out, &Interrupt::never()).await
}

/// [`chat_with`], stopped by `interrupt`.
pub async fn chat_interruptible(
    args: ChatArgs,
    env: EnvLookup<'_>,
    mut lines: impl Stream<Item = std::io::Result<String>> + Unpin,
    out: &mut (dyn Write + Send),
    interrupt: &Interrupt,
) -> ExitCode {
    let mut setup = match setup(
        &args.model,
        args.telemetry.clone(),
        env,
        std::sync::Arc::new(crate::policy::TerminalApprover::default()),
    )
    .await
    {
        Ok(setup) => setup,
        Err(code) => return code,
    };
    let mut code = ExitCode::SUCCESS;
    loop {
        let _ = write!(std::io::stderr(), ">> ");
        let _ = std::io::stderr().flush();
        let session = setup.session.clone();
        let Some(next) =
            unless_interrupted(&session, interrupt, Duration::ZERO, lines.next()).await
        else {
            code = interrupted(interrupt, "interrupted");
            break;
        };
        let line = match next {
            Some(Ok(line)) => line,
            None => break,
            Some(Err(e)) => {
                code = fail(1, format!("cannot read input: {e}"));
                break;
            }
        };
        let query = line.trim();
        if query.is_empty() || query == "q" || query == "exit" {
            break;
        }
        let Some(outcome) =
            unless_interrupted(&session, interrupt, CANCEL_GRACE, setup.agent.run(query)).await
        else {
            code = interrupted(interrupt, "interrupted; running tool calls were cancelled");
            break;
        };
        match outcome {
            Ok(r) => {
                if !r.final_text.is_empty() {
                    let _ = writeln!(out, "{}", r.final_text);
                }
                if r.stop_reason != StopReason::FinalAnswer {
                    let _ = writeln!(out, "[stop: {}]", r.stop_reason.as_str());
                }
                let _ = out.flush();
            }
            Err(e) => {
                let fatal = matches!(
                    &e,
                    AgentError::Provider(ProviderError::Auth { .. } | ProviderError::MissingKey(_))
                        | AgentError::Engine(_)
                );
                code = fail(exit_code_of(&e), e.to_string());
                if fatal {
                    break;
                }
                code = ExitCode::SUCCESS;
            }
        }
    }
    teardown(setup, code).await
}
