//! The MCP command line through the real binary: `mcp list` (text and JSON, exit 1 when a server
//! failed), `--mcp-config` on `dispatch` and `tools`, and configuration errors naming the server
//! and key (exit 2).

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::mcp::*;
use serde_json::{Value, json};

fn switchboard(args: &[&str], stdin: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.args(args);
    common::cli::fed(cmd, stdin.as_bytes())
}

fn config(dir: &Path, python: &Path) -> std::path::PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/misbehaving.py");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let text = json!({"mcpServers": {
        "bad": {"command": python, "args": [script, state], "timeout_ms": 5000},
        "gone": {"command": "/nonexistent/server"},
        "off": {"type": "http", "url": "http://127.0.0.1:9/mcp", "enabled": false}
    }});
    let path = dir.join("mcp.json");
    std::fs::write(&path, text.to_string()).unwrap();
    path
}

#[test]
fn mcp_list_shows_each_server_its_status_and_its_tools() {
    let Some(py) = python("mcp list") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &py);
    let out = switchboard(&["mcp", "list", "--mcp-config", cfg.to_str().unwrap()], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed server makes it exit 1\n{text}"
    );
    assert!(text.contains("bad (stdio): up, 9 tools\n"), "{text}");
    assert!(
        text.contains("mcp__bad__echo          concurrent  echo\n"),
        "{text}"
    );
    assert!(
        text.contains("mcp__bad__hang          serial      hang\n"),
        "{text}"
    );
    assert!(
        text.contains("gone (stdio): failed: cannot start \"/nonexistent/server\""),
        "{text}"
    );
    assert!(text.contains("off (http): disabled\n"), "{text}");

    let out = switchboard(
        &[
            "mcp",
            "list",
            "--mcp-config",
            cfg.to_str().unwrap(),
            "--json",
        ],
        "",
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let servers = doc["servers"].as_array().unwrap();
    let names: Vec<&str> = servers
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bad", "gone", "off"]);
    assert_eq!(servers[0]["state"], "up");
    assert_eq!(servers[0]["transport"], "stdio");
    assert_eq!(servers[0]["tools"].as_array().unwrap().len(), 9);
    assert_eq!(servers[1]["state"], "failed");
    assert_eq!(servers[2]["state"], "disabled");
}

#[test]
fn dispatch_and_tools_take_an_mcp_config() {
    let Some(py) = python("dispatch --mcp-config") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &py);
    let ws = tempfile::tempdir().unwrap();
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "mcp__bad__echo", "input": {"k": "v"}},
        {"type": "tool_use", "id": "b", "name": "write_file", "input": {"path": "x.txt", "content": "hi"}},
        {"type": "tool_use", "id": "c", "name": "mcp__bad__fail", "input": {}}
    ]});
    let out = switchboard(
        &[
            "dispatch",
            "--workspace",
            ws.path().to_str().unwrap(),
            "--mcp-config",
            cfg.to_str().unwrap(),
        ],
        &turn.to_string(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    let blocks = reply["content"].as_array().unwrap();
    let ids: Vec<&str> = blocks
        .iter()
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(blocks[0]["content"], r#"{"k": "v"}"#);
    assert_eq!(blocks[2]["is_error"], true);
    assert_eq!(
        blocks[2]["content"],
        "Error [execution_error]: it went wrong"
    );
    // The failed server is reported on stderr; the rest still ran.
    assert!(String::from_utf8_lossy(&out.stderr).contains("MCP server gone failed"));

    let out = switchboard(
        &[
            "tools",
            "--format",
            "openai",
            "--mcp-config",
            cfg.to_str().unwrap(),
        ],
        "",
    );
    let catalog: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = catalog
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"read_file") && names.contains(&"mcp__bad__big"),
        "{names:?}"
    );
}

#[test]
fn a_bad_configuration_is_one_line_naming_the_server_and_key_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mcp.json");
    std::fs::write(
        &path,
        r#"{"mcpServers": {"files": {"command": "x", "timeout_ms": -1}}}"#,
    )
    .unwrap();
    for args in [
        vec!["mcp", "list", "--mcp-config", path.to_str().unwrap()],
        vec!["tools", "--mcp-config", path.to_str().unwrap()],
    ] {
        let out = switchboard(&args, "");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(r#"server "files": "timeout_ms": must be a non-negative integer"#),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn load_drives_an_mcp_tool_beside_a_direct_rmcp_client() {
    let Some(py) = python("load --mcp-call") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &py);
    let out = switchboard(
        &[
            "load",
            "--mcp-config",
            cfg.to_str().unwrap(),
            "--mcp-call",
            "mcp__bad__echo",
            "--mcp-args",
            r#"{"k": 1}"#,
            "--sessions",
            "2",
            "--calls-per-turn",
            "3",
            "--turns",
            "5",
            "--baseline",
            "direct",
            "--json",
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for side in ["engine", "direct"] {
        assert_eq!(report[side]["calls"], 30, "{report}");
        assert_eq!(report[side]["errors"], 0, "{report}");
    }
    assert_eq!(report["engine"]["turns_not_answered_once_in_order"], 0);
    // Every engine call reached the server (2 sessions × 5 turns × 3 calls), and as many direct.
    let calls = std::fs::read_to_string(dir.path().join("state/events.log"))
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(" echo"))
        .count();
    assert_eq!(calls, 60);

    let out = switchboard(
        &[
            "load",
            "--mcp-config",
            cfg.to_str().unwrap(),
            "--mcp-call",
            "mcp__bad__nope",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--mcp-call mcp__bad__nope: no such tool")
    );
}
