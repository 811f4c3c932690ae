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
//! rounds, and reports the cost (see `compare.rs`); `--journal DIR` runs the engine with a
//! durable call journal, and `--compare-journal` runs the workload with and without it,
//! alternating rounds, and reports the cost, the journal's flushes and the latency of a lone
//! one-call turn (see `compare_journal.rs`, `journal_dir.rs`). The studies of our own parts
//! that serve no user at run time (`tool_search`'s recall, a sandboxed command's cost) live in
//! the unpublished `benches/studies` crate. The four A/B
//! comparisons (`--compare-metrics`, `--compare-journal`, the peers and serve sets) alternate
//! their sides and keep each side's best round through one driver (see `ab.rs`). Bad flags exit 2.
//! Metrics flags work as for `dispatch`: the recorder is installed before any engine is built.

mod ab;
mod args;
mod compare;
mod compare_journal;
mod driver;
mod echo;
mod http;
mod idle;
mod journal_dir;
mod mcp;
mod monitor;
mod numbers;
mod peers;
mod report;
mod rss;
mod serve_set;
mod stats;
mod svg;
mod workload;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::exporter::Telemetry;
use crate::tools::builtin_tools;
use crate::workspace::Workspace;
pub use args::{Baseline, LoadArgs, WorkloadSet};
use driver::{Bounds, Display, Phase, ToolSet, direct_phase, engine_phase, http_phase};
pub use workload::ToolKind;
use workload::{Workload, load_tools, session_dir};

/// Turns per session at most in a timed run (the other bound is the deadline).
const TIMED_TURN_CAP: u64 = 1_000_000_000;

/// Most `--sessions` × `--calls-per-turn` of a run (every session keeps its own call ids).
const MAX_SLOTS: usize = 2_000_000;

/// Most `--sessions` × `--calls-per-turn` of a builtin run (its call templates are per session).
const MAX_BUILTIN_SLOTS: usize = 100_000;

/// Measuring time when neither `--turns` nor `--duration` is given.
const DEFAULT_DURATION: Duration = Duration::from_secs(5);

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    crate::command::fail(code, format!("load: {message}"))
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
        mcp::run(&args, name).await
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
            Err(e) => return fail(1, format!("{}: {e}", w.name)),
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

/// The end of a comparison run (`--compare-metrics`, `--compare-journal`): its JSON into the
/// report directory, if any, and a failure if any turn was not answered exactly once, in order.
fn finish_comparison(
    args: &LoadArgs,
    file: &str,
    doc: &Value,
    violations: &stats::Recorder,
) -> ExitCode {
    if let Some(dir) = &args.report
        && let Err(e) = write_json(dir, file, doc)
    {
        return fail(1, &e);
    }
    for e in &violations.examples {
        crate::command::say(&format!("load: violation: {e}"));
    }
    if violations.violations > 0 {
        return fail(
            1,
            format!(
                "{} turns were not answered exactly once, in order",
                violations.violations
            ),
        );
    }
    ExitCode::SUCCESS
}

/// The end of a workload set: its JSON lines into `--report DIR/<file>`, and a failure if any
/// turn was not answered exactly once, in order.
fn finish_set(args: &LoadArgs, lines: &[String], violations: u64, file: &str) -> ExitCode {
    if let Some(dir) = &args.report {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        if let Err(e) =
            std::fs::create_dir_all(dir).and_then(|()| std::fs::write(dir.join(file), text))
        {
            return fail(1, format!("cannot write {}/{file}: {e}", dir.display()));
        }
    }
    if violations > 0 {
        return fail(
            1,
            format!("{violations} turns were not answered exactly once, in order"),
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
            format!(
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
    let journal = match &args.journal {
        Some(dir) => match journal_dir::JournalRoot::open(dir) {
            Ok(root) => Some(Arc::new(root)),
            Err(e) => return fail(2, &e),
        },
        None => None,
    };
    let tools = ToolSet {
        specs,
        workspace,
        policy: args.policy.clone(),
        journal,
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
        return compare::command(args, &tools, &workload, bounds, warmup, duration).await;
    }
    if args.compare_journal {
        let warmup = args.warmup.unwrap_or_else(|| {
            duration.map_or(Duration::ZERO, |d| (d / 10).min(Duration::from_millis(200)))
        });
        return compare_journal::command(args, &tools, &workload, bounds, warmup, duration).await;
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
        .map(|d| ab::ratio(engine.calls_per_s(), d.calls_per_s()));
    let soak = rss::SoakVerdict::of(&engine.rss_samples);
    let doc = load_json(args, &engine, direct.as_ref(), ratio, soak.as_ref());
    let title = format!(
        "switchboard load{}: {} sessions × {} calls/turn, tool {}{}{}, {}{}",
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
        args.journal
            .as_deref()
            .map_or_else(String::new, |d| format!(", journal in {}", d.display())),
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
            format!("{violations} turns were not answered exactly once, in order"),
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
            "journal": args.journal,
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
