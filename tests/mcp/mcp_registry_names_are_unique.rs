//! Registry names of MCP tools are unique across servers and within one, by construction, and
//! `mcp list` shows what a call really reaches: servers whose names nearly collide (`a`, `a-`,
//! `_a`; `a_` is refused because `mcp__a___x` would begin with server `a`'s prefix) list tools
//! whose names collide once sanitized, a hashed name equal to another tool's plain name, and two
//! long names whose hashes agree. Every registry name maps to exactly one (server, raw tool),
//! a call through each name reaches that tool (the misbehaving server answers "<server> <raw>"),
//! and `mcp list --json` agrees. Needs python3.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::mcp::*;
use serde_json::{Value, json};
use switchboard::CatalogFormat;
use switchboard::mcp::{McpConfig, ServerState};

/// Two 58-character raw names with the same first 47 characters whose FNV-1a hashes agree in
/// their low 32 bits (`55110f15`): the hashed form alone would give both one name.
const LONG_A: &str = "a_very_long_tool_name_that_the_server_chose_to_use_281191";
const LONG_B: &str = "a_very_long_tool_name_that_the_server_chose_to_use_455080";

/// Each server and its raw tool names. On `a`, `x.y` collides with `x_y` and is hashed to
/// `mcp__a__x_y_7f3152d6`, the plain name of the tool `x_y_7f3152d6`.
fn servers() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "a",
            vec![
                "_x",
                "x",
                "z",
                "x.y",
                "x_y",
                "x_y_7f3152d6",
                LONG_A,
                LONG_B,
                "a__x",
            ],
        ),
        ("a-", vec!["x", "_z", "z", "x.y"]),
        ("_a", vec!["x", "_x", "a__x"]),
    ]
}

fn config(py: &std::path::Path, state: &std::path::Path) -> Value {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/misbehaving.py");
    let servers: serde_json::Map<String, Value> = servers()
        .into_iter()
        .map(|(name, tools)| {
            let options = json!({"named": tools, "label": name}).to_string();
            let entry = json!({
                "command": py,
                "args": [script, state, options],
                "defer": "never",
            });
            (name.to_string(), entry)
        })
        .collect();
    json!({ "mcpServers": servers })
}

#[test]
fn a_server_name_ending_in_an_underscore_is_refused() {
    let text = r#"{"mcpServers": {"a": {"command": "x"}, "a_": {"command": "x"}}}"#;
    let err = McpConfig::parse(text, &|_| None).unwrap_err().to_string();
    assert!(
        err.contains(r#"server "a_""#) && err.contains(r#"not ending in "_""#),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_registry_name_reaches_exactly_the_tool_mcp_list_shows() {
    let Some(py) = python("unique registry names") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let config = config(&py, state.path());
    let engine = engine_from(&config.to_string()).await;

    // What the status (and so `mcp list`) says each name reaches.
    let mut shown: BTreeMap<String, (String, String)> = BTreeMap::new();
    for status in engine.mcp_status() {
        assert_eq!(status.state, ServerState::Up, "{status:?}");
        assert!(status.skipped.is_empty(), "{status:?}");
        for tool in &status.tools {
            let before = shown.insert(
                tool.name.clone(),
                (status.name.clone(), tool.raw_name.clone()),
            );
            assert!(before.is_none(), "{} is shown twice", tool.name);
        }
    }
    // Every listed tool is shown exactly once.
    let listed: BTreeSet<(String, String)> = servers()
        .into_iter()
        .flat_map(|(s, tools)| {
            tools
                .into_iter()
                .map(move |t| (s.to_string(), t.to_string()))
        })
        .collect();
    let reached: BTreeSet<(String, String)> = shown.values().cloned().collect();
    assert_eq!(reached, listed);
    assert_eq!(shown.len(), listed.len());
    // The registry holds exactly these names.
    let catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    let registered: BTreeSet<String> = catalog
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(registered, shown.keys().cloned().collect::<BTreeSet<_>>());
    // A call through each name reaches the tool shown for it, on its server.
    let calls: Vec<_> = shown
        .keys()
        .enumerate()
        .map(|(i, name)| call(&format!("c{i}"), name, json!({})))
        .collect();
    let results = turn(&engine, calls).await;
    for ((name, (server, raw)), result) in shown.iter().zip(&results) {
        assert_eq!(result.error, None, "{name}: {}", result.content);
        assert_eq!(result.content, format!("{server} {raw}"), "{name}");
    }
    engine.shutdown(std::time::Duration::from_secs(1)).await;

    // `mcp list --json` of the same configuration shows the same names for the same tools.
    let file = state.path().join("mcp.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let out = common::cli::run(
        state.path(),
        &[
            "mcp",
            "list",
            "--json",
            "--mcp-config",
            file.to_str().unwrap(),
        ],
        "",
    );
    assert!(out.status.success(), "{}", common::cli::describe(&out));
    let listing = common::cli::stdout_json(&out);
    let mut from_cli: BTreeMap<String, (String, String)> = BTreeMap::new();
    for server in listing["servers"].as_array().unwrap() {
        for tool in server["tools"].as_array().unwrap() {
            from_cli.insert(
                tool["name"].as_str().unwrap().to_string(),
                (
                    server["name"].as_str().unwrap().to_string(),
                    tool["raw_name"].as_str().unwrap().to_string(),
                ),
            );
        }
        assert_eq!(server["skipped"], json!([]), "{server}");
    }
    assert_eq!(from_cli, shown);
}
