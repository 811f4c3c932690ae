//! `switchboard load`: drives the real engine with many concurrent sessions and reports
//! throughput, latency and memory, beside the direct in-process baseline when asked.
//!
//! Three modes. The default runs `--sessions` sessions (each `engine.session()`, each looping in
//! its own tokio task) for `--turns` turns or for `--duration`, every turn `--calls-per-turn`
//! calls to the workload tools (see `workload.rs`), through the full actor path with schema
//! validation on; with `--baseline direct` the same turns then go through
//! [`crate::baseline::DirectDispatcher`] in the same kind of tasks, and the report gives the ratio
//! engine ÷ direct. It prints a table (or one JSON document with `--json`; `--report DIR` also
//! writes it with a latency SVG), and exits 1 if any turn was not answered exactly once, in
//! order. `--workload-set peers` runs the six workloads of `../shared/bench/peers.md` and the two
//! write workloads of resource-aware scheduling (see `peers.rs`); `--idle` measures memory per idle session (see `idle.rs`). `--target
//! http://HOST:PORT` sends the same turns to a running `switchboard serve` instead, one
//! keep-alive connection per session (see `http.rs`), and `--workload-set serve` measures the
//! HTTP hop against the in-process engine in one run (see `serve_set.rs`); `--compare-metrics`
//! runs the workload on an engine that records metrics and on one that does not, alternating
//! rounds, and reports the cost (see `compare.rs`). Bad flags exit 2.
//! Metrics flags work as for `dispatch`: the recorder is installed before any engine is built.

mod compare;
mod driver;
mod http;
mod idle;
mod monitor;
mod numbers;
mod peers;
mod report;
mod rss;
mod serve_set;
mod stats;
mod svg;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::command::TelemetryArgs;
use crate::exporter::Telemetry;
use crate::tools::builtin_tools;
use crate::workspace::Workspace;
use driver::{Bounds, Display, Phase, ToolSet, direct_phase, engine_phase, http_phase};
pub use workload::load_tools;
use workload::{Workload, session_dir};

/// Turns per session at most in a timed run (the other bound is the deadline).
const TIMED_TURN_CAP: u64 = 1_000_000_000;

/// Most `--sessions` × `--calls-per-turn` of a run (every session keeps its own call ids).
const MAX_SLOTS: usize = 2_000_000;

/// Most `--sessions` × `--calls-per-turn` of a builtin run (its call templates are per session).
const MAX_BUILTIN_SLOTS: usize = 100_000;

/// Measuring time when neither `--turns` nor `--duration` is given.
const DEFAULT_DURATION: Duration = Duration::from_secs(5);

/// `--tool`: which tools the calls go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolKind {
    /// Inline, returns `text` (`noop`, or `noop_serial`).
    Noop,
    /// Async, sleeps `--sleep-ms` (`sleep`, or `sleep_serial`).
    Sleep,
    /// Inline, hashes `text` `--cpu-work` times (`cpu`, or `cpu_serial`).
    Cpu,
    /// Half noop, a quarter cpu, a quarter sleep.
    Mixed,
    /// Async writes of (simulated) files, sleeping `--sleep-ms`: `write` writes file N for call
    /// slot N (a turn's writes overlap); with `--serial-ratio 1` every call goes to
    /// `write_same_file` (one file: they run one after another).
    Write,
    /// The five built-in tools on a temporary workspace (write, read, edit, glob, bash per five calls).
    Builtin,
}

impl ToolKind {
    fn name(self) -> &'static str {
        match self {
            ToolKind::Noop => "noop",
            ToolKind::Sleep => "sleep",
            ToolKind::Cpu => "cpu",
            ToolKind::Mixed => "mixed",
            ToolKind::Write => "write",
            ToolKind::Builtin => "builtin",
        }
    }
}

/// `--baseline`: what the engine is compared with in the same run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// The direct in-process loop: validate + call + encode, no actors.
    Direct,
}

/// `--workload-set`: a fixed set of workloads run in sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadSet {
    /// The six workloads of `peers.md` and the two write workloads, one JSON line each.
    Peers,
    /// The sidecar's cost: the in-process engine versus the same turns over HTTP to a server
    /// started in this process, for one-call turns and 64 sessions × 8 no-op calls.
    Serve,
}

/// Flags of `switchboard load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Concurrent sessions, each with its own task.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub sessions: u32,
    /// Turns per session (instead of --duration).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000), conflicts_with = "duration")]
    pub turns: Option<u64>,
    /// Run for this long, e.g. `10s` (default 5s when --turns is not given). With --idle: hold
    /// the sessions this long, sampling RSS.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Calls in each turn.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub calls_per_turn: u32,
    /// Which tools the calls go to.
    #[arg(long, value_enum, default_value_t = ToolKind::Noop)]
    pub tool: ToolKind,
    /// How long each `sleep` call sleeps, in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub sleep_ms: u64,
    /// Hash rounds of each `cpu` call (its `n`).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=workload::CPU_WORK_MAX))]
    pub cpu_work: u64,
    /// Share of calls sent to the tool's serial (not concurrency-safe) variant, 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    pub serial_ratio: f64,
    /// Share of calls that fail before running, 0 to 1: half unknown tools, half invalid arguments.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    pub error_rate: f64,
    /// Engine worker actors (default: the engine's own, one per CPU and at least 2).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: Option<u32>,
    /// Run the same workload through this baseline too, in the same run, and report the ratio.
    #[arg(long, value_enum)]
    pub baseline: Option<Baseline>,
    /// Run a fixed set of workloads instead (one JSON line each, with its direct ratio).
    #[arg(long, value_enum, conflicts_with_all = ["idle", "baseline"], group = "rounds_mode")]
    pub workload_set: Option<WorkloadSet>,
    /// Run the workload on an engine recording metrics (the exporter's recorder) and on one
    /// recording nothing, alternating --rounds times in this process, and report the cost
    /// (`metrics_cost` = 1 − on ÷ off calls/s, each side's best round).
    #[arg(long, group = "rounds_mode",
          conflicts_with_all = ["idle", "baseline", "target", "faults", "mcp_call"])]
    pub compare_metrics: bool,
    /// Hold --sessions idle sessions (each warmed with one turn) and report memory per session.
    #[arg(long, conflicts_with_all = ["turns", "baseline"])]
    pub idle: bool,
    /// Run the engine under this permission policy (rules and hooks; ask is deny); with
    /// `--baseline direct` the ratio shows what the policy adds (the direct loop has none).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["workload_set", "target", "idle"])]
    pub policy: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON document and a latency picture (`load.json`, `latency.svg`) into DIR.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long, short)]
    pub quiet: bool,
    /// Unmeasured warm-up before each measured phase, e.g. `500ms` (peers: a tenth of the
    /// duration, at most 200ms).
    #[arg(long, value_parser = parse_warmup)]
    pub warmup: Option<Duration>,
    /// Hard cap on each phase, whatever --turns says.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub max_time: Duration,
    /// With --workload-set: alternate the engine and direct phases this many times per workload
    /// and report each side's best round (with --compare-metrics: the metrics-on and -off phases).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100), requires = "rounds_mode")]
    pub rounds: u32,
    /// Seed of the call mix (errors, serial share, mixed tools).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Inject faults at these rates, e.g. `panic=0.01,hang=0.01,cancel=0.01`: a share of calls
    /// go to a tool that panics or one that hangs until its 200 ms timeout, a share of turns are
    /// cancelled 0–2 ms after they start. The run then checks that every call was still answered
    /// exactly once, in order (and, with --duration, that RSS stayed flat). Engine only.
    #[arg(long, value_parser = workload::parse_faults, conflicts_with_all = ["baseline", "workload_set", "idle"])]
    pub faults: Option<workload::Faults>,
    /// Drive a running `switchboard serve` at http://HOST:PORT instead of an in-process engine
    /// (started with --with-load-tools for the noop, sleep and cpu tools; its sleep is 10 ms).
    #[arg(long, value_name = "URL", conflicts_with_all = ["baseline", "workload_set", "idle", "faults"])]
    pub target: Option<String>,
    /// File whose first line is the server's bearer token (otherwise SWITCHBOARD_TOKEN, or none).
    #[arg(long, value_name = "FILE", requires = "target")]
    pub token_file: Option<PathBuf>,
    /// MCP servers (with --mcp-call).
    #[command(flatten)]
    pub mcp: crate::mcp::command::McpArgs,
    /// Drive this MCP tool (its registry name, `mcp__server__tool`) instead of the workload
    /// tools: every call of every turn goes to it; `--baseline direct` then makes the same calls
    /// with a direct rmcp client.
    #[arg(long, value_name = "NAME", requires = "mcp_config",
          conflicts_with_all = ["workload_set", "idle", "faults"])]
    pub mcp_call: Option<String>,
    /// The arguments of every --mcp-call call (a JSON object; default `{}`).
    #[arg(long, value_name = "JSON", requires = "mcp_call")]
    pub mcp_args: Option<String>,
    /// Metrics.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0 and 1"))
    }
}

fn parse_warmup(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))?;
    if d > Duration::from_secs(3600) {
        return Err("at most 1h".into());
    }
    Ok(d)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = parse_warmup(s)?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

fn fail(code: u8, message: &str) -> ExitCode {
    crate::command::fail(code, &format!("load: {message}"))
}

/// Runs `switchboard load`.
pub async fn run(args: LoadArgs) -> ExitCode {
    let telemetry = match Telemetry::start(
        args.telemetry.metrics_addr,
        args.telemetry.metrics_file.clone(),
    )
    .await
    {
        Ok(t) => t,
        Err(e) => return fail(2, &e),
    };
    let code = if let Some(name) = &args.mcp_call {
        crate::mcp::load::run(&args, name).await
    } else if args.workload_set == Some(WorkloadSet::Serve) {
        run_serve_set(&args).await
    } else if args.workload_set.is_some() {
        run_peers(&args).await
    } else if args.idle {
        run_idle(&args).await
    } else {
        run_load(&args).await
    };
    match telemetry.finish().await {
        Ok(()) => code,
        Err(e) => fail(1, &e),
    }
}

fn workers(args: &LoadArgs) -> Option<usize> {
    args.workers.map(|w| w as usize)
}

async fn run_idle(args: &LoadArgs) -> ExitCode {
    let report = match idle::run(
        args.sessions as usize,
        workers(args),
        args.duration,
        !args.quiet,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return fail(1, &e),
    };
    if args.json {
        crate::command::out(&format!("{}\n", report.to_json()));
    } else {
        crate::command::out(&report.text());
    }
    if let Some(dir) = &args.report
        && let Err(e) = write_json(dir, "idle.json", &report.to_json())
    {
        return fail(1, &e);
    }
    if report.failures > 0 {
        return fail(1, "some warm-up turns failed");
    }
    ExitCode::SUCCESS
}

async fn run_peers(args: &LoadArgs) -> ExitCode {
    let config = set_config(args);
    let mut lines = Vec::new();
    let mut violations = 0;
    for w in &peers::WORKLOADS {
        let result = match peers::run_one(w, &config).await {
            Ok(r) => r,
            Err(e) => return fail(1, &format!("{}: {e}", w.name)),
        };
        crate::command::out(&format!("{}\n", result.line));
        violations += result.violations;
        for e in &result.examples {
            crate::command::say(&format!("load: {}: violation: {e}", w.name));
        }
        lines.push(result.line);
    }
    finish_set(args, &lines, violations, "peers.jsonl")
}

/// The settings of a workload set (`--workload-set peers|serve`) from the flags.
fn set_config(args: &LoadArgs) -> peers::PeersConfig {
    let duration = args.duration.unwrap_or(peers::DEFAULT_DURATION);
    peers::PeersConfig {
        duration,
        turns: args.turns,
        max_time: args.max_time,
        warmup: args
            .warmup
            .unwrap_or_else(|| (duration / 10).min(Duration::from_millis(200))),
        workers: workers(args),
        progress: !args.quiet,
        seed: args.seed,
        rounds: args.rounds,
    }
}

/// The end of a workload set: its JSON lines into `--report DIR/<file>`, and a failure if any
/// turn was not answered exactly once, in order.
fn finish_set(args: &LoadArgs, lines: &[String], violations: u64, file: &str) -> ExitCode {
    if let Some(dir) = &args.report {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        if let Err(e) =
            std::fs::create_dir_all(dir).and_then(|()| std::fs::write(dir.join(file), text))
        {
            return fail(1, &format!("cannot write {}/{file}: {e}", dir.display()));
        }
    }
    if violations > 0 {
        return fail(
            1,
            &format!("{violations} turns were not answered exactly once, in order"),
        );
    }
    ExitCode::SUCCESS
}

async fn run_serve_set(args: &LoadArgs) -> ExitCode {
    let config = set_config(args);
    let (lines, violations) = match serve_set::run(&config).await {
        Ok(r) => r,
        Err(e) => return fail(1, &e),
    };
    finish_set(args, &lines, violations, "serve.jsonl")
}

/// The server of `--target`, with its token (`--token-file`, else `SWITCHBOARD_TOKEN`).
fn endpoint(args: &LoadArgs) -> Result<Option<Arc<http::Endpoint>>, String> {
    let Some(url) = &args.target else {
        return Ok(None);
    };
    let token = match &args.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --token-file {}: {e}", path.display()))?;
            Some(text.lines().next().unwrap_or_default().trim().to_string())
        }
        None => std::env::var(crate::serve::auth::TOKEN_ENV).ok(),
    }
    .filter(|t| !t.is_empty());
    Ok(Some(Arc::new(http::Endpoint::parse(url, token)?)))
}

/// Keeps the injected panics of `--faults` off stderr (every other panic still prints).
fn quiet_injected_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m.contains(workload::INJECTED_PANIC));
        if !injected {
            previous(info);
        }
    }));
}

async fn run_load(args: &LoadArgs) -> ExitCode {
    let endpoint = match endpoint(args) {
        Ok(e) => e,
        Err(e) => return fail(2, &e),
    };
    if endpoint.is_some() && args.tool == ToolKind::Builtin {
        return fail(
            2,
            "--tool builtin is not available with --target (its files assume one shared workspace); use noop, sleep, cpu or mixed",
        );
    }
    let sessions = args.sessions as usize;
    let slots = sessions.saturating_mul(args.calls_per_turn as usize);
    let most = if args.tool == ToolKind::Builtin {
        MAX_BUILTIN_SLOTS
    } else {
        MAX_SLOTS
    };
    if slots > most {
        return fail(
            2,
            &format!(
                "--sessions × --calls-per-turn is {slots}; at most {most} with --tool {} (every session keeps its own call ids{})",
                args.tool.name(),
                if args.tool == ToolKind::Builtin {
                    " and files"
                } else {
                    ""
                }
            ),
        );
    }
    let workload = Arc::new(Workload {
        tool: args.tool,
        calls_per_turn: args.calls_per_turn as usize,
        sleep: Duration::from_millis(args.sleep_ms),
        cpu_work: args.cpu_work,
        serial_ratio: args.serial_ratio,
        error_rate: args.error_rate,
        pattern: None,
        seed: args.seed,
        faults: args.faults.unwrap_or_default(),
    });
    if workload.faults.any() {
        quiet_injected_panics();
    }
    // The builtin tools work on a fresh temporary workspace, one subdirectory per session; it is
    // removed when `_workspace` goes out of scope.
    let (tools, workspace, _workspace) = if args.tool == ToolKind::Builtin {
        match builtin_workspace(sessions) {
            Ok((dir, ws)) => (builtin_tools(), Some(ws), Some(dir)),
            Err(e) => return fail(1, &e),
        }
    } else {
        let mut tools = load_tools(workload.sleep);
        tools.extend(crate::testing::write_tools(workload.sleep));
        (tools, None, None)
    };
    let specs = if workload.faults.any() {
        tools.into_iter().chain(workload::fault_tools()).collect()
    } else {
        tools
    };
    let tools = ToolSet {
        specs,
        workspace,
        policy: args.policy.clone(),
    };
    let duration = match (args.turns, args.duration) {
        (Some(_), _) => None,
        (None, d) => Some(d.unwrap_or(DEFAULT_DURATION)),
    };
    let bounds = match duration {
        Some(d) => Bounds {
            turns: TIMED_TURN_CAP,
            stop_after: d.min(args.max_time),
            timed: true,
        },
        None => Bounds {
            turns: args.turns.unwrap_or(1),
            stop_after: args.max_time,
            timed: false,
        },
    };
    if args.compare_metrics {
        let warmup = args.warmup.unwrap_or_else(|| {
            duration.map_or(Duration::ZERO, |d| (d / 10).min(Duration::from_millis(200)))
        });
        return run_compare(args, &tools, &workload, bounds, warmup, duration).await;
    }
    let warmup = args.warmup.unwrap_or(Duration::ZERO);
    let display = |label: &str| Display {
        label: label.to_string(),
        progress: !args.quiet,
        sample_rss: duration.is_some(),
    };
    let label = if endpoint.is_some() { "http" } else { "engine" };
    let measured = match &endpoint {
        Some(endpoint) => {
            http_phase(
                Arc::clone(endpoint),
                sessions,
                &workload,
                &bounds,
                &display(label),
                warmup,
            )
            .await
        }
        None => {
            engine_phase(
                tools.clone(),
                workers(args),
                sessions,
                &workload,
                &bounds,
                &display(label),
                warmup,
            )
            .await
        }
    };
    let engine = match measured {
        Ok(p) => p,
        Err(e) => return fail(1, &e),
    };
    let direct = match args.baseline {
        Some(Baseline::Direct) => {
            match direct_phase(
                tools,
                sessions,
                &workload,
                &bounds,
                &display("direct"),
                warmup,
            )
            .await
            {
                Ok(p) => Some(p),
                Err(e) => return fail(1, &e),
            }
        }
        None => None,
    };
    let ratio = direct
        .as_ref()
        .map(|d| peers::ratio(engine.calls_per_s(), d.calls_per_s()));
    let soak = rss::SoakVerdict::of(&engine.rss_samples);
    let doc = load_json(args, &engine, direct.as_ref(), ratio, soak.as_ref());
    let title = format!(
        "switchboard load{}: {} sessions × {} calls/turn, tool {}{}{}, {}",
        args.target
            .as_deref()
            .map_or_else(String::new, |t| format!(" over HTTP to {t}")),
        sessions,
        args.calls_per_turn,
        args.tool.name(),
        if args.serial_ratio > 0.0 {
            format!(", serial {}", args.serial_ratio)
        } else {
            String::new()
        },
        if args.error_rate > 0.0 {
            format!(", errors {}", args.error_rate)
        } else {
            String::new()
        },
        match duration {
            Some(d) => humantime::format_duration(d).to_string(),
            None => format!("{} turns per session", bounds.turns),
        },
    );
    if args.json {
        crate::command::out(&format!("{doc}\n"));
    } else {
        let mut phases: Vec<(&str, &Phase)> = vec![(label, &engine)];
        if let Some(d) = &direct {
            phases.push(("direct", d));
        }
        crate::command::out(&report::table(&title, &phases, ratio));
        if let Some(s) = &soak {
            crate::command::out(&format!("{}\n", s.line()));
        }
    }
    if let Some(dir) = &args.report {
        let mut series = vec![svg::Series {
            name: label,
            color: "#1f77b4",
            hist: &engine.stats.turn_latency,
        }];
        if let Some(d) = &direct {
            series.push(svg::Series {
                name: "direct",
                color: "#ff7f0e",
                hist: &d.stats.turn_latency,
            });
        }
        let picture = svg::latency_svg(&title, &series);
        if let Err(e) = report::write_report(dir, &doc, &picture) {
            return fail(1, &e);
        }
    }
    let violations = engine.stats.violations + direct.as_ref().map_or(0, |d| d.stats.violations);
    if violations > 0 {
        return fail(
            1,
            &format!("{violations} turns were not answered exactly once, in order"),
        );
    }
    ExitCode::SUCCESS
}

async fn run_compare(
    args: &LoadArgs,
    tools: &ToolSet,
    workload: &Arc<Workload>,
    bounds: Bounds,
    warmup: Duration,
    duration: Option<Duration>,
) -> ExitCode {
    let config = compare::CompareConfig {
        workers: workers(args),
        sessions: args.sessions as usize,
        bounds,
        warmup,
        rounds: args.rounds,
        progress: !args.quiet,
    };
    let c = match compare::run(tools, workload, &config).await {
        Ok(c) => c,
        Err(e) => return fail(1, &e),
    };
    let (on, off) = (c.on.calls_per_s(), c.off.calls_per_s());
    let doc = json!({
        "mode": "compare_metrics",
        "config": config_json(args),
        "rounds": c.rounds,
        "metrics_on_calls_per_s": on.round() as u64,
        "metrics_off_calls_per_s": off.round() as u64,
        "metrics_cost": (c.cost() * 10_000.0).round() / 10_000.0,
        "metrics_on": report::phase_json(&c.on),
        "metrics_off": report::phase_json(&c.off),
        "recorded_turns": c.recorded_turns,
        "histogram_bytes": c.histogram_bytes,
        "violations": c.violations.violations,
    });
    if args.json {
        crate::command::out(&format!("{doc}\n"));
    } else {
        let title = format!(
            "switchboard load --compare-metrics: {} sessions × {} calls/turn, tool {}, {}, best of {} rounds per side",
            args.sessions,
            args.calls_per_turn,
            args.tool.name(),
            match duration {
                Some(d) => humantime::format_duration(d).to_string(),
                None => format!("{} turns per session", config.bounds.turns),
            },
            c.rounds,
        );
        crate::command::out(&report::table(
            &title,
            &[("metrics on", &c.on), ("metrics off", &c.off)],
            None,
        ));
        crate::command::out(&format!(
            "metrics cost: {:.1} % (on ÷ off = {:.3}); {} turns recorded in histograms of {} bytes\n",
            c.cost() * 100.0,
            peers::ratio(on, off),
            numbers::group(c.recorded_turns),
            numbers::group(c.histogram_bytes as u64),
        ));
    }
    if let Some(dir) = &args.report
        && let Err(e) = write_json(dir, "compare-metrics.json", &doc)
    {
        return fail(1, &e);
    }
    for e in &c.violations.examples {
        crate::command::say(&format!("load: violation: {e}"));
    }
    if c.violations.violations > 0 {
        return fail(
            1,
            &format!(
                "{} turns were not answered exactly once, in order",
                c.violations.violations
            ),
        );
    }
    ExitCode::SUCCESS
}

fn builtin_workspace(sessions: usize) -> Result<(tempfile::TempDir, Workspace), String> {
    let dir = tempfile::Builder::new()
        .prefix("switchboard-load-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary workspace: {e}"))?;
    for i in 0..sessions {
        std::fs::create_dir(dir.path().join(session_dir(i)))
            .map_err(|e| format!("cannot create a session directory: {e}"))?;
    }
    let ws = Workspace::open(dir.path())
        .map_err(|e| format!("cannot open the temporary workspace: {e}"))?;
    Ok((dir, ws))
}

fn load_json(
    args: &LoadArgs,
    engine: &Phase,
    direct: Option<&Phase>,
    ratio: Option<f64>,
    soak: Option<&rss::SoakVerdict>,
) -> Value {
    json!({
        "mode": "load",
        "config": config_json(args),
        "calls": engine.stats.calls,
        "violations": engine.stats.violations + direct.map_or(0, |d| d.stats.violations),
        "engine": report::phase_json(engine),
        "direct": direct.map(report::phase_json),
        "direct_ratio": ratio.map(|r| (r * 1000.0).round() / 1000.0),
        "soak": soak.map(rss::SoakVerdict::to_json),
        "rss_samples_bytes": engine.rss_samples,
        "peak_rss_bytes": engine.peak_rss.max(direct.and_then(|d| d.peak_rss)),
    })
}

/// The run's settings, as every JSON report gives them.
fn config_json(args: &LoadArgs) -> Value {
    json!({
            "sessions": args.sessions,
            "turns": args.turns,
            "duration_ms": match args.turns {
                Some(_) => None,
                None => Some(args.duration.unwrap_or(DEFAULT_DURATION).as_millis() as u64),
            },
            "calls_per_turn": args.calls_per_turn,
            "tool": args.tool.name(),
            "sleep_ms": args.sleep_ms,
            "cpu_work": args.cpu_work,
            "serial_ratio": args.serial_ratio,
            "error_rate": args.error_rate,
            "workers": args.workers,
            "baseline": args.baseline.map(|_| "direct"),
            "seed": args.seed,
            "target": args.target,
            "faults": args.faults.map(|f| json!({"panic": f.panic, "hang": f.hang, "cancel": f.cancel})),
    })
}

fn write_json(dir: &std::path::Path, name: &str, doc: &Value) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create report directory {}: {e}", dir.display()))?;
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(doc).unwrap_or_else(|_| "null".into());
    std::fs::write(&path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
}
