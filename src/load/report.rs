//! Reports of a load run: the human-readable table, the JSON document, and `--report DIR`.
//!
//! The table has one column per phase (engine, and direct when `--baseline direct`): calls,
//! calls/s, turns/s, turn latency p50/p90/p99/p99.9/max, queue wait percentiles, results by error
//! code, the journal's flushes (an engine with `--journal`), exactly-once violations and peak
//! RSS, then the engine/direct ratio and the soak verdict.
//! The JSON document carries the same figures (latencies in µs) and is what `--json` prints and
//! `--report DIR` writes as `load.json`, beside `latency.svg` (see [`super::svg`]).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use super::driver::Phase;
use super::numbers::{duration_us, group, rate};
use super::rss;
use super::stats::{Percentiles, code_index, round2};
use crate::protocol::ErrorCode;

/// One phase as JSON.
pub fn phase_json(phase: &Phase) -> Value {
    let s = &phase.stats;
    json!({
        "calls": s.calls,
        "turns": s.turns,
        "elapsed_s": (phase.elapsed.as_secs_f64() * 1e6).round() / 1e6,
        "calls_per_s": round2(phase.calls_per_s()),
        "turns_per_s": round2(phase.turns_per_s()),
        "ok": s.ok,
        "errors": s.errors_json(),
        "violations": s.violations,
        "violation_examples": s.examples,
        "turn_latency_us": Percentiles::of(&s.turn_latency).to_json(),
        "queue_wait_us": Percentiles::of(&s.queue_wait).to_json(),
        "peak_rss_bytes": phase.peak_rss,
        "stopped_by": phase.stopped_by,
        "journal": phase.journal.map(|j| json!({
            "flushes": j.flushes,
            "records": j.records,
            "flush_busy_s": (j.busy.as_secs_f64() * 1e6).round() / 1e6,
            "flushes_per_s": round2(phase.flushes_per_s().unwrap_or(0.0)),
            "calls_per_flush": round2(phase.calls_per_flush().unwrap_or(0.0)),
        })),
    })
}

/// The table of a run: a title line, then one column per phase.
pub fn table(title: &str, phases: &[(&str, &Phase)], ratio: Option<f64>) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, f: &dyn Fn(&Phase) -> String| {
        rows.push((name.to_string(), phases.iter().map(|(_, p)| f(p)).collect()));
    };
    row("calls", &|p| group(p.stats.calls));
    row("turns", &|p| group(p.stats.turns));
    row("elapsed", &|p| format!("{:.3} s", p.elapsed.as_secs_f64()));
    row("calls/s", &|p| rate(p.calls_per_s()));
    row("turns/s", &|p| rate(p.turns_per_s()));
    type Pick = fn(&Percentiles) -> f64;
    let quantiles: [(&str, Pick); 5] = [
        ("p50", |q| q.p50),
        ("p90", |q| q.p90),
        ("p99", |q| q.p99),
        ("p99.9", |q| q.p999),
        ("max", |q| q.max),
    ];
    for (name, pick) in quantiles {
        row(&format!("turn latency {name}"), &|p| {
            duration_us(pick(&Percentiles::of(&p.stats.turn_latency)))
        });
    }
    for (name, pick) in quantiles {
        row(&format!("queue wait {name}"), &|p| {
            let q = Percentiles::of(&p.stats.queue_wait);
            if q.count == 0 {
                "-".into()
            } else {
                duration_us(pick(&q))
            }
        });
    }
    row("ok", &|p| group(p.stats.ok));
    for code in ErrorCode::ALL {
        if phases
            .iter()
            .any(|(_, p)| p.stats.errors[code_index(code)] > 0)
        {
            row(code.as_str(), &|p| group(p.stats.errors[code_index(code)]));
        }
    }
    if phases.iter().any(|(_, p)| p.journal.is_some()) {
        row("journal flushes", &|p| {
            p.journal.map_or_else(|| "-".into(), |j| group(j.flushes))
        });
        row("flushes/s", &|p| {
            p.flushes_per_s().map_or_else(|| "-".into(), rate)
        });
        row("calls/flush", &|p| {
            p.calls_per_flush()
                .map_or_else(|| "-".into(), |c| format!("{c:.1}"))
        });
        row("flush time mean", &|p| {
            p.journal.filter(|j| j.flushes > 0).map_or_else(
                || "-".into(),
                |j| duration_us(j.busy.as_secs_f64() * 1e6 / j.flushes as f64),
            )
        });
    }
    row("violations", &|p| group(p.stats.violations));
    row("peak RSS", &|p| rss::mib(p.peak_rss));
    row("stopped by", &|p| p.stopped_by.to_string());

    let width = rows
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0)
        + 2;
    let col = rows
        .iter()
        .flat_map(|(_, v)| v.iter().map(|s| s.chars().count()))
        .chain(phases.iter().map(|(l, _)| l.len()))
        .max()
        .unwrap_or(0)
        + 2;
    let mut out = String::new();
    let _ = writeln!(out, "{title}\n");
    let _ = write!(out, "{:width$}", "");
    for (label, _) in phases {
        let _ = write!(out, "{label:>col$}");
    }
    out.push('\n');
    for (name, values) in &rows {
        let _ = write!(out, "{name:width$}");
        for v in values {
            let _ = write!(out, "{v:>col$}");
        }
        out.push('\n');
    }
    if let Some(r) = ratio {
        let _ = writeln!(
            out,
            "\nengine/direct: {r:.3} (engine calls/s ÷ direct calls/s, same run)"
        );
    }
    for (_, p) in phases {
        for e in &p.stats.examples {
            let _ = writeln!(out, "violation: {e}");
        }
    }
    out
}

/// Writes `load.json` and `latency.svg` into `dir` (created if missing).
pub fn write_report(dir: &Path, doc: &Value, svg: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create report directory {}: {e}", dir.display()))?;
    let text = serde_json::to_string_pretty(doc).unwrap_or_else(|_| "null".into());
    let write = |name: &str, contents: &str| {
        let path = dir.join(name);
        std::fs::write(&path, contents).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write("load.json", &(text + "\n"))?;
    write("latency.svg", svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(duration_us(0.25), "250 ns");
        assert_eq!(duration_us(12.34), "12.3 µs");
        assert_eq!(duration_us(1250.0), "1.25 ms");
        assert_eq!(duration_us(2_100_000.0), "2.10 s");
    }
}
