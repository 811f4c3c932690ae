//! The figure (a benchmark, not a test; ignored by default): per-call overhead of an MCP call
//! through Switchboard versus the same call made directly with the rmcp client in the same
//! process — `server-everything`'s `echo` over stdio, one call at a time, median and p99.
//!
//! ```sh
//! SWITCHBOARD_MCP_TEST_DIR=target/mcp-test-deps \
//!   cargo test --release --test mcp -- --ignored --nocapture mcp_overhead_figure::
//! ```
//!
//! Each side talks to its own server-everything process. Rounds alternate (direct, engine, …) so
//! machine noise hits both; the first round of each side is a warm-up and not counted.

use crate::common;

use std::time::{Duration, Instant};

use common::mcp::*;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::json;
use switchboard::mcp::ServerSpec;

const ROUNDS: usize = 6;
const CALLS_PER_ROUND: usize = 500;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run it with --ignored --nocapture (release build)"]
async fn mcp_call_overhead_through_switchboard_versus_direct_rmcp() {
    let Some(dir) = test_dir("MCP overhead figure") else {
        return;
    };
    let entry = node_entry(&dir, "server-everything");

    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&entry)
        .arg("stdio")
        .stderr(std::process::Stdio::null());
    let direct = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let engine = engine_with(vec![(
        "everything",
        ServerSpec::stdio("node", [entry.display().to_string(), "stdio".to_string()]),
    )])
    .await;

    let args = json!({"message": "hi"});
    let (mut direct_times, mut engine_times) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let count = round > 0;
        for _ in 0..CALLS_PER_ROUND {
            let params = CallToolRequestParams::new("echo")
                .with_arguments(args.as_object().unwrap().clone());
            let t = Instant::now();
            let r = direct.peer().call_tool(params).await.unwrap();
            let elapsed = t.elapsed();
            assert_ne!(r.is_error, Some(true));
            if count {
                direct_times.push(elapsed);
            }
        }
        for i in 0..CALLS_PER_ROUND {
            let t = Instant::now();
            let r = engine
                .dispatch(vec![call(
                    &format!("c{i}"),
                    "mcp__everything__echo",
                    args.clone(),
                )])
                .await
                .expect("engine available");
            let elapsed = t.elapsed();
            assert_eq!(r[0].content, "Echo: hi");
            if count {
                engine_times.push(elapsed);
            }
        }
    }
    direct_times.sort();
    engine_times.sort();
    let (d50, d99) = (
        percentile(&direct_times, 0.5),
        percentile(&direct_times, 0.99),
    );
    let (e50, e99) = (
        percentile(&engine_times, 0.5),
        percentile(&engine_times, 0.99),
    );
    println!(
        "server-everything echo over stdio, {} calls per side, one at a time",
        direct_times.len()
    );
    println!("| path | median µs | p99 µs |");
    println!("| --- | ---: | ---: |");
    println!(
        "| direct rmcp client | {:.0} | {:.0} |",
        micros(d50),
        micros(d99)
    );
    println!(
        "| through Switchboard | {:.0} | {:.0} |",
        micros(e50),
        micros(e99)
    );
    println!(
        "| overhead | {:+.0} | {:+.0} |",
        micros(e50) - micros(d50),
        micros(e99) - micros(d99)
    );
    engine.shutdown(Duration::from_secs(2)).await;
    let _ = direct.cancel().await;
}
