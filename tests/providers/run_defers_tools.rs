//! `run` and `chat` with deferred tools: the request bodies they send to the mock model servers
//! on both wires. The deferred tools are a real MCP server's — `switchboard mcp-serve`, started
//! from an `--mcp-config` whose server says `"defer": "always"`.

use crate::common;

use std::collections::HashMap;
use std::process::ExitCode;

use common::EventLog;
use common::mock_server::{MockServer, MockTurn};
use common::model::{completion, message, text, tool_use};
use serde_json::{Value, json};
use switchboard::cli::{
    ChatArgs, McpArgs, ModelArgs, ProviderChoice, RunArgs, TelemetryArgs, chat_with, run_with,
};

const BUILTINS: [&str; 5] = ["bash", "read_file", "write_file", "edit_file", "glob"];

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + Send + Sync + use<> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

/// A workspace with `note.txt`, and an MCP config starting `switchboard mcp-serve` on it with
/// every tool deferred.
fn setup() -> (tempfile::TempDir, ModelArgs) {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("note.txt"), "the note\n").unwrap();
    let config = ws.path().join("mcp.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"sb": {
            "command": env!("CARGO_BIN_EXE_switchboard"),
            "args": ["mcp-serve", "--workspace", ws.path()],
            "defer": "always",
        }}})
        .to_string(),
    )
    .unwrap();
    let model = ModelArgs {
        workspace: Some(ws.path().to_path_buf()),
        mcp: McpArgs {
            mcp_config: Some(config),
            ..McpArgs::default()
        },
        ..ModelArgs::default()
    };
    (ws, model)
}

fn names(tools: &Value) -> Vec<String> {
    tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.get("name")
                .or_else(|| t.pointer("/function/name"))
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sends_deferred_tools_with_defer_loading_and_answers_a_search_with_references() {
    let (_ws, model) = setup();
    let server = MockServer::start(
        vec![
            MockTurn::anthropic(message(
                vec![tool_use(
                    "s1",
                    "tool_search",
                    json!({"query": "read the contents of a file"}),
                )],
                "tool_use",
            )),
            MockTurn::anthropic(message(
                vec![tool_use(
                    "r1",
                    "mcp__sb__read_file",
                    json!({"path": "note.txt"}),
                )],
                "tool_use",
            )),
            MockTurn::anthropic(message(vec![text("It says: the note.")], "end_turn")),
        ],
        EventLog::default(),
    )
    .await;
    let url = server.anthropic_url();
    let mut out = Vec::new();
    let code = run_with(
        RunArgs {
            prompt: "what does note.txt say?".into(),
            json: false,
            model,
            telemetry: TelemetryArgs::default(),
        },
        &env(&[
            ("ANTHROPIC_BASE_URL", &url),
            ("ANTHROPIC_API_KEY", "k"),
            ("MODEL_ID", "claude-test"),
        ]),
        &mut out,
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS, "{}", String::from_utf8_lossy(&out));
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let tools = &requests[0].body["tools"];
    let all = names(tools);
    assert_eq!(all[0], "tool_search");
    assert_eq!(all.len(), 11, "{all:?}");
    for t in tools.as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        assert!(t.get("cache_control").is_none(), "{name}");
        let deferred = t.get("defer_loading") == Some(&json!(true));
        assert_eq!(deferred, name.starts_with("mcp__sb__"), "{name}");
    }
    for b in BUILTINS {
        assert!(all.contains(&format!("mcp__sb__{b}")), "{all:?}");
    }
    // The search's answer: a text line, then a tool_reference block per tool found, the
    // read_file first.
    let messages = requests[1].body["messages"].as_array().unwrap();
    let result = &messages.last().unwrap()["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "s1");
    let content = result["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "text");
    assert_eq!(
        content[1],
        json!({"type": "tool_reference", "tool_name": "mcp__sb__read_file"})
    );
    assert!(content[1..].iter().all(|b| b["type"] == "tool_reference"));
    // The same catalog again: an Anthropic catalog never changes when tools are found.
    assert_eq!(requests[1].body["tools"], requests[0].body["tools"]);
    // The deferred tool ran through the MCP server.
    let messages = requests[2].body["messages"].as_array().unwrap();
    let result = &messages.last().unwrap()["content"][0];
    assert_eq!(result["tool_use_id"], "r1");
    assert!(
        result["content"].to_string().contains("the note"),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_over_openai_sends_the_visible_tools_and_appends_what_a_search_found() {
    let (_ws, mut model) = setup();
    model.provider = ProviderChoice::Openai;
    let server = MockServer::start(
        vec![
            MockTurn::openai(completion(
                None,
                &[("s1", "tool_search", r#"{"query":"select:mcp__sb__glob"}"#)],
                "tool_calls",
            )),
            MockTurn::openai(completion(
                None,
                &[("g1", "mcp__sb__glob", r#"{"pattern":"*.txt"}"#)],
                "tool_calls",
            )),
            MockTurn::openai(completion(Some("One note."), &[], "stop")),
            MockTurn::openai(completion(Some("Bye."), &[], "stop")),
        ],
        EventLog::default(),
    )
    .await;
    let url = server.openai_url();
    let lines = futures::stream::iter(["list the text files", "thanks"].map(|l| Ok(l.to_string())));
    let mut out = Vec::new();
    let code = chat_with(
        ChatArgs {
            model,
            telemetry: TelemetryArgs::default(),
        },
        &env(&[("OPENAI_BASE_URL", &url), ("MODEL_ID", "local-model")]),
        lines,
        &mut out,
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS, "{}", String::from_utf8_lossy(&out));
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    // Before the search: the search and the tools not deferred, nothing of the MCP server.
    let mut visible = vec!["tool_search".to_string()];
    visible.extend(BUILTINS.map(String::from));
    assert_eq!(names(&requests[0].body["tools"]), visible);
    // After it: the same list, the found tool appended (never reordered), and the tool message
    // carries its definition as text.
    let mut grown = visible.clone();
    grown.push("mcp__sb__glob".into());
    for r in &requests[1..] {
        assert_eq!(names(&r.body["tools"]), grown);
    }
    let messages = requests[1].body["messages"].as_array().unwrap();
    let tool_message = messages.iter().find(|m| m["role"] == "tool").unwrap();
    let text = tool_message["content"].as_str().unwrap();
    assert!(text.contains("mcp__sb__glob"), "{text}");
    assert!(text.contains(r#""input_schema""#), "{text}");
    let messages = requests[2].body["messages"].as_array().unwrap();
    let glob = messages.last().unwrap();
    assert_eq!(glob["role"], "tool");
    assert!(
        glob["content"].as_str().unwrap().contains("note.txt"),
        "{glob}"
    );
}
