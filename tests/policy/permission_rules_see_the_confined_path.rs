//! Permission rules decide on what a call really touches: the workspace-relative path after
//! confinement (absolute spellings, `./`, symlinks inside the workspace), and the command. A
//! denied call never runs and its answer names the rule.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::workspace::Confined;
use common::{call, counting_tool, run_turn};
use serde_json::json;
use switchboard::policy::{Policy, Subject};
use switchboard::tools::builtin_tools;
use switchboard::{Engine, ErrorCode, ToolSpec};

fn engine(ws: &switchboard::Workspace, policy: serde_json::Value, extra: Vec<ToolSpec>) -> Engine {
    Engine::builder()
        .tools(builtin_tools())
        .tools(extra)
        .workspace(ws.clone())
        .policy(Policy::from_json(&policy).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_path_rule_cannot_be_dodged_by_spelling_or_symlinks() {
    let c = Confined::new(
        &["ws/cfg"],
        &[("ws/cfg/.env", "SECRET=1"), ("ws/ok.txt", "fine")],
    );
    c.link("cfg/.env", "innocent.txt");
    c.link(c.ws_path("cfg"), "settings");
    let e = engine(
        &c.ws,
        json!({"permissions": {"deny": ["read_file(**/.env)"], "default": "allow"}}),
        vec![],
    );
    let abs = c.ws_path("cfg/.env").display().to_string();
    let spellings = [
        "cfg/.env",
        "./cfg/.env",
        "cfg//.env",
        &abs,
        "innocent.txt",
        "settings/.env",
    ];
    let calls = spellings
        .iter()
        .enumerate()
        .map(|(i, p)| call(&format!("t{i}"), "read_file", json!({"path": p})))
        .chain([call("ok", "read_file", json!({"path": "ok.txt"}))])
        .collect();
    let results = run_turn(&e, calls).await;
    for (r, spelling) in results.iter().zip(spellings) {
        assert_eq!(
            r.error,
            Some(ErrorCode::PermissionDenied),
            "{spelling}: {}",
            r.content
        );
        assert_eq!(
            r.content, "Error [permission_denied]: denied by rule \"read_file(**/.env)\"",
            "{spelling}"
        );
        assert!(!r.content.contains("SECRET"));
    }
    assert!(
        results[6].content.contains("fine"),
        "{}",
        results[6].content
    );
}

#[tokio::test]
async fn a_path_with_dotdot_is_refused_before_any_rule() {
    let c = Confined::new(&[], &[("outside/x", "out")]);
    let e = engine(
        &c.ws,
        json!({"permissions": {"allow": ["read_file"], "default": "deny"}}),
        vec![],
    );
    let results = run_turn(
        &e,
        vec![call("t", "read_file", json!({"path": "a/../../outside/x"}))],
    )
    .await;
    assert_eq!(results[0].error, Some(ErrorCode::PermissionDenied));
    assert!(
        results[0].content.contains("escapes workspace"),
        "{}",
        results[0].content
    );
}

#[tokio::test]
async fn write_rules_confine_writes_to_a_directory() {
    let c = Confined::new(&["ws/src"], &[]);
    let e = engine(
        &c.ws,
        json!({"permissions": {"allow": ["write_file(src/**)"], "default": "deny"}}),
        vec![],
    );
    let results = run_turn(
        &e,
        vec![
            call(
                "a",
                "write_file",
                json!({"path": "src/lib.rs", "content": "x"}),
            ),
            call(
                "b",
                "write_file",
                json!({"path": "Cargo.toml", "content": "x"}),
            ),
        ],
    )
    .await;
    assert_eq!(results[0].error, None, "{}", results[0].content);
    assert_eq!(
        results[1].content,
        "Error [permission_denied]: denied by the policy's default"
    );
    assert!(c.ws_path("src/lib.rs").exists());
    assert!(!c.ws_path("Cargo.toml").exists());
}

#[tokio::test]
async fn bash_rules_deny_by_prefix_and_name_the_rule() {
    let c = Confined::new(&[], &[]);
    let e = engine(
        &c.ws,
        json!({"permissions": {"deny": ["bash(rm:*)"], "default": "allow"}}),
        vec![],
    );
    let results = run_turn(
        &e,
        vec![
            call("a", "bash", json!({"command": "rm -rf ."})),
            call("b", "bash", json!({"command": "echo hi && rm -rf ."})),
        ],
    )
    .await;
    for r in &results {
        assert_eq!(
            r.content,
            "Error [permission_denied]: denied by rule \"bash(rm:*)\""
        );
    }
}

#[tokio::test]
async fn custom_tools_are_matched_through_their_subject_function() {
    let c = Confined::new(&[], &[]);
    let ran = Arc::new(AtomicUsize::new(0));
    let deploy = counting_tool("deploy", Arc::clone(&ran)).subject(|args| {
        args.get("target")
            .and_then(|t| t.as_str())
            .map(|t| Subject::Command(t.to_string()))
    });
    let mcpish = counting_tool("mcp__github__create_issue", Arc::clone(&ran));
    let e = engine(
        &c.ws,
        json!({"permissions": {"deny": ["deploy(prod:*)", "mcp__github__*"], "default": "allow"}}),
        vec![deploy, mcpish],
    );
    let results = run_turn(
        &e,
        vec![
            call("a", "deploy", json!({"target": "prod eu-1"})),
            call("b", "deploy", json!({"target": "staging"})),
            call("c", "mcp__github__create_issue", json!({})),
        ],
    )
    .await;
    assert_eq!(
        common::outcomes(&results),
        ["permission_denied", "ok", "permission_denied"]
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn a_bad_policy_file_is_an_error_naming_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.json");
    std::fs::write(&path, r#"{"permissions": {"deny": ["read_file(src/[)"]}}"#).unwrap();
    let err = Policy::load(&path).unwrap_err().to_string();
    assert!(err.contains("bad rule \"read_file(src/[)\""), "{err}");
    assert!(err.contains("policy.json"), "{err}");
}

/// With hard links allowed, a deny rule on a file holds for its other names in the workspace: a
/// hard link to a denied file is denied too (naming the rule and the denied name), while a hard
/// link to a file no rule denies reads normally.
#[tokio::test]
async fn a_hard_link_does_not_dodge_a_deny_rule_when_hard_links_are_allowed() {
    let c = Confined::new(
        &["ws/keys"],
        &[
            ("ws/keys/id.pem", "PRIVATE-KEY-9"),
            ("ws/notes.md", "notes"),
        ],
    );
    std::fs::hard_link(c.ws_path("keys/id.pem"), c.ws_path("innocent.txt")).unwrap();
    std::fs::hard_link(c.ws_path("notes.md"), c.ws_path("notes-link.md")).unwrap();
    let ws = c.ws.clone().allow_hard_links(true);
    let e = engine(
        &ws,
        json!({"permissions": {"deny": ["read_file(keys/*.pem)"], "default": "allow"}}),
        vec![],
    );
    let results = run_turn(
        &e,
        vec![
            call("a", "read_file", json!({"path": "innocent.txt"})),
            call("b", "read_file", json!({"path": "notes-link.md"})),
        ],
    )
    .await;
    assert_eq!(
        results[0].error,
        Some(ErrorCode::PermissionDenied),
        "{}",
        results[0].content
    );
    assert!(
        !results[0].content.contains("PRIVATE-KEY"),
        "{}",
        results[0].content
    );
    assert!(
        results[0].content.contains("read_file(keys/*.pem)")
            && results[0].content.contains("keys/id.pem"),
        "{}",
        results[0].content
    );
    assert_eq!(results[1].error, None, "{}", results[1].content);
    assert!(results[1].content.contains("notes"));
}
