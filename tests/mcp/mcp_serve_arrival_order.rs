//! `switchboard mcp-serve --order arrival` through the real binary, driven over stdio by a raw
//! JSON-RPC client that writes several `tools/call`s at once (one write, before reading any
//! answer), as a framework running one model turn's calls concurrently does: a read sent with an
//! edit of the same file always sees the edit; calls that do not conflict still overlap (proven
//! with a barrier in a PreToolUse hook, never a stopwatch); and a call cancelled while it waits
//! releases the calls behind it.

use crate::common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long the client waits for an answer before failing the test (a guard against a hang,
/// not a measurement).
const ANSWER_GUARD: Duration = Duration::from_secs(60);

/// `mcp-serve` as a child process and a line-by-line JSON-RPC client of it.
struct McpServe {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Answers read while waiting for others, by id.
    early: HashMap<i64, Value>,
    log: PathBuf,
}

impl McpServe {
    /// Starts `mcp-serve --workspace WS --order arrival EXTRA…` and initialises the session.
    fn start(ws: &Path, log_dir: &Path, extra: &[&str]) -> McpServe {
        let log = log_dir.join("mcp-serve.stderr");
        let mut child = common::cli::switchboard()
            .arg("mcp-serve")
            .arg("--workspace")
            .arg(ws)
            .args(["--order", "arrival"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("mcp-serve starts");
        let lines = common::cli::lines_of(child.stdout.take().unwrap());
        let mut server = McpServe {
            stdin: child.stdin.take(),
            child,
            lines,
            early: HashMap::new(),
            log,
        };
        server.send(&[
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "arrival-order-test", "version": "0"}
            }}),
        ]);
        let init = server.answer(0);
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        server.send(&[json!({"jsonrpc": "2.0", "method": "notifications/initialized"})]);
        server
    }

    /// Writes these messages in one write: the server has them all before it answers any.
    fn send(&mut self, messages: &[Value]) {
        let text: String = messages.iter().map(|m| format!("{m}\n")).collect();
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// The next answer to arrive (a response or an error with an id); notifications are skipped.
    fn next_answer(&mut self) -> (i64, Value) {
        loop {
            let line = match self.lines.recv_timeout(ANSWER_GUARD) {
                Ok(line) => line,
                Err(e) => panic!(
                    "no answer from mcp-serve within {ANSWER_GUARD:?} ({e}); its stderr:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ),
            };
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if let Some(id) = message["id"].as_i64() {
                return (id, message);
            }
        }
    }

    /// The answer to request `id`, keeping the others that arrive meanwhile.
    fn answer(&mut self, id: i64) -> Value {
        if let Some(answer) = self.early.remove(&id) {
            return answer;
        }
        loop {
            let (got, message) = self.next_answer();
            if got == id {
                return message;
            }
            self.early.insert(got, message);
        }
    }
}

impl Drop for McpServe {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call(id: i64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// The text of a successful `tools/call` answer (panics on an error result).
fn ok_text(answer: &Value) -> &str {
    let result = &answer["result"];
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert_eq!(result["isError"], false, "{answer}");
    text
}

#[test]
fn with_order_arrival_a_read_sent_with_an_edit_of_the_same_file_always_sees_the_edit() {
    let ws = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut server = McpServe::start(ws.path(), logs.path(), &[]);
    server.send(&[call(
        1,
        "write_file",
        json!({"path": "f.txt", "content": "round 0\n"}),
    )]);
    ok_text(&server.answer(1));
    server.send(&[call(2, "read_file", json!({"path": "f.txt"}))]);
    ok_text(&server.answer(2));
    for round in 1..=30 {
        let (edit, read) = (10 * round, 10 * round + 1);
        let (old, new) = (format!("round {}", round - 1), format!("round {round}"));
        server.send(&[
            call(
                edit,
                "edit_file",
                json!({"path": "f.txt", "old_text": old, "new_text": new}),
            ),
            call(read, "read_file", json!({"path": "f.txt"})),
        ]);
        let edited = server.answer(edit);
        let seen = server.answer(read);
        ok_text(&edited);
        assert!(
            ok_text(&seen).contains(&new),
            "round {round}: the read sent after the edit saw {seen}"
        );
    }
}

/// A PreToolUse hook that holds each call until `$1` calls are inside it at once (each marks
/// itself with a file of its own: `$$` is the same in every hook's PID namespace): a serial run of
/// those calls can never pass it (the first would wait for the others until it gives up and
/// denies its call).
const BARRIER_HOOK: &str = r#"cat > /dev/null
mkdir -p .barrier && mktemp .barrier/XXXXXX > /dev/null
tries=0
while [ "$(ls .barrier | wc -l)" -lt "$1" ]; do
  tries=$((tries + 1))
  if [ "$tries" -gt 600 ]; then
    echo "barrier: only $(ls .barrier | wc -l) of $1 calls were in flight at once" >&2
    exit 2
  fi
  sleep 0.05
done
"#;

/// A PreToolUse hook that holds a call of `d/x.txt` until the file `go` exists (and says it
/// started by creating `.held`); other calls pass at once.
const HOLD_HOOK: &str = r#"input=$(cat)
case "$input" in
  *'"d/x.txt"'*) ;;
  *) exit 0 ;;
esac
touch .held
tries=0
while [ ! -e go ]; do
  tries=$((tries + 1))
  if [ "$tries" -gt 1200 ]; then echo "nobody said go" >&2; exit 2; fi
  sleep 0.05
done
"#;

/// A policy file allowing the file tools, with `script` as the PreToolUse hook of `matcher`.
fn policy_with_hook(dir: &Path, matcher: &str, script: &str, args: &str) -> PathBuf {
    let hook = dir.join("hook.sh");
    std::fs::write(&hook, script).unwrap();
    let policy = dir.join("policy.json");
    let text = json!({
        "permissions": {"default": "allow"},
        "hooks": {"PreToolUse": [{"matcher": matcher, "hooks": [
            {"type": "command", "command": format!("sh {} {args}", hook.display()), "timeout": 90}
        ]}]}
    });
    std::fs::write(&policy, text.to_string()).unwrap();
    policy
}

#[test]
fn with_order_arrival_calls_that_do_not_conflict_still_overlap() {
    let ws = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("c.txt"), "see\n").unwrap();
    let policy = policy_with_hook(dir.path(), "write_file|read_file", BARRIER_HOOK, "3");
    let mut server = McpServe::start(
        ws.path(),
        dir.path(),
        &["--policy", policy.to_str().unwrap()],
    );
    // Two writes and a read of three different files: no two conflict, so all three are inside
    // the barrier at once, or none of them passes it.
    server.send(&[
        call(
            1,
            "write_file",
            json!({"path": "a/one.txt", "content": "1"}),
        ),
        call(
            2,
            "write_file",
            json!({"path": "b/two.txt", "content": "2"}),
        ),
        call(3, "read_file", json!({"path": "c.txt"})),
    ]);
    assert_eq!(ok_text(&server.answer(1)), "Wrote 1 bytes to a/one.txt");
    assert_eq!(ok_text(&server.answer(2)), "Wrote 1 bytes to b/two.txt");
    assert!(ok_text(&server.answer(3)).contains("see"));
}

#[test]
fn with_order_arrival_a_call_cancelled_while_it_waits_releases_the_calls_behind_it() {
    let ws = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("d")).unwrap();
    let policy = policy_with_hook(dir.path(), "write_file", HOLD_HOOK, "");
    let mut server = McpServe::start(
        ws.path(),
        dir.path(),
        &["--policy", policy.to_str().unwrap()],
    );
    // 1 writes d/x.txt (held in its hook); 2 lists d, so it waits for 1; 3 writes d/y.txt, so it
    // waits for 2 (not for 1: another file).
    server.send(&[
        call(1, "write_file", json!({"path": "d/x.txt", "content": "x"})),
        call(2, "read_file", json!({"path": "d"})),
        call(3, "write_file", json!({"path": "d/y.txt", "content": "y"})),
    ]);
    let held = ws.path().join(".held");
    let end = Instant::now() + ANSWER_GUARD;
    while !held.exists() {
        assert!(Instant::now() < end, "call 1 never reached its hook");
        std::thread::sleep(Duration::from_millis(20));
    }
    server.send(&[
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": 2, "reason": "the user moved on"}}),
    ]);
    // Call 1 is still held, so the next answer can only be call 3's: the cancelled call 2 stopped
    // waiting for call 1, and released call 3.
    let (id, answer) = server.next_answer();
    assert_eq!(id, 3, "{answer}");
    assert_eq!(ok_text(&answer), "Wrote 1 bytes to d/y.txt");
    std::fs::write(ws.path().join("go"), "").unwrap();
    let (id, answer) = server.next_answer();
    assert_eq!(id, 1, "{answer}");
    assert_eq!(ok_text(&answer), "Wrote 1 bytes to d/x.txt");
    // The cancelled call is never answered (as the protocol says); the server goes on.
    server.send(&[call(4, "read_file", json!({"path": "d/x.txt"}))]);
    let (id, answer) = server.next_answer();
    assert_eq!(id, 4, "{answer}");
    assert!(ok_text(&answer).contains('x'));
}
