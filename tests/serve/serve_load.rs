//! `switchboard load` over HTTP: `--target` against a server on 127.0.0.1:0 (every call answered
//! once, in order, through the server), and `--workload-set serve` (both sides measured).

use crate::serve_common;

use std::process::Command;

use serde_json::Value;
use serve_common::*;

fn load() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.arg("load")
        .arg("--quiet")
        .env_remove("SWITCHBOARD_TOKEN");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_target_drives_a_running_server_with_every_call_answered_in_order() {
    let s = start(|c| c.load_tools = true).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut cmd = load();
    cmd.args([
        "--sessions",
        "4",
        "--turns",
        "25",
        "--calls-per-turn",
        "8",
        "--json",
    ])
    .args([
        "--tool",
        "mixed",
        "--error-rate",
        "0.1",
        "--serial-ratio",
        "0.3",
    ])
    .args(["--target", &s.base, "--token-file"])
    .arg(&token_file);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["calls"], 4 * 25 * 8);
    assert_eq!(doc["violations"], 0);
    assert_eq!(doc["config"]["target"], s.base.as_str());
    let errors = &doc["engine"]["errors"];
    assert!(errors["unknown_tool"].as_u64().unwrap() > 0, "{errors}");
    assert!(
        errors["invalid_arguments"].as_u64().unwrap() > 0,
        "{errors}"
    );
    assert_eq!(errors["execution_error"], 0, "{errors}");
    assert_eq!(errors["overloaded"], 0, "{errors}");

    // Without the token every turn is refused, and the run says so.
    let mut cmd = load();
    cmd.args(["--sessions", "1", "--turns", "1", "--target", &s.base]);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    s.shutdown().await.unwrap();
}

#[test]
fn load_target_refuses_what_a_server_cannot_run() {
    let out = load()
        .args(["--tool", "builtin", "--target", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tool builtin"));
    let out = load()
        .args(["--target", "https://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_serve_workload_set_measures_both_sides() {
    let out = load()
        .args(["--workload-set", "serve", "--turns", "20"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["single_call_noop", "sessions64_batch8_noop"]);
    for l in &lines {
        assert!(l["in_process_calls_per_s"].as_u64().unwrap() > 0, "{l}");
        assert!(l["http_calls_per_s"].as_u64().unwrap() > 0, "{l}");
        assert!(l["http_turn_p99_us"].as_f64().unwrap() > 0.0, "{l}");
        assert_eq!(l["http_errors"], 0, "{l}");
        // The hop's floor, measured beside it: a bare echo of the same turn's bytes.
        let echo = l["http_echo_turn_p50_us"].as_f64().unwrap();
        assert!(echo > 0.0, "{l}");
        assert!(l["http_echo_turn_p99_us"].as_f64().unwrap() >= echo, "{l}");
        assert!(l["http_over_echo_p50"].as_f64().unwrap() > 0.0, "{l}");
    }
}
