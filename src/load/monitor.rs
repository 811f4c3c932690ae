//! The monitor: one OS thread per phase that stops the phase on time, draws the progress bar and
//! samples RSS.
//!
//! Session loops may never yield (a direct loop over inline tools never awaits anything that is
//! pending), which starves any tokio timer meant to stop them. So the stop signal comes from this
//! plain thread: at the deadline it sets [`Shared::stop`], which every session loop checks before
//! each turn. The same thread redraws the progress bar (indicatif, on stderr; hidden when stderr
//! is not a terminal or with `--quiet`) every 100 ms with the calls counted so far and the recent
//! calls/s, and, when asked, reads RSS about once a second. It ends when the phase ends
//! ([`Monitor::finish`]) and hands back what it saw.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::numbers::{group, rate};
use super::rss;

/// How often the progress bar is redrawn.
const TICK: Duration = Duration::from_millis(100);

/// How often RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(1);

/// What the session loops and the monitor share.
#[derive(Debug, Default)]
pub struct Shared {
    /// Set when the phase must stop; loops check it before every turn.
    pub stop: AtomicBool,
    /// Calls dispatched so far (loops add in batches).
    pub calls: AtomicU64,
}

/// How the monitor runs.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Set [`Shared::stop`] this long after the start.
    pub stop_after: Duration,
    /// Calls the phase will make if it runs by count (the bar's length); `None` for a timed run.
    pub expected_calls: Option<u64>,
    /// Draw a progress bar (if stderr is a terminal).
    pub progress: bool,
    /// Prefix of the bar, e.g. `engine`.
    pub label: String,
    /// Sample RSS about once a second.
    pub sample_rss: bool,
}

/// What the monitor saw.
#[derive(Debug, Default)]
pub struct MonitorReport {
    /// True when it set the stop flag (the deadline passed before the loops ended).
    pub stopped: bool,
    /// RSS samples, bytes, about one a second.
    pub rss_samples: Vec<u64>,
}

/// A running monitor thread.
#[derive(Debug)]
pub struct Monitor {
    done: Option<Sender<()>>,
    thread: Option<JoinHandle<MonitorReport>>,
}

impl Monitor {
    /// Starts the thread. If the thread cannot be started the phase still stops by count, and a
    /// timed phase is stopped at once rather than left to run unbounded.
    pub fn start(shared: Arc<Shared>, config: MonitorConfig) -> Monitor {
        let (tx, rx) = mpsc::channel::<()>();
        let fallback = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("load-monitor".into())
            .spawn(move || watch(&shared, &config, &rx));
        match spawned {
            Ok(thread) => Monitor {
                done: Some(tx),
                thread: Some(thread),
            },
            Err(e) => {
                crate::command::say(&format!("cannot start the load monitor thread: {e}"));
                fallback.stop.store(true, Ordering::Relaxed);
                Monitor {
                    done: None,
                    thread: None,
                }
            }
        }
    }

    /// Stops the thread and returns what it saw.
    pub fn finish(mut self) -> MonitorReport {
        drop(self.done.take());
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

fn progress_bar(config: &MonitorConfig) -> ProgressBar {
    if !config.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let len = config
        .expected_calls
        .unwrap_or(config.stop_after.as_millis() as u64);
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix:>7} [{elapsed_precise}] {wide_bar} {msg}")
    {
        bar.set_style(style);
    }
    bar.set_prefix(config.label.clone());
    bar
}

fn watch(shared: &Shared, config: &MonitorConfig, done: &mpsc::Receiver<()>) -> MonitorReport {
    let bar = progress_bar(config);
    let start = Instant::now();
    let deadline = start + config.stop_after;
    let mut next_sample = start + RSS_EVERY;
    let mut report = MonitorReport::default();
    let (mut last_calls, mut last_at) = (0u64, start);
    let mut recent = 0.0f64;
    loop {
        let now = Instant::now();
        if !report.stopped && now >= deadline {
            shared.stop.store(true, Ordering::Relaxed);
            report.stopped = true;
        }
        if config.sample_rss && now >= next_sample {
            if let Some(bytes) = rss::current() {
                report.rss_samples.push(bytes);
            }
            next_sample += RSS_EVERY;
        }
        if !bar.is_hidden() {
            let calls = shared.calls.load(Ordering::Relaxed);
            let window = now.duration_since(last_at).as_secs_f64();
            if window >= 0.5 {
                recent = (calls - last_calls.min(calls)) as f64 / window;
                (last_calls, last_at) = (calls, now);
            }
            let position = match config.expected_calls {
                Some(_) => calls,
                None => now.duration_since(start).as_millis() as u64,
            };
            bar.set_position(position);
            bar.set_message(format!("{} calls · {} calls/s", group(calls), rate(recent)));
        }
        let mut wait = TICK;
        if !report.stopped {
            wait = wait.min(deadline.saturating_duration_since(now));
        }
        if config.sample_rss {
            wait = wait.min(next_sample.saturating_duration_since(now));
        }
        match done.recv_timeout(wait.max(Duration::from_millis(1))) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    bar.finish_and_clear();
    report
}
