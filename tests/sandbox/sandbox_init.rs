//! The init of a call's namespaces is the trampoline *forked* (from the engine's spawner: no
//! program start per call besides the command's shell), in every mode — and with `--sandbox off` too, where it replaces `unshare` and an init
//! shell: the command's shell is pid 2 under it, `/proc` shows only the call, `kill $$` is told
//! as a death by that signal while `exit 137` stays an exit status, and nothing the command
//! started outlives the call. An engine that is not root gets the same, the trampoline making
//! the user namespace itself (the CLI run as `nobody`).

use crate::common;

use std::time::Duration;

use common::direct::survivors;
use common::sandbox::*;
use switchboard::ErrorCode;
use switchboard::sandbox::SandboxMode;
use switchboard::tools::bash::CALL_ID_VAR;

/// What a call sees of its namespace: `$$ $PPID`, the init's name, its command line (NUL
/// separated, shown with spaces), how many processes `/proc` lists, and the shell's `$0`.
const LOOK: &str = "echo $$ $PPID; cat /proc/1/comm; tr '\\0' ' ' < /proc/1/cmdline; echo; \
                    ls /proc | grep -c '^[0-9]'; echo \"$0\"";

fn as_root() -> bool {
    available(
        "root (an unprivileged engine is tested by running the CLI as nobody, below)",
        rustix::process::geteuid().is_root(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_every_mode_the_command_runs_under_the_forked_trampoline_as_pid_1() {
    if !as_root() {
        return;
    }
    for mode in [
        SandboxMode::Off,
        SandboxMode::WorkspaceWrite,
        SandboxMode::ReadOnly,
    ] {
        let (_dir, ws) = temp_workspace();
        let Some(engine) = engine(Some(&ws), config(mode)) else {
            return;
        };
        let session = engine.session();
        let r = bash(&session, LOOK).await;
        let out = ok_text(&r);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0], "2 1",
            "{mode}: the shell is pid 2 under the init: {out}"
        );
        // The kernel keeps 15 bytes of a name.
        assert_eq!(lines[1], "switchboard-san", "{mode}: {out}");
        // Forked: the init's command line is the engine's spawner's, not a start of the
        // trampoline for the call (nor a second one, `sandbox-exec --inner …`).
        assert!(
            lines[2].contains(" sandbox-exec --spawner "),
            "{mode}: {out}"
        );
        assert!(
            !lines[2].contains("--inner"),
            "{mode}: a second start: {out}"
        );
        let visible: usize = lines[3].parse().unwrap();
        assert!(visible < 10, "{mode}: /proc shows only the call: {out}");
        // Found in the command's PATH by the init, started under the name it was given.
        assert_eq!(lines[4], "bash", "{mode}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_sandbox_off_deaths_exits_and_leftovers_are_as_under_an_init_shell() {
    if !as_root() {
        return;
    }
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::Off)) else {
        return;
    };
    assert_eq!(engine.sandbox().describe()["trampoline"], TRAMPOLINE);
    let session = engine.session();
    let killed = bash(&session, "echo started; kill -9 $$").await;
    assert_eq!(
        error_text(&killed, ErrorCode::ExecutionError),
        "Error [execution_error]: killed by SIGKILL; output:\nstarted"
    );
    let termed = bash(&session, "kill -TERM $$").await;
    assert_eq!(
        error_text(&termed, ErrorCode::ExecutionError),
        "Error [execution_error]: killed by SIGTERM"
    );
    let exited = bash(&session, "echo plain; exit 137").await;
    assert_eq!(ok_text(&exited), "plain\n[exit code: 137]");
    // Off means off: the engine's TMPDIR (if any), not a private one; no limits named.
    let cpu = bash(&session, "kill -XCPU $$").await;
    assert_eq!(
        error_text(&cpu, ErrorCode::ExecutionError),
        "Error [execution_error]: killed by SIGXCPU"
    );

    // Daemons of every kind end with the call.
    let id = common::fresh("off-daemons");
    let command = format!(
        "setsid sleep 300 & (sleep 300 &); nohup sleep 300 >/dev/null 2>&1 & echo ${CALL_ID_VAR}"
    );
    let call = bash_call(&id, &command, Duration::from_secs(60));
    let r = session.dispatch(vec![call]).await.unwrap().remove(0);
    assert_eq!(ok_text(&r), id);
    assert_eq!(survivors(&id).await, Vec::<String>::new());
}

/// `setpriv` and unprivileged user namespaces, to run the CLI as `nobody`.
fn nobody_can_have_namespaces() -> bool {
    let works = std::process::Command::new("setpriv")
        .args(NOBODY)
        .args(["unshare", "--user", "--map-root-user", "true"])
        .status()
        .is_ok_and(|s| s.success());
    available("setpriv and unprivileged user namespaces", works)
}

/// `setpriv` arguments that drop to `nobody`.
const NOBODY: [&str; 3] = ["--reuid=65534", "--regid=65534", "--clear-groups"];

#[test]
fn for_an_unprivileged_engine_the_trampoline_makes_the_user_namespace_itself() {
    if !as_root() || !nobody_can_have_namespaces() {
        return;
    }
    let (dir, ws) = temp_workspace();
    // `nobody` may enter the temporary directory and owns the workspace.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(ws.root(), Some(65534), Some(65534)).unwrap();
    for mode in ["workspace-write", "off"] {
        let turn = serde_json::json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "look", "name": "bash",
             "input": {"command": format!("{LOOK}; id -u; touch mine && stat -c %u mine")}},
            {"type": "tool_use", "id": "kill", "name": "bash", "input": {"command": "kill -9 $$"}},
            {"type": "tool_use", "id": "exit", "name": "bash", "input": {"command": "exit 137"}}
        ]});
        let mut cli = std::process::Command::new("setpriv");
        cli.args(NOBODY)
            .arg(CLI)
            .args(["dispatch", "--sandbox", mode, "--workspace"])
            .arg(ws.root());
        let out = common::cli::fed(cli, turn.to_string().as_bytes());
        assert!(out.status.success(), "{mode}: {out:?}");
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = |i: usize| {
            answer["content"][i]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let look = text(0);
        let lines: Vec<&str> = look.lines().collect();
        assert_eq!(lines[0], "2 1", "{mode}: {look}");
        assert_eq!(lines[1], "switchboard-san", "{mode}: {look}");
        // Neither `unshare` nor a start of the trampoline came in between: the init is the
        // engine's spawner forked, and it made the user namespace itself (root inside, below).
        assert!(!lines[2].contains("--inner"), "{mode}: {look}");
        assert!(
            lines[2].contains(" sandbox-exec --spawner "),
            "{mode}: {look}"
        );
        let visible: usize = lines[3].parse().unwrap();
        assert!(visible < 10, "{mode}: {look}");
        assert_eq!(lines[4], "bash", "{mode}: {look}");
        // Root inside its namespace, the user outside: what it writes belongs to `nobody`.
        assert_eq!(&lines[5..], ["0", "0"], "{mode}: {look}");
        let owner = std::fs::metadata(ws.root().join("mine")).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&owner), 65534);
        std::fs::remove_file(ws.root().join("mine")).unwrap();
        assert_eq!(
            text(1),
            "Error [execution_error]: killed by SIGKILL",
            "{mode}"
        );
        assert_eq!(text(2), "(no output)\n[exit code: 137]", "{mode}");
    }
}
