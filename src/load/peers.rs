//! `--workload-set peers`: the six workloads of `../shared/bench/peers.md` and two write
//! workloads, each measured on the engine and then on the direct baseline in the same run, one JSON line per workload.
//!
//! | workload | sessions | turn | line |
//! | --- | --- | --- | --- |
//! | `single_call_noop` | 1 | 1 × `noop` | `calls_per_s` |
//! | `batch8_concurrent_safe_noop` | 1 | 8 × `noop` (safe) | `calls_per_s` |
//! | `batch8_serial_noop` | 1 | 8 × `noop_serial` | `calls_per_s` |
//! | `batch8_sleep10ms_wall_ms` | 1 | 8 × `sleep` (safe, 10 ms) | `wall_ms` (mean turn) |
//! | `error_paths` | 1 | [unknown tool, invalid arguments] | `calls_per_s` |
//! | `sessions64_batch8_noop` | 64 | 8 × `noop` (safe) | `calls_per_s` |
//! | `batch8_writes_distinct_10ms` | 1 | 8 × `write` (files 0–7, 10 ms) | `wall_ms` (mean turn) |
//! | `batch8_writes_same_file_10ms` | 1 | 8 × `write_same_file` (file 0, 10 ms) | `wall_ms` |
//!
//! The last two are Switchboard's own (issue #14, resource-aware scheduling): eight writes that
//! declare eight different files overlap like eight safe sleeps, eight writes of one file run one
//! after another.
//!
//! Every line carries `direct_ratio` = engine ÷ direct (calls/s, or wall time for the sleep
//! batch, where 1.0 is ideal and higher is slower). Each workload runs for `--duration` (default
//! 2 s) per side, after a warm-up of a tenth of that (at most 200 ms), or for `--turns` turns per
//! session. With `--rounds N` the engine and direct phases alternate N times (see [`super::ab`])
//! and each side reports its best round (more calls/s, or the shorter mean turn); violations of
//! every round are counted.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::ab::{alternate, ratio};
use super::driver::{Bounds, Display, Phase, ToolSet, direct_phase, engine_phase};
use super::stats::{Percentiles, round_to};
use super::workload::ToolKind;
use super::workload::{Slot, Workload, load_tools};

/// Default measuring time of each side of each workload.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(2);

/// One workload of the set.
#[derive(Debug, Clone, Copy)]
pub struct PeerWorkload {
    /// Its name in `peers.md`.
    pub name: &'static str,
    sessions: usize,
    calls_per_turn: usize,
    tool: ToolKind,
    serial: bool,
    errors: bool,
    wall: bool,
}

/// The six workloads of `peers.md`, in its order, then the two write workloads.
pub const WORKLOADS: [PeerWorkload; 8] = [
    PeerWorkload {
        name: "single_call_noop",
        sessions: 1,
        calls_per_turn: 1,
        tool: ToolKind::Noop,
        serial: false,
        errors: false,
        wall: false,
    },
    PeerWorkload {
        name: "batch8_concurrent_safe_noop",
        sessions: 1,
        calls_per_turn: 8,
        tool: ToolKind::Noop,
        serial: false,
        errors: false,
        wall: false,
    },
    PeerWorkload {
        name: "batch8_serial_noop",
        sessions: 1,
        calls_per_turn: 8,
        tool: ToolKind::Noop,
        serial: true,
        errors: false,
        wall: false,
    },
    PeerWorkload {
        name: "batch8_sleep10ms_wall_ms",
        sessions: 1,
        calls_per_turn: 8,
        tool: ToolKind::Sleep,
        serial: false,
        errors: false,
        wall: true,
    },
    PeerWorkload {
        name: "error_paths",
        sessions: 1,
        calls_per_turn: 2,
        tool: ToolKind::Noop,
        serial: false,
        errors: true,
        wall: false,
    },
    PeerWorkload {
        name: "sessions64_batch8_noop",
        sessions: 64,
        calls_per_turn: 8,
        tool: ToolKind::Noop,
        serial: false,
        errors: false,
        wall: false,
    },
    PeerWorkload {
        name: "batch8_writes_distinct_10ms",
        sessions: 1,
        calls_per_turn: 8,
        tool: ToolKind::Write,
        serial: false,
        errors: false,
        wall: true,
    },
    PeerWorkload {
        name: "batch8_writes_same_file_10ms",
        sessions: 1,
        calls_per_turn: 8,
        tool: ToolKind::Write,
        serial: true,
        errors: false,
        wall: true,
    },
];

/// How a workload set runs (the peers set and the serve set alike).
#[derive(Debug, Clone)]
pub struct PeersConfig {
    /// Measuring time per side (ignored when `turns` is set).
    pub duration: Duration,
    /// Turns per session instead of a duration.
    pub turns: Option<u64>,
    /// Hard cap per side.
    pub max_time: Duration,
    /// Warm-up per side.
    pub warmup: Duration,
    /// Engine workers.
    pub workers: Option<usize>,
    /// Draw progress bars.
    pub progress: bool,
    /// Seed of the call generators.
    pub seed: u64,
    /// Engine-then-direct rounds per workload; each side reports its best round.
    pub rounds: u32,
}

/// What one workload gave: its JSON line and the violations seen.
#[derive(Debug)]
pub struct PeerResult {
    /// The line, as printed (keys in the order of `peers.md`: `workload` first).
    pub line: String,
    /// Turns not answered exactly once, in order, over every round and both sides.
    pub violations: u64,
    /// The first few of them, described.
    pub examples: Vec<String>,
}

/// Runs one workload on both sides.
pub async fn run_one(w: &PeerWorkload, config: &PeersConfig) -> Result<PeerResult, String> {
    let sleep = Duration::from_millis(10);
    let workload = Arc::new(Workload {
        tool: w.tool,
        calls_per_turn: w.calls_per_turn,
        sleep,
        cpu_work: 0,
        serial_ratio: if w.serial { 1.0 } else { 0.0 },
        error_rate: 0.0,
        pattern: w.errors.then(|| vec![Slot::Unknown, Slot::Invalid]),
        faults: super::workload::Faults::default(),
        seed: config.seed,
    });
    let bounds = Bounds::for_rounds(config.turns, config.duration, config.max_time);
    let display = |side: &str| Display::round(side, config.progress);
    let mut specs = load_tools(sleep);
    specs.extend(crate::testing::write_tools(sleep));
    let tools = ToolSet {
        specs,
        workspace: None,
        policy: None,
        journal: None,
    };
    let mean = |p: &Phase| Percentiles::of(&p.stats.turn_latency).mean;
    let rounds = alternate(
        config.rounds,
        async || {
            engine_phase(
                tools.clone(),
                config.workers,
                w.sessions,
                &workload,
                &bounds,
                &display("engine"),
                config.warmup,
            )
            .await
        },
        async || {
            direct_phase(
                tools.clone(),
                w.sessions,
                &workload,
                &bounds,
                &display("direct"),
                config.warmup,
            )
            .await
        },
        // More calls/s, or for a wall-time workload the shorter mean turn.
        |p: &Phase| if w.wall { -mean(p) } else { p.calls_per_s() },
    )
    .await?;
    let (engine, direct) = (rounds.a, rounds.b);
    let line = if w.wall {
        let e = Percentiles::of(&engine.stats.turn_latency).mean / 1000.0;
        let d = Percentiles::of(&direct.stats.turn_latency).mean / 1000.0;
        ordered(&[
            ("workload", json!(w.name)),
            ("wall_ms", json!(round_to(e, 3))),
            ("direct_wall_ms", json!(round_to(d, 3))),
            ("direct_ratio", json!(round_to(ratio(e, d), 3))),
        ])
    } else {
        let (e, d) = (engine.calls_per_s(), direct.calls_per_s());
        ordered(&[
            ("workload", json!(w.name)),
            ("calls_per_s", json!(e.round() as u64)),
            ("direct_calls_per_s", json!(d.round() as u64)),
            ("direct_ratio", json!(round_to(ratio(e, d), 3))),
        ])
    };
    Ok(PeerResult {
        line,
        violations: rounds.violations.violations,
        examples: rounds.violations.examples,
    })
}

/// A one-line JSON object with its keys in the given order.
fn ordered(fields: &[(&str, Value)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::from(*k)))
        .collect();
    format!("{{{}}}", body.join(","))
}
