//! A SIGINT or SIGTERM in the very first milliseconds of `dispatch`. The documented contract
//! (docs/cli.md, "Signals"): from the first line of `main` on — before the async runtime starts
//! any thread — both signals are caught, so the turn already sent is answered (every call, in
//! order, `cancelled` where it did not run) and the process exits 130 (143); a signal that comes
//! earlier, while the program is still being loaded, ends the process by its default action,
//! with nothing printed and nothing run. 200 runs: four in five at varied delays of up to 12 ms,
//! one in five the instant the process has a second thread (the runtime's: a run that dies by
//! the signal after that point breaks the contract, as every run did before the handlers came
//! first).

use crate::common;

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::json;

use common::answers::{answers, turn};
use common::cli::BIN;

/// Bound on anything one run waits for.
const BOUND: Duration = Duration::from_secs(30);
const RUNS: usize = 200;

/// What `/proc/PID/status` showed just before the signal was sent.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    threads: u64,
    /// The signal sent is caught (`SigCgt`).
    caught: bool,
}

fn seen(pid: u32, signal: i32) -> Seen {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str, radix: u32| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), radix).ok())
            .unwrap_or(0)
    };
    Seen {
        threads: field("Threads:", 10),
        caught: field("SigCgt:", 16) & (1 << (signal - 1)) != 0,
    }
}

fn finish(child: std::process::Child) -> Output {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(BOUND).expect("the process exits").unwrap()
}

/// One run: the turn sent, then `signal` after `delay` (or, with `None`, the instant a second
/// thread exists). Returns what was seen before the signal and the process's output.
fn run(ws: &Path, signal: Signal, delay: Option<Duration>) -> (Seen, Output) {
    let doc = turn(&[
        ("bash", json!({"command": "touch ran"})),
        ("read_file", json!({"path": "missing.txt"})),
        ("glob", json!({"pattern": "*"})),
    ]);
    let mut child = Command::new(BIN)
        // The signal path is the same in every sandbox mode; `off` spares each run the probes.
        .args(["dispatch", "--sandbox", "off", "--workspace"])
        .arg(ws)
        .current_dir(ws)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(doc.to_string().as_bytes())
        .unwrap();
    let pid = child.id();
    let number = signal.as_raw();
    match delay {
        Some(delay) => std::thread::sleep(delay),
        None => {
            let started = Instant::now();
            while seen(pid, number).threads < 2 && started.elapsed() < BOUND {
                std::hint::spin_loop();
            }
        }
    }
    let before = seen(pid, number);
    kill_process(Pid::from_raw(pid as i32).unwrap(), signal).expect("the process is there");
    (before, finish(child))
}

#[test]
fn an_early_signal_is_answered_or_ends_the_process_before_main() {
    let root = tempfile::tempdir().unwrap();
    let (mut answered, mut ended) = (0, 0);
    for i in 0..RUNS {
        let ws = root.path().join(format!("run{i}"));
        std::fs::create_dir(&ws).unwrap();
        let signal = if i % 2 == 0 {
            Signal::INT
        } else {
            Signal::TERM
        };
        let delay = (i % 5 != 0).then(|| Duration::from_micros((i as u64 * 397) % 12_000));
        let (before, out) = run(&ws, signal, delay);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.signal() {
            Some(killed_by) => {
                // Before `main`: nothing was printed, nothing ran, and the process had not yet
                // reached the point (its first thread, its handlers) where it takes signals over.
                ended += 1;
                assert_eq!(killed_by, signal.as_raw(), "run {i}: {stderr}");
                assert!(out.stdout.is_empty(), "run {i} printed before dying");
                assert!(!ws.join("ran").exists(), "run {i} ran a command and died");
                assert!(
                    before.threads <= 1 && !before.caught,
                    "run {i} died of the signal after main began ({before:?})"
                );
            }
            None => {
                answered += 1;
                let code = if signal == Signal::INT { 130 } else { 143 };
                assert!(
                    matches!(out.status.code(), Some(c) if c == code || c == 0),
                    "run {i}: status {:?}, stderr: {stderr}",
                    out.status.code()
                );
                let answers = answers(&out);
                let ids: Vec<&str> = answers.iter().map(|a| a.id.as_str()).collect();
                assert_eq!(
                    ids,
                    ["c0", "c1", "c2"],
                    "run {i}: every call answered, in order"
                );
                for a in &answers {
                    let outcome = a.outcome();
                    // The read of a missing file fails on its own when it does run.
                    assert!(
                        ["ok", "cancelled", "execution_error"].contains(&outcome.as_str())
                            && (outcome != "execution_error" || a.id == "c1"),
                        "run {i}: {a:?}"
                    );
                }
            }
        }
    }
    println!("{answered} runs answered, {ended} ended by the signal before main");
    assert!(answered > 0, "no run got as far as main");
}
