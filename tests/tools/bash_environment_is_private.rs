//! The engine's environment never reaches a bash command: not through inheritance (the child's
//! environment is an allowlist, whatever the parent's variables are called), and not by reading
//! the engine's process (`/proc/$PPID/environ`, `/proc/<engine pid>/environ`, `ps eww`) — also as
//! root. `BASH_ENV`/`ENV` never run, `LD_PRELOAD` never passes.

use crate::common;

use common::workspace::temp_workspace;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard::ToolCall;
use tokio::io::AsyncWriteExt;

const BOUND: Duration = Duration::from_secs(15);

/// What a command runs to look for the engine's secrets in every place it could find them.
fn snoop(engine_pid: u32) -> String {
    format!(
        "env; echo ---; cat /proc/$PPID/environ; cat /proc/{engine_pid}/environ; \
         cat /proc/1/environ; ps eww -A 2>&1; for f in /proc/[0-9]*/environ; do cat $f; done; \
         echo; echo SNOOPED"
    )
}

/// Names set by `env` that may appear: the allowlist, the call marker, the call's idempotency
/// key, and bash's own.
fn assert_only_allowed_names(env_output: &str) {
    let names: BTreeSet<&str> = env_output
        .lines()
        .take_while(|l| *l != "---")
        .filter_map(|l| l.split_once('='))
        .map(|(k, _)| k)
        .collect();
    let allowed = switchboard::tools::bash::INHERITED_ENV;
    for name in &names {
        assert!(
            allowed.contains(name)
                || [
                    "HOME",
                    "PWD",
                    "SWITCHBOARD_CALL_ID",
                    "SWITCHBOARD_IDEMPOTENCY_KEY",
                    "SWITCHBOARD_CALL_TOKEN",
                    "SHLVL",
                    "_",
                    "OLDPWD",
                ]
                .contains(name),
            "variable {name} reached the command"
        );
    }
    assert!(names.contains("SWITCHBOARD_CALL_ID"), "{env_output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatch_binary_keeps_its_secrets_from_bash() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let ws = base.join("ws");
    std::fs::create_dir(&ws).unwrap();
    // A startup file bash would run if BASH_ENV/ENV reached it.
    let rc = base.join("evil_rc.sh");
    let ran = base.join("rc_ran");
    std::fs::write(&rc, format!("echo RC-FILE-RAN; touch {}\n", ran.display())).unwrap();
    let secrets = [
        ("DATABASE_URL", "postgres://app:db-pass-5eb1@db/prod"),
        ("SSH_AUTH_SOCK", "/tmp/ssh-agent-sock-3c9d"),
        ("ANTHROPIC_API_KEY", "sk-ant-api-key-77aa19"),
        ("OPENAI_API_KEY", "sk-openai-key-e0e0e1"),
        ("LC_SMUGGLED", "lc-smuggled-4242"),
        ("LD_PRELOAD", "/nonexistent/preload-f00d.so"),
        ("SECRET_WITH_NEWLINE", "line1\nhidden-line-9a9a"),
    ];
    let mut cmd = tokio::process::Command::new(common::cli::BIN);
    cmd.args(["dispatch", "--workspace"])
        .arg(&ws)
        .env("BASH_ENV", &rc)
        .env("ENV", &rc)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in secrets {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let engine_pid = child.id().unwrap();
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "snoop", "name": "bash", "input": {"command": snoop(engine_pid)}},
        {"type": "tool_use", "id": "rc", "name": "bash", "input": {"command": "echo plain"}}
    ]});
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(turn.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("dispatch finished")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc: Value = serde_json::from_str(stdout.trim()).unwrap();
    let snooped = doc["content"][0]["content"].as_str().unwrap();
    assert!(
        snooped.contains("SNOOPED"),
        "the command ran to the end: {snooped}"
    );
    assert_only_allowed_names(snooped);
    for (name, value) in secrets {
        let value = value.rsplit('\n').next().unwrap();
        assert!(
            !stdout.contains(value),
            "{name} leaked to the command:\n{snooped}"
        );
    }
    assert!(
        !stdout.contains(&rc.display().to_string()),
        "BASH_ENV leaked"
    );
    assert!(!stdout.contains("RC-FILE-RAN"), "BASH_ENV/ENV ran");
    assert!(!ran.exists(), "BASH_ENV/ENV ran");
    assert_eq!(doc["content"][1]["content"], "plain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_in_this_process_keeps_the_test_processs_environment_from_bash() {
    // Cargo gives the test process variables that bash must not see (no set_var needed).
    let description = std::env::var("CARGO_PKG_DESCRIPTION").unwrap();
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    assert!(!description.is_empty());
    let (_tmp, ws) = temp_workspace();
    let engine = common::builtin_engine(&ws, Vec::new());
    let results = tokio::time::timeout(
        BOUND,
        engine.dispatch(vec![ToolCall::new(
            "snoop-lib",
            "bash",
            json!({"command": snoop(std::process::id())}),
        )]),
    )
    .await
    .unwrap()
    .expect("engine available");
    let out = &results[0].content;
    assert!(out.contains("SNOOPED"), "{out}");
    assert_only_allowed_names(out);
    assert!(!out.contains(&description), "engine environment leaked");
    assert!(
        !out.contains(&format!("CARGO_MANIFEST_DIR={manifest}")),
        "engine environment leaked"
    );
    assert!(!out.contains("CARGO_"), "a CARGO_ variable leaked:\n{out}");
}
