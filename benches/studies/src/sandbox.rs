//! `studies sandbox`: what a sandboxed command costs, against what a process start costs,
//! measured in one run.
//!
//! Rows, each at 1 and at 16 concurrent sessions (every session a task that runs one call after
//! another):
//!
//! | mode | each call |
//! | --- | --- |
//! | `bare` | a fork-exec of `bash -c true` from this process, waited for (no engine) |
//! | `off` | the engine's `bash` tool running `true` with `--sandbox off` |
//! | `workspace-write` | the same under the default sandbox |
//! | `read-only` | the same under `read-only` |
//!
//! One JSON line per row: `mode`, `sessions`, `calls`, `p50_ms`, `p99_ms`, `calls_per_s`, and
//! `vs_bare` (this row's p50 ÷ the bare row's p50 at the same sessions). Every row runs for
//! `--duration` (default 2 s) or `--turns` calls per session, bounded by `--max-time`; every call
//! must succeed (`true` prints nothing) or the run fails.

use std::time::{Duration, Instant};

use serde_json::json;

use switchboard::sandbox::{SandboxConfig, SandboxMode};
use switchboard::tools::builtin_tools;
use switchboard::{Engine, Session, ToolCall, Workspace};

use crate::samples::{Samples, round};

/// The session counts of every mode.
pub const SESSIONS: [usize; 2] = [1, 16];

/// Measuring time of a row when neither `--turns` nor `--duration` is given.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(2);

/// How a row is bounded.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Calls per session, if fixed.
    pub calls: Option<u64>,
    /// Measuring time otherwise.
    pub duration: Duration,
    /// Hard stop of a row, either way.
    pub max_time: Duration,
}

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bare,
    Engine(SandboxMode),
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Bare => "bare",
            Mode::Engine(m) => m.as_str(),
        }
    }
}

const MODES: [Mode; 4] = [
    Mode::Bare,
    Mode::Engine(SandboxMode::Off),
    Mode::Engine(SandboxMode::WorkspaceWrite),
    Mode::Engine(SandboxMode::ReadOnly),
];

/// One row's samples.
struct Row {
    calls: u64,
    elapsed: Duration,
    latencies: Samples,
}

/// Runs every row; returns the printed JSON lines.
pub async fn run(bounds: Bounds, progress: bool) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    for sessions in SESSIONS {
        let mut bare_p50 = None;
        for mode in MODES {
            if progress {
                eprintln!(
                    "studies: sandbox: {} at {sessions} session(s)…",
                    mode.name()
                );
            }
            let mut row = run_row(mode, sessions, bounds).await?;
            let p50_ms = row.latencies.us(0.5) / 1000.0;
            if mode == Mode::Bare {
                bare_p50 = Some(p50_ms);
            }
            let per_s = row.calls as f64 / row.elapsed.as_secs_f64().max(1e-9);
            let line = json!({
                "workload": "sandbox",
                "mode": mode.name(),
                "sessions": sessions,
                "calls": row.calls,
                "p50_ms": round(p50_ms, 3),
                "p99_ms": round(row.latencies.us(0.99) / 1000.0, 3),
                "calls_per_s": per_s.round() as u64,
                "vs_bare": bare_p50
                    .filter(|b| *b > 0.0)
                    .map(|b| round(p50_ms / b, 2)),
            })
            .to_string();
            lines.push(line);
        }
    }
    Ok(lines)
}

async fn run_row(mode: Mode, sessions: usize, bounds: Bounds) -> Result<Row, String> {
    let dir = tempfile::Builder::new()
        .prefix("switchboard-sandbox-load-")
        .tempdir()
        .map_err(|e| format!("cannot create a workspace: {e}"))?;
    let engine = match mode {
        Mode::Bare => None,
        Mode::Engine(m) => {
            let ws = Workspace::open(dir.path()).map_err(|e| e.to_string())?;
            let engine = Engine::builder()
                .tools(builtin_tools())
                .workspace(ws)
                .sandbox(SandboxConfig::new(m))
                .build()
                .map_err(|e| format!("{}: {e}", m.as_str()))?;
            Some(engine)
        }
    };
    let sessions: Vec<Option<Session>> = (0..sessions)
        .map(|_| engine.as_ref().map(Engine::session))
        .collect();
    // One call per session first (the first spawn, the page cache), not measured.
    let warm: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(s, session)| {
            let session = session.clone();
            tokio::spawn(async move { one_call(session.as_ref(), &format!("w{s}")).await })
        })
        .collect();
    for task in warm {
        task.await.map_err(|e| e.to_string())??;
    }
    let started = Instant::now();
    let deadline = started + bounds.max_time;
    let stop_at = match bounds.calls {
        Some(_) => deadline,
        None => (started + bounds.duration).min(deadline),
    };
    let tasks: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(s, session)| {
            let limit = bounds.calls;
            tokio::spawn(async move {
                let mut latencies = Samples::default();
                let mut n = 0u64;
                while limit.is_none_or(|l| n < l) && Instant::now() < stop_at {
                    let t = Instant::now();
                    one_call(session.as_ref(), &format!("s{s}-{n}")).await?;
                    latencies.record(t.elapsed());
                    n += 1;
                }
                Ok::<_, String>((n, latencies))
            })
        })
        .collect();
    let mut row = Row {
        calls: 0,
        elapsed: Duration::ZERO,
        latencies: Samples::default(),
    };
    for task in tasks {
        let (n, h) = task.await.map_err(|e| e.to_string())??;
        row.calls += n;
        row.latencies.extend(h);
    }
    row.elapsed = started.elapsed();
    if let Some(engine) = engine {
        engine.shutdown(Duration::from_secs(5)).await;
    }
    Ok(row)
}

/// One `true`: through the engine's `bash` in `session`, or a bare fork-exec without one.
async fn one_call(session: Option<&Session>, id: &str) -> Result<(), String> {
    let Some(session) = session else {
        return bare_call().await;
    };
    let call = ToolCall::new(id, "bash", json!({"command": "true"}));
    let result = session
        .dispatch(vec![call])
        .await
        .map_err(|e| e.to_string())?;
    match result.first() {
        Some(r) if r.error.is_none() => Ok(()),
        Some(r) => Err(format!("bash true failed: {}", r.content)),
        None => Err("no result".into()),
    }
}

/// A fork-exec of `bash -c true`, waited for: what any process start costs here.
async fn bare_call() -> Result<(), String> {
    let status = tokio::process::Command::new("bash")
        .args(["-c", "true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .map_err(|e| format!("cannot start bash: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("bash -c true: {status}"))
}
