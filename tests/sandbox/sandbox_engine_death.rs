//! Nothing outlives the engine: `kill -9` of a `switchboard dispatch` process whose bash command
//! started background jobs, a `setsid` daemon and a job ignoring SIGHUP leaves no process of
//! that command alive (the trampoline's parent-death signal ends the call's PID namespace) —
//! under the default sandbox, and with `--sandbox off` too, whose commands have the trampoline
//! as the init of their namespaces as well.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::sandbox::*;
use switchboard::sandbox::SandboxMode;

/// Pids of processes whose environment carries `SWITCHBOARD_CALL_ID=<id>`.
fn processes_of_call(id: &str) -> Vec<u32> {
    let needle = format!("SWITCHBOARD_CALL_ID={id}\0").into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

#[test]
fn kill_9_of_dispatch_leaves_no_process_of_its_command_alive() {
    // Skip only where the sandbox cannot run at all.
    if engine_available().is_none() {
        return;
    }
    kill_9_leaves_nothing("workspace-write");
}

#[test]
fn kill_9_of_dispatch_with_the_sandbox_off_leaves_no_process_of_its_command_alive_either() {
    if !available(
        "root (the trampoline makes the namespaces itself only as root)",
        rustix::process::geteuid().is_root(),
    ) {
        return;
    }
    kill_9_leaves_nothing("off");
}

fn kill_9_leaves_nothing(mode: &str) {
    let (_dir, ws) = temp_workspace();
    let id = format!("kill9-{mode}-{}", std::process::id());
    let command = "sleep 300 & setsid sleep 301 & (trap '' HUP TERM; sleep 302) & \
                   echo up > started; wait";
    let turn = serde_json::json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}}
    ]});
    let mut engine = Command::new(CLI)
        .args(["dispatch", "--sandbox", mode, "--workspace"])
        .arg(ws.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    engine
        .stdin
        .take()
        .unwrap()
        .write_all(turn.to_string().as_bytes())
        .unwrap();
    let started = Instant::now();
    while !ws.root().join("started").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // `started` is written while the background jobs may still be forking: wait (bounded)
    // until all four are there.
    let mut before = processes_of_call(&id);
    while before.len() < 4 && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
        before = processes_of_call(&id);
    }
    assert!(
        before.len() >= 4,
        "expected the command's processes: {before:?}"
    );
    engine.kill().unwrap(); // SIGKILL
    engine.wait().unwrap();
    let killed = Instant::now();
    let mut left = processes_of_call(&id);
    while !left.is_empty() && killed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        left = processes_of_call(&id);
    }
    assert!(left.is_empty(), "survivors of kill -9: {left:?}");
}

/// Whether the default sandbox can be enforced here (else the test is skipped).
fn engine_available() -> Option<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { engine(None, config(SandboxMode::WorkspaceWrite)).map(|_| ()) })
}
