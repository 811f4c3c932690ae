//! The real `switchboard serve` binary: refusing to start without a token or with `--no-auth`
//! off loopback, serving `/metrics` with the HTTP series, SIGTERM during a running call (every
//! request in flight gets its complete answer, exit 0), and SIGHUP reopening the audit log
//! without stopping anything.

use crate::serve_common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use serve_common::*;

fn serve_cmd(root: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.arg("serve")
        .arg("--workspace-root")
        .arg(root)
        .env_remove("SWITCHBOARD_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn no_auth_is_refused_off_loopback_and_a_missing_token_says_how_to_give_one() {
    let root = tempfile::tempdir().unwrap();
    let out = serve_cmd(root.path())
        .args(["--listen", "0.0.0.0:0", "--no-auth"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--no-auth is refused") && err.contains("loopback"),
        "{err}"
    );

    let out = serve_cmd(root.path())
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token-file") && err.contains("SWITCHBOARD_TOKEN"),
        "{err}"
    );
}

#[test]
fn a_token_from_the_environment_or_a_file_is_required_on_v1() {
    let root = tempfile::tempdir().unwrap();
    let token_file = root.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut cmd = serve_cmd(&root.path().join("ws"));
    cmd.args(["--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token_file);
    let (mut child, base) = spawn_server(cmd);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = client();
        let url = format!("{base}/v1/tools");
        assert_eq!(send(c.get(&url)).await.status, 401);
        assert_eq!(send(c.get(&url).bearer_auth(TOKEN)).await.status, 200);
        let metrics = send(c.get(format!("{base}/metrics"))).await;
        assert!(
            metrics
                .text
                .contains(r#"switchboard_http_requests_total{route="/v1/tools",status="401"} 1"#),
            "{}",
            metrics.text
        );
        assert!(
            metrics
                .text
                .contains(r#"switchboard_http_request_seconds_count{route="/v1/tools"} 2"#)
        );
        assert!(
            !metrics.text.contains("route=\"/v1/sessions/s"),
            "no session id as a label"
        );
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
}

/// SIGTERM while a `sleep 30` runs: the request in flight gets every result (the call
/// cancelled after the grace period, the call after it too), and the server exits 0.
#[test]
fn sigterm_during_a_running_call_answers_it_fully_and_exits_zero() {
    let root = tempfile::tempdir().unwrap();
    let mut cmd = serve_cmd(&root.path().join("ws"));
    cmd.args(["--listen", "127.0.0.1:0", "--no-auth", "--grace", "500ms"]);
    let (mut child, base) = spawn_server(cmd);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async {
        let c = client();
        let created = send(c.post(format!("{base}/v1/sessions")).body("{}")).await;
        let v = created.json();
        let (id, ws) = (
            v["session_id"].as_str().unwrap().to_string(),
            v["workspace"].as_str().unwrap().to_string(),
        );
        let body = turn(&[
            ("a", "write_file", json!({"path": "a.txt", "content": "a"})),
            (
                "b",
                "bash",
                json!({"command": "touch started; sleep 30; echo never"}),
            ),
            ("c", "write_file", json!({"path": "c.txt", "content": "c"})),
        ]);
        let running = {
            let url = format!("{base}/v1/sessions/{id}/dispatch");
            tokio::spawn(async move { send(c.post(url).body(body)).await })
        };
        let started = std::path::PathBuf::from(format!("{ws}/started"));
        assert!(appears(&started, Duration::from_secs(20)).await);
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        tokio::time::timeout(Duration::from_secs(30), running)
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!(answer.status, 200, "{}", answer.text);
    let blocks = answer.json()["content"].as_array().unwrap().clone();
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[0]["content"], "Wrote 1 bytes to a.txt");
    assert!(
        blocks[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [cancelled]"),
        "{}",
        blocks[1]
    );
    assert!(
        blocks[2]["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [cancelled]"),
        "{}",
        blocks[2]
    );
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
}

/// A call that finishes within the grace period keeps its real result.
#[test]
fn sigterm_lets_a_call_finish_within_the_grace_period() {
    let root = tempfile::tempdir().unwrap();
    let mut cmd = serve_cmd(&root.path().join("ws"));
    cmd.args(["--listen", "127.0.0.1:0", "--no-auth", "--grace", "20s"]);
    let (mut child, base) = spawn_server(cmd);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async {
        let c = client();
        let created = send(c.post(format!("{base}/v1/sessions")).body("{}")).await;
        let v = created.json();
        let (id, ws) = (
            v["session_id"].as_str().unwrap().to_string(),
            v["workspace"].as_str().unwrap().to_string(),
        );
        let body = turn(&[(
            "b",
            "bash",
            json!({"command": "touch started; sleep 1; echo finished"}),
        )]);
        let running = {
            let url = format!("{base}/v1/sessions/{id}/dispatch");
            tokio::spawn(async move { send(c.post(url).body(body)).await })
        };
        let started = std::path::PathBuf::from(format!("{ws}/started"));
        assert!(appears(&started, Duration::from_secs(20)).await);
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        tokio::time::timeout(Duration::from_secs(30), running)
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(answer.json()["content"][0]["content"], "finished");
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
}

/// `serve --audit-log`: SIGHUP (as logrotate sends after renaming the log) neither stops the
/// server nor ends a session; the next call's line goes to a new file at the path, the renamed
/// file keeps what it had, and SIGTERM still stops the server (exit 0) with every line written.
#[test]
fn sighup_reopens_the_audit_log_and_sigterm_still_stops_the_server() {
    let root = tempfile::tempdir().unwrap();
    let audit = root.path().join("audit.jsonl");
    let mut cmd = serve_cmd(&root.path().join("ws"));
    cmd.args(["--listen", "127.0.0.1:0", "--no-auth", "--audit-log"])
        .arg(&audit);
    let (child, base) = spawn_server(cmd);
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    let rotated = root.path().join("audit.jsonl.1");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = client();
        let created = send(c.post(format!("{base}/v1/sessions")).body("{}")).await;
        let id = created.json()["session_id"].as_str().unwrap().to_string();
        let url = format!("{base}/v1/sessions/{id}/dispatch");
        let glob = |call: &str| turn(&[(call, "glob", json!({"pattern": "*"}))]);
        let first = send(c.post(&url).body(glob("before"))).await;
        assert_eq!(first.status, 200, "{}", first.text);
        let written = eventually(Duration::from_secs(20), || {
            let audit = audit.clone();
            async move { file_lines(&audit).len() == 1 }
        })
        .await;
        assert!(written, "the first line reached the log");
        std::fs::rename(&audit, &rotated).unwrap();
        for _ in 0..3 {
            rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
        }
        let second = send(c.post(&url).body(glob("after"))).await;
        assert_eq!(second.status, 200, "{}", second.text);
    });
    terminate(child);
    let id_of = |line: &String| {
        serde_json::from_str::<serde_json::Value>(line).unwrap()["tool_use_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let old: Vec<String> = file_lines(&rotated).iter().map(id_of).collect();
    let new: Vec<String> = file_lines(&audit).iter().map(id_of).collect();
    assert_eq!(old, ["before"]);
    assert_eq!(
        new,
        ["after"],
        "the line after SIGHUP is in a new file at the path"
    );
}
