//! Running the built `switchboard` binary and reading what it printed: a command for it, a run
//! with stdin fed and output captured (synchronous, or on tokio and bounded), and stdout read
//! as JSON.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// The binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// A command for the binary (nothing else set).
pub fn switchboard() -> Command {
    Command::new(BIN)
}

/// Runs the binary with `args` in `cwd` (no `RUST_LOG`), feeding `stdin`, and waits for it.
pub fn run(cwd: &Path, args: &[&str], stdin: &str) -> Output {
    let mut cmd = switchboard();
    cmd.args(args).current_dir(cwd).env_remove("RUST_LOG");
    fed(cmd, stdin.as_bytes())
}

/// Runs `cmd` with `stdin` written to it (stdout and stderr captured) and waits for it.
pub fn fed(mut cmd: Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    {
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin).unwrap();
    }
    child.wait_with_output().expect("the command finishes")
}

/// `switchboard dispatch --workspace <ws> <extra…>` in `ws`, fed `stdin`.
pub fn dispatch(ws: &Path, extra: &[&str], stdin: &str) -> Output {
    let ws = ws.to_str().unwrap();
    let mut args = vec!["dispatch", "--workspace", ws];
    args.extend_from_slice(extra);
    run(Path::new(ws), &args, stdin)
}

/// `switchboard dispatch --workspace <ws> <extra…>` on tokio, fed `stdin` while it runs (so a
/// large input cannot deadlock on a full pipe); fails the test if it outlives `bound` (the child
/// is then killed).
pub async fn dispatch_bounded(
    ws: &Path,
    extra: &[&str],
    stdin: Vec<u8>,
    bound: Duration,
) -> Output {
    let mut child = tokio::process::Command::new(BIN)
        .arg("dispatch")
        .arg("--workspace")
        .arg(ws)
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        let _ = input.write_all(&stdin).await;
    });
    let out = tokio::time::timeout(bound, child.wait_with_output())
        .await
        .expect("dispatch finished")
        .unwrap();
    writer.await.unwrap();
    out
}

/// Stdout parsed as one JSON document (surrounding white space allowed).
pub fn stdout_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {text}"))
}

/// Stdout as exactly one line holding one JSON document.
pub fn stdout_one_line_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim().lines().count(), 1, "one document: {text}");
    serde_json::from_str(text.trim()).unwrap()
}

/// Stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit status, stdout and stderr, for an assertion message.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The lines a child prints on `stdout`, read on a thread of their own so a test can wait for
/// one with a timeout (`recv_timeout`); the channel closes when the child closes its stdout.
pub fn lines_of(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}
