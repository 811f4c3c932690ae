//! External hooks are held like bash's commands: a process a hook leaves behind (`setsid`) dies
//! with the hook; a persistent hook that stops reading its input gets a bounded queue, and calls
//! that find it full are answered at once by the hook's failure rule (denied before the call);
//! and a hook is named by a label, never by its command line, which may hold a credential.

use crate::common;

use std::time::{Duration, Instant};

use common::call;
use serde_json::{Value, json};
use switchboard::policy::{AuditLog, Policy};
use switchboard::{Engine, ErrorCode, ToolCall, ToolDispatchResult};

fn engine(policy: Value) -> Engine {
    Engine::builder()
        .tool(common::echo_tool("echo"))
        .policy(Policy::from_json(&policy).unwrap())
        .build()
        .unwrap()
}

async fn turn(engine: &Engine, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
    tokio::time::timeout(Duration::from_secs(60), engine.dispatch(calls))
        .await
        .expect("answered within the bound")
        .unwrap()
}

/// Pids of processes whose command line holds `marker`.
fn running(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[tokio::test]
async fn a_process_a_hook_leaves_behind_with_setsid_dies_with_the_hook() {
    // A sleep whose length no other process on the machine has: its marker.
    let marker = format!(
        "3599.{}{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() % 1000
    );
    let command = format!("setsid sleep {marker} < /dev/null > /dev/null 2>&1 & sleep 0.2; exit 0");
    let e = engine(json!({"hooks": {"PreToolUse": [{"matcher": "echo",
        "hooks": [{"type": "command", "command": command, "timeout": 10}]}]}}));
    let results = turn(&e, vec![call("a", "echo", json!({"text": "hi"}))]).await;
    assert_eq!(results[0].content, "echo:hi");
    // Left alone, the sleep would run for an hour; the hook's end must take it down.
    let waited = Instant::now();
    loop {
        let left = running(&marker);
        if left.is_empty() {
            break;
        }
        if waited.elapsed() > Duration::from_secs(20) {
            for pid in &left {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
            }
            panic!("the hook's setsid child {left:?} outlived the call");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_persistent_hook_that_stops_reading_gets_a_bounded_queue_and_calls_past_it_are_denied() {
    // The hook never reads its input: requests pile up in front of it.
    let e = engine(json!({"hooks": {"PreToolUse": [{"matcher": "echo",
        "hooks": [{"type": "persistent", "command": "exec sleep 3600", "timeout": 3}]}]}}));
    let big = "x".repeat(512 * 1024);
    let calls = (0..40)
        .map(|i| call(&format!("c{i}"), "echo", json!({"text": big})))
        .collect();
    let results = turn(&e, calls).await;
    assert_eq!(results.len(), 40);
    let mut refused = 0;
    for r in &results {
        // Fail closed: every call is denied, none ran.
        assert_eq!(
            r.error,
            Some(ErrorCode::PermissionDenied),
            "{}",
            &r.content[..200.min(r.content.len())]
        );
        if r.content.contains("is not reading its input") {
            refused += 1;
        }
    }
    // 8 MiB of queue holds 16 of these requests (and the pipe a little more): the rest are
    // refused at once instead of growing the engine's memory.
    assert!(
        refused >= 20,
        "only {refused} calls were refused at the bound"
    );
}

#[tokio::test]
async fn a_hook_is_named_by_its_label_never_by_its_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let secret = "sk-live-hunter2";
    let policy = json!({"hooks": {"PreToolUse": [{"matcher": "echo", "hooks": [
        {"type": "command", "command": format!("API_KEY={secret} false")},
        {"type": "command", "name": "guard", "command": format!("API_KEY={secret} true")}
    ]}]}});
    let log = AuditLog::open(&audit, false).unwrap();
    let e = Engine::builder()
        .tool(common::echo_tool("echo"))
        .policy(Policy::from_json(&policy).unwrap().audit(log))
        .build()
        .unwrap();
    let results = turn(&e, vec![call("a", "echo", json!({"text": "hi"}))]).await;
    assert_eq!(
        results[0].content,
        "Error [permission_denied]: denied by hook:PreToolUse[0].hooks[0]: \
         hook:PreToolUse[0].hooks[0] failed with exit code 1 (fail closed)"
    );
    e.shutdown(Duration::from_secs(5)).await;
    let line = std::fs::read_to_string(&audit).unwrap();
    assert!(
        line.contains("\"by\":\"hook:PreToolUse[0].hooks[0]\""),
        "{line}"
    );
    assert!(!line.contains(secret) && !results[0].content.contains(secret));
    let named = Policy::from_json(&policy).unwrap();
    assert_eq!(&*named.external_hooks().pre[1].label, "hook:guard");
    assert!(!format!("{named:?} {:?}", named.external_hooks()).contains(secret));
}
