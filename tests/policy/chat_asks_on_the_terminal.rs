//! `chat` answers an `ask` rule on the terminal: the real binary, a scripted model that writes a
//! file the policy asks about, and its stdin answering the question `y` or `n`. The question is
//! on stderr, the answer decides whether the file is written, and the audit log says who decided.

use crate::common;

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use common::cli::run;

/// Runs `chat` in a fresh workspace: prompt `go`, then `answer` to the approval question, then an
/// empty line (quit). Returns the output, the workspace and the audit lines.
fn chat_answering(answer: &str) -> (Output, tempfile::TempDir, Vec<Value>) {
    let ws = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let script = files.path().join("script.json");
    std::fs::write(
        &script,
        json!([
            {"type": "message", "role": "assistant", "stop_reason": "tool_use", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "write_file",
                 "input": {"path": "src/main.rs", "content": "fn main() {}\n"}}
            ]},
            {"type": "message", "role": "assistant", "stop_reason": "end_turn", "content": [
                {"type": "text", "text": "done"}
            ]}
        ])
        .to_string(),
    )
    .unwrap();
    let policy = files.path().join("policy.json");
    std::fs::write(
        &policy,
        json!({"permissions": {"ask": ["write_file(src/**)"], "default": "allow"}}).to_string(),
    )
    .unwrap();
    let audit = files.path().join("audit.jsonl");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    let out = run(
        ws.path(),
        &[
            "chat",
            "--provider",
            "scripted",
            "--script",
            &p(&script),
            "--workspace",
            &p(ws.path()),
            "--policy",
            &p(&policy),
            "--audit-log",
            &p(&audit),
            "--approval-timeout",
            "20s",
        ],
        &format!("go\n{answer}\n\n"),
    );
    let lines = std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit lines are JSON"))
        .collect();
    (out, ws, lines)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn yes_at_the_terminal_runs_the_call() {
    let (out, ws, audit) = chat_answering("y");
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("allow write_file src/main.rs? (rule \"write_file(src/**)\") [y/N]"),
        "the question is asked on stderr: {}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0]["decision"], "approved");
    assert_eq!(audit[0]["by"], "approver");
    assert_eq!(audit[0]["outcome"], "ok");
}

#[test]
fn no_at_the_terminal_denies_the_call() {
    let (out, ws, audit) = chat_answering("n");
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains("[y/N]"), "{}", stderr(&out));
    assert!(
        !ws.path().join("src/main.rs").exists(),
        "nothing was written"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0]["decision"], "refused");
    assert_eq!(audit[0]["by"], "approver");
    assert_eq!(audit[0]["outcome"], "permission_denied");
}
