//! The audit log holds one parseable line per call after 64 sessions ran at once — also for calls
//! refused before the policy saw them (unknown tool, invalid arguments, duplicate ids) — a log
//! whose reader never reads (a FIFO) drops and counts lines instead of holding calls back, lines a
//! full disk refuses are counted (a 64 KiB tmpfs: every line is written or counted, and the loss
//! is said once, at error level), a log rotated while 64 sessions write loses no line and a
//! deleted one is created again, and the CLI reopens a rotated log on SIGHUP instead of dying.

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

#[tokio::test]
async fn calls_refused_before_the_policy_still_get_one_audit_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path, false).unwrap();
    let engine = engine(&log);
    let first = engine
        .dispatch(vec![
            call("ok", "echo", json!({"text": "x"})),
            call("nope", "no_such_tool", json!({})),
            call("bad", "echo", json!({"text": 3})),
            call("", "echo", json!({"text": "x"})),
        ])
        .await
        .unwrap();
    assert_eq!(
        common::outcomes(&first),
        [
            "ok",
            "unknown_tool",
            "invalid_arguments",
            "invalid_arguments"
        ]
    );
    let dup = engine
        .dispatch(vec![
            call("d", "echo", json!({"text": "x"})),
            call("d", "echo", json!({"text": "y"})),
        ])
        .await
        .unwrap();
    assert_eq!(
        common::outcomes(&dup),
        ["invalid_arguments", "invalid_arguments"]
    );
    engine.shutdown(Duration::from_secs(5)).await;
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(&str, &str, &str, &str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["tool_use_id"].as_str().unwrap(),
                l["tool"].as_str().unwrap(),
                l["decision"].as_str().unwrap(),
                l["by"].as_str().unwrap(),
                l["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("nope", "no_such_tool", "none", "admission", "unknown_tool"),
            ("bad", "echo", "none", "admission", "invalid_arguments"),
            ("", "echo", "none", "admission", "invalid_arguments"),
            ("ok", "echo", "allow", "default", "ok"),
            ("d", "echo", "none", "admission", "invalid_arguments"),
            ("d", "echo", "none", "admission", "invalid_arguments"),
        ]
    );
    for l in &lines {
        assert_eq!(l["args_sha256"].as_str().unwrap().len(), 64);
    }
}

#[tokio::test]
async fn lines_a_full_disk_refuses_are_counted_in_the_dropped_total() {
    // /dev/full refuses every write with ENOSPC, as a full disk does.
    let log = AuditLog::open(std::path::Path::new("/dev/full"), false).unwrap();
    let engine = engine(&log);
    let results = engine
        .dispatch(
            (0..10)
                .map(|i| call(&format!("t{i}"), "echo", json!({"text": "x"})))
                .collect(),
        )
        .await
        .unwrap();
    assert_eq!(results.len(), 10);
    engine.shutdown(Duration::from_secs(5)).await;
    assert_eq!(log.dropped(), 10, "every lost line is counted");
}

#[test]
fn sighup_reopens_a_rotated_audit_log_and_does_not_end_the_command() {
    use std::io::Write;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut child = common::cli::switchboard()
        .args(["dispatch", "--sandbox", "best-effort", "--workspace"])
        .arg(&ws)
        .arg("--audit-log")
        .arg(&audit)
        .current_dir(&ws)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log is opened after SIGHUP is caught: once it exists, the signal is safe to send.
    let waited = std::time::Instant::now();
    while !audit.exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the log was never opened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rotated = dir.path().join("audit.jsonl.1");
    std::fs::rename(&audit, &rotated).unwrap();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let turn = r#"{"role": "assistant", "content": [{"type": "tool_use", "id": "g1", "name": "glob", "input": {"pattern": "*"}}]}"#;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(turn.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", common::cli::describe(&out));
    assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "");
    let text = std::fs::read_to_string(&audit).expect("the log was opened again");
    let line: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["tool_use_id"], "g1");
}

/// The `tool_use_id`s of the audit lines in `path` (none when it does not exist).
fn audit_ids(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).expect("every line is JSON");
            line["tool_use_id"].as_str().unwrap().to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_rotated_while_64_sessions_write_loses_no_line_and_a_deleted_one_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path, false).unwrap();
    let engine = engine(&log);
    // Rotated as logrotate does without copytruncate: renamed away, the path left to the writer.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rotator = {
        let (done, path, dir) = (done.clone(), path.clone(), dir.path().to_path_buf());
        std::thread::spawn(move || {
            let mut rotated = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(15));
                let to = dir.join(format!("audit.jsonl.{}", rotated.len() + 1));
                if std::fs::rename(&path, &to).is_ok() {
                    rotated.push(to);
                }
            }
            rotated
        })
    };
    run_sessions(&engine).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let rotated = rotator.join().unwrap();
    let last = engine
        .dispatch(vec![call("after-rotation", "echo", json!({"text": "x"}))])
        .await
        .unwrap();
    assert!(last[0].is_ok());
    log.flush(Duration::from_secs(10));
    assert!(
        rotated.len() >= 2,
        "the log was rotated while lines were written: {rotated:?}"
    );
    let mut seen: Vec<String> = rotated.iter().flat_map(|p| audit_ids(p)).collect();
    let current = audit_ids(&path);
    assert_eq!(
        current.last().map(String::as_str),
        Some("after-rotation"),
        "new lines land in a new file at the path"
    );
    seen.extend(current);
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no line written twice");
    assert_eq!(seen.len(), SESSIONS * TURNS * CALLS + 1, "no line lost");
    assert_eq!(log.dropped(), 0);

    // Deleted: the next line creates it again.
    std::fs::remove_file(&path).unwrap();
    engine
        .dispatch(vec![call("after-deletion", "echo", json!({"text": "x"}))])
        .await
        .unwrap();
    engine.shutdown(Duration::from_secs(5)).await;
    assert_eq!(audit_ids(&path), ["after-deletion"]);
    assert_eq!(log.dropped(), 0);
}

/// The value of a series in a Prometheus exposition.
fn series(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

#[test]
fn a_full_disk_loses_lines_counted_one_by_one_and_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mounted) = common::tmpfs::small_tmpfs(dir.path(), "64k") else {
        return;
    };
    let small = mounted.path().to_path_buf();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let audit = small.join("audit.jsonl");
    let metrics = dir.path().join("metrics.txt");
    // About 230 bytes a line: 600 lines are twice what 64 KiB hold.
    const N: usize = 600;
    let calls: Vec<Value> = (0..N)
        .map(|i| {
            json!({"type": "tool_use", "id": format!("g{i}"), "name": "glob",
                   "input": {"pattern": format!("*.{i}")}})
        })
        .collect();
    let turn = json!({"role": "assistant", "content": calls}).to_string();
    let mut cmd = common::cli::switchboard();
    cmd.args(["dispatch", "--sandbox", "best-effort", "--workspace"])
        .arg(&ws)
        .arg("--audit-log")
        .arg(&audit)
        .arg("--metrics-file")
        .arg(&metrics)
        .current_dir(&ws)
        .env_remove("RUST_LOG");
    let out = common::cli::fed(cmd, turn.as_bytes());
    assert!(out.status.success(), "{}", common::cli::describe(&out));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["content"].as_array().unwrap().len(), N);

    // Whole lines only: the last write may have stopped inside a line, which counts as lost.
    let text = std::fs::read(&audit).unwrap();
    let whole = text
        .split_inclusive(|b| *b == b'\n')
        .filter(|l| l.ends_with(b"\n") && serde_json::from_slice::<Value>(l).is_ok());
    let written = whole.count();
    let exposition = std::fs::read_to_string(&metrics).unwrap();
    let failed = series(
        &exposition,
        "switchboard_audit_dropped_total{reason=\"write_failed\"}",
    )
    .unwrap_or_else(|| panic!("no write_failed series:\n{exposition}"));
    let full = series(
        &exposition,
        "switchboard_audit_dropped_total{reason=\"buffer_full\"}",
    )
    .unwrap_or_else(|| panic!("no buffer_full series:\n{exposition}"));
    assert!(failed > 0.0, "the disk filled up: {written} lines written");
    assert_eq!(
        written + failed as usize + full as usize,
        N,
        "every line is written or counted as lost"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("audit log"))
        .collect();
    assert_eq!(errors.len(), 1, "said once, at error level:\n{stderr}");
    assert!(
        errors[0].contains("No space left on device"),
        "{}",
        errors[0]
    );
}
