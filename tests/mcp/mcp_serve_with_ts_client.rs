//! `switchboard mcp-serve` end to end with the official TypeScript SDK client
//! (tests/mcp_servers/serve_client.mjs): list tools and their hints, call each, see error results,
//! cancel a running bash call (its process dies) and keep using the server; and the official MCP
//! Inspector CLI (list, call, an error result). Needs node, `@modelcontextprotocol/sdk` and
//! `@modelcontextprotocol/inspector` under `$SWITCHBOARD_MCP_TEST_DIR` (skipped without it).

use crate::common;

use std::path::Path;
use std::process::Command;

use common::mcp::*;

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

/// Runs the official MCP Inspector CLI against `mcp-serve` and parses its JSON answer.
fn inspector(dir: &Path, ws: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(dir.join("node_modules/.bin/mcp-inspector"))
        .arg("--cli")
        .arg(env!("CARGO_BIN_EXE_switchboard"))
        .args(["mcp-serve", "--workspace"])
        .arg(ws)
        .args(args)
        .output()
        .expect("the inspector runs");
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the inspector prints JSON")
}

#[test]
fn the_mcp_inspector_cli_lists_and_calls_the_tools() {
    let Some(dir) = test_dir("mcp-serve with the MCP Inspector CLI") else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    let listed = inspector(&dir, ws.path(), &["--method", "tools/list"]);
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["bash", "edit_file", "glob", "read_file", "write_file"]
    );
    let wrote = inspector(
        &dir,
        ws.path(),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "write_file",
            "--tool-arg",
            "path=a.txt",
            "--tool-arg",
            "content=hello",
        ],
    );
    assert_eq!(wrote["isError"], false);
    assert_eq!(wrote["content"][0]["text"], "Wrote 5 bytes to a.txt");
    let missing = inspector(
        &dir,
        ws.path(),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "read_file",
            "--tool-arg",
            "path=missing",
        ],
    );
    assert_eq!(missing["isError"], true);
    assert_eq!(
        missing["content"][0]["text"],
        "Error [execution_error]: file not found: missing"
    );
}
