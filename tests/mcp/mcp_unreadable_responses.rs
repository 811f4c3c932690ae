//! What a server sends that cannot be read is accounted for at once, never by a timeout: a
//! response over the 16 MiB message limit or with a lone surrogate escape answers its call
//! `execution_error` naming the cause (with a 120 s tool timeout, so a `timeout` answer would
//! mean the call waited for it); a block of an unknown kind becomes a note beside the known
//! blocks; a tool whose input schema is nested 70 levels deep or is not an object is skipped
//! with a reason shown by `mcp list`, and the rest of the server loads (with a 120 s start-up
//! timeout). The connection keeps working afterwards. Needs python3.

use crate::common;

use std::time::Duration;

use common::mcp::*;
use serde_json::json;
use switchboard::ErrorCode;
use switchboard::mcp::{ServerSpec, ServerState};

/// The misbehaving server with `options`, a 120 s tool timeout and a 120 s start-up timeout.
fn bad_server(
    py: &std::path::Path,
    state: &std::path::Path,
    options: serde_json::Value,
) -> ServerSpec {
    let mut spec = misbehaving(py, state);
    if let switchboard::mcp::Transport::Stdio { args, .. } = &mut spec.transport {
        args.push(options.to_string());
    }
    spec.timeout = Duration::from_secs(120);
    spec.startup_timeout = Duration::from_secs(120);
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_that_cannot_be_read_answer_their_calls_at_once_and_name_the_cause() {
    let Some(py) = python("unreadable responses") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let options = json!({"bad_answers": true});
    let engine = engine_with(vec![("bad", bad_server(&py, state.path(), options))]).await;
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__bad__huge", json!({})),
            call("b", "mcp__bad__surrogate", json!({})),
            call("c", "mcp__bad__hologram", json!({})),
            call("d", "mcp__bad__echo", json!({"still": "here"})),
        ],
    )
    .await;
    assert_eq!(
        results[0].error,
        Some(ErrorCode::ExecutionError),
        "{}",
        results[0].content
    );
    assert_eq!(
        results[0].content,
        format!(
            "Error [execution_error]: MCP server bad sent a response that could not be read: \
             the response is {} bytes, over the 16 MiB limit of a message",
            // {"jsonrpc": "2.0", "id": N, "result": {"content": [{"type": "text", "text": "h…"}],
            // "isError": false}} as Python writes it, N being the request's id.
            huge_response_len(state.path())
        )
    );
    assert_eq!(results[1].error, Some(ErrorCode::ExecutionError));
    assert!(
        results[1].content.starts_with(
            "Error [execution_error]: MCP server bad sent a response that could not be read: \
             a text block cannot be read:"
        ) && results[1].content.contains("hex escape"),
        "{}",
        results[1].content
    );
    assert_eq!(results[2].error, None, "{}", results[2].content);
    assert_eq!(
        results[2].content,
        "before\n[content of unknown type \"hologram\", not shown]\nafter"
    );
    assert_eq!(results[3].content, r#"{"still": "here"}"#);
    // The connection is intact: nothing was restarted.
    let again = turn(&engine, vec![call("e", "mcp__bad__echo", json!({"n": 2}))]).await;
    assert_eq!(again[0].content, r#"{"n": 2}"#);
    assert_eq!(engine.mcp_status()[0].restarts, 0);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// The length of the `huge` tool's response line as the server wrote it, from its request id in
/// the events log.
fn huge_response_len(state: &std::path::Path) -> usize {
    let log = std::fs::read_to_string(state.join("events.log")).unwrap();
    let id = log
        .lines()
        .find_map(|l| l.strip_prefix("call ")?.strip_suffix(" huge"))
        .expect("the huge call reached the server");
    let text = "h".repeat(17 * 1024 * 1024);
    format!(
        r#"{{"jsonrpc": "2.0", "id": {id}, "result": {{"content": [{{"type": "text", "text": "{text}"}}], "isError": false}}}}"#
    )
    .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_whose_schema_cannot_be_read_is_skipped_and_the_rest_of_the_server_loads() {
    let Some(py) = python("unreadable tool definitions") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let options = json!({"bad_tools": true});
    let engine = engine_with(vec![("bad", bad_server(&py, state.path(), options))]).await;
    let status = engine.mcp_status().remove(0);
    assert_eq!(status.state, ServerState::Up, "{status:?}");
    let skipped: Vec<(&str, &str)> = status
        .skipped
        .iter()
        .map(|(raw, why)| (raw.as_str(), why.as_str()))
        .collect();
    assert!(
        skipped.contains(&(
            "deep_schema",
            "its definition is nested deeper than 128 levels"
        )),
        "{skipped:?}"
    );
    assert!(
        skipped.contains(&("string_schema", "its inputSchema is not a JSON object")),
        "{skipped:?}"
    );
    assert_eq!(
        skipped.len(),
        3,
        "and bad_schema, which does not compile: {skipped:?}"
    );
    // The 9 usual tools.
    assert_eq!(status.tools.len(), 9, "{:?}", status.tools);
    assert_eq!(engine.tool_count().await, 9);
    engine.shutdown(Duration::from_secs(1)).await;

    // `mcp list` shows each skipped tool with its reason.
    let options = json!({"bad_tools": true}).to_string();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/misbehaving.py");
    let config = json!({"mcpServers": {"bad": {
        "command": py, "args": [script, state.path(), options], "startup_timeout_ms": 120000
    }}});
    let file = state.path().join("mcp.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let out = common::cli::run(
        state.path(),
        &["mcp", "list", "--mcp-config", file.to_str().unwrap()],
        "",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", common::cli::describe(&out));
    assert!(text.contains("bad (stdio): up, 9 tools\n"), "{text}");
    assert!(
        text.contains("  skipped deep_schema: its definition is nested deeper than 128 levels\n"),
        "{text}"
    );
    assert!(
        text.contains("  skipped string_schema: its inputSchema is not a JSON object\n"),
        "{text}"
    );
}
