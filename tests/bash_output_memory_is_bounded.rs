//! Capturing a command's output holds at most the output cap in memory, however much it prints.
//! Alone in its own test binary, so no other test's allocations move the peak it measures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard::Workspace;
use switchboard::tool::{Handler, SessionScope, ToolContext};
use switchboard::tools::bash;
use tokio_util::sync::CancellationToken;

/// Peak resident memory of this process (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_hundreds_of_megabytes_does_not_grow_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path()).unwrap();
    let spec = bash::spec();
    let Handler::Async(f) = &spec.handler else {
        panic!("bash is async")
    };
    let ctx = ToolContext::new(
        "memory",
        "bash",
        Arc::new(SessionScope::new("memory", Some(ws))),
        Instant::now() + Duration::from_secs(60),
        CancellationToken::new(),
    );
    let args = json!({"command": "head -c 300000000 /dev/zero | tr '\\0' z"});
    let before = peak_rss_kib();
    let out = tokio::time::timeout(Duration::from_secs(30), f(args, ctx))
        .await
        .expect("the flood finished")
        .unwrap();
    let grown_mib = (peak_rss_kib().saturating_sub(before)) / 1024;
    assert!(out.len() <= 50_000);
    let (_, rest) = out.split_once("\n… ").expect("a truncation marker");
    let dropped: u64 = rest.split(' ').next().unwrap().parse().unwrap();
    assert!(dropped > 299_000_000, "{dropped}");
    assert!(
        grown_mib < 100,
        "capturing 300 MB raised peak memory by {grown_mib} MiB"
    );
}
