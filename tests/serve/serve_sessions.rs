//! `switchboard serve` sessions over real HTTP on 127.0.0.1:0: workspace names, refused sessions
//! that make no workspace, workspaces that cannot reach each other, idle expiry, and 64 sessions
//! × 50 turns answered exactly once, in order.

use crate::serve_common;

use std::time::Duration;

use serde_json::{Value, json};
use serve_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_workspace_names_are_refused_and_create_nothing() {
    let s = start(|_| {}).await;
    let c = client();
    let long = "n".repeat(200);
    for name in [
        "..",
        ".",
        "a/b",
        "",
        long.as_str(),
        "../escape",
        "/tmp",
        "a\\b",
        "ä",
    ] {
        let a = post(
            &c,
            &s.url("/v1/sessions"),
            &json!({"workspace": name}).to_string(),
        )
        .await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{name:?}: {}",
            a.text
        );
    }
    assert_eq!(workspace_count(&s.root.path().join("ws")), 0);
    assert!(!s.root.path().join("escape").exists());
    // A name that exists as a symlink (planted to lead out of the root) or a file is refused.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), s.root.path().join("ws/linked")).unwrap();
    std::fs::write(s.root.path().join("ws/plain"), "x").unwrap();
    for name in ["linked", "plain"] {
        let a = post(
            &c,
            &s.url("/v1/sessions"),
            &json!({"workspace": name}).to_string(),
        )
        .await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{name}: {}",
            a.text
        );
    }
    let ok = "n".repeat(128);
    session(&c, &s, Some(&ok)).await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_session_makes_no_workspace_and_leaves_an_existing_one_as_it_was() {
    let s = start(|_| {}).await;
    let c = client();
    let ws = s.root.path().join("ws");
    let object = json!({"type": "object"});
    let refusals = [
        // A name that is taken: by a built-in, or twice in `tools`.
        json!([{"name": "read_file", "input_schema": object}]),
        json!([{"name": "a", "input_schema": object}, {"name": "a", "input_schema": object}]),
        // A schema that does not compile, or compiles past the engine's bounds.
        json!([{"name": "b", "input_schema":
            {"type": "object", "properties": {"x": {"type": "no-such-type"}}}}]),
        json!([{"name": "g", "input_schema":
            {"type": "object", "properties": {"x": {"type": "string", "pattern": "[^x]{3000}y"}}}}]),
    ];
    let refused = |body: Value| {
        let c = c.clone();
        let url = s.url("/v1/sessions");
        async move {
            let a = post(&c, &url, &body.to_string()).await;
            assert_eq!(
                (a.status, a.code().as_str()),
                (400, "bad_request"),
                "{body}: {}",
                a.text
            );
        }
    };
    std::fs::create_dir(ws.join("kept")).unwrap();
    std::fs::write(ws.join("kept/notes.txt"), "mine").unwrap();
    std::fs::create_dir(ws.join("empty")).unwrap();
    for (i, tools) in refusals.iter().enumerate() {
        let name = format!("new{i}");
        refused(json!({"workspace": name, "tools": tools})).await;
        assert!(!ws.join(&name).exists(), "{tools}: {name} was made");
        // A fresh workspace (no name) is not made either.
        refused(json!({"tools": tools})).await;
        // One that existed stays, as it was, even empty.
        refused(json!({"workspace": "kept", "tools": tools})).await;
        refused(json!({"workspace": "empty", "tools": tools})).await;
    }
    assert_eq!(
        std::fs::read_to_string(ws.join("kept/notes.txt")).unwrap(),
        "mine"
    );
    assert!(ws.join("empty").is_dir());
    assert_eq!(workspace_count(&ws), 2, "only the two that existed");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_cannot_reach_each_others_workspace() {
    let s = start(|_| {}).await;
    let c = client();
    let (a, a_ws) = session(&c, &s, Some("alpha")).await;
    let (b, b_ws) = session(&c, &s, None).await;
    assert_ne!(a_ws, b_ws);
    let w = dispatch(
        &c,
        &s,
        &a,
        &turn(&[(
            "w",
            "write_file",
            json!({"path": "secret.txt", "content": "only alpha"}),
        )]),
    )
    .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let probes = turn(&[
        ("r1", "read_file", json!({"path": "../alpha/secret.txt"})),
        (
            "r2",
            "read_file",
            json!({"path": format!("{a_ws}/secret.txt")}),
        ),
        (
            "r3",
            "write_file",
            json!({"path": "../alpha/secret.txt", "content": "b was here"}),
        ),
        (
            "r4",
            "edit_file",
            json!({"path": format!("{a_ws}/secret.txt"), "old_text": "only", "new_text": "not only"}),
        ),
        ("r5", "glob", json!({"pattern": "**/secret.txt"})),
    ]);
    let answer = dispatch(&c, &s, &b, &probes).await.json();
    let blocks = answer["content"].as_array().unwrap();
    for block in &blocks[..4] {
        let text = block["content"].as_str().unwrap();
        assert!(text.starts_with("Error [permission_denied]"), "{block}");
        assert_eq!(block["is_error"], true);
    }
    assert_eq!(blocks[4]["content"], "(no matches)");
    assert_eq!(
        std::fs::read_to_string(format!("{a_ws}/secret.txt")).unwrap(),
        "only alpha"
    );
    // A second session naming the same workspace shares it (documented).
    let (a2, _) = session(&c, &s, Some("alpha")).await;
    let shared = dispatch(
        &c,
        &s,
        &a2,
        &turn(&[("r", "read_file", json!({"path": "secret.txt"}))]),
    )
    .await;
    assert_eq!(shared.json()["content"][0]["content"], "only alpha");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_closed_and_their_workspaces_stay() {
    let s = start(|c| c.idle_timeout = Duration::from_millis(300)).await;
    let c = client();
    let (id, ws) = session(&c, &s, Some("keep")).await;
    let w = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("w", "write_file", json!({"path": "f", "content": "kept"}))]),
    )
    .await;
    assert_eq!(w.status, 200);
    let url = s.url(&format!("/v1/sessions/{id}"));
    let mut closed = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if get(&c, &url).await.status == 404 {
            closed = true;
            break;
        }
    }
    assert!(closed, "the idle session was never closed");
    assert_eq!(std::fs::read_to_string(format!("{ws}/f")).unwrap(), "kept");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_sessions_of_fifty_turns_each_get_every_result_once_in_order() {
    let s = start(|c| c.load_tools = true).await;
    let mut tasks = Vec::new();
    for n in 0..64 {
        let s_url = s.url("");
        tasks.push(tokio::spawn(async move {
            let c = client();
            let a = post(&c, &format!("{s_url}/v1/sessions"), "{}").await;
            let id = a.json()["session_id"].as_str().unwrap().to_string();
            let url = format!("{s_url}/v1/sessions/{id}/dispatch");
            for t in 0..50 {
                let calls: Vec<(String, &str, Value)> = (0..4)
                    .map(|k| {
                        let tool = if k % 2 == 0 { "noop" } else { "noop_serial" };
                        (
                            format!("s{n}t{t}c{k}"),
                            tool,
                            json!({"text": format!("{n}/{t}/{k}"), "n": 0}),
                        )
                    })
                    .collect();
                let refs: Vec<(&str, &str, Value)> = calls
                    .iter()
                    .map(|(i, t, v)| (i.as_str(), *t, v.clone()))
                    .collect();
                let answer = post(&c, &url, &turn(&refs)).await;
                assert_eq!(answer.status, 200, "{}", answer.text);
                let blocks = answer.json()["content"].as_array().unwrap().clone();
                assert_eq!(blocks.len(), 4);
                for (k, b) in blocks.iter().enumerate() {
                    assert_eq!(b["tool_use_id"], format!("s{n}t{t}c{k}"));
                    assert_eq!(b["content"], format!("{n}/{t}/{k}"));
                }
            }
            let info = get(&c, &format!("{s_url}/v1/sessions/{id}")).await.json();
            assert_eq!(
                (info["turns"].clone(), info["calls"].clone()),
                (json!(50), json!(200))
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_may_narrow_the_servers_sandbox_but_never_widen_it() {
    let s = start(|_| {}).await;
    let c = client();
    let narrowed = post(&c, &s.url("/v1/sessions"), r#"{"sandbox": "read-only"}"#).await;
    assert_eq!(narrowed.status, 201, "{}", narrowed.text);
    let v = narrowed.json();
    let (id, ws) = (
        v["session_id"].as_str().unwrap().to_string(),
        v["workspace"].as_str().unwrap().to_string(),
    );
    let a = dispatch(
        &c,
        &s,
        &id,
        &turn(&[(
            "b",
            "bash",
            serde_json::json!({"command": "echo x > f.txt"}),
        )]),
    )
    .await;
    assert!(
        a.json()["content"][0]["content"]
            .as_str()
            .unwrap()
            .contains("exit code"),
        "{}",
        a.text
    );
    assert!(!std::path::Path::new(&format!("{ws}/f.txt")).exists());
    for wider in [
        r#"{"sandbox": "off"}"#,
        r#"{"sandbox": "best-effort"}"#,
        r#"{"sandbox": {"allow_network": true}}"#,
    ] {
        let a = post(&c, &s.url("/v1/sessions"), wider).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{wider}"
        );
        assert!(a.text.contains("narrow"), "{}", a.text);
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_may_choose_a_stricter_policy_the_server_offers_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("read-only.json");
    std::fs::write(
        &file,
        r#"{"permissions": {"deny": ["bash", "write_file"], "allow": ["edit_file"]}}"#,
    )
    .unwrap();
    let server_policy = dir.path().join("server.json");
    std::fs::write(
        &server_policy,
        r#"{"permissions": {"deny": ["edit_file"], "default": "allow"}}"#,
    )
    .unwrap();
    let spec = format!("reviewer={}", file.display());
    let policies = switchboard::serve::SessionPolicies::load(&[spec]).unwrap();
    let s = start(|config| {
        config.session_policies = policies;
        config.policy.file = Some(server_policy.clone());
    })
    .await;
    let c = client();
    let strict = post(&c, &s.url("/v1/sessions"), r#"{"policy": "reviewer"}"#).await;
    assert_eq!(strict.status, 201, "{}", strict.text);
    let strict = strict.json()["session_id"].as_str().unwrap().to_string();
    let plain = session(&c, &s, None).await.0;
    let calls = turn(&[
        ("b", "bash", serde_json::json!({"command": "echo hi"})),
        (
            "w",
            "write_file",
            serde_json::json!({"path": "a.txt", "content": "x"}),
        ),
        (
            "e",
            "edit_file",
            serde_json::json!({"path": "a.txt", "old_text": "x", "new_text": "y"}),
        ),
        ("g", "glob", serde_json::json!({"pattern": "*"})),
    ]);
    let texts = |a: &Answer| -> Vec<String> {
        a.json()["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["content"].as_str().unwrap().to_string())
            .collect()
    };
    let narrowed = texts(&dispatch(&c, &s, &strict, &calls).await);
    assert!(
        narrowed[0].starts_with("Error [permission_denied]")
            && narrowed[0].contains("session's policy reviewer"),
        "{narrowed:?}"
    );
    assert!(
        narrowed[1].starts_with("Error [permission_denied]"),
        "{narrowed:?}"
    );
    // The session's allow rule does not lift the server's deny.
    assert!(
        narrowed[2].starts_with("Error [permission_denied]") && !narrowed[2].contains("reviewer"),
        "{narrowed:?}"
    );
    assert!(!narrowed[3].starts_with("Error"), "{narrowed:?}");
    // Another session keeps the server's policy only.
    let other = texts(&dispatch(&c, &s, &plain, &calls).await);
    assert_eq!(other[0], "hi", "{other:?}");
    assert!(!other[1].starts_with("Error"), "{other:?}");
    for (body, says) in [
        (r#"{"policy": "admin"}"#, "offers reviewer"),
        (r#"{"policy": 3}"#, "`policy`"),
    ] {
        let a = post(&c, &s.url("/v1/sessions"), body).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{body}"
        );
        assert!(a.text.contains(says), "{}", a.text);
    }
    s.shutdown().await.unwrap();
}

#[test]
fn a_session_policy_that_asks_or_has_hooks_is_refused_when_the_server_starts() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, says) in [
        ("asks", r#"{"permissions": {"ask": ["bash"]}}"#, "not ask"),
        (
            "hooks",
            r#"{"hooks": {"PreToolUse": []}}"#,
            "permissions only",
        ),
        (
            "bad",
            r#"{"permissions": {"deny": 3}}"#,
            "session policy bad",
        ),
    ] {
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, text).unwrap();
        let err =
            switchboard::serve::SessionPolicies::load(&[format!("{name}={}", file.display())])
                .unwrap_err()
                .to_string();
        assert!(err.contains(says), "{name}: {err}");
    }
    for spec in ["noequals", "bad name=x.json", "=x.json"] {
        let err = switchboard::serve::SessionPolicies::load(&[spec.to_string()]).unwrap_err();
        assert!(
            matches!(err, switchboard::serve::SessionPolicyError::Spec { .. }),
            "{spec}: {err}"
        );
        assert!(
            err.to_string().contains("--session-policy"),
            "{spec}: {err}"
        );
    }
}
