//! `--workload-set serve`: what the HTTP hop of `switchboard serve` costs, measured in one run
//! against the in-process engine doing the same turns.
//!
//! It starts a server in this process on a free loopback port (with a bearer token and the load
//! tools, exactly as `serve --with-load-tools` would run), then for each workload runs the
//! in-process engine phase and the HTTP phase (one keep-alive connection per session, see
//! `http.rs`), alternating `--rounds` times and keeping each side's best round, and prints one
//! JSON line per workload:
//!
//! | workload | sessions | turn |
//! | --- | --- | --- |
//! | `single_call_noop` | 1 | 1 × `noop` |
//! | `sessions64_batch8_noop` | 64 | 8 × `noop` (safe) |
//!
//! with calls/s and turn latency p50/p99 (µs) of each side and `http_ratio` = HTTP calls/s ÷
//! in-process calls/s. The client and the server share the machine's cores.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::driver::{Bounds, Display, Phase, ToolSet, engine_phase, http_phase};
use super::http::Endpoint;
use super::peers::{PeersConfig, ratio};
use super::stats::{Percentiles, Recorder, round_to};
use super::workload::ToolKind;
use super::workload::{Faults, Workload, load_tools};
use crate::serve::{Auth, ServeConfig, Server};

/// `(name, sessions, calls per turn)` of the two workloads.
const WORKLOADS: [(&str, usize, usize); 2] = [
    ("single_call_noop", 1, 1),
    ("sessions64_batch8_noop", 64, 8),
];

/// Runs the set; returns the printed lines and the number of violations.
pub async fn run(config: &PeersConfig) -> Result<(Vec<String>, u64), String> {
    let root = tempfile::Builder::new()
        .prefix("switchboard-serve-load-")
        .tempdir()
        .map_err(|e| format!("cannot create a workspace root: {e}"))?;
    let token = format!(
        "load-{:016x}",
        std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::time::SystemTime::now(),
        )
    );
    let listen = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
    let mut serve_config = ServeConfig::new(
        listen,
        root.path(),
        Auth::token(&token).map_err(|e| e.to_string())?,
    );
    serve_config.load_tools = true;
    serve_config.workers = config.workers;
    let server = Server::bind(serve_config)
        .await
        .map_err(|e| e.to_string())?;
    let endpoint = Arc::new(Endpoint::parse(
        &format!("http://{}", server.local_addr()),
        Some(token),
    )?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let mut lines = Vec::new();
    let mut violations = Recorder::default();
    let mut outcome = Ok(());
    for (name, sessions, calls) in WORKLOADS {
        match run_one(name, sessions, calls, &endpoint, config).await {
            Ok((line, v)) => {
                crate::command::out(&format!("{line}\n"));
                lines.push(line);
                violations.merge_violations(&v);
            }
            Err(e) => {
                outcome = Err(format!("{name}: {e}"));
                break;
            }
        }
    }
    let _ = stop.send(());
    let _ = serving.await;
    for e in &violations.examples {
        crate::command::say(&format!("load: serve: violation: {e}"));
    }
    outcome.map(|()| (lines, violations.violations))
}

async fn run_one(
    name: &str,
    sessions: usize,
    calls: usize,
    endpoint: &Arc<Endpoint>,
    config: &PeersConfig,
) -> Result<(String, Recorder), String> {
    let sleep = Duration::from_millis(10);
    let workload = Arc::new(Workload {
        tool: ToolKind::Noop,
        calls_per_turn: calls,
        sleep,
        cpu_work: 0,
        serial_ratio: 0.0,
        error_rate: 0.0,
        pattern: None,
        seed: config.seed,
        faults: Faults::default(),
    });
    let bounds = Bounds::for_rounds(config.turns, config.duration, config.max_time);
    let display = |side: &str| Display {
        label: side.to_string(),
        progress: config.progress,
        sample_rss: false,
    };
    let tools = ToolSet {
        specs: load_tools(sleep),
        workspace: None,
        policy: None,
        journal: None,
    };
    let mut best: Option<(Phase, Phase)> = None;
    let mut violations = Recorder::default();
    for _ in 0..config.rounds.max(1) {
        let local = engine_phase(
            tools.clone(),
            config.workers,
            sessions,
            &workload,
            &bounds,
            &display("in-process"),
            config.warmup,
        )
        .await?;
        let http = http_phase(
            Arc::clone(endpoint),
            sessions,
            &workload,
            &bounds,
            &display("http"),
            config.warmup,
        )
        .await?;
        for phase in [&local, &http] {
            violations.merge_violations(&phase.stats);
        }
        best = Some(match best {
            None => (local, http),
            Some((l0, h0)) => (faster(l0, local), faster(h0, http)),
        });
    }
    let Some((local, http)) = best else {
        return Err("no round ran".into());
    };
    let (l, h) = (
        Percentiles::of(&local.stats.turn_latency),
        Percentiles::of(&http.stats.turn_latency),
    );
    let errors = http.stats.calls - http.stats.ok;
    let line = json!({
        "workload": name,
        "in_process_calls_per_s": local.calls_per_s().round() as u64,
        "http_calls_per_s": http.calls_per_s().round() as u64,
        "http_ratio": (ratio(http.calls_per_s(), local.calls_per_s()) * 1000.0).round() / 1000.0,
        "in_process_turn_p50_us": round_to(l.p50, 1),
        "in_process_turn_p99_us": round_to(l.p99, 1),
        "http_turn_p50_us": round_to(h.p50, 1),
        "http_turn_p99_us": round_to(h.p99, 1),
        "http_errors": errors,
    })
    .to_string();
    Ok((line, violations))
}

fn faster(a: Phase, b: Phase) -> Phase {
    if b.calls_per_s() > a.calls_per_s() {
        b
    } else {
        a
    }
}
