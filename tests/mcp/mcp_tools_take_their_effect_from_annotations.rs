//! An MCP tool's effect class comes from the server's annotations (`readOnlyHint` → read-only,
//! `idempotentHint` → idempotent, neither → side effect), or from the server entry's `effect`;
//! the journal records each call under it. The server is a real one: `switchboard mcp-serve`,
//! whose built-in tools carry those hints.

use crate::common;

use std::time::Duration;

use common::mcp::*;
use serde_json::json;
use switchboard::journal::Journal;
use switchboard::mcp::McpConfig;
use switchboard::{Engine, SessionOptions};

/// The effect each call was journaled under, with the server entry's extra keys `extra`.
async fn journaled_effects(extra: serde_json::Value) -> Vec<String> {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "x").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let mut server = json!({
        "command": env!("CARGO_BIN_EXE_switchboard"),
        "args": ["mcp-serve", "--workspace", ws.path()],
    });
    for (k, v) in extra.as_object().unwrap() {
        server[k] = v.clone();
    }
    let text = json!({"mcpServers": {"sb": server}}).to_string();
    let config = McpConfig::parse(&text, &|k| std::env::var(k).ok()).expect("config parses");
    {
        let engine = Engine::builder()
            .mcp_config(config)
            .journal(journal.path())
            .start()
            .await
            .expect("engine starts");
        let session = engine
            .session_with(SessionOptions::new().id("e"))
            .await
            .unwrap();
        let results = session
            .dispatch(vec![
                call("r", "mcp__sb__read_file", json!({"path": "a.txt"})),
                call(
                    "w",
                    "mcp__sb__write_file",
                    json!({"path": "b.txt", "content": "y"}),
                ),
                call("b", "mcp__sb__bash", json!({"command": "true"})),
            ])
            .await
            .unwrap();
        for r in &results {
            assert!(r.is_ok(), "{}", r.content);
        }
        engine.shutdown(Duration::from_secs(2)).await;
    }
    let j = Journal::open(journal.path(), Duration::from_secs(3600)).unwrap();
    j.lookup("e", &["r", "w", "b"])
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every call is journaled").effect)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_hints_decide_unless_the_entry_says_otherwise() {
    assert_eq!(
        journaled_effects(json!({})).await,
        ["read_only", "idempotent", "side_effect"]
    );
    assert_eq!(
        journaled_effects(json!({"effect": "side_effect"})).await,
        ["side_effect", "side_effect", "side_effect"]
    );
}
