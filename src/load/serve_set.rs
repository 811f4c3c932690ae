//! `--workload-set serve`: what the HTTP hop of `switchboard serve` costs, measured in one run
//! against the in-process engine doing the same turns.
//!
//! It starts a server in this process on a free loopback port (with a bearer token and the load
//! tools, exactly as `serve --with-load-tools` would run), then for each workload runs the
//! in-process engine phase and the HTTP phase (one keep-alive connection per session, see
//! `http.rs`), alternating `--rounds` times and keeping each side's best round by calls/s (see
//! `ab.rs`), and prints one JSON line per workload:
//!
//! | workload | sessions | turn |
//! | --- | --- | --- |
//! | `single_call_noop` | 1 | 1 × `noop` |
//! | `sessions64_batch8_noop` | 64 | 8 × `noop` (safe) |
//!
//! with calls/s and turn latency p50/p99 (µs) of each side and `http_ratio` = HTTP calls/s ÷
//! in-process calls/s. The client and the server share the machine's cores.
//!
//! Beside each row, the hop's physical floor measured in the same rounds (`echo.rs`): as many
//! connections of the same client to a bare HTTP/1.1 echo server on the same loopback, each
//! sending the row's turn as its body and reading it back — `http_echo_turn_p50_us` and
//! `http_echo_turn_p99_us` next to `http_turn_p50_us`, and `http_over_echo_p50` = their ratio.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::ab::{alternate, keep_best, ratio};
use super::driver::{Bounds, Display, Phase, ToolSet, engine_phase, http_phase};
use super::echo::{Echo, EchoPhase};
use super::http::Endpoint;
use super::peers::PeersConfig;
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
    let echo = match Echo::start().await {
        Ok(echo) => echo,
        Err(e) => {
            let _ = stop.send(());
            let _ = serving.await;
            return Err(e);
        }
    };
    let mut lines = Vec::new();
    let mut violations = Recorder::default();
    let mut outcome = Ok(());
    for (name, sessions, calls) in WORKLOADS {
        match run_one(name, sessions, calls, &endpoint, &echo, config).await {
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
    echo.stop().await;
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
    echo: &Echo,
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
    let display = |side: &str| Display::round(side, config.progress);
    let tools = ToolSet {
        specs: load_tools(sleep),
        workspace: None,
        policy: None,
        journal: None,
    };
    let mut best_echo: Option<EchoPhase> = None;
    let body = Arc::new(turn_body(calls));
    let rounds = alternate(
        config.rounds,
        async || {
            engine_phase(
                tools.clone(),
                config.workers,
                sessions,
                &workload,
                &bounds,
                &display("in-process"),
                config.warmup,
            )
            .await
        },
        // The echo floor is measured in every round, after the HTTP phase.
        async || {
            let http = http_phase(
                Arc::clone(endpoint),
                sessions,
                &workload,
                &bounds,
                &display("http"),
                config.warmup,
            )
            .await?;
            let floor = echo.measure(sessions, &body, &bounds).await?;
            keep_best(&mut best_echo, floor, EchoPhase::per_s);
            Ok(http)
        },
        Phase::calls_per_s,
    )
    .await?;
    let (local, http) = (rounds.a, rounds.b);
    let (l, h) = (
        Percentiles::of(&local.stats.turn_latency),
        Percentiles::of(&http.stats.turn_latency),
    );
    let e = best_echo.as_ref().map(|e| Percentiles::of(&e.latency));
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
        "http_echo_turn_p50_us": e.map(|e| round_to(e.p50, 1)),
        "http_echo_turn_p99_us": e.map(|e| round_to(e.p99, 1)),
        "http_over_echo_p50": e.map(|e| round_to(ratio(h.p50, e.p50), 2)),
        "http_errors": errors,
    })
    .to_string();
    Ok((line, rounds.violations))
}

/// A turn of `calls` no-op calls as the HTTP phase sends it (an Anthropic assistant message):
/// the echo's body.
fn turn_body(calls: usize) -> Vec<u8> {
    let content: Vec<serde_json::Value> = (0..calls)
        .map(|i| {
            json!({
                "type": "tool_use",
                "id": format!("toolu_load_{i:012}"),
                "name": "noop",
                "input": {"text": crate::testing::TEXT, "n": 0},
            })
        })
        .collect();
    json!({"role": "assistant", "content": content})
        .to_string()
        .into_bytes()
}
