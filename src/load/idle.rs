//! `--idle`: hold N idle sessions and measure what each costs in memory.
//!
//! It builds the engine with the workload tools, reads RSS, then — in a spawned task — opens N
//! sessions and dispatches on each a turn the engine refuses whole (one call with an empty id):
//! the turn goes through the session's whole dispatch path, so the session shows its whole cost,
//! and its answer memory stays empty (such a turn is not remembered). RSS again: (after − before)
//! ÷ N is the memory of an idle session. Then one `noop` turn on each, whose answer the session
//! keeps for retries, and RSS once more: the growth ÷ N is what one kept answer costs. With
//! `--duration` it then holds the sessions that long, sampling RSS every second (a soak of idle
//! sessions), and finally drops them and reads RSS once more.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::monitor::{Monitor, MonitorConfig, Shared};
use super::numbers::group;
use super::rss::{self, SoakVerdict};
use super::workload::{TEXT, load_tools};
use crate::engine::Engine;
use crate::engine::Session;
use crate::protocol::ToolCall;

/// What an idle run measured.
#[derive(Debug)]
pub struct IdleReport {
    /// Sessions held.
    pub sessions: usize,
    /// RSS before opening them, bytes.
    pub before: Option<u64>,
    /// RSS with all of them open, answer memory empty, bytes.
    pub opened: Option<u64>,
    /// RSS with each keeping one answer, bytes.
    pub after: Option<u64>,
    /// RSS after dropping them, bytes.
    pub dropped: Option<u64>,
    /// Time to open them all (each with its refused turn).
    pub create: Duration,
    /// Warm-up turns that did not come back as expected (must be 0): the refused turn refused,
    /// the `noop` turn `ok`.
    pub failures: usize,
    /// RSS samples while holding them (with `--duration`).
    pub soak: Option<SoakVerdict>,
}

impl IdleReport {
    /// (opened − before) ÷ sessions: an idle session with its answer memory empty, bytes.
    pub fn bytes_per_session(&self) -> Option<f64> {
        Some(self.per(self.before?, self.opened?))
    }

    /// (after − opened) ÷ sessions: one kept answer (a 32-character `noop` answer), bytes.
    pub fn bytes_per_kept_answer(&self) -> Option<f64> {
        Some(self.per(self.opened?, self.after?))
    }

    fn per(&self, from: u64, to: u64) -> f64 {
        to.saturating_sub(from) as f64 / self.sessions.max(1) as f64
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "mode": "idle",
            "sessions": self.sessions,
            "rss_before_bytes": self.before,
            "rss_opened_bytes": self.opened,
            "rss_after_bytes": self.after,
            "rss_after_drop_bytes": self.dropped,
            "bytes_per_session": self.bytes_per_session().map(f64::round),
            "kib_per_session": self.bytes_per_session().map(|b| (b / 1024.0 * 100.0).round() / 100.0),
            "bytes_per_kept_answer": self.bytes_per_kept_answer().map(f64::round),
            "create_ms": (self.create.as_secs_f64() * 1e5).round() / 100.0,
            "warm_turn_failures": self.failures,
            "peak_rss_bytes": rss::peak(),
            "soak": self.soak.as_ref().map(SoakVerdict::to_json),
        })
    }

    /// As text.
    pub fn text(&self) -> String {
        let bytes = |b: Option<f64>| {
            b.map_or_else(
                || "n/a".to_string(),
                |b| format!("{} bytes ({:.2} KiB)", group(b.round() as u64), b / 1024.0),
            )
        };
        let per = bytes(self.bytes_per_session());
        let answer = bytes(self.bytes_per_kept_answer());
        let mut out = format!(
            "switchboard load --idle: {} sessions, each dispatched a turn refused whole (answer \
             memory empty), then a noop turn (one kept answer)\n\n\
             RSS before          {}\n\
             RSS with sessions   {}\n\
             per session         {per}\n\
             RSS with answers    {}\n\
             per kept answer     {answer}\n\
             RSS after dropping  {}\n\
             open time           {:.1} ms\n\
             failed warm turns   {}\n",
            group(self.sessions as u64),
            rss::mib(self.before),
            rss::mib(self.opened),
            rss::mib(self.after),
            rss::mib(self.dropped),
            self.create.as_secs_f64() * 1000.0,
            self.failures,
        );
        if let Some(soak) = &self.soak {
            out.push_str(&soak.line());
            out.push('\n');
        }
        out
    }
}

/// Opens `n` sessions, warms each, measures, optionally holds them for `hold`.
pub async fn run(
    n: usize,
    workers: Option<usize>,
    hold: Option<Duration>,
    progress: bool,
) -> Result<IdleReport, String> {
    let mut builder = Engine::builder().tools(load_tools(Duration::ZERO));
    if let Some(w) = workers {
        builder = builder.workers(w);
    }
    let engine = builder.build().map_err(|e| e.to_string())?;
    // Let the runtime and the engine's own actors settle before the first reading.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = rss::current();
    let started = Instant::now();
    let opener = engine.clone();
    let opened = tokio::spawn(async move {
        let mut sessions: Vec<Session> = Vec::with_capacity(n);
        let mut failures = 0usize;
        for _ in 0..n {
            let session = opener.session();
            // An empty id: the engine refuses the turn whole and does not remember it.
            let call = ToolCall::new("", "noop", json!({"text": TEXT, "n": 0}));
            let results = session.dispatch(vec![call]).await.unwrap_or_default();
            if results.len() != 1 || results[0].is_ok() {
                failures += 1;
            }
            sessions.push(session);
        }
        (sessions, failures)
    })
    .await;
    let (sessions, mut failures) = opened.map_err(|e| format!("opening sessions failed: {e}"))?;
    let create = started.elapsed();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let opened = rss::current();
    let warmed = tokio::spawn(async move {
        let mut failures = 0usize;
        for (i, session) in sessions.iter().enumerate() {
            let call = ToolCall::new(format!("warm_{i}"), "noop", json!({"text": TEXT, "n": 0}));
            let results = session.dispatch(vec![call]).await.unwrap_or_default();
            if results.len() != 1 || !results[0].is_ok() {
                failures += 1;
            }
        }
        (sessions, failures)
    })
    .await;
    let (sessions, warm_failures) = warmed.map_err(|e| format!("warming sessions failed: {e}"))?;
    failures += warm_failures;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = rss::current();
    let soak = match hold {
        Some(hold) => {
            let shared = Arc::new(Shared::default());
            let monitor = Monitor::start(
                Arc::clone(&shared),
                MonitorConfig {
                    stop_after: hold,
                    expected_calls: None,
                    progress,
                    label: "idle".into(),
                    sample_rss: true,
                },
            );
            // The monitor thread sets the flag at the deadline; this task only polls it.
            while !shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            SoakVerdict::of(&monitor.finish().rss_samples)
        }
        None => None,
    };
    drop(sessions);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dropped = rss::current();
    engine.shutdown(Duration::from_secs(2)).await;
    Ok(IdleReport {
        sessions: n,
        before,
        opened,
        after,
        dropped,
        create,
        failures,
        soak,
    })
}
