//! Descriptors the engine inherited never reach a command. `switchboard dispatch` and
//! `switchboard serve`, started (as a CI runner, `Popen(close_fds=False)` or a shell's `3>log`
//! would) with a file outside the workspace open for reading on fd 37, another open for
//! appending on fd 38 and a TCP connection to a loopback listener of the test on fd 39: a bash
//! call cannot read the first, write the second or talk through the third, and sees no
//! descriptor but 0, 1 and 2 — nor does a hook process `dispatch` runs. The same holds for an
//! engine embedded in this process (the trampoline closes what the embedder leaves open).

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::sandbox::*;
use serde_json::{Value, json};
use switchboard::sandbox::SandboxMode;

/// Bound on anything these tests wait for.
const BOUND: Duration = Duration::from_secs(60);

/// What the bash call tries with the inherited descriptors; it prints the descriptors it has.
const PROBE: &str = "cat <&37; echo appended-from-sandbox >&38; \
                     echo hello-from-sandbox >&39; \
                     echo FDS $(ls /proc/self/fd | sort -n | tr '\\n' ' ')";

/// Files outside the workspace and a loopback listener whose one connection the engine inherits.
struct Outside {
    _dir: tempfile::TempDir,
    secret: std::path::PathBuf,
    log: std::path::PathBuf,
    port: u16,
    /// What the listener received on the inherited connection, once it closed.
    received: mpsc::Receiver<Vec<u8>>,
}

impl Outside {
    fn new() -> Outside {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "TOP-SECRET\n").unwrap();
        let log = dir.path().join("log.txt");
        std::fs::write(&log, "log line\n").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, received) = mpsc::channel();
        std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            conn.set_read_timeout(Some(BOUND)).unwrap();
            let mut got = Vec::new();
            let _ = conn.read_to_end(&mut got);
            let _ = tx.send(got);
        });
        Outside {
            _dir: dir,
            secret,
            log,
            port,
            received,
        }
    }

    /// `switchboard ARGS…`, started by a shell that opens fds 37, 38 and 39 first.
    fn spawn(&self, args: &[&str], cwd: &Path, stdin: Stdio, stderr: Stdio) -> Child {
        Command::new("bash")
            .arg("-c")
            .arg(concat!(
                r#"exec 37<"$1" 38>>"$2" 39<>"/dev/tcp/127.0.0.1/$3" || exit 99; "#,
                r#"shift 3; exec "$@""#
            ))
            .arg("with-fds")
            .arg(&self.secret)
            .arg(&self.log)
            .arg(self.port.to_string())
            .arg(CLI)
            .args(args)
            .current_dir(cwd)
            .env_remove("RUST_LOG")
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap()
    }

    /// Checks the bash call's output and that nothing outside changed or was sent.
    fn assert_untouched(&self, output: &str) {
        assert!(
            !output.contains("TOP-SECRET"),
            "read the outside file: {output}"
        );
        assert_eq!(
            output.matches("Bad file descriptor").count(),
            3,
            "each inherited descriptor is unknown to the command: {output}"
        );
        assert_only_stdio(output);
        assert_eq!(std::fs::read_to_string(&self.log).unwrap(), "log line\n");
    }

    /// What the listener received, once the engine (the last holder) closed the connection.
    fn received(&self) -> Vec<u8> {
        self.received
            .recv_timeout(BOUND)
            .expect("the inherited connection is closed when the engine exits")
    }
}

/// The `FDS …` line of the output lists 0, 1, 2 and the directory `ls` itself reads: nothing
/// else.
fn assert_only_stdio(output: &str) {
    let fds = output
        .lines()
        .find_map(|l| l.strip_prefix("FDS "))
        .unwrap_or_else(|| panic!("no descriptor list: {output}"));
    assert_eq!(fds.trim(), "0 1 2 3", "{output}");
}

fn sandbox_available() -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { engine(None, config(SandboxMode::WorkspaceWrite)).is_some() })
}

#[test]
fn dispatch_started_with_extra_descriptors_keeps_them_from_bash() {
    if !sandbox_available() {
        return;
    }
    let outside = Outside::new();
    let (_dir, ws) = temp_workspace();
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "fds", "name": "bash", "input": {"command": PROBE}}
    ]});
    // A PreToolUse hook (a process of the engine's own, outside the sandbox) notes what it has.
    let hook = "{ cat <&37; echo FDS $(ls /proc/self/fd | sort -n | tr '\\n' ' '); } \
                > hook.txt 2>&1; cat >/dev/null";
    let policy = ws.root().join("../policy.json");
    std::fs::write(
        &policy,
        json!({"hooks": {"PreToolUse": [
            {"matcher": "bash", "hooks": [{"type": "command", "command": hook}]}
        ]}})
        .to_string(),
    )
    .unwrap();
    let mut child = outside.spawn(
        &[
            "dispatch",
            "--workspace",
            ws.root().to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
        ws.root(),
        Stdio::piped(),
        Stdio::piped(),
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(turn.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = answer["content"][0]["content"].as_str().unwrap();
    outside.assert_untouched(text);
    let hook_saw = std::fs::read_to_string(ws.root().join("hook.txt")).unwrap();
    assert!(
        !hook_saw.contains("TOP-SECRET"),
        "the hook read it: {hook_saw}"
    );
    assert_only_stdio(&hook_saw);
    assert_eq!(
        outside.received(),
        b"",
        "the command wrote to the inherited socket"
    );
}

/// A minimal HTTP/1.1 exchange with the server (one request per connection).
fn http(base: &str, method: &str, path: &str, body: &str) -> Value {
    let addr = base.trim_start_matches("http://");
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(BOUND)).unwrap();
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 20"), "{response}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {response}"))
}

#[test]
fn serve_started_with_extra_descriptors_keeps_them_from_bash() {
    if !sandbox_available() {
        return;
    }
    let outside = Outside::new();
    let root = tempfile::tempdir().unwrap();
    let workspaces = root.path().join("ws");
    let mut child = outside.spawn(
        &[
            "serve",
            "--workspace-root",
            workspaces.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--no-auth",
        ],
        root.path(),
        Stdio::null(),
        Stdio::piped(),
    );
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let base = lines
        .by_ref()
        .take(50)
        .map_while(Result::ok)
        .find_map(|line| {
            let at = line.find("listening on ")?;
            Some(line[at + "listening on ".len()..].trim().to_string())
        })
        .expect("the ready line");
    std::thread::spawn(move || for _ in lines {});

    let session = http(&base, "POST", "/v1/sessions", "{}");
    let id = session["session_id"].as_str().unwrap();
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "fds", "name": "bash", "input": {"command": PROBE}}
    ]});
    let answer = http(
        &base,
        "POST",
        &format!("/v1/sessions/{id}/dispatch"),
        &turn.to_string(),
    );
    let text = answer["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();

    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    rx.recv_timeout(BOUND).expect("the server exits").unwrap();
    outside.assert_untouched(&text);
    assert_eq!(
        outside.received(),
        b"",
        "the command wrote to the inherited socket"
    );
}

#[tokio::test]
async fn an_embedding_process_s_open_descriptors_do_not_reach_bash() {
    let (dir, ws) = temp_workspace();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET\n").unwrap();
    // Opened without O_CLOEXEC, as an embedder's launcher might leave one.
    let fd = rustix::fs::open(
        &secret,
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let n = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let r = bash(
        &engine.session(),
        &format!("cat <&{n}; echo FDS $(ls /proc/self/fd | sort -n | tr '\\n' ' ')"),
    )
    .await;
    let text = ok_text(&r);
    assert!(!text.contains("TOP-SECRET"), "{text}");
    assert!(text.contains("Bad file descriptor"), "{text}");
    assert_only_stdio(text);
    drop(fd);
}
