//! Latency samples of a study, and the figures it reports from them.

use std::time::Duration;

/// Durations in nanoseconds, as measured.
#[derive(Default)]
pub struct Samples(Vec<u64>);

impl Samples {
    pub fn record(&mut self, elapsed: Duration) {
        self.0
            .push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
    }

    pub fn record_ns(&mut self, ns: u64) {
        self.0.push(ns);
    }

    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    /// The sample at quantile `q` (nearest rank) in microseconds; 0 with no samples.
    pub fn us(&mut self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_unstable();
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1] as f64 / 1000.0
    }

    pub fn max_us(&self) -> f64 {
        self.0.iter().max().map_or(0.0, |&ns| ns as f64 / 1000.0)
    }

    /// `doc` with `p50_us`, `p99_us` and `max_us` of these samples added (2 decimals).
    pub fn with_latency(&mut self, mut doc: serde_json::Value) -> String {
        doc["p50_us"] = round(self.us(0.5), 2).into();
        doc["p99_us"] = round(self.us(0.99), 2).into();
        doc["max_us"] = round(self.max_us(), 2).into();
        doc.to_string()
    }
}

/// `x` rounded to `places` decimals (0 when it is not finite), for JSON.
pub fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    if x.is_finite() {
        (x * scale).round() / scale
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_ranks_in_microseconds() {
        let mut s = Samples::default();
        for ns in (1..=100).rev() {
            s.record_ns(ns * 1000);
        }
        assert_eq!(s.us(0.5), 50.0);
        assert_eq!(s.us(0.99), 99.0);
        assert_eq!(s.us(1.0), 100.0);
        assert_eq!(s.max_us(), 100.0);
        assert_eq!(Samples::default().us(0.5), 0.0);
        assert_eq!(round(1.23456, 2), 1.23);
        assert_eq!(round(f64::NAN, 2), 0.0);
    }
}
