//! When and how long to wait before asking the model again.
//!
//! Retried: HTTP 429, 500, 502, 503 and 529, connection failures and timeouts before the answer
//! started — never a stream that already delivered a block (its calls may be running). Each wait
//! is the server's `retry-after` (or `retry-after-ms`) when it sent one, capped at
//! [`RetryPolicy::max_retry_after`]; otherwise exponential backoff from
//! [`RetryPolicy::base_delay`], doubling per attempt up to [`RetryPolicy::max_delay`], with jitter
//! (a uniform pick in the upper half). After [`RetryPolicy::max_attempts`] requests the last
//! failure is returned, naming its status.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The statuses that are retried.
pub const RETRYABLE_STATUSES: [u16; 5] = [429, 500, 502, 503, 529];

/// True for a status worth asking again.
pub fn is_retryable_status(status: u16) -> bool {
    RETRYABLE_STATUSES.contains(&status)
}

/// Retry settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Requests made at most, the first included (≥ 1).
    pub max_attempts: u32,
    /// Backoff before the second attempt; it doubles for each later one.
    pub base_delay: Duration,
    /// Longest backoff.
    pub max_delay: Duration,
    /// Longest wait a `retry-after` header can impose.
    pub max_retry_after: Duration,
    /// What one second of `retry-after` means: one second, except in tests that shrink it.
    pub retry_after_unit: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
            retry_after_unit: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt number `attempt` (1-based): `retry_after` (seconds, as the
    /// server sent it) if any, capped; else jittered exponential backoff.
    pub fn delay(&self, attempt: u32, retry_after: Option<f64>) -> Duration {
        if let Some(seconds) = retry_after {
            let wait = self.retry_after_unit.mul_f64(seconds.clamp(0.0, 1e6));
            return wait.min(self.max_retry_after);
        }
        let exp = attempt.saturating_sub(1).min(30);
        let full = self
            .base_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay);
        // Uniform in [full / 2, full].
        full / 2 + full.mul_f64(jitter() / 2.0)
    }
}

/// Reads `retry-after-ms` (milliseconds) or `retry-after` (seconds; an HTTP date is ignored).
pub fn parse_retry_after(retry_after: Option<&str>, retry_after_ms: Option<&str>) -> Option<f64> {
    let number = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    retry_after_ms
        .and_then(number)
        .map(|ms| ms / 1000.0)
        .or_else(|| retry_after.and_then(number))
}

/// A number in [0, 1) from a tiny xorshift generator (jitter needs no real randomness).
fn jitter() -> f64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64)
            | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listed_statuses_and_only_those_are_retried() {
        for s in [429, 500, 502, 503, 529] {
            assert!(is_retryable_status(s));
        }
        for s in [200, 400, 401, 403, 404, 413, 501] {
            assert!(!is_retryable_status(s));
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let p = RetryPolicy::default();
        for attempt in 1..=8 {
            let full = (Duration::from_millis(500) * (1 << (attempt - 1))).min(p.max_delay);
            for _ in 0..50 {
                let d = p.delay(attempt, None);
                assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
            }
        }
    }

    #[test]
    fn retry_after_wins_and_is_capped() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay(1, Some(3.0)), Duration::from_secs(3));
        assert_eq!(p.delay(1, Some(0.0)), Duration::ZERO);
        assert_eq!(p.delay(1, Some(3600.0)), Duration::from_secs(60));
        let fast = RetryPolicy {
            retry_after_unit: Duration::from_millis(10),
            ..RetryPolicy::default()
        };
        assert_eq!(fast.delay(1, Some(2.0)), Duration::from_millis(20));
    }

    #[test]
    fn retry_after_headers_parse() {
        assert_eq!(parse_retry_after(Some("2"), None), Some(2.0));
        assert_eq!(parse_retry_after(Some(" 1.5 "), None), Some(1.5));
        assert_eq!(parse_retry_after(Some("2"), Some("250")), Some(0.25));
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), None),
            None
        );
        assert_eq!(parse_retry_after(Some("-1"), None), None);
        assert_eq!(parse_retry_after(None, None), None);
    }
}
