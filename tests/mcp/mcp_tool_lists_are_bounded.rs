//! A server's `tools/list` is bounded — pages, tools and bytes of tool definitions, per server:
//! a server that pages forever fails to load with a reason naming the bound, inside an address
//! space limit this test sets on the engine's process (RLIMIT_AS, 512 MiB), and the engine runs
//! on with its other servers; the bounds are configurable per server. Needs python3.

use crate::common;

use serde_json::json;
use switchboard::mcp::ServerState;

use common::mcp::*;

/// The engine's address space in the flood test: far above what `mcp list` needs (under 100 MB
/// resident), far below what an unbounded listing reaches before its start-up timeout.
const ADDRESS_SPACE: u64 = 512 << 20;

#[test]
fn a_server_that_pages_forever_fails_to_load_and_the_engine_runs_on() {
    let Some(py) = python("endless tools/list") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/misbehaving.py");
    // Every page: 200 new tools of about 4 kB each, and a next cursor.
    let endless = json!({"page_forever": {"tools": 200, "bytes": 4000}}).to_string();
    let config = json!({"mcpServers": {
        "flood": {"command": py, "args": [script, state.path(), endless],
                  "startup_timeout_ms": 20000},
        "fine": {"command": py, "args": [script, state.path()]},
    }});
    let file = state.path().join("mcp.json");
    std::fs::write(&file, config.to_string()).unwrap();
    // `mcp list` under an address-space limit set by a python3 wrapper before it execs.
    let out = std::process::Command::new(&py)
        .args([
            "-c",
            "import os, resource, sys; n = int(sys.argv[1]); \
             resource.setrlimit(resource.RLIMIT_AS, (n, n)); os.execv(sys.argv[2], sys.argv[2:])",
            &ADDRESS_SPACE.to_string(),
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
    // Exit 1: an enabled server is not up. Not a crash, and the listing was printed.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        common::cli::describe(&out)
    );
    let listing = common::cli::stdout_json(&out);
    let server = |name: &str| {
        listing["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap()
    };
    let flood = server("flood");
    assert_eq!(flood["state"], "failed", "{flood}");
    assert_eq!(
        flood["reason"],
        "tools/list stopped: the tool definitions pass 16 MiB (max_list_bytes)"
    );
    let fine = server("fine");
    assert_eq!(fine["state"], "up", "{fine}");
    assert_eq!(fine["tools"].as_array().unwrap().len(), 9, "{fine}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bound_is_set_per_server_and_names_itself_when_passed() {
    let Some(py) = python("tools/list bounds") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    // The misbehaving server lists 10 tools in 2 pages, about 1,100 bytes of definitions.
    let with = |f: fn(&mut switchboard::mcp::ListLimits)| {
        let mut spec = misbehaving(&py, state.path());
        f(&mut spec.list_limits);
        spec
    };
    let engine = engine_with(vec![
        ("pages", with(|l| l.pages = 1)),
        ("tools", with(|l| l.tools = 5)),
        ("bytes", with(|l| l.bytes = 500)),
        (
            "roomy",
            with(|l| {
                *l = switchboard::mcp::ListLimits {
                    pages: 2,
                    tools: 10,
                    bytes: 4096,
                }
            }),
        ),
    ])
    .await;
    let state_of = |name: &str| engine.mcp_servers().get(name).unwrap().status().state;
    let failed = |name: &str| match state_of(name) {
        ServerState::Failed { reason } => reason,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(
        failed("pages"),
        "tools/list stopped: the server lists more than 1 pages (max_list_pages)"
    );
    assert_eq!(
        failed("tools"),
        "tools/list stopped: the server lists more than 5 tools (max_tools)"
    );
    assert_eq!(
        failed("bytes"),
        "tools/list stopped: the tool definitions pass 500 bytes (max_list_bytes)"
    );
    // Exactly at the bounds, the server loads; the engine and its tools work.
    assert_eq!(state_of("roomy"), ServerState::Up);
    let results = turn(
        &engine,
        vec![call("a", "mcp__roomy__echo", json!({"k": 1}))],
    )
    .await;
    assert_eq!(results[0].content, r#"{"k": 1}"#);
    engine.shutdown(std::time::Duration::from_secs(1)).await;
}
