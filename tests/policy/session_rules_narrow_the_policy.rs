//! A session's own rules narrow the engine's policy: they deny what it allows (in place and on
//! a worker alike), never allow what it denies; other sessions keep the engine's policy alone.

use crate::common;

use common::call;
use serde_json::json;
use switchboard::policy::{Policy, Rules};
use switchboard::tools::builtin_tools;
use switchboard::{Engine, ErrorCode, SessionError, SessionOptions, Workspace};

fn rules(v: serde_json::Value) -> Rules {
    Rules::from_json(&v).unwrap()
}

#[tokio::test]
async fn session_rules_deny_what_the_policy_allows_and_never_lift_its_denials() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".env"), "SECRET=1").unwrap();
    std::fs::write(dir.path().join("ok.txt"), "fine").unwrap();
    let ws = Workspace::open(dir.path()).unwrap();
    let engine = Engine::builder()
        .tools(builtin_tools())
        .workspace(ws)
        .policy(
            Policy::from_json(&json!({"permissions": {"deny": ["glob"], "default": "allow"}}))
                .unwrap(),
        )
        .build()
        .unwrap();
    let narrowed = engine
        .session_with(SessionOptions::new().rules(
            "no-secrets",
            rules(json!({"deny": ["read_file(**/.env)", "bash"], "allow": ["glob"], "default": "allow"})),
        ))
        .await
        .unwrap();
    let plain = engine.session();
    let calls = || {
        vec![
            call("env", "read_file", json!({"path": ".env"})),
            call("ok", "read_file", json!({"path": "ok.txt"})),
            call("sh", "bash", json!({"command": "echo hi"})),
            call("g", "glob", json!({"pattern": "*"})),
        ]
    };
    let r = narrowed.dispatch(calls()).await.unwrap();
    assert_eq!(
        r[0].error,
        Some(ErrorCode::PermissionDenied),
        "{}",
        r[0].content
    );
    assert!(
        r[0].content.contains("session's policy no-secrets"),
        "{}",
        r[0].content
    );
    assert!(r[1].is_ok(), "{}", r[1].content);
    assert_eq!(
        r[2].error,
        Some(ErrorCode::PermissionDenied),
        "{}",
        r[2].content
    );
    // The session allows glob; the engine's deny still holds.
    assert_eq!(
        r[3].error,
        Some(ErrorCode::PermissionDenied),
        "{}",
        r[3].content
    );
    let p = plain.dispatch(calls()).await.unwrap();
    assert!(
        p[0].is_ok() && p[1].is_ok(),
        "{} / {}",
        p[0].content,
        p[1].content
    );
    assert_eq!(p[3].error, Some(ErrorCode::PermissionDenied));
}

#[tokio::test]
async fn session_rules_need_a_policy_to_narrow_and_may_not_ask() {
    let plain = Engine::builder().tools(builtin_tools()).build().unwrap();
    let err = plain
        .session_with(
            SessionOptions::new().rules("r", rules(json!({"deny": ["bash"], "default": "allow"}))),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, SessionError::Policy(_)), "{err}");
    assert!(err.to_string().contains("no policy"), "{err}");
    let policed = Engine::builder()
        .tools(builtin_tools())
        .policy(Policy::allow_all())
        .build()
        .unwrap();
    for asking in [
        json!({"ask": ["bash"], "default": "allow"}),
        json!({"deny": ["bash"]}),
    ] {
        let err = policed
            .session_with(SessionOptions::new().rules("r", rules(asking)))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not ask"), "{err}");
    }
}
