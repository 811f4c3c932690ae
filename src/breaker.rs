//! Restart intensity per tool, Erlang/OTP style: a tool whose handler panics more than
//! `max_panics` times within `window` is tripped, and for the next `window` its calls are answered
//! at once (`execution_error`, nothing runs) instead of crashing again and again. After that the
//! tool gets a fresh start.
//!
//! The hot path pays one atomic load per call ([`Breaker::tripped`]); the panic path takes a small
//! lock.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Default: more than 5 panics within 10 s trips a tool.
pub const DEFAULT_MAX_PANICS: usize = 5;
/// Default window (and cool-down).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// One tool's panic history.
#[derive(Debug)]
pub struct Breaker {
    epoch: Instant,
    max_panics: usize,
    window: Duration,
    recent: Mutex<VecDeque<Instant>>,
    /// Nanoseconds since `epoch` until which the tool is tripped (0: not tripped).
    tripped_until: AtomicU64,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker::new(DEFAULT_MAX_PANICS, DEFAULT_WINDOW)
    }
}

impl Breaker {
    /// Trips after more than `max_panics` panics within `window`, for `window`.
    pub fn new(max_panics: usize, window: Duration) -> Self {
        Breaker {
            epoch: Instant::now(),
            max_panics,
            window,
            recent: Mutex::new(VecDeque::new()),
            tripped_until: AtomicU64::new(0),
        }
    }

    /// If the tool is tripped now, how long it stays so.
    #[inline]
    pub fn tripped(&self) -> Option<Duration> {
        let until = self.tripped_until.load(Ordering::Acquire);
        if until == 0 {
            return None;
        }
        let now = self.nanos(Instant::now());
        (now < until).then(|| Duration::from_nanos(until - now))
    }

    /// Records a panic; returns true if this one tripped the tool.
    pub fn record_panic(&self) -> bool {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            recent.pop_front();
        }
        recent.push_back(now);
        if recent.len() > self.max_panics {
            recent.clear();
            let until = self.nanos(now + self.window).max(1);
            self.tripped_until.store(until, Ordering::Release);
            return true;
        }
        false
    }

    /// The limit, for messages: `(max_panics, window)`.
    pub fn limit(&self) -> (usize, Duration) {
        (self.max_panics, self.window)
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_the_limit_within_the_window_trips() {
        let b = Breaker::new(2, Duration::from_secs(60));
        assert!(!b.record_panic());
        assert!(!b.record_panic());
        assert!(b.tripped().is_none());
        assert!(b.record_panic());
        assert!(b.tripped().is_some_and(|d| d <= Duration::from_secs(60)));
    }

    #[test]
    fn the_trip_expires_after_the_window() {
        let b = Breaker::new(0, Duration::from_millis(1));
        assert!(b.record_panic());
        std::thread::sleep(Duration::from_millis(5));
        assert!(b.tripped().is_none());
    }
}
