//! `load --compare-metrics`: what recording metrics costs, measured in one process.
//!
//! The same workload runs on two engines built from the same tools: one whose metric handles
//! record into the recorder the exporter installs ([`crate::exporter::recorder`]: the Prometheus
//! recorder for counters and gauges, pre-aggregated sharded histograms), built under it without
//! installing it process-wide, and one whose handles are no-ops (as with no `--metrics-*` flag).
//! The two sides alternate `--rounds` times (on, then off), each building a fresh engine with its
//! own warm-up, and each side reports its best round (interference on a shared machine only ever
//! slows a round down). `metrics_cost` = 1 − on ÷ off calls/s. The histograms' turn count is read
//! back from the recorder, so a run shows the "on" side really recorded.

use std::sync::Arc;
use std::time::Duration;

use super::driver::{Bounds, Display, Phase, ToolSet, engine_phase_recording};
use super::stats::Recorder;
use super::workload::Workload;
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
        1.0 - super::peers::ratio(self.on.calls_per_s(), self.off.calls_per_s())
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
    pub fn of(args: &super::LoadArgs, bounds: Bounds, warmup: Duration) -> CompareConfig {
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
    args: &super::LoadArgs,
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

/// Runs the alternating rounds.
pub async fn run(
    tools: &ToolSet,
    workload: &Arc<Workload>,
    config: &CompareConfig,
) -> Result<Compared, String> {
    let (recorder, handle) = crate::exporter::recorder();
    let display = |label: &str| Display {
        label: label.to_string(),
        progress: config.progress,
        sample_rss: false,
    };
    let mut best: Option<(Phase, Phase)> = None;
    let mut violations = Recorder::default();
    let rounds = config.rounds.max(1);
    for _ in 0..rounds {
        let on = engine_phase_recording(
            Some(&recorder),
            tools.clone(),
            config.workers,
            config.sessions,
            workload,
            &config.bounds,
            &display("metrics on"),
            config.warmup,
        )
        .await?;
        let off = engine_phase_recording(
            Some(&metrics::NoopRecorder),
            tools.clone(),
            config.workers,
            config.sessions,
            workload,
            &config.bounds,
            &display("metrics off"),
            config.warmup,
        )
        .await?;
        violations.merge_violations(&on.stats);
        violations.merge_violations(&off.stats);
        best = Some(match best {
            None => (on, off),
            Some((on0, off0)) => (faster(on0, on), faster(off0, off)),
        });
    }
    let (on, off) = best.ok_or("no round ran")?;
    Ok(Compared {
        on,
        off,
        rounds,
        recorded_turns: handle.histogram_count(TURN_DISPATCH_SECONDS),
        histogram_bytes: handle.histogram_bytes(),
        violations,
    })
}

fn faster(a: Phase, b: Phase) -> Phase {
    if b.calls_per_s() > a.calls_per_s() {
        b
    } else {
        a
    }
}
