//! A command whose shell dies by a signal (the OOM killer's SIGKILL, a segfault, a SIGTERM) is an
//! `execution_error` naming the signal, not an `ok` result ending in `[exit code: 137]` — in both
//! of bash's modes (PID namespaces, where the status comes through an init shell as 128 + N, and
//! direct). A plain non-zero exit, including `exit 137`, stays a successful result with
//! `[exit code: N]`.

use crate::common;

use std::time::Duration;

use serde_json::json;
use switchboard::Workspace;
use switchboard::protocol::ErrorCode;
use switchboard::tool::Handler;
use switchboard::tools::bash::{self, Isolation};
use tokio_util::sync::CancellationToken;

use common::answers::dispatch;

#[test]
fn through_dispatch_a_killed_command_is_an_execution_error_naming_the_signal() {
    let ws = tempfile::tempdir().unwrap();
    let answers = dispatch(
        ws.path(),
        &[
            ("bash", json!({"command": "echo started; kill -KILL $$"})),
            ("bash", json!({"command": "kill -SEGV $$"})),
            ("bash", json!({"command": "kill -TERM $$"})),
            ("bash", json!({"command": "echo plain; exit 137"})),
            ("bash", json!({"command": "exit 3"})),
            ("bash", json!({"command": "echo still serving"})),
        ],
    );
    assert_eq!(answers[0].outcome(), "execution_error", "{answers:?}");
    assert_eq!(
        answers[0].content,
        "Error [execution_error]: killed by SIGKILL; output:\nstarted"
    );
    assert_eq!(
        answers[1].content,
        "Error [execution_error]: killed by SIGSEGV"
    );
    assert_eq!(
        answers[2].content,
        "Error [execution_error]: killed by SIGTERM"
    );
    assert_eq!(answers[3].outcome(), "ok");
    assert_eq!(answers[3].content, "plain\n[exit code: 137]");
    assert_eq!(answers[4].content, "(no output)\n[exit code: 3]");
    assert_eq!(answers[5].content, "still serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_both_modes_a_signal_death_is_an_error_and_an_exit_status_is_not() {
    for isolation in [Isolation::Auto, Isolation::Off] {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let spec = common::direct::in_workspace(bash::spec_with(isolation), &ws);
        let Handler::Async(f) = &spec.handler else {
            panic!("bash is async")
        };
        let run = |command: &str| {
            let ctx =
                common::direct::ctx("killed", Duration::from_secs(60), CancellationToken::new());
            f(json!({ "command": command }), ctx)
        };
        let err = run("kill -9 $$").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError, "{isolation:?}");
        assert_eq!(err.detail, "killed by SIGKILL");
        // The program bash runs in its place (the last command) is the one the OOM killer hits.
        let err = run("cd . && bash -c 'kill -9 $$'").await.unwrap_err();
        assert_eq!(err.detail, "killed by SIGKILL");
        let ok = run("exit 137").await.unwrap();
        assert_eq!(ok, "(no output)\n[exit code: 137]", "{isolation:?}");
        // A child killed while the shell goes on is the shell's business: a plain status.
        let ok = run("bash -c 'kill -9 $$'; echo after").await.unwrap();
        assert!(ok.starts_with("after\n"), "{ok}");
    }
}
