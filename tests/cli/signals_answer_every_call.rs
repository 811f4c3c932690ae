//! SIGINT and SIGTERM never leave a call unanswered nor a command running: `dispatch` answers
//! every call of the turn in flight (`cancelled`, its processes killed), prints that answer and
//! exits 130 (SIGINT) or 143 (SIGTERM) — also when the signal comes in its first milliseconds,
//! before the turn was read. `run`, `chat`, `demo` and `load` stop the same way with the same
//! exit codes, and a `sleep 3; touch late.txt` they were running never writes `late.txt`.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::json;

use common::answers::{answers, turn};
use common::cli::BIN;

/// Bound on anything a test waits for.
const BOUND: Duration = Duration::from_secs(30);

const SLOW: &str = "touch started; sleep 3; touch late.txt";

fn spawn(args: &[&str], cwd: &Path) -> Child {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

fn signal(child: &Child, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    kill_process(pid, signal).expect("the process is there to signal");
}

/// Waits (bounded) until `check` holds, failing the test with `what` otherwise.
fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < BOUND, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// True once the process catches both SIGINT and SIGTERM (`SigCgt` in `/proc/PID/status`).
fn catches_int_and_term(child: &Child) -> bool {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let bit = |signal: u32| 1u64 << (signal - 1);
    mask & bit(2) != 0 && mask & bit(15) != 0
}

/// The command's own processes are gone: after the 3 s sleep would have ended, `late.txt` is
/// still missing.
fn assert_never_late(ws: &Path) {
    std::thread::sleep(Duration::from_millis(3_500));
    assert!(
        !ws.join("late.txt").exists(),
        "the command kept running after the engine answered"
    );
}

fn finish(child: Child) -> Output {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(BOUND)
        .expect("the process exits after the signal")
        .unwrap()
}

fn dispatch_a_slow_turn_and_signal(sig: Signal) -> (tempfile::TempDir, Output) {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "a").unwrap();
    let doc = turn(&[
        ("read_file", json!({"path": "a.txt"})),
        ("bash", json!({"command": SLOW})),
        ("read_file", json!({"path": "a.txt"})),
    ]);
    let mut child = spawn(
        &["dispatch", "--workspace", ws.path().to_str().unwrap()],
        ws.path(),
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(doc.to_string().as_bytes())
        .unwrap();
    wait_until("the command started", || ws.path().join("started").exists());
    signal(&child, sig);
    (ws, finish(child))
}

fn assert_slow_turn_answered(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers = answers(out);
    let ids: Vec<&str> = answers.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["c0", "c1", "c2"], "every call answered, in order");
    assert_eq!(answers[0].content, "a", "the read before ran");
    assert_eq!(answers[1].outcome(), "cancelled", "{answers:?}");
    assert_eq!(answers[2].outcome(), "cancelled", "{answers:?}");
}

#[test]
fn sigterm_during_dispatch_answers_every_call_kills_the_command_and_exits_143() {
    let (ws, out) = dispatch_a_slow_turn_and_signal(Signal::TERM);
    assert_slow_turn_answered(&out, 143);
    assert_never_late(ws.path());
}

#[test]
fn sigint_during_dispatch_answers_every_call_kills_the_command_and_exits_130() {
    let (ws, out) = dispatch_a_slow_turn_and_signal(Signal::INT);
    assert_slow_turn_answered(&out, 130);
    assert_never_late(ws.path());
}

#[test]
fn a_signal_as_soon_as_the_handlers_exist_still_answers_the_turn_already_sent() {
    for sig in [Signal::INT, Signal::TERM] {
        let ws = tempfile::tempdir().unwrap();
        let doc = turn(&[
            ("bash", json!({"command": "touch ran"})),
            ("glob", json!({"pattern": "*"})),
        ]);
        let mut child = spawn(
            &["dispatch", "--workspace", ws.path().to_str().unwrap()],
            ws.path(),
        );
        {
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(doc.to_string().as_bytes()).unwrap();
        }
        // The handlers are there before the input is read: poll for them and signal at once.
        wait_until("SIGINT and SIGTERM are caught", || {
            catches_int_and_term(&child)
        });
        signal(&child, sig);
        let out = finish(child);
        let code = if sig == Signal::INT { 130 } else { 143 };
        assert_eq!(
            out.status.code(),
            Some(code),
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answers = answers(&out);
        assert_eq!(answers.len(), 2, "{answers:?}");
        for a in &answers {
            assert!(
                a.outcome() == "cancelled" || !a.is_error,
                "cancelled or done: {a:?}"
            );
        }
    }
}

#[test]
fn a_signal_before_the_turn_is_complete_exits_without_running_anything() {
    let ws = tempfile::tempdir().unwrap();
    let mut child = spawn(
        &["dispatch", "--workspace", ws.path().to_str().unwrap()],
        ws.path(),
    );
    // Half a document, and stdin stays open.
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(br#"{"role":"assistant","content":[{"type":"tool_use","#)
        .unwrap();
    wait_until("SIGINT and SIGTERM are caught", || {
        catches_int_and_term(&child)
    });
    signal(&child, Signal::TERM);
    let out = finish(child);
    drop(stdin);
    assert_eq!(out.status.code(), Some(143));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
}

/// A script for `run --provider scripted`: one turn running [`SLOW`], then a final answer.
fn slow_script(dir: &Path) -> PathBuf {
    let script = json!([
        {"type": "message", "role": "assistant", "stop_reason": "tool_use", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": SLOW}}
        ]},
        {"type": "message", "role": "assistant", "stop_reason": "end_turn", "content": [
            {"type": "text", "text": "done"}
        ]}
    ]);
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    path
}

#[test]
fn sigterm_during_run_kills_the_command_and_exits_143() {
    let ws = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let script = slow_script(scripts.path());
    let child = spawn(
        &[
            "run",
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--workspace",
            ws.path().to_str().unwrap(),
            "--prompt",
            "go",
        ],
        ws.path(),
    );
    wait_until("the command started", || ws.path().join("started").exists());
    signal(&child, Signal::TERM);
    let out = finish(child);
    assert_eq!(
        out.status.code(),
        Some(143),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_never_late(ws.path());
}

#[test]
fn sigterm_during_chat_kills_the_command_and_exits_143() {
    let ws = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let script = slow_script(scripts.path());
    let mut child = spawn(
        &[
            "chat",
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--workspace",
            ws.path().to_str().unwrap(),
        ],
        ws.path(),
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    wait_until("the command started", || ws.path().join("started").exists());
    signal(&child, Signal::TERM);
    let out = finish(child);
    drop(stdin);
    assert_eq!(
        out.status.code(),
        Some(143),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_never_late(ws.path());
}

#[test]
fn sigterm_stops_demo_with_its_report_and_143() {
    let ws = tempfile::tempdir().unwrap();
    let child = spawn(
        &[
            "demo",
            "--sessions",
            "2",
            "--duration",
            "10m",
            "--workspace",
            ws.path().to_str().unwrap(),
        ],
        ws.path(),
    );
    // Rounds are under way once the first session's files exist.
    wait_until("the demo runs", || ws.path().join("s1/notes.md").exists());
    signal(&child, Signal::TERM);
    let out = finish(child);
    assert_eq!(
        out.status.code(),
        Some(143),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "the report is printed"
    );
}

#[test]
fn sigint_and_sigterm_stop_load() {
    for (sig, code) in [(Signal::INT, 130), (Signal::TERM, 143)] {
        let dir = tempfile::tempdir().unwrap();
        let child = spawn(
            &[
                "load",
                "--sessions",
                "2",
                "--tool",
                "noop",
                "--duration",
                "10m",
                "--quiet",
            ],
            dir.path(),
        );
        wait_until("SIGINT and SIGTERM are caught", || {
            catches_int_and_term(&child)
        });
        signal(&child, sig);
        let out = finish(child);
        assert_eq!(
            out.status.code(),
            Some(code),
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn sigterm_in_lines_mode_answers_the_turn_in_flight_and_exits_143() {
    let ws = tempfile::tempdir().unwrap();
    let first = turn(&[("bash", json!({"command": "echo one"}))]);
    let mut slow = turn(&[
        ("bash", json!({"command": SLOW})),
        ("glob", json!({"pattern": "*"})),
    ]);
    // Each turn's calls have ids of their own, as a model's do (one session answers an id it
    // has seen from its stored answers).
    for block in slow["content"].as_array_mut().unwrap() {
        block["id"] = json!(format!("slow-{}", block["id"].as_str().unwrap()));
    }
    let mut child = spawn(
        &[
            "dispatch",
            "--lines",
            "--workspace",
            ws.path().to_str().unwrap(),
        ],
        ws.path(),
    );
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{first}\n{slow}").unwrap();
    wait_until("the command started", || ws.path().join("started").exists());
    signal(&child, Signal::TERM);
    let out = finish(child);
    drop(stdin);
    assert_eq!(out.status.code(), Some(143));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "both turns answered: {text}");
    let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    let outcomes: Vec<bool> = second["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            b["content"]
                .as_str()
                .unwrap()
                .starts_with("Error [cancelled]")
        })
        .collect();
    assert_eq!(outcomes, [true, true], "{second}");
    assert_never_late(ws.path());
}

#[test]
fn sigint_at_the_chat_prompt_exits_130() {
    let ws = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let script = slow_script(scripts.path());
    let mut child = spawn(
        &[
            "chat",
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--workspace",
            ws.path().to_str().unwrap(),
        ],
        ws.path(),
    );
    // Nothing typed: the chat waits at its prompt, stdin open.
    let stdin = child.stdin.take().unwrap();
    wait_until("SIGINT and SIGTERM are caught", || {
        catches_int_and_term(&child)
    });
    signal(&child, Signal::INT);
    let out = finish(child);
    drop(stdin);
    assert_eq!(out.status.code(), Some(130));
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
}
