//! `switchboard run` end to end through the built binary, offline (`--provider scripted`).

use crate::common;

use common::cli::switchboard;
use serde_json::{Value, json};

fn script(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("script.json");
    let turns = json!([
        {"content": [
            {"type": "text", "text": "writing"},
            {"type": "tool_use", "id": "t1", "name": "write_file", "input": {"path": "a.txt", "content": "hello"}},
            {"type": "tool_use", "id": "t2", "name": "read_file", "input": {"path": "a.txt"}},
            {"type": "tool_use", "id": "t3", "name": "nope", "input": {}}
        ], "stop_reason": "tool_use"},
        {"content": [{"type": "text", "text": "All done."}], "stop_reason": "end_turn"}
    ]);
    std::fs::write(&path, turns.to_string()).unwrap();
    path
}

/// `switchboard run --provider scripted` on a fresh workspace, plus `extra` flags; returns the
/// output and the workspace (kept alive for the caller to inspect).
fn scripted_run(extra: &[&str]) -> (std::process::Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let out = switchboard()
        .args(["run", "--provider", "scripted", "--prompt", "do it"])
        .args(extra)
        .arg("--workspace")
        .arg(ws.path())
        .arg("--script")
        .arg(script(dir.path()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, ws)
}

#[test]
fn a_scripted_run_prints_the_final_text_and_the_stop_reason() {
    let (out, ws) = scripted_run(&[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("All done."), "{stdout}");
    assert!(stdout.contains("final_answer"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "hello"
    );
}

#[test]
fn run_json_reports_turns_calls_and_each_dispatch_in_order() {
    let (out, _ws) = scripted_run(&["--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["stop_reason"], "final_answer");
    assert_eq!(doc["turns"], 2);
    assert_eq!(doc["tool_calls"], 3);
    assert_eq!(doc["final_text"], "All done.");
    let results = doc["dispatches"][0]["results"].as_array().unwrap();
    let ids: Vec<&str> = results
        .iter()
        .map(|r| r["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t1", "t2", "t3"]);
    assert_eq!(results[2]["outcome"], "unknown_tool");
}

#[test]
fn a_missing_api_key_is_one_line_and_exit_2() {
    let out = switchboard()
        .args(["run", "--provider", "anthropic", "--prompt", "hi"])
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("ANTHROPIC_API_KEY"), "{stderr}");
    assert!(out.stdout.is_empty());
}
