//! `load --compare-journal`: what the durable call journal costs, measured in one process.
//!
//! The same workload runs on two engines built from the same tools: one with a journal (in a
//! fresh subdirectory of `--journal DIR` each time, see [`super::journal_dir`]) and one without.
//! A session with a journal writes the intents of a turn's side-effect and idempotent calls and
//! waits until they are durable before they run, then writes their answers and waits again before
//! the turn is answered; the journal's writer puts every write waiting at that moment into one
//! durable commit (a flush). The workload tools declare no effect, so they are side-effect tools:
//! every call that runs is written twice.
//!
//! The sides alternate `--rounds` times (on, then off, see [`super::ab`]), each on a fresh engine
//! with its own warm-up, and each reports its best round by calls/s. `journal_cost` = 1 − on ÷ off
//! calls/s. Flushes per second and calls per flush are the journal's own counts
//! ([`crate::journal::Journal::flush_counts`]) over the best "on" round.
//!
//! Each round also times one session making one-call turns one after another, on a fresh engine
//! of each side: the latency a lone call pays, which under load hides behind the batching. Those
//! turns' latencies are merged over the rounds.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::ab::{alternate, ratio};
use super::compare::CompareConfig;
use super::driver::{Bounds, Display, Phase, ToolSet, engine_phase};
use super::numbers::{duration_us, group};
use super::stats::{Percentiles, Recorder, round_to, round2};
use super::workload::Workload;
use super::{LoadArgs, config_json, fail, finish_comparison, report};

/// One-call turns per side and round, at most.
const SINGLE_CALL_TURNS: u64 = 200;

/// The longest a side's one-call phase may run in a round.
const SINGLE_CALL_TIME: Duration = Duration::from_secs(2);

/// What a comparison measured.
#[derive(Debug)]
pub struct Compared {
    /// The best round with the journal.
    pub on: Phase,
    /// The best round without it.
    pub off: Phase,
    /// One-call turns of one session with the journal, every round.
    pub single_on: Recorder,
    /// One-call turns of one session without it, every round.
    pub single_off: Recorder,
    /// Rounds per side.
    pub rounds: u32,
    /// Violations of every phase of both sides.
    pub violations: Recorder,
}

impl Compared {
    /// 1 − on ÷ off calls/s (0 when the off side measured nothing).
    pub fn cost(&self) -> f64 {
        super::ab::cost(&self.on, &self.off)
    }

    /// The `--json` document; `config` is the run's settings.
    pub fn to_json(&self, config: Value) -> Value {
        let journal = self.on.journal.unwrap_or_default();
        let (on1, off1) = (self.single(true), self.single(false));
        json!({
            "mode": "compare_journal",
            "config": config,
            "rounds": self.rounds,
            "journal_on_calls_per_s": self.on.calls_per_s().round() as u64,
            "journal_off_calls_per_s": self.off.calls_per_s().round() as u64,
            "journal_cost": (self.cost() * 10_000.0).round() / 10_000.0,
            "flushes_per_s": round2(self.on.flushes_per_s().unwrap_or(0.0)),
            "calls_per_flush": round2(self.on.calls_per_flush().unwrap_or(0.0)),
            "records_per_flush": round2(per_flush(journal.records as f64, journal.flushes)),
            "flush_ms_mean": round_to(per_flush(journal.busy.as_secs_f64() * 1e3, journal.flushes), 6),
            "single_call_p50_ms_on": round_to(on1.p50 / 1e3, 6),
            "single_call_p50_ms_off": round_to(off1.p50 / 1e3, 6),
            "single_call_p99_ms_on": round_to(on1.p99 / 1e3, 6),
            "single_call_p99_ms_off": round_to(off1.p99 / 1e3, 6),
            "single_call_turns_on": on1.count,
            "single_call_turns_off": off1.count,
            "journal_on": report::phase_json(&self.on),
            "journal_off": report::phase_json(&self.off),
            "violations": self.violations.violations,
        })
    }

    /// The lines under the table: the cost, the flushes, the lone one-call turn.
    pub fn summary(&self) -> String {
        let journal = self.on.journal.unwrap_or_default();
        let (on1, off1) = (self.single(true), self.single(false));
        format!(
            "journal cost: {:.1} % (on ÷ off = {:.3})\n\
             journal flushes: {} per second, {:.1} calls ({:.1} records) each, {} per flush on average\n\
             one session, one-call turns one after another ({} on, {} off): \
             p50 {} on, {} off; p99 {} on, {} off\n",
            self.cost() * 100.0,
            ratio(self.on.calls_per_s(), self.off.calls_per_s()),
            group(self.on.flushes_per_s().unwrap_or(0.0).round() as u64),
            self.on.calls_per_flush().unwrap_or(0.0),
            per_flush(journal.records as f64, journal.flushes),
            duration_us(per_flush(journal.busy.as_secs_f64() * 1e6, journal.flushes)),
            group(on1.count),
            group(off1.count),
            duration_us(on1.p50),
            duration_us(off1.p50),
            duration_us(on1.p99),
            duration_us(off1.p99),
        )
    }

    /// The percentiles (µs) of the one-call turns with or without the journal.
    fn single(&self, on: bool) -> Percentiles {
        let r = if on {
            &self.single_on
        } else {
            &self.single_off
        };
        Percentiles::of(&r.turn_latency)
    }
}

/// `total` ÷ `flushes` (0 when there were none).
fn per_flush(total: f64, flushes: u64) -> f64 {
    if flushes == 0 {
        0.0
    } else {
        total / flushes as f64
    }
}

/// Runs `load --compare-journal`: the rounds, then the table and summary (or `--json`), and
/// `--report DIR/compare-journal.json`.
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
    let doc = c.to_json(config_json(args));
    if args.json {
        crate::command::out(&format!("{doc}\n"));
    } else {
        let title = format!(
            "{}, journal in {}",
            super::compare::title("compare-journal", args, duration, &config, c.rounds),
            args.journal
                .as_deref()
                .map_or_else(String::new, |d| d.display().to_string()),
        );
        crate::command::out(&report::table(
            &title,
            &[("journal on", &c.on), ("journal off", &c.off)],
            None,
        ));
        crate::command::out(&c.summary());
    }
    finish_comparison(args, "compare-journal.json", &doc, &c.violations)
}

/// Runs the alternating rounds; `tools.journal` is where the "on" side's journals go.
pub async fn run(
    tools: &ToolSet,
    workload: &Arc<Workload>,
    config: &CompareConfig,
) -> Result<Compared, String> {
    if tools.journal.is_none() {
        return Err("--compare-journal needs --journal DIR".into());
    }
    let without = ToolSet {
        journal: None,
        ..tools.clone()
    };
    let single = Arc::new(Workload {
        calls_per_turn: 1,
        ..Workload::clone(workload)
    });
    let single_bounds = Bounds {
        turns: SINGLE_CALL_TURNS.min(config.bounds.turns),
        stop_after: SINGLE_CALL_TIME.min(config.bounds.stop_after),
        timed: false,
    };
    let (n, bounds) = (config.sessions, &config.bounds);
    let mut single_on = Recorder::default();
    let mut single_off = Recorder::default();
    let rounds = alternate(
        config.rounds,
        async || {
            let on = side(tools, n, workload, bounds, "journal on", config).await?;
            let one = side(tools, 1, &single, &single_bounds, "one call, on", config).await?;
            single_on.merge(&one.stats);
            Ok((on, one))
        },
        async || {
            let off = side(&without, n, workload, bounds, "journal off", config).await?;
            let one = side(
                &without,
                1,
                &single,
                &single_bounds,
                "one call, off",
                config,
            )
            .await?;
            single_off.merge(&one.stats);
            Ok((off, one))
        },
        |(main, _): &(Phase, Phase)| main.calls_per_s(),
    )
    .await?;
    Ok(Compared {
        on: rounds.a.0,
        off: rounds.b.0,
        single_on,
        single_off,
        rounds: rounds.rounds,
        violations: rounds.violations,
    })
}

/// One phase of one side on a fresh engine: `sessions` sessions making `workload`'s turns.
async fn side(
    tools: &ToolSet,
    sessions: usize,
    workload: &Arc<Workload>,
    bounds: &Bounds,
    label: &str,
    config: &CompareConfig,
) -> Result<Phase, String> {
    let display = Display::round(label, config.progress);
    engine_phase(
        tools.clone(),
        config.workers,
        sessions,
        workload,
        bounds,
        &display,
        config.warmup,
    )
    .await
}
