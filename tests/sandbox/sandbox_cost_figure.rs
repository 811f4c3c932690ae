//! The README's figure (a benchmark, not a test; ignored by default): wall time of
//! `bash {"command":"true"}` through the engine with `--sandbox off` versus `workspace-write`,
//! interleaved in one run so both see the same machine.
//!
//! `cargo test --release --test sandbox -- --ignored --nocapture sandbox_cost_figure::`

use crate::common;

use std::time::{Duration, Instant};

use common::sandbox::*;
use switchboard::sandbox::SandboxMode;

const CALLS: usize = 300;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
async fn bash_true_with_and_without_the_sandbox() {
    let (_dir, ws) = temp_workspace();
    // The third row shows what the network namespace costs.
    let modes = [
        ("off", config(SandboxMode::Off)),
        ("workspace-write", config(SandboxMode::WorkspaceWrite)),
        (
            "workspace-write --allow-network",
            config(SandboxMode::WorkspaceWrite).allow_network(true),
        ),
    ];
    let mut sessions = Vec::new();
    for (_, config) in &modes {
        let Some(engine) = engine(Some(&ws), config.clone()) else {
            return;
        };
        sessions.push(engine.session());
    }
    // Warm up both (the launcher probe, page cache).
    for s in &sessions {
        for _ in 0..10 {
            ok_text(&bash(s, "true").await);
        }
    }
    let mut times = vec![Vec::with_capacity(CALLS); modes.len()];
    for _ in 0..CALLS {
        for (i, s) in sessions.iter().enumerate() {
            let started = Instant::now();
            let r = bash(s, "true").await;
            times[i].push(started.elapsed());
            ok_text(&r);
        }
    }
    println!(
        "bash {{\"command\":\"true\"}} through the engine, {CALLS} calls per mode, interleaved"
    );
    println!("| mode | median | p99 |");
    println!("| --- | ---: | ---: |");
    for ((mode, _), t) in modes.iter().zip(&mut times) {
        t.sort();
        println!(
            "| {mode} | {:.2} ms | {:.2} ms |",
            percentile(t, 0.5).as_secs_f64() * 1e3,
            percentile(t, 0.99).as_secs_f64() * 1e3
        );
    }
}
