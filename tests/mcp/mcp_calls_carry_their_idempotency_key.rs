//! Every `tools/call` the engine sends carries the call's idempotency key in its `_meta`, under
//! `io.switchboard/idempotency-key` (a key MCP's naming rules allow and do not reserve), beside
//! rmcp's own `progressToken`: the key of the session and the `tool_use_id`, another for another
//! session. Needs python3 (the misbehaving test server echoes `_meta`).

use crate::common;

use std::time::Duration;

use common::mcp::*;
use serde_json::{Value, json};
use switchboard::mcp::IDEMPOTENCY_META_KEY;
use switchboard::tool::idempotency_key;
use switchboard::{Engine, SessionOptions};

/// The `_meta` the server received for call `id` of session `session`.
async fn meta_seen(engine: &Engine, session: &str, id: &str) -> Value {
    let session = engine
        .session_with(SessionOptions::new().id(session))
        .await
        .expect("the session opens");
    let results = tokio::time::timeout(
        Duration::from_secs(30),
        session.dispatch(vec![call(id, "mcp__m__meta", json!({}))]),
    )
    .await
    .expect("the turn is answered")
    .expect("the engine is available");
    assert!(results[0].is_ok(), "{}", results[0].content);
    serde_json::from_str(&results[0].content).expect("the server answers JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_call_carries_the_key_in_its_meta() {
    let Some(py) = python("idempotency key in _meta") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let mut spec = misbehaving(&py, state.path());
    if let switchboard::mcp::Transport::Stdio { args, .. } = &mut spec.transport {
        args.push(json!({"meta": true}).to_string());
    }
    let engine = engine_with(vec![("m", spec)]).await;

    let meta = meta_seen(&engine, "s-mcp", "toolu_9").await;
    assert_eq!(
        meta[IDEMPOTENCY_META_KEY],
        idempotency_key("s-mcp", None, "toolu_9"),
        "{meta}"
    );
    assert!(
        meta.get("progressToken").is_some(),
        "rmcp's keys stay: {meta}"
    );
    let other = meta_seen(&engine, "s-other", "toolu_9").await;
    assert_eq!(
        other[IDEMPOTENCY_META_KEY],
        idempotency_key("s-other", None, "toolu_9")
    );
    assert_ne!(other[IDEMPOTENCY_META_KEY], meta[IDEMPOTENCY_META_KEY]);
    engine.shutdown(Duration::from_secs(2)).await;
}

/// MCP's rule for `_meta` keys: an optional prefix of dot-separated labels (a letter first, a
/// letter or digit last, letters, digits and hyphens between) ending in `/`, reserved when its
/// second label is `modelcontextprotocol` or `mcp`; then a name that begins and ends with a
/// letter or digit, with letters, digits, `-`, `_` and `.` between.
#[test]
fn the_meta_key_follows_mcps_naming_rules_and_is_not_reserved() {
    let (prefix, name) = IDEMPOTENCY_META_KEY.split_once('/').expect("a prefix");
    let labels: Vec<&str> = prefix.split('.').collect();
    for label in &labels {
        let b = label.as_bytes();
        assert!(b.first().is_some_and(u8::is_ascii_alphabetic), "{label}");
        assert!(b.last().is_some_and(u8::is_ascii_alphanumeric), "{label}");
        assert!(
            b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-'),
            "{label}"
        );
    }
    assert!(!matches!(
        labels.get(1),
        Some(&"mcp" | &"modelcontextprotocol")
    ));
    let b = name.as_bytes();
    assert!(b.first().is_some_and(u8::is_ascii_alphanumeric));
    assert!(b.last().is_some_and(u8::is_ascii_alphanumeric));
    assert!(
        b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
    );
}
