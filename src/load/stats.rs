//! What a load phase measured: counts, error codes, exactly-once violations and HDR histograms.
//!
//! A [`Recorder`] takes one turn at a time ([`Recorder::record_turn`]): it checks the turn was
//! answered exactly once and in order (as many results as calls, result *i* carrying the id of
//! call *i*; anything else is a counted, described violation), counts outcomes by error code, and
//! records the turn's latency and, for every call whose handler ran, its queue wait
//! (`timing.queued`) in nanoseconds into HDR histograms (2 significant digits, 1 ns to 1 h). Sessions share a bounded
//! number of recorders, so memory does not grow with the session count; recorders merge
//! ([`Recorder::merge`]) into a phase total, summed up as [`Percentiles`].

use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::protocol::{ErrorCode, ToolDispatchResult};

/// Highest latency a histogram tracks (larger values are clamped): one hour, in ns.
const HIGHEST_NS: u64 = 3_600_000_000_000;

/// How many violations are kept as text.
const MAX_EXAMPLES: usize = 8;

/// An empty latency histogram (ns).
pub fn histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy the crate's rules (1 ≤ low, high ≥ 2·low, 0..=5
    // digits), so this cannot fail.
    Histogram::new_with_bounds(1, HIGHEST_NS, 2).expect("constant histogram bounds are valid")
}

/// Position of a code in [`ErrorCode::ALL`].
pub fn code_index(code: ErrorCode) -> usize {
    match code {
        ErrorCode::UnknownTool => 0,
        ErrorCode::InvalidArguments => 1,
        ErrorCode::PermissionDenied => 2,
        ErrorCode::ExecutionError => 3,
        ErrorCode::Timeout => 4,
        ErrorCode::Cancelled => 5,
        ErrorCode::Overloaded => 6,
        ErrorCode::OutcomeUnknown => 7,
        ErrorCode::WorkspaceLost => 8,
    }
}

/// Counts and histograms of the turns recorded so far.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Turns recorded.
    pub turns: u64,
    /// Calls sent.
    pub calls: u64,
    /// Results that were `ok`.
    pub ok: u64,
    /// Results by error code, in [`ErrorCode::ALL`] order.
    pub errors: [u64; ErrorCode::ALL.len()],
    /// Turns not answered exactly once in order (count).
    pub violations: u64,
    /// The first few violations, described.
    pub examples: Vec<String>,
    /// Turn latency, ns.
    pub turn_latency: Histogram<u64>,
    /// Queue wait of each call that was admitted (not refused by lookup or validation), ns.
    pub queue_wait: Histogram<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            turns: 0,
            calls: 0,
            ok: 0,
            errors: [0; ErrorCode::ALL.len()],
            violations: 0,
            examples: Vec::new(),
            turn_latency: histogram(),
            queue_wait: histogram(),
        }
    }
}

impl Recorder {
    /// Records one turn: `ids` are the calls' ids in call order, `results` what came back.
    pub fn record_turn(
        &mut self,
        latency: Duration,
        ids: &[Arc<str>],
        results: &[ToolDispatchResult],
    ) {
        self.turns += 1;
        self.calls += ids.len() as u64;
        self.turn_latency.saturating_record(nanos(latency));
        if results.len() != ids.len() {
            self.violation(format!(
                "a turn of {} calls got {} results",
                ids.len(),
                results.len()
            ));
        } else if let Some(i) = (0..ids.len()).find(|&i| {
            !Arc::ptr_eq(&results[i].tool_use_id, &ids[i]) && results[i].tool_use_id != ids[i]
        }) {
            self.violation(format!(
                "result {i} answers {:?}, expected {:?}",
                &*results[i].tool_use_id, &*ids[i]
            ));
        }
        for r in results {
            match r.error {
                None => self.ok += 1,
                Some(code) => self.errors[code_index(code)] += 1,
            }
            if r.timing.ran {
                self.queue_wait.saturating_record(nanos(r.timing.queued));
            }
        }
    }

    /// Counts a violation that is not a turn's (e.g. a session task that died).
    pub fn violation(&mut self, what: String) {
        self.violations += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(what);
        }
    }

    /// Adds another recorder's violations (count and examples) to this one, nothing else.
    pub fn merge_violations(&mut self, other: &Recorder) {
        self.violations += other.violations;
        for e in &other.examples {
            if self.examples.len() < MAX_EXAMPLES {
                self.examples.push(e.clone());
            }
        }
    }

    /// Adds another recorder's counts and histograms to this one.
    pub fn merge(&mut self, other: &Recorder) {
        self.turns += other.turns;
        self.calls += other.calls;
        self.ok += other.ok;
        for (a, b) in self.errors.iter_mut().zip(other.errors) {
            *a += b;
        }
        self.merge_violations(other);
        // Same bounds on both sides: adding cannot fail.
        let _ = self.turn_latency.add(&other.turn_latency);
        let _ = self.queue_wait.add(&other.queue_wait);
    }

    /// The error counts as a JSON object with every code.
    pub fn errors_json(&self) -> Value {
        let map: serde_json::Map<String, Value> = ErrorCode::ALL
            .iter()
            .map(|c| (c.as_str().to_string(), json!(self.errors[code_index(*c)])))
            .collect();
        Value::Object(map)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// The usual percentiles of a histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// Percentiles of a histogram of nanoseconds, in µs (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            mean: h.mean() / 1000.0,
        }
    }

    /// As JSON (µs, 2 decimals).
    pub fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "p50": round2(self.p50),
            "p90": round2(self.p90),
            "p99": round2(self.p99),
            "p99_9": round2(self.p999),
            "max": round2(self.max),
            "mean": round2(self.mean),
        })
    }
}

/// Rounds to `places` decimals (for JSON); 0 for what is not a finite number.
pub fn round_to(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    if x.is_finite() {
        (x * scale).round() / scale
    } else {
        0.0
    }
}

/// Rounds to 2 decimals (for JSON).
pub fn round2(x: f64) -> f64 {
    round_to(x, 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Timing;

    fn result(id: &str, code: Option<ErrorCode>) -> ToolDispatchResult {
        match code {
            None => ToolDispatchResult::ok(id.into(), "t".into(), String::new(), Timing::default()),
            Some(c) => ToolDispatchResult::error(id.into(), "t".into(), c, "x", Timing::default()),
        }
    }

    #[test]
    fn counts_outcomes_and_catches_missing_or_reordered_results() {
        let ids: Vec<Arc<str>> = vec!["a".into(), "b".into()];
        let mut r = Recorder::default();
        r.record_turn(
            Duration::from_micros(5),
            &ids,
            &[result("a", None), result("b", Some(ErrorCode::UnknownTool))],
        );
        assert_eq!(
            (r.turns, r.calls, r.ok, r.errors[0], r.violations),
            (1, 2, 1, 1, 0)
        );
        r.record_turn(
            Duration::from_micros(5),
            &ids,
            &[result("b", None), result("a", None)],
        );
        r.record_turn(Duration::from_micros(5), &ids, &[result("a", None)]);
        assert_eq!(r.violations, 2);
        assert_eq!(r.examples.len(), 2);
        let mut total = Recorder::default();
        total.merge(&r);
        total.merge(&r);
        assert_eq!(total.turns, 6);
        assert_eq!(total.violations, 4);
        let p = Percentiles::of(&total.turn_latency);
        assert_eq!(p.count, 6);
        assert!((4.9..5.1).contains(&p.p50), "{p:?}");
    }
}
