//! The driver: runs one phase — every session's turn loop in its own tokio task — against the
//! engine or the direct baseline, and gathers what it measured.
//!
//! A session loop takes a turn from its [`SessionTurns`], dispatches it on its [`Target`] (its own
//! engine [`Session`], or the shared [`DirectDispatcher`]), encodes the results as the Anthropic
//! message to append, straight to bytes (as a harness would; the bytes are then dropped) and records the turn.
//! Loops are bounded twice: by a turn count and by [`Shared::stop`], which the phase's
//! [`Monitor`] thread sets at the deadline. The clock runs from spawning the tasks to the last one
//! ending. Loops run in spawned tasks, never in `block_on` (an actor round trip from `block_on`
//! costs many times more).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::http::{Endpoint, HttpSession};
use super::journal_dir::JournalRoot;
use super::monitor::{Monitor, MonitorConfig, Shared};
use super::rss;
use super::stats::Recorder;
use super::workload::{SessionTurns, Templates, Workload};
use crate::baseline::DirectDispatcher;
use crate::engine::Engine;
use crate::engine::Session;
use crate::journal::{FlushCounts, Journal};
use crate::protocol::{ToolCall, ToolDispatchResult, WireFormat, write_json};
use crate::tool::ToolSpec;

/// At most this many recorders per phase; sessions beyond share them.
const MAX_RECORDERS: usize = 64;

/// Calls a loop counts locally before adding them to the shared progress counter.
const FLUSH_CALLS: u64 = 512;

/// Where a session's turns go.
#[derive(Debug, Clone)]
pub enum Target {
    /// The engine, through this session.
    Engine(Session),
    /// The direct in-process baseline (shared by all sessions).
    Direct(Arc<DirectDispatcher>),
    /// A session of a `switchboard serve` server, over its own keep-alive connection.
    Http(Arc<tokio::sync::Mutex<HttpSession>>),
}

impl Target {
    /// Dispatches a turn; with `cancel_after` (fault injection, engine only) the turn is cancelled
    /// that long after it starts.
    async fn dispatch(
        &self,
        calls: Vec<ToolCall>,
        cancel_after: Option<Duration>,
    ) -> Vec<ToolDispatchResult> {
        // An engine fault answers nothing: the run counts the turn as not answered exactly once.
        match (self, cancel_after) {
            (Target::Engine(session), None) => session.dispatch(calls).await.unwrap_or_default(),
            (Target::Engine(session), Some(after)) => {
                let token = session.turn_token();
                let trigger = token.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    trigger.cancel();
                });
                session
                    .dispatch_with_cancel(calls, token)
                    .await
                    .unwrap_or_default()
            }
            (Target::Direct(direct), _) => direct.dispatch(calls).await,
            (Target::Http(session), _) => session.lock().await.dispatch(calls).await,
        }
    }
}

/// How a phase is bounded.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Turns per session at most.
    pub turns: u64,
    /// Stop after this long (the run's `--duration`, or the hard cap `--max-time`).
    pub stop_after: Duration,
    /// True when `stop_after` is the run's duration (a timed run), false when it is only a cap.
    pub timed: bool,
}

impl Bounds {
    /// The bounds of one round of a workload set: `turns` turns per session if given, else
    /// `duration`; never longer than `max_time`.
    pub fn for_rounds(turns: Option<u64>, duration: Duration, max_time: Duration) -> Bounds {
        match turns {
            Some(turns) => Bounds {
                turns,
                stop_after: max_time,
                timed: false,
            },
            None => Bounds {
                turns: u64::MAX,
                stop_after: duration.min(max_time),
                timed: true,
            },
        }
    }
}

/// How a phase reports while it runs.
#[derive(Debug, Clone)]
pub struct Display {
    /// Progress bar prefix (`engine`, `direct`, `warm-up`).
    pub label: String,
    /// Draw the progress bar.
    pub progress: bool,
    /// Sample RSS every second (a soak).
    pub sample_rss: bool,
}

impl Display {
    /// A phase that samples no RSS: a round of a comparison, a warm-up.
    pub fn round(label: &str, progress: bool) -> Display {
        Display {
            label: label.to_string(),
            progress,
            sample_rss: false,
        }
    }
}

/// What one phase measured.
#[derive(Debug)]
pub struct Phase {
    /// Counts and histograms of every session.
    pub stats: Recorder,
    /// Wall time from the first task spawned to the last one ended.
    pub elapsed: Duration,
    /// How it ended: `turns` (every session did its turns), `duration` (the deadline of a timed
    /// run) or `hard_cap` (the `--max-time` cap cut a counted run short).
    pub stopped_by: &'static str,
    /// Peak RSS during the phase, bytes (`None` where it cannot be read).
    pub peak_rss: Option<u64>,
    /// RSS samples, bytes, about one a second (when asked for).
    pub rss_samples: Vec<u64>,
    /// What the engine's journal flushed during the measured loops (an engine with a journal).
    pub journal: Option<FlushCounts>,
}

impl Phase {
    /// Calls per second.
    pub fn calls_per_s(&self) -> f64 {
        per_s(self.stats.calls, self.elapsed)
    }

    /// Turns per second.
    pub fn turns_per_s(&self) -> f64 {
        per_s(self.stats.turns, self.elapsed)
    }

    /// Journal flushes per second (`None` without a journal).
    pub fn flushes_per_s(&self) -> Option<f64> {
        self.journal.map(|j| per_s(j.flushes, self.elapsed))
    }

    /// Calls answered per journal flush (`None` without a journal, or when nothing was flushed).
    /// Each call takes part in two flushes (its intent's and its answer's).
    pub fn calls_per_flush(&self) -> Option<f64> {
        self.journal
            .filter(|j| j.flushes > 0)
            .map(|j| self.stats.calls as f64 / j.flushes as f64)
    }
}

fn per_s(n: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// Runs one phase: one task per target (session), each with its own turn builder.
pub async fn run_phase(
    targets: &[Target],
    workload: &Arc<Workload>,
    bounds: &Bounds,
    display: &Display,
) -> Phase {
    run_turns(targets, workload, bounds, display, false).await
}

/// [`run_phase`]; `warm_up` gives the turns ids of their own ([`SessionTurns::for_warm_up`]).
async fn run_turns(
    targets: &[Target],
    workload: &Arc<Workload>,
    bounds: &Bounds,
    display: &Display,
    warm_up: bool,
) -> Phase {
    let sessions = targets.len();
    let recorders: Vec<Arc<Mutex<Recorder>>> = (0..sessions.clamp(1, MAX_RECORDERS))
        .map(|_| Arc::new(Mutex::new(Recorder::default())))
        .collect();
    let shared = Arc::new(Shared::default());
    let expected = (!bounds.timed).then(|| {
        bounds
            .turns
            .saturating_mul(sessions as u64)
            .saturating_mul(workload.calls_per_turn as u64)
    });
    rss::reset_peak();
    let monitor = Monitor::start(
        Arc::clone(&shared),
        MonitorConfig {
            stop_after: bounds.stop_after,
            expected_calls: expected,
            progress: display.progress,
            label: display.label.clone(),
            sample_rss: display.sample_rss,
        },
    );
    let templates = Templates::shared(workload);
    let turns_each: Vec<SessionTurns> = (0..sessions)
        .map(|i| {
            let turns = SessionTurns::new(Arc::clone(workload), templates.as_ref(), i);
            if warm_up { turns.for_warm_up() } else { turns }
        })
        .collect();
    let start = Instant::now();
    let tasks: Vec<_> = targets
        .iter()
        .zip(turns_each)
        .enumerate()
        .map(|(i, (target, turns))| {
            let target = target.clone();
            let recorder = Arc::clone(&recorders[i % recorders.len()]);
            let shared = Arc::clone(&shared);
            let max_turns = bounds.turns;
            tokio::spawn(session_loop(target, turns, max_turns, recorder, shared))
        })
        .collect();
    let mut failures = Vec::new();
    for task in tasks {
        if let Err(e) = task.await {
            failures.push(format!("a session task failed: {e}"));
        }
    }
    let elapsed = start.elapsed();
    let seen = monitor.finish();
    let mut stats = Recorder::default();
    for r in &recorders {
        stats.merge(&r.lock().unwrap_or_else(PoisonError::into_inner));
    }
    for f in failures {
        stats.violation(f);
    }
    let stopped_by = match (seen.stopped, bounds.timed) {
        (false, _) => "turns",
        (true, true) => "duration",
        (true, false) => "hard_cap",
    };
    Phase {
        stats,
        elapsed,
        stopped_by,
        peak_rss: rss::peak(),
        rss_samples: seen.rss_samples,
        journal: None,
    }
}

async fn session_loop(
    target: Target,
    mut turns: SessionTurns,
    max_turns: u64,
    recorder: Arc<Mutex<Recorder>>,
    shared: Arc<Shared>,
) {
    let mut unflushed = 0u64;
    let mut encoded = Vec::with_capacity(1024);
    for _ in 0..max_turns {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let cancel_after = turns.cancel_after();
        let calls = turns.next_turn();
        let n = calls.len() as u64;
        let sent = Instant::now();
        let results = target.dispatch(calls, cancel_after).await;
        let latency = sent.elapsed();
        encoded.clear();
        // Writing to a Vec cannot fail; the bytes are what a harness would send on.
        let _ = write_json(WireFormat::Anthropic, &results, &mut encoded);
        std::hint::black_box(&encoded);
        recorder
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record_turn(latency, turns.ids(), &results);
        unflushed += n;
        if unflushed >= FLUSH_CALLS {
            shared.calls.fetch_add(unflushed, Ordering::Relaxed);
            unflushed = 0;
        }
    }
    shared.calls.fetch_add(unflushed, Ordering::Relaxed);
}

/// Warm-up before a measured phase: the same loops on the same sessions, unmeasured, with ids
/// of their own, for `warmup` (if not zero).
async fn warm_up(targets: &[Target], workload: &Arc<Workload>, warmup: Duration) {
    if warmup.is_zero() {
        return;
    }
    let bounds = Bounds {
        turns: u64::MAX,
        stop_after: warmup,
        timed: true,
    };
    let display = Display::round("warm-up", false);
    run_turns(targets, workload, &bounds, &display, true).await;
}

/// The tools of a load run, and the workspace the built-in ones work in (if any).
#[derive(Clone)]
pub struct ToolSet {
    /// The tool specs.
    pub specs: Vec<ToolSpec>,
    /// The workspace of every session (the built-in workload only).
    pub workspace: Option<crate::workspace::Workspace>,
    /// The engine's permission policy file (`--policy`), loaded afresh for each engine phase.
    pub policy: Option<std::path::PathBuf>,
    /// Where each engine phase opens a fresh journal (`--journal`), if it has one.
    pub journal: Option<Arc<JournalRoot>>,
}

/// The engine phase: an engine with `tools` (`workers` workers), one session per simulated
/// session, a warm-up, then the measured loops; the engine is shut down afterwards. The engine
/// records into the installed recorder (if any).
pub async fn engine_phase(
    tools: ToolSet,
    workers: Option<usize>,
    sessions: usize,
    workload: &Arc<Workload>,
    bounds: &Bounds,
    display: &Display,
    warmup: Duration,
) -> Result<Phase, String> {
    engine_phase_recording(
        None, tools, workers, sessions, workload, bounds, display, warmup,
    )
    .await
}

/// [`engine_phase`], with the engine's metric handles taken from `recorder` instead of the
/// installed one (`metrics::NoopRecorder` for an engine that records nothing). With
/// `tools.journal`, the engine journals into a fresh directory, removed after the phase, and the
/// phase reports what the journal flushed during the measured loops.
#[allow(clippy::too_many_arguments)]
pub async fn engine_phase_recording(
    recorder: Option<&(dyn metrics::Recorder + Sync)>,
    tools: ToolSet,
    workers: Option<usize>,
    sessions: usize,
    workload: &Arc<Workload>,
    bounds: &Bounds,
    display: &Display,
    warmup: Duration,
) -> Result<Phase, String> {
    let mut builder = Engine::builder().tools(tools.specs);
    if let Some(ws) = tools.workspace {
        builder = builder.workspace(ws);
    }
    if let Some(path) = &tools.policy {
        let policy = crate::policy::Policy::load(path).map_err(|e| e.to_string())?;
        builder = builder.policy(policy);
    }
    if let Some(w) = workers {
        builder = builder.workers(w);
    }
    // Declared before the engine, so removed after it is gone.
    let journal_dir = match &tools.journal {
        Some(root) => Some(root.phase_dir()?),
        None => None,
    };
    if let Some(dir) = &journal_dir {
        builder = builder.journal(dir.path());
    }
    let engine = match recorder {
        Some(r) => metrics::with_local_recorder(r, || builder.build()),
        None => builder.build(),
    }
    .map_err(|e| format!("cannot build the engine: {e}"))?;
    let targets: Vec<Target> = (0..sessions)
        .map(|_| Target::Engine(engine.session()))
        .collect();
    warm_up(&targets, workload, warmup).await;
    let journal = engine.journal();
    let before = journal.map(Journal::flush_counts);
    let mut phase = run_phase(&targets, workload, bounds, display).await;
    phase.journal = journal
        .zip(before)
        .map(|(j, before)| j.flush_counts().since(before));
    drop(targets);
    engine.shutdown(Duration::from_secs(2)).await;
    Ok(phase)
}

/// The direct phase: the same workload through one shared [`DirectDispatcher`], in the same kind
/// of tasks.
pub async fn direct_phase(
    tools: ToolSet,
    sessions: usize,
    workload: &Arc<Workload>,
    bounds: &Bounds,
    display: &Display,
    warmup: Duration,
) -> Result<Phase, String> {
    let mut direct = DirectDispatcher::new(tools.specs)
        .map_err(|e| format!("cannot build the direct baseline: {e}"))?;
    if let Some(ws) = tools.workspace {
        direct = direct.with_workspace(ws);
    }
    let direct = Arc::new(direct);
    let targets: Vec<Target> = (0..sessions)
        .map(|_| Target::Direct(Arc::clone(&direct)))
        .collect();
    warm_up(&targets, workload, warmup).await;
    Ok(run_phase(&targets, workload, bounds, display).await)
}

/// The HTTP phase: one server session per simulated session, each over its own keep-alive
/// connection to `endpoint`, a warm-up, then the measured loops; the sessions are deleted
/// afterwards.
pub async fn http_phase(
    endpoint: Arc<Endpoint>,
    sessions: usize,
    workload: &Arc<Workload>,
    bounds: &Bounds,
    display: &Display,
    warmup: Duration,
) -> Result<Phase, String> {
    let mut targets = Vec::with_capacity(sessions);
    let mut held = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let session = Arc::new(tokio::sync::Mutex::new(
            HttpSession::open(Arc::clone(&endpoint)).await?,
        ));
        held.push(Arc::clone(&session));
        targets.push(Target::Http(session));
    }
    warm_up(&targets, workload, warmup).await;
    let phase = run_phase(&targets, workload, bounds, display).await;
    drop(targets);
    for session in held {
        if let Ok(session) = Arc::try_unwrap(session) {
            session.into_inner().close().await;
        }
    }
    Ok(phase)
}
