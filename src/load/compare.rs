//! `load --compare-metrics`: what recording metrics costs, measured in one process.
//!
//! The same workload runs on two engines built from the same tools: one whose metric handles
//! record into the recorder the exporter installs ([`crate::exporter::recorder`]: the Prometheus
//! recorder for counters and gauges, pre-aggregated sharded histograms), built under it without
//! installing it process-wide, and one whose handles are no-ops (as with no `--metrics-*` flag).
//! The two sides alternate `--rounds` times (on, then off, see [`super::ab`]), each building a
//! fresh engine with its own warm-up, and each side reports its best round by calls/s.
//! `metrics_cost` = 1 − on ÷ off calls/s. The histograms' turn count is read back from the
//! recorder, so a run shows the "on" side really recorded.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::ab::{alternate, ratio};
use super::driver::{Bounds, Display, Phase, ToolSet, engine_phase_recording};
use super::stats::Recorder;
use super::workload::Workload;
use super::{LoadArgs, config_json, fail, finish_comparison, numbers, report};
use crate::metrics::TURN_DISPATCH_SECONDS;

/// What a comparison measured.
#[derive(Debug)]
pub struct Compared {
    /// The best round with the recorder.
    pub on: Phase,
    /// The best round without it.
    pub off: Phase,
    /// Rounds per side.
    pub rounds: u32,
    /// Turns the recorder's `switchboard_turn_dispatch_seconds` holds (every "on" round, warm-ups
    /// included).
    pub recorded_turns: u64,
    /// Bytes the recorder's histogram buckets hold (fixed per series).
    pub histogram_bytes: usize,
    /// Violations of every round of both sides.
    pub violations: Recorder,
}

impl Compared {
    /// 1 − on ÷ off calls/s (0 when the off side measured nothing).
    pub fn cost(&self) -> f64 {
        super::ab::cost(&self.on, &self.off)
    }
}

/// How a comparison runs.
#[derive(Debug)]
pub struct CompareConfig {
    /// Engine workers.
    pub workers: Option<usize>,
    /// Sessions.
    pub sessions: usize,
    /// Bounds of every round.
    pub bounds: Bounds,
    /// Warm-up before every round.
    pub warmup: Duration,
    /// Rounds per side.
    pub rounds: u32,
    /// Progress bars.
    pub progress: bool,
}

impl CompareConfig {
    /// The comparison the flags ask for (`--workers`, `--sessions`, `--rounds`, `--quiet`).
    pub fn of(args: &LoadArgs, bounds: Bounds, warmup: Duration) -> CompareConfig {
        CompareConfig {
            workers: args.workers.map(|w| w as usize),
            sessions: args.sessions as usize,
            bounds,
            warmup,
            rounds: args.rounds,
            progress: !args.quiet,
        }
    }
}

/// The title of a comparison's table: `switchboard load --FLAG: the workload, how long, best of
/// R rounds per side` (`flag` without its dashes).
pub fn title(
    flag: &str,
    args: &LoadArgs,
    duration: Option<Duration>,
    config: &CompareConfig,
    rounds: u32,
) -> String {
    format!(
        "switchboard load --{flag}: {} sessions × {} calls/turn, tool {}, {}, best of {rounds} rounds per side",
        args.sessions,
        args.calls_per_turn,
        args.tool.name(),
        match duration {
            Some(d) => humantime::format_duration(d).to_string(),
            None => format!("{} turns per session", config.bounds.turns),
        },
    )
}

/// Runs `load --compare-metrics`: the rounds, then the table and cost line (or `--json`), and
/// `--report DIR/compare-metrics.json`.
pub async fn command(
    args: &LoadArgs,
    tools: &ToolSet,
    workload: &Arc<Workload>,
    bounds: Bounds,
    warmup: Duration,
    duration: Option<Duration>,
) -> ExitCode {
    let config = CompareConfig::of(args, bounds, warmup);
    let c = match run(tools, workload, &config).await {
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
        let title = title("compare-metrics", args, duration, &config, c.rounds);
        crate::command::out(&report::table(
            &title,
            &[("metrics on", &c.on), ("metrics off", &c.off)],
            None,
        ));
        crate::command::out(&format!(
            "metrics cost: {:.1} % (on ÷ off = {:.3}); {} turns recorded in histograms of {} bytes\n",
            c.cost() * 100.0,
            ratio(on, off),
            numbers::group(c.recorded_turns),
            numbers::group(c.histogram_bytes as u64),
        ));
    }
    finish_comparison(args, "compare-metrics.json", &doc, &c.violations)
}

/// Runs the alternating rounds.
pub async fn run(
    tools: &ToolSet,
    workload: &Arc<Workload>,
    config: &CompareConfig,
) -> Result<Compared, String> {
    let (recorder, handle) = crate::exporter::recorder();
    let display = |label: &str| Display::round(label, config.progress);
    let side = async |recorder: &(dyn metrics::Recorder + Sync), label: &str| {
        engine_phase_recording(
            Some(recorder),
            tools.clone(),
            config.workers,
            config.sessions,
            workload,
            &config.bounds,
            &display(label),
            config.warmup,
        )
        .await
    };
    let rounds = alternate(
        config.rounds,
        async || side(&recorder, "metrics on").await,
        async || side(&metrics::NoopRecorder, "metrics off").await,
        Phase::calls_per_s,
    )
    .await?;
    Ok(Compared {
        on: rounds.a,
        off: rounds.b,
        rounds: rounds.rounds,
        recorded_turns: handle.histogram_count(TURN_DISPATCH_SECONDS),
        histogram_bytes: handle.histogram_bytes(),
        violations: rounds.violations,
    })
}
