//! Memory of the process: resident set size now and at its peak, and the soak verdict.
//!
//! Figures come from `/proc/self/status` (`VmRSS` now, `VmHWM` the peak); where that file does not
//! exist they are `None` and reports say "n/a". [`reset_peak`] writes `5` to
//! `/proc/self/clear_refs` so that each phase's peak is its own (best effort). A soak run samples
//! RSS about once a second; [`SoakVerdict::of`] calls the run flat when, after a warm-up (the
//! first tenth of the samples, at least one), the largest sample of the last third is within
//! [`FLAT_TOLERANCE`] of the largest of the first third.

use serde_json::{Value, json};

/// How much the last third's peak may exceed the first third's for RSS to count as flat.
pub const FLAT_TOLERANCE: f64 = 0.10;

/// One `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    })
}

/// Resident set size now, in bytes.
pub fn current() -> Option<u64> {
    status_bytes("VmRSS")
}

/// Peak resident set size since start (or since the last [`reset_peak`]), in bytes.
pub fn peak() -> Option<u64> {
    status_bytes("VmHWM")
}

/// Resets the peak to the current RSS (Linux ≥ 4.0); false where that is not possible.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Bytes as MiB with one decimal, or `n/a`.
pub fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "n/a".to_string(),
        |b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    )
}

/// What the RSS samples of a soak say.
#[derive(Debug, Clone, PartialEq)]
pub struct SoakVerdict {
    /// Samples taken (about one a second).
    pub samples: usize,
    /// Samples skipped as warm-up.
    pub warmup: usize,
    /// Smallest and largest sample after warm-up, bytes.
    pub min: u64,
    /// Largest sample after warm-up, bytes.
    pub max: u64,
    /// Largest sample of the first third after warm-up, bytes.
    pub first_third_max: u64,
    /// Largest sample of the last third, bytes.
    pub last_third_max: u64,
    /// `last_third_max / first_third_max − 1`, in percent.
    pub growth_pct: f64,
    /// Flat when the growth is within [`FLAT_TOLERANCE`]; `None` with fewer than 3 samples after
    /// warm-up.
    pub flat: Option<bool>,
}

impl SoakVerdict {
    /// The verdict over RSS samples (bytes, in time order); `None` without samples.
    pub fn of(samples: &[u64]) -> Option<SoakVerdict> {
        if samples.is_empty() {
            return None;
        }
        let warmup = (samples.len() / 10).max(1).min(samples.len() - 1);
        let kept = &samples[warmup..];
        let third = kept.len() / 3;
        let max_of = |s: &[u64]| s.iter().copied().max().unwrap_or(0);
        let (first, last) = if third == 0 {
            (kept, kept)
        } else {
            (&kept[..third], &kept[kept.len() - third..])
        };
        let (first_third_max, last_third_max) = (max_of(first), max_of(last));
        let growth_pct = if first_third_max == 0 {
            0.0
        } else {
            (last_third_max as f64 / first_third_max as f64 - 1.0) * 100.0
        };
        Some(SoakVerdict {
            samples: samples.len(),
            warmup,
            min: kept.iter().copied().min().unwrap_or(0),
            max: max_of(kept),
            first_third_max,
            last_third_max,
            growth_pct,
            flat: (third > 0).then_some(growth_pct <= FLAT_TOLERANCE * 100.0),
        })
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "samples": self.samples,
            "warmup_samples": self.warmup,
            "min_rss_bytes": self.min,
            "max_rss_bytes": self.max,
            "first_third_max_rss_bytes": self.first_third_max,
            "last_third_max_rss_bytes": self.last_third_max,
            "growth_pct": super::stats::round2(self.growth_pct),
            "flat": self.flat,
            "tolerance_pct": FLAT_TOLERANCE * 100.0,
        })
    }

    /// One line for the table.
    pub fn line(&self) -> String {
        let verdict = match self.flat {
            Some(true) => "flat",
            Some(false) => "GREW",
            None => "too few samples to judge",
        };
        format!(
            "RSS over {} samples (first {} skipped): min {}, max {}, first third max {}, last third max {} ({:+.1} %): {verdict}",
            self.samples,
            self.warmup,
            mib(Some(self.min)),
            mib(Some(self.max)),
            mib(Some(self.first_third_max)),
            mib(Some(self.last_third_max)),
            self.growth_pct,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_rss() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(current().unwrap() > 0);
            assert!(peak().unwrap() >= current().unwrap() / 2);
        }
    }

    #[test]
    fn flat_and_growing_series_are_told_apart() {
        let flat: Vec<u64> = (0..60).map(|i| 100 + (i % 3)).collect();
        assert_eq!(SoakVerdict::of(&flat).unwrap().flat, Some(true));
        let growing: Vec<u64> = (0..60).map(|i| 100 + 2 * i).collect();
        assert_eq!(SoakVerdict::of(&growing).unwrap().flat, Some(false));
        assert_eq!(SoakVerdict::of(&[5, 6]).unwrap().flat, None);
        assert!(SoakVerdict::of(&[]).is_none());
    }
}
