//! What an MCP server's tool schemas may cost the engine is bounded: a tool whose patterns pass
//! the engine's limits (here 200 patterns like `[^x]{3000}y`, an 11 KB schema that compiled to
//! about 620 MB without them) is skipped with a warning naming the tool, the keyword and the
//! limit; the server's other tools load and run, patterns included. Needs python3.

use crate::common;

use serde_json::json;
use switchboard::ErrorCode;
use switchboard::mcp::ServerSpec;

use common::mcp::*;

/// The misbehaving server, listing also `greedy` (200 oversized patterns) and `patterned`.
fn greedy_server(py: &std::path::Path, state: &std::path::Path) -> (String, Vec<String>) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/misbehaving.py");
    let options = json!({"greedy_patterns": 200}).to_string();
    (
        py.display().to_string(),
        vec![
            script.display().to_string(),
            state.display().to_string(),
            options,
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_past_the_pattern_bounds_is_skipped_by_name_and_the_rest_of_its_server_loads() {
    let Some(py) = python("greedy patterns") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let (command, args) = greedy_server(&py, state.path());
    let engine = engine_with(vec![("bad", ServerSpec::stdio(command, args))]).await;
    let status = engine.mcp_status()[0].clone();
    let names: Vec<&str> = status.tools.iter().map(|t| t.name.as_str()).collect();
    // The 9 tools of the usual listing, and `patterned`.
    assert_eq!(names.len(), 10, "{names:?}");
    assert!(names.contains(&"mcp__bad__patterned"), "{names:?}");
    let skipped: Vec<&(String, String)> = status
        .skipped
        .iter()
        .filter(|(raw, _)| raw == "greedy")
        .collect();
    assert_eq!(skipped.len(), 1, "{:?}", status.skipped);
    let why = &skipped[0].1;
    assert!(
        why.contains("mcp__bad__greedy")
            && why.contains("`pattern` at /properties/p0/pattern")
            && why.contains(&switchboard::testing::PATTERN_COMPILED_BYTES.to_string()),
        "{why}"
    );
    // The good tool's own pattern is checked like any schema.
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__bad__patterned", json!({"id": "abc"})),
            call("b", "mcp__bad__patterned", json!({"id": "ABC"})),
        ],
    )
    .await;
    assert_eq!(results[0].content, r#"{"id": "abc"}"#);
    assert_eq!(results[1].error, Some(ErrorCode::InvalidArguments));
    engine.shutdown(std::time::Duration::from_secs(1)).await;
}

/// `mcp list` in an address space of 512 MiB: the oversized patterns would need about 620 MB.
#[test]
fn mcp_list_warns_of_the_skipped_tool_within_a_small_address_space() {
    let Some(py) = python("greedy patterns, mcp list") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let (command, args) = greedy_server(&py, state.path());
    let config = json!({"mcpServers": {"bad": {"command": command, "args": args}}});
    let file = state.path().join("mcp.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let address_space: u64 = 512 << 20;
    let out = std::process::Command::new(&py)
        .args([
            "-c",
            "import os, resource, sys; n = int(sys.argv[1]); \
             resource.setrlimit(resource.RLIMIT_AS, (n, n)); os.execv(sys.argv[2], sys.argv[2:])",
            &address_space.to_string(),
            common::cli::BIN,
            "mcp",
            "list",
            "--json",
            "--mcp-config",
            file.to_str().unwrap(),
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        common::cli::describe(&out)
    );
    let stderr = common::cli::stderr(&out);
    let warning = stderr
        .lines()
        .find(|l| l.contains("MCP tool \"greedy\" skipped"))
        .unwrap_or_else(|| panic!("no warning names the tool:\n{stderr}"));
    assert!(warning.contains("`pattern`"), "{warning}");
    let listing = common::cli::stdout_json(&out);
    let server = &listing["servers"][0];
    assert_eq!(server["state"], "up", "{server}");
    assert_eq!(server["tools"].as_array().unwrap().len(), 10, "{server}");
}
