//! A bash command finds its call's idempotency key in `SWITCHBOARD_IDEMPOTENCY_KEY`: the key of
//! the session and the `tool_use_id` (`switchboard::tool::idempotency_key`), the same when the
//! same call reaches a fresh engine (a replay without a journal), another for another session or
//! another id. Through the sandbox's trampoline and without it.

use crate::common;

use std::time::Duration;

use common::sandbox::{available, config};
use common::workspace::temp_workspace;
use serde_json::json;
use switchboard::sandbox::SandboxMode;
use switchboard::tool::idempotency_key;
use switchboard::tools::bash::IDEMPOTENCY_KEY_VAR;
use switchboard::tools::builtin_tools;
use switchboard::{Engine, SessionOptions, ToolCall, Workspace};

/// What `$SWITCHBOARD_IDEMPOTENCY_KEY` holds for call `id` of session `session` on a fresh
/// engine in `mode` (`None`: the kernel cannot give that mode; skipped).
async fn key_seen(ws: &Workspace, mode: SandboxMode, session: &str, id: &str) -> Option<String> {
    let engine = match Engine::builder()
        .tools(builtin_tools())
        .workspace(ws.clone())
        .sandbox(config(mode))
        .build()
    {
        Ok(engine) => engine,
        Err(e) => {
            available(&format!("the sandbox ({e})"), false);
            return None;
        }
    };
    let session = engine
        .session_with(SessionOptions::new().id(session))
        .await
        .expect("the session opens");
    let command = format!("printf '%s' \"${IDEMPOTENCY_KEY_VAR}\"");
    let results = tokio::time::timeout(
        Duration::from_secs(30),
        session.dispatch(vec![ToolCall::new(
            id,
            "bash",
            json!({ "command": command }),
        )]),
    )
    .await
    .expect("the turn is answered")
    .expect("the engine is available");
    engine.shutdown(Duration::from_secs(2)).await;
    assert!(results[0].is_ok(), "{}", results[0].content);
    Some(results[0].content.to_string())
}

async fn check(mode: SandboxMode) {
    let (_tmp, ws) = temp_workspace();
    let Some(first) = key_seen(&ws, mode, "s-a", "toolu_01").await else {
        return;
    };
    assert_eq!(first, idempotency_key("s-a", None, "toolu_01"));
    // The same call on a fresh engine (nothing remembered): the same key.
    let again = key_seen(&ws, mode, "s-a", "toolu_01").await.unwrap();
    assert_eq!(again, first);
    // The same tool_use_id in another session, and another id in the same session: other keys.
    let other_session = key_seen(&ws, mode, "s-b", "toolu_01").await.unwrap();
    assert_eq!(other_session, idempotency_key("s-b", None, "toolu_01"));
    assert_ne!(other_session, first);
    let other_id = key_seen(&ws, mode, "s-a", "toolu_02").await.unwrap();
    assert_eq!(other_id, idempotency_key("s-a", None, "toolu_02"));
    assert_ne!(other_id, first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_reaches_a_sandboxed_command() {
    check(SandboxMode::BestEffort).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_reaches_an_unconfined_command() {
    check(SandboxMode::Off).await;
}
