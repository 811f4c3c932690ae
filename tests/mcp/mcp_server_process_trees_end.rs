//! Nothing a stdio MCP server starts outlives it: a server that starts `setsid sleep 1000` (a
//! grandchild in a session of its own, out of the server's process group) loses it when the
//! engine shuts the server down, when the server crashes and is restarted, and when the engine's
//! process exits; after `kill -9` of the engine, the server itself dies (the parent-death
//! signal), even one that does not exit at the end of its stdin. Needs python3 and `setsid`
//! (util-linux).

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

use common::mcp::*;
use serde_json::{Value, json};

/// How long a process may take to be gone once it should be (a guard, not a measurement).
const GONE_WITHIN: Duration = Duration::from_secs(15);

fn grandchild_options() -> String {
    json!({"grandchild": true}).to_string()
}

/// The same, and the server does not exit at the end of its stdin (so only a signal ends it).
fn lingering_options() -> String {
    json!({"grandchild": true, "linger": true}).to_string()
}

fn spawner(py: &std::path::Path, state: &std::path::Path) -> switchboard::mcp::ServerSpec {
    let mut spec = misbehaving(py, state);
    if let switchboard::mcp::Transport::Stdio { args, .. } = &mut spec.transport {
        args.push(grandchild_options());
    }
    spec
}

/// `{"server": pid, "grandchild": pid}` from a spawn_grandchild answer.
fn pids(answer: &str) -> (u32, u32) {
    let v: Value = serde_json::from_str(answer).expect(answer);
    let pid = |k: &str| u32::try_from(v[k].as_u64().expect(answer)).unwrap();
    (pid("server"), pid("grandchild"))
}

/// Polls until `pid` is gone (or a zombie), for at most [`GONE_WITHIN`].
async fn gone(pid: u32) -> bool {
    eventually(GONE_WITHIN, || process_gone(pid)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_grandchild_ends_when_the_server_is_stopped_or_restarted() {
    if which("setsid").is_none() {
        eprintln!("SKIPPED setsid grandchild: setsid is not on PATH");
        return;
    }
    let Some(py) = python("setsid grandchild") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![("g", spawner(&py, state.path()))]).await;
    let spawn = |id: &str| call(id, "mcp__g__spawn_grandchild", json!({}));

    // A crash: the restarted server's tree is new, the old one is gone.
    let results = turn(&engine, vec![spawn("a")]).await;
    let (server, grandchild) = pids(&results[0].content);
    assert!(!process_gone(grandchild), "the grandchild runs");
    let crashed = turn(&engine, vec![call("b", "mcp__g__crash_once", json!({}))]).await;
    assert_eq!(
        crashed[0].error,
        Some(switchboard::ErrorCode::ExecutionError)
    );
    assert!(gone(server).await, "the crashed server {server} is gone");
    assert!(
        gone(grandchild).await,
        "grandchild {grandchild} outlived its crashed server"
    );

    // Shutting the engine down stops the server and everything it started.
    let results = turn(&engine, vec![spawn("c")]).await;
    let (server, grandchild) = pids(&results[0].content);
    assert!(!process_gone(server) && !process_gone(grandchild));
    engine.shutdown(Duration::from_secs(1)).await;
    assert!(
        gone(server).await,
        "server {server} outlived the engine's shutdown"
    );
    assert!(
        gone(grandchild).await,
        "grandchild {grandchild} outlived the engine's shutdown"
    );
}

/// `switchboard dispatch --lines` with the spawning server, fed one turn at a time.
fn dispatch_engine(
    py: &std::path::Path,
    dir: &std::path::Path,
    options: String,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/misbehaving.py");
    let config = json!({"mcpServers": {"g": {
        "command": py, "args": [script, dir, options]
    }}});
    let file = dir.join("mcp.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let mut child = common::cli::switchboard()
        .args([
            "dispatch",
            "--lines",
            "--sandbox",
            "best-effort",
            "--workspace",
        ])
        .arg(dir)
        .arg("--mcp-config")
        .arg(&file)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Asks the engine to spawn a grandchild; its answer's pids.
fn spawn_through(
    child: &mut std::process::Child,
    out: &mut BufReader<std::process::ChildStdout>,
) -> (u32, u32) {
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "mcp__g__spawn_grandchild", "input": {}}
    ]});
    let stdin = child.stdin.as_mut().unwrap();
    writeln!(stdin, "{turn}").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let answer: Value = serde_json::from_str(&line).expect(&line);
    pids(answer["content"][0]["content"].as_str().expect(&line))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_grandchild_ends_when_the_engine_process_exits() {
    if which("setsid").is_none() {
        eprintln!("SKIPPED setsid grandchild: setsid is not on PATH");
        return;
    }
    let Some(py) = python("setsid grandchild, engine exit") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut engine, mut out) = dispatch_engine(&py, dir.path(), grandchild_options());
    let (server, grandchild) = spawn_through(&mut engine, &mut out);
    assert!(!process_gone(server) && !process_gone(grandchild));
    // End of input: the engine shuts down and exits.
    drop(engine.stdin.take());
    let status = engine.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(gone(server).await, "server {server} outlived the engine");
    assert!(
        gone(grandchild).await,
        "grandchild {grandchild} outlived the engine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_dies_with_an_engine_killed_by_sigkill() {
    let Some(py) = python("server after kill -9") else {
        return;
    };
    if which("setsid").is_none() {
        eprintln!("SKIPPED server after kill -9: setsid is not on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The server ignores the end of its stdin: only the parent-death signal can end it.
    let (mut engine, mut out) = dispatch_engine(&py, dir.path(), lingering_options());
    let (server, grandchild) = spawn_through(&mut engine, &mut out);
    engine.kill().unwrap(); // SIGKILL: no shutdown runs
    let _ = engine.wait();
    let server_gone = gone(server).await;
    if !server_gone {
        // Started by this test (through the engine): ended by it too.
        let _ = std::process::Command::new("kill")
            .args(["-9", &server.to_string()])
            .status();
    }
    // A grandchild in a session of its own is what `kill -9` of the engine leaves (documented):
    // this test started it, and ends it.
    let _ = std::process::Command::new("kill")
        .args(["-9", &grandchild.to_string()])
        .status();
    assert!(server_gone, "server {server} outlived its engine's SIGKILL");
}
