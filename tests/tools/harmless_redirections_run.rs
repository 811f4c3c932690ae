//! `> /dev/null` and its relatives run: the seed's `> /dev/` entry refused every one of them,
//! though models write them constantly. Redirections to other device nodes stay refused
//! (`permission_denied`) and run nothing.

use crate::common;

use serde_json::json;

use common::answers::dispatch;

#[test]
fn redirections_to_dev_null_stdout_and_stderr_run() {
    let ws = tempfile::tempdir().unwrap();
    let commands = [
        "echo hidden > /dev/null; echo a",
        "echo hidden >/dev/null; echo b",
        "ls missing 2>/dev/null; echo c",
        "echo hidden &>/dev/null; echo d",
        "echo hidden >> /dev/null; echo e",
        "echo f > /dev/stdout",
        "echo g >/dev/stderr",
    ];
    let calls: Vec<(&str, serde_json::Value)> = commands
        .iter()
        .map(|c| ("bash", json!({ "command": c })))
        .collect();
    let answers = dispatch(ws.path(), &calls);
    let contents: Vec<&str> = answers.iter().map(|a| a.content.as_str()).collect();
    assert_eq!(contents, ["a", "b", "c", "d", "e", "f", "g"], "{answers:?}");
}

#[test]
fn redirections_to_other_devices_are_refused_and_run_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let answers = dispatch(
        ws.path(),
        &[
            ("bash", json!({"command": "touch ran1; echo x > /dev/full"})),
            ("bash", json!({"command": "touch ran2; echo x >/dev/full"})),
            (
                "bash",
                json!({"command": "touch ran3; echo x > /dev/null2"}),
            ),
            ("bash", json!({"command": "echo still serving"})),
        ],
    );
    for a in &answers[..3] {
        assert_eq!(a.outcome(), "permission_denied", "{a:?}");
    }
    assert_eq!(answers[3].content, "still serving");
    for name in ["ran1", "ran2", "ran3"] {
        assert!(!ws.path().join(name).exists(), "{name}: nothing ran");
    }
}
