//! Per-call limits: a fork bomb inside a 3 s timeout ends in `execution_error` or `timeout` and
//! the next call of the turn runs; a memory bomb is killed with the limit named; a file past the
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
            bash_call("bomb", "f(){ f|f; }; f", Duration::from_secs(3)),
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
        "x=$(head -c 629145600 /dev/zero | tr '\\0' a); echo ${#x}",
    )
    .await;
    let text = error_text(&r, ErrorCode::ExecutionError);
    assert!(
        text.contains("killed: out of memory (limit 256 MiB)"),
        "{text}"
    );
    // The engine (this process) is alive and the next call runs.
    assert_eq!(ok_text(&bash(&session, "echo ok").await), "ok");
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
