//! `switchboard mcp-serve` end to end with the official TypeScript SDK client
//! (tests/mcp_servers/serve_client.mjs): list tools and their hints, call each, see error results,
//! cancel a running bash call (its process dies) and keep using the server. Needs node and
//! `@modelcontextprotocol/sdk` under `$SWITCHBOARD_MCP_TEST_DIR` (skipped without it).

mod mcp_common;

use std::path::Path;
use std::process::Command;

use mcp_common::*;

#[test]
fn the_typescript_sdk_client_lists_calls_sees_errors_and_cancels() {
    let Some(dir) = test_dir("mcp-serve with the TypeScript SDK client") else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/serve_client.mjs");
    let out = Command::new("node")
        .arg(script)
        .arg(&dir)
        .arg(env!("CARGO_BIN_EXE_switchboard"))
        .arg(ws.path())
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(stdout.contains("mcp-serve end to end: ok"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes/a.txt")).unwrap(),
        "goodbye\n"
    );
}
