//! Per-call limits: a fork bomb inside a 3 s timeout ends in `execution_error` or `timeout` and
//! the next call of the turn runs; a memory bomb is killed with the limit named (the call's, or
//! one above it: the engine's cgroup), and a later call given the same cgroups is not said to
//! have hit a limit; a `kill -9` is not called out of memory; a file past the
//! size limit is an `execution_error` naming it. The bombs run only when the pids / memory
//! cgroup of the call is in force (never on a machine where they could take the host down).

use crate::common;

use std::time::Duration;

use common::sandbox::*;
use switchboard::ErrorCode;
use switchboard::sandbox::{SandboxLimits, SandboxMode};

const MIB: u64 = 1 << 20;

/// An engine under the default sandbox with [`limits`], or `None` (skipped) where it cannot run.
fn limited_engine(ws: &switchboard::Workspace) -> Option<switchboard::Engine> {
    engine(
        Some(ws),
        config(SandboxMode::WorkspaceWrite).limits(limits()),
    )
}

fn limits() -> SandboxLimits {
    SandboxLimits {
        max_processes: 64,
        max_memory: 256 * MIB,
        max_file_size: MIB,
        max_tmp_size: 4 * MIB,
    }
}

#[tokio::test]
async fn a_fork_bomb_ends_and_the_next_call_of_the_turn_runs() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = limited_engine(&ws) else {
        return;
    };
    if !available(
        "a writable pids cgroup (the fork bomb runs only inside one)",
        engine.sandbox().status().limits_processes(),
    ) {
        return;
    }
    let session = engine.session();
    let results = session
        .dispatch(vec![
            bash_call(
                "bomb",
                "echo \"$TMPDIR\"; f(){ f|f; }; f",
                Duration::from_secs(3),
            ),
            bash_call("next", "echo still-here", Duration::from_secs(60)),
        ])
        .await
        .expect("engine available");
    assert!(
        matches!(
            results[0].error,
            Some(ErrorCode::Timeout | ErrorCode::ExecutionError)
        ),
        "{}",
        results[0].content
    );
    assert!(
        results[0]
            .content
            .contains("process limit reached (limit 64 processes)"),
        "{}",
        results[0].content
    );
    assert_eq!(ok_text(&results[1]), "still-here");
    // A later call given the bomb's cgroups is not said to have hit the limit.
    let tmpdir = tmpdir_of(&results[0].content);
    let r = in_the_same_slot(&session, &tmpdir, "echo \"$TMPDIR\"; exit 3").await;
    assert_eq!(r.content, format!("{tmpdir}\n[exit code: 3]"));
}

/// The `TMPDIR` a call printed first (after the error's own line, when it failed).
fn tmpdir_of(content: &str) -> String {
    content
        .lines()
        .find(|l| l.starts_with('/') && l.ends_with("/tmp"))
        .unwrap_or_else(|| panic!("no TMPDIR in {content}"))
        .to_string()
}

/// Runs `command` (which prints its `TMPDIR` first) until a call runs with the directory and
/// cgroups of the call whose `TMPDIR` was `tmpdir` — kept for a later call once that call
/// ended (given back off the runtime, so not always to the very next call) — and returns that
/// call's result. Bounded: 40 calls.
async fn in_the_same_slot(
    session: &switchboard::Session,
    tmpdir: &str,
    command: &str,
) -> switchboard::ToolDispatchResult {
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = bash(session, command).await;
        if r.content.lines().any(|l| l == tmpdir) {
            return r;
        }
    }
    panic!("no later call was given the directory and cgroups of the call of {tmpdir}");
}

#[tokio::test]
async fn a_memory_bomb_is_killed_with_the_limit_named() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = limited_engine(&ws) else {
        return;
    };
    if !available(
        "a writable memory cgroup (the memory bomb runs only inside one)",
        engine.sandbox().status().limits_memory(),
    ) {
        return;
    }
    let session = engine.session();
    // 600 MiB held in one shell variable, against a 256 MiB limit.
    let r = bash(
        &session,
        "echo \"$TMPDIR\"; x=$(head -c 629145600 /dev/zero | tr '\\0' a); echo ${#x}",
    )
    .await;
    let text = error_text(&r, ErrorCode::ExecutionError);
    assert!(
        text.contains("killed: out of memory (limit 256 MiB)"),
        "{text}"
    );
    // The engine (this process) is alive and the next call runs.
    assert_eq!(ok_text(&bash(&session, "echo ok").await), "ok");
    // A later call given the killed call's memory cgroup is not said killed.
    let tmpdir = tmpdir_of(text);
    let r = in_the_same_slot(&session, &tmpdir, "echo \"$TMPDIR\"").await;
    assert_eq!(ok_text(&r), tmpdir);
}

/// A command killed by SIGKILL that the OOM killer did not kill is just that: no guessed
/// "out of memory", whether the memory cgroup is in force or not.
#[tokio::test]
async fn a_kill_9_is_not_reported_as_out_of_memory() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = limited_engine(&ws) else {
        return;
    };
    let session = engine.session();
    let r = bash(&session, "echo started; kill -9 $$").await;
    let text = error_text(&r, ErrorCode::ExecutionError);
    assert!(text.contains("killed by SIGKILL"), "{text}");
    assert!(!text.contains("memory"), "{text}");
}

#[tokio::test]
async fn a_file_past_the_size_limit_is_an_execution_error_naming_it() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = limited_engine(&ws) else {
        return;
    };
    let session = engine.session();
    let r = bash(&session, "head -c 2097152 /dev/zero > big").await;
    let text = error_text(&r, ErrorCode::ExecutionError);
    assert!(text.contains("killed: file size limit (1 MiB)"), "{text}");
    assert_eq!(std::fs::metadata(ws.root().join("big")).unwrap().len(), MIB);
}

/// This process's memory cgroup directory (cgroup v1), if the hierarchy is mounted.
fn own_memory_cgroup() -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })?;
    let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

/// When the kernel kills a call's process for a memory limit above the call's own (here: the
/// engine's cgroup, 300 MB, around a call allowed 1 GiB), the answer names the limit that
/// applied and the cgroup that sets it, and the call's own limit as not the one. The engine runs in a cgroup this test makes under
/// its own, so the memory bomb is bounded by a limit set here.
#[test]
fn an_out_of_memory_kill_by_a_limit_above_the_call_says_so() {
    let Some(own) = own_memory_cgroup() else {
        available("a cgroup v1 memory hierarchy", false);
        return;
    };
    let dir = own.join(format!("switchboard-test-oom-{}", std::process::id()));
    let made = std::fs::create_dir(&dir)
        .and_then(|()| std::fs::write(dir.join("memory.limit_in_bytes"), "300000000"));
    if let Err(e) = made {
        let _ = std::fs::remove_dir(&dir);
        available(&format!("a writable memory cgroup ({e})"), false);
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let bomb = r#"{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"bash","input":{"command":"x=$(head -c 629145600 /dev/zero | tr '\\0' a); echo ${#x}"}}]}"#;
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec \"$0\" dispatch --workspace \"$1\" --max-memory 1G",
            dir.display()
        ))
        .arg(CLI)
        .arg(ws.path());
    let out = common::cli::fed(cmd, bomb.as_bytes());
    for _ in 0..100 {
        if std::fs::remove_dir(&dir).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // The limit that applied is named: this test's cgroup (300,000,000 bytes, rounded down to
    // whole pages by the kernel), which holds the engine.
    assert!(
        text.contains(&format!(
            "killed: out of memory, by the memory limit of the cgroup {} that holds the engine (",
            dir.display()
        )) && text.contains("of its own 1 GiB"),
        "{text}"
    );
}
