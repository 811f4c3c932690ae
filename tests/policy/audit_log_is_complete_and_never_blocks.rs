//! The audit log holds one parseable line per call after 64 sessions ran at once, and a log whose
//! reader never reads (a FIFO) drops and counts lines instead of holding calls back.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::call;
use serde_json::{Value, json};
use switchboard::policy::{AuditLog, Policy};
use switchboard::{Engine, ToolCall};

const SESSIONS: usize = 64;
const TURNS: usize = 4;
const CALLS: usize = 8;

fn turn_calls(s: usize, t: usize) -> Vec<ToolCall> {
    (0..CALLS)
        .map(|c| {
            let name = if c == 5 { "denied" } else { "echo" };
            call(
                &format!("s{s}t{t}c{c}"),
                name,
                json!({"text": format!("{s}-{t}-{c}")}),
            )
        })
        .collect()
}

async fn run_sessions(engine: &Engine) {
    let runs = (0..SESSIONS).map(|s| {
        let session = engine.session();
        async move {
            for t in 0..TURNS {
                let results = session.dispatch(turn_calls(s, t)).await.unwrap();
                assert_eq!(results.len(), CALLS);
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(runs))
        .await
        .expect("every session finished");
}

/// An engine with `echo` and `denied` (denied by a rule) that audits into `log`.
fn engine(log: &AuditLog) -> Engine {
    let policy =
        Policy::from_json(&json!({"permissions": {"deny": ["denied"], "default": "allow"}}))
            .unwrap();
    Engine::builder()
        .tool(common::echo_tool("echo"))
        .tool(common::echo_tool("denied"))
        .policy(policy.audit(log.clone()))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_64_sessions_has_one_parseable_audit_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path, false).unwrap();
    let engine = engine(&log);
    run_sessions(&engine).await;
    engine.shutdown(Duration::from_secs(5)).await;
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert_eq!(lines.len(), SESSIONS * TURNS * CALLS);
    assert_eq!(log.dropped(), 0);
    let ids: HashSet<&str> = lines
        .iter()
        .map(|l| l["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), lines.len(), "one line per call");
    for l in &lines {
        let denied = l["tool"] == "denied";
        assert_eq!(l["decision"], if denied { "deny" } else { "allow" });
        assert_eq!(
            l["outcome"],
            if denied { "permission_denied" } else { "ok" }
        );
        assert_eq!(l["by"], if denied { "rule:denied" } else { "default" });
        assert_eq!(l["args_sha256"].as_str().unwrap().len(), 64);
        assert!(l.get("args").is_none(), "arguments only with --audit-args");
        assert!(l["session"].as_str().unwrap().starts_with('s'));
        assert!(l["time"].as_str().unwrap().ends_with('Z'));
        assert!(l["duration_ms"].as_f64().unwrap() >= 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_nobody_reads_drops_and_counts_lines_but_never_holds_a_call() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("audit.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // Opened read-write: no reader needed to open it; the pipe fills after 64 KiB.
    let log = AuditLog::open_with(&fifo, true, 16).unwrap();
    let engine = engine(&log);
    run_sessions(&engine).await;
    assert!(log.dropped() > 0, "a full pipe must drop lines");
    assert!(log.dropped() < (SESSIONS * TURNS * CALLS) as u64);
}
