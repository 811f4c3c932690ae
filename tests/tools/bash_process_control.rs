//! bash under control: no process started by a call survives it (background jobs, `setsid`
//! daemons, double forks — after success, timeout and cancellation, with and without namespaces),
//! timeouts and cancellation answer with the partial output, `timeout_ms` is a bounded per-call
//! limit, and each process carries the call's marker so all of this can be checked from `/proc`.

use crate::common;

use common::TURN_BOUND;

use std::time::Duration;

use serde_json::{Value, json};
use switchboard::Workspace;
use switchboard::protocol::ErrorCode;
use switchboard::tool::{ToolOutcome, ToolSpec};
use switchboard::tools::bash::{self, Isolation, Launcher};

use common::direct::{survivors, unique_id};
use common::workspace::temp_workspace;
use switchboard::ToolCall;
use tokio_util::sync::CancellationToken;

/// Waits (bounded) until `path` exists.
async fn wait_for_file(path: &std::path::Path) {
    tokio::time::timeout(TURN_BOUND, async {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the command got going");
}

struct Bash {
    _tmp: tempfile::TempDir,
    ws: Workspace,
    spec: ToolSpec,
}

impl Bash {
    fn new(isolation: Isolation) -> Self {
        let (tmp, ws) = temp_workspace();
        let spec = common::direct::in_workspace(bash::spec_with(isolation), &ws);
        Bash {
            _tmp: tmp,
            ws,
            spec,
        }
    }

    /// Runs a command as call `id`, cancelled by `cancel`, bounded (10 s).
    async fn run(&self, id: &str, args: Value, cancel: CancellationToken) -> ToolOutcome {
        common::direct::call_bounded(&self.spec, id, args, cancel).await
    }
}

/// A command that leaves daemons behind in every way a shell can: a background job, `setsid`,
/// a double fork into a new session, `nohup`, and a daemon that empties its own environment
/// variables except the marker (which it cannot shed without losing our tracking — see the
/// direct-mode test). `ready` appears once they are all started.
const DAEMONS: &str = "sleep 300 & \
    setsid sleep 301 & \
    ( setsid sh -c 'sleep 302 & sleep 303' & ) ; \
    nohup sleep 304 >/dev/null 2>&1 & \
    sleep 0.1; touch ready";

async fn no_daemon_survives(isolation: Isolation) {
    let b = Bash::new(isolation);
    // After a successful command.
    let id = unique_id("daemons-ok");
    let out = b
        .run(
            &id,
            json!({"command": format!("{DAEMONS}; echo spawned")}),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(out.unwrap(), "spawned");
    assert!(b.ws.root().join("ready").exists());
    assert_eq!(survivors(&id).await, Vec::<String>::new(), "after success");

    // After a timeout.
    let id = unique_id("daemons-timeout");
    let err = b
        .run(
            &id,
            json!({"command": format!("{DAEMONS}; sleep 30"), "timeout_ms": 1000}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout, "{}", err.detail);
    assert_eq!(
        survivors(&id).await,
        Vec::<String>::new(),
        "after a timeout"
    );

    // After cancellation.
    std::fs::remove_file(b.ws.root().join("ready")).unwrap();
    let id = unique_id("daemons-cancel");
    let cancel = CancellationToken::new();
    let args = json!({"command": format!("{DAEMONS}; sleep 30")});
    let (outcome, ()) = tokio::join!(b.run(&id, args, cancel.clone()), async {
        wait_for_file(&b.ws.root().join("ready")).await;
        cancel.cancel();
    });
    let err = outcome.unwrap_err();
    assert_eq!(err.code, ErrorCode::Cancelled, "{}", err.detail);
    assert_eq!(survivors(&id).await, Vec::<String>::new(), "after cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_root_commands_run_in_their_own_pid_and_mount_namespaces() {
    if !rustix::process::geteuid().is_root() {
        return; // Unprivileged: namespaces depend on the system's user-namespace policy.
    }
    let launcher = bash::probe_launcher().await;
    assert!(
        matches!(launcher, Launcher::Namespaces { .. }),
        "as root, unshare must work: {launcher:?}"
    );
    let b = Bash::new(Isolation::Auto);
    let out = b
        .run(
            "ns",
            json!({"command": "echo $$ $PPID; ls /proc | grep -c '^[0-9]'; kill -9 $$"}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(out.code, ErrorCode::ExecutionError);
    let out = out.detail;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1], "2 1",
        "the shell runs under the namespace's own init"
    );
    let visible: usize = lines[2].parse().unwrap();
    assert!(
        visible < 10,
        "/proc shows only the call's processes: {visible}"
    );
    // The shell is no init: it can be killed like any process, and says so.
    assert_eq!(lines[0], "killed by SIGKILL; output:", "{out}");
    assert_eq!(
        lines.len(),
        3,
        "no job notice from the init in the output: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_process_survives_a_call_in_namespace_mode() {
    no_daemon_survives(Isolation::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_process_survives_a_call_in_direct_mode_either() {
    no_daemon_survives(Isolation::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_answers_with_the_partial_output() {
    let b = Bash::new(Isolation::Auto);
    let id = unique_id("partial-timeout");
    let err = b
        .run(
            &id,
            json!({"command": "echo first line; echo to stderr >&2; sleep 30; echo never", "timeout_ms": 700}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
    assert_eq!(
        err.detail,
        "timeout (0.7s); partial output:\nfirst line\nto stderr"
    );
    assert_eq!(survivors(&id).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_answers_with_the_partial_output() {
    for isolation in [Isolation::Auto, Isolation::Off] {
        let b = Bash::new(isolation);
        let id = unique_id("partial-cancel");
        let cancel = CancellationToken::new();
        let ready = b.ws.root().join("ready");
        let args = json!({"command": "echo working; touch ready; sleep 30; echo never"});
        let (outcome, ()) = tokio::join!(b.run(&id, args, cancel.clone()), async {
            wait_for_file(&ready).await;
            cancel.cancel();
        });
        let err = outcome.unwrap_err();
        assert_eq!(
            (err.code, err.detail.as_str()),
            (ErrorCode::Cancelled, "cancelled; partial output:\nworking"),
            "{isolation:?}"
        );
        assert_eq!(survivors(&id).await, Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_output_of_a_flood_is_capped() {
    let b = Bash::new(Isolation::Auto);
    let err = b
        .run(
            "flood",
            json!({"command": "head -c 3000000 /dev/zero | tr '\\0' x; sleep 30", "timeout_ms": 1500}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
    assert!(
        err.detail.len() <= bash::OUTPUT_CAP,
        "{} bytes",
        err.detail.len()
    );
    assert!(err.detail.starts_with("timeout (1.5s); partial output:\n"));
    // One line of 3 MB: head and tail of it around one marker.
    assert_eq!(
        err.detail.matches("bytes truncated").count(),
        1,
        "one marker"
    );
    assert!(
        err.detail.len() > bash::OUTPUT_CAP - 2_000,
        "{}",
        err.detail.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_engine_timeouts_and_cancellation_keep_the_partial_output() {
    let (_tmp, ws) = temp_workspace();
    let engine = common::builtin_engine(&ws, Vec::new());
    let id = unique_id("engine-timeout");
    let results = tokio::time::timeout(
        TURN_BOUND,
        engine.dispatch(vec![
            ToolCall::new(
                id.as_str(),
                "bash",
                json!({"command": "echo partial; sleep 30", "timeout_ms": 500}),
            ),
            ToolCall::new("after", "bash", json!({"command": "echo next"})),
        ]),
    )
    .await
    .unwrap()
    .expect("engine available");
    assert_eq!(results[0].error, Some(ErrorCode::Timeout));
    assert_eq!(
        results[0].content,
        "Error [timeout]: timeout (0.5s); partial output:\npartial"
    );
    assert_eq!(results[1].content, "next");
    assert_eq!(survivors(&id).await, Vec::<String>::new());

    let session = engine.session();
    let id = unique_id("engine-cancel");
    let ready = ws.root().join("ready");
    let turn = session.dispatch(vec![
        ToolCall::new(
            id.as_str(),
            "bash",
            json!({"command": "echo begun; touch ready; sleep 30"}),
        ),
        ToolCall::new("never", "bash", json!({"command": "touch ran"})),
    ]);
    let (results, ()) = tokio::join!(tokio::time::timeout(TURN_BOUND, turn), async {
        wait_for_file(&ready).await;
        session.cancel();
    });
    let results = results.unwrap().expect("engine available");
    assert_eq!(results[0].error, Some(ErrorCode::Cancelled));
    assert_eq!(
        results[0].content,
        "Error [cancelled]: cancelled; partial output:\nbegun"
    );
    assert_eq!(results[1].error, Some(ErrorCode::Cancelled));
    assert!(
        !ws.root().join("ran").exists(),
        "the unstarted call never ran"
    );
    assert_eq!(survivors(&id).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_ms_is_validated_and_bounds_the_call() {
    let (_tmp, ws) = temp_workspace();
    let engine = common::builtin_engine(&ws, Vec::new());
    let bad = [
        json!(0),
        json!(-5),
        json!(600_001),
        json!(u64::MAX),
        json!("100"),
        json!(1.5),
        json!(true),
        json!(null),
        json!({}),
    ];
    let mut calls: Vec<ToolCall> = bad
        .iter()
        .enumerate()
        .map(|(i, v)| {
            ToolCall::new(
                format!("bad{i}"),
                "bash",
                json!({"command": "touch ran", "timeout_ms": v}),
            )
        })
        .collect();
    calls.push(ToolCall::new(
        "max",
        "bash",
        json!({"command": "echo ok", "timeout_ms": 600_000}),
    ));
    calls.push(ToolCall::new(
        "min",
        "bash",
        json!({"command": "sleep 5", "timeout_ms": 1}),
    ));
    let results = tokio::time::timeout(TURN_BOUND, engine.dispatch(calls))
        .await
        .unwrap()
        .expect("engine available");
    for r in &results[..bad.len()] {
        assert_eq!(r.error, Some(ErrorCode::InvalidArguments), "{}", r.content);
        assert!(r.content.contains("/timeout_ms"), "{}", r.content);
    }
    assert!(!ws.root().join("ran").exists());
    assert_eq!(results[bad.len()].content, "ok");
    assert_eq!(
        results[bad.len() + 1].content,
        "Error [timeout]: timeout (1ms)"
    );
}

/// The session (and process group) of a live process, from `/proc/PID/stat`.
fn session_and_group(pid: &str) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state, ppid, pgrp, session, …
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.get(3)?.parse().ok()?, fields.get(2)?.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_sandbox_a_command_still_leads_a_session_of_its_own() {
    // Without the sandbox's trampoline, `setsid` (util-linux, like `unshare`) makes the session.
    let found = std::process::Command::new("sh")
        .args(["-c", "command -v setsid"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        println!("SKIPPED: no `setsid` on PATH");
        return;
    }
    // From /proc, not getsid(2): a process whose session leader is outside its PID namespace
    // (CI's container) is in session 0, which rustix's `Pid` cannot hold.
    let (own, _) = session_and_group("self").expect("this process's /proc/self/stat");
    for isolation in [Isolation::Auto, Isolation::Off] {
        let b = Bash::new(isolation);
        let id = unique_id("session");
        let cancel = CancellationToken::new();
        let ready = b.ws.root().join("ready");
        let args = json!({"command": "sleep 30 & touch ready; wait"});
        let (outcome, seen) = tokio::join!(b.run(&id, args, cancel.clone()), async {
            wait_for_file(&ready).await;
            let seen: Vec<(String, Option<(i32, i32)>)> = common::direct::marked_processes(&id)
                .into_iter()
                .map(|pid| {
                    let ids = session_and_group(&pid);
                    (pid, ids)
                })
                .collect();
            cancel.cancel();
            seen
        });
        assert_eq!(outcome.unwrap_err().code, ErrorCode::Cancelled);
        assert!(seen.len() >= 2, "{isolation:?}: {seen:?}");
        let (session, group) = seen[0].1.expect("a live process");
        assert_ne!(
            session, own,
            "{isolation:?}: the engine's session: {seen:?}"
        );
        assert_eq!(session, group, "{isolation:?}: {seen:?}");
        for (pid, ids) in &seen {
            assert_eq!(
                *ids,
                Some((session, group)),
                "{isolation:?}: process {pid} is elsewhere: {seen:?}"
            );
        }
        assert!(
            seen.iter().any(|(pid, _)| *pid == session.to_string()),
            "{isolation:?}: the session's leader is a process of the call: {seen:?}"
        );
        assert_eq!(survivors(&id).await, Vec::<String>::new());
    }
}
