//! `run` and `chat` through the library entry points (`cli::run_with`, `cli::chat_with`)
//! with their environment and output given: offline with a script, and against the mock server.

use crate::common;

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Parser;
use common::EventLog;
use common::mock_server::{MockServer, MockTurn};
use common::model::{completion, message, text, tool_use};
use serde_json::{Value, json};
use switchboard::cli::{
    ChatArgs, ModelArgs, ProviderChoice, RunArgs, TelemetryArgs, chat_with, run_with,
};

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + Send + Sync + use<> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn run_args(prompt: &str, model: ModelArgs, json: bool) -> RunArgs {
    RunArgs {
        prompt: prompt.into(),
        json,
        model,
        telemetry: TelemetryArgs::default(),
    }
}

fn script_file(dir: &std::path::Path, docs: Value) -> std::path::PathBuf {
    let path = dir.join("script.json");
    std::fs::write(&path, docs.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_script_works_offline_and_prints_the_answer_and_the_stop_reason() {
    let ws = tempfile::tempdir().unwrap();
    let script = script_file(
        ws.path(),
        json!([
            message(
                vec![
                    text("Writing."),
                    tool_use(
                        "w1",
                        "write_file",
                        json!({"path":"out/hello.txt","content":"hi\n"})
                    )
                ],
                "tool_use"
            ),
            message(
                vec![tool_use("r1", "read_file", json!({"path":"out/hello.txt"}))],
                "tool_use"
            ),
            message(vec![text("Wrote and checked hello.txt.")], "end_turn"),
        ]),
    );
    for (json_out, stream) in [(false, true), (true, false)] {
        let model = ModelArgs {
            provider: ProviderChoice::Scripted,
            script: Some(script.clone()),
            workspace: Some(ws.path().to_path_buf()),
            no_stream: !stream,
            ..ModelArgs::default()
        };
        let mut out = Vec::new();
        let code = run_with(run_args("make hello", model, json_out), &env(&[]), &mut out).await;
        assert_eq!(code, ExitCode::SUCCESS);
        let out = String::from_utf8(out).unwrap();
        if json_out {
            let doc: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(doc["stop_reason"], "final_answer");
            assert_eq!(doc["turns"], 3);
            assert_eq!(doc["tool_calls"], 2);
            assert_eq!(doc["final_text"], "Wrote and checked hello.txt.");
            assert_eq!(doc["dispatches"][0]["results"][0]["tool"], "write_file");
            assert_eq!(doc["dispatches"][0]["results"][0]["outcome"], "ok");
            assert_eq!(doc["dispatches"][1]["calls"], 1);
            assert_eq!(doc["dispatches"][1]["eager"], 0);
        } else {
            assert_eq!(
                out,
                "Wrote and checked hello.txt.\nstop_reason: final_answer (3 turns, 2 tool calls)\n"
            );
        }
        assert_eq!(
            std::fs::read_to_string(ws.path().join("out/hello.txt")).unwrap(),
            "hi\n"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_problems_exit_2() {
    let ws = tempfile::tempdir().unwrap();
    let base = || ModelArgs {
        workspace: Some(ws.path().to_path_buf()),
        ..ModelArgs::default()
    };
    let mut out = Vec::new();
    // No ANTHROPIC_API_KEY.
    let code = run_with(
        run_args("hi", base(), false),
        &env(&[("MODEL_ID", "m")]),
        &mut out,
    )
    .await;
    assert_eq!(code, ExitCode::from(2));
    // No model.
    let code = run_with(
        run_args("hi", base(), false),
        &env(&[("ANTHROPIC_API_KEY", "k")]),
        &mut out,
    )
    .await;
    assert_eq!(code, ExitCode::from(2));
    // Scripted without a script.
    let scripted = ModelArgs {
        provider: ProviderChoice::Scripted,
        ..base()
    };
    let code = run_with(run_args("hi", scripted, false), &env(&[]), &mut out).await;
    assert_eq!(code, ExitCode::from(2));
    assert!(out.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_talks_to_the_endpoint_named_by_the_environment() {
    let ws = tempfile::tempdir().unwrap();
    let log = EventLog::default();
    let server = MockServer::start(
        vec![
            MockTurn::openai(completion(
                None,
                &[("c1", "glob", r#"{"pattern":"*"}"#)],
                "tool_calls",
            )),
            MockTurn::openai(completion(Some("Nothing here."), &[], "stop")),
        ],
        log,
    )
    .await;
    let model = ModelArgs {
        provider: ProviderChoice::Openai,
        workspace: Some(ws.path().to_path_buf()),
        ..ModelArgs::default()
    };
    let mut out = Vec::new();
    let url = server.openai_url();
    let code = run_with(
        run_args("list", model, false),
        &env(&[("OPENAI_BASE_URL", &url), ("MODEL_ID", "local-model")]),
        &mut out,
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "Nothing here.\nstop_reason: final_answer (2 turns, 1 tool calls)\n"
    );
    let requests = server.requests();
    assert_eq!(requests[0].body["model"], "local-model");
    assert_eq!(requests[0].body["stream"], true);
    assert_eq!(requests[0].body["max_tokens"], 8000);
    let system = requests[0].body["messages"][0]["content"].as_str().unwrap();
    assert!(system.starts_with("You are a coding agent at "), "{system}");
    assert!(system.ends_with(". Use tools to solve tasks. Act, don't explain."));
    assert_eq!(requests[1].body["messages"][3]["role"], "tool");
    assert_eq!(requests[1].body["messages"][3]["content"], "(no matches)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_exits_1_with_the_variable_named() {
    let ws = tempfile::tempdir().unwrap();
    let server = MockServer::start(
        vec![MockTurn::status(
            401,
            &[],
            json!({"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}),
        )],
        EventLog::default(),
    )
    .await;
    let model = ModelArgs {
        workspace: Some(ws.path().to_path_buf()),
        model: Some("claude-test".into()),
        ..ModelArgs::default()
    };
    let url = server.anthropic_url();
    let mut out = Vec::new();
    let code = run_with(
        run_args("hi", model, false),
        &env(&[("ANTHROPIC_BASE_URL", &url), ("ANTHROPIC_API_KEY", "bad")]),
        &mut out,
    )
    .await;
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(server.requests().len(), 1);
    assert_eq!(server.requests()[0].headers["x-api-key"], "bad");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_keeps_one_history_and_shows_a_stop_reason_that_is_not_a_final_answer() {
    let ws = tempfile::tempdir().unwrap();
    let server = MockServer::start(
        vec![
            MockTurn::anthropic(message(vec![text("Hello!")], "end_turn")),
            MockTurn::anthropic(message(vec![text("A long sto")], "max_tokens")),
        ],
        EventLog::default(),
    )
    .await;
    let args = ChatArgs {
        model: ModelArgs {
            workspace: Some(ws.path().to_path_buf()),
            ..ModelArgs::default()
        },
        telemetry: TelemetryArgs::default(),
    };
    let url = server.anthropic_url();
    let lines = futures::stream::iter(
        ["hi", "tell me a story", "q", "never read"].map(|l| Ok(l.to_string())),
    );
    let mut out = Vec::new();
    let code = chat_with(
        args,
        &env(&[
            ("ANTHROPIC_BASE_URL", &url),
            ("ANTHROPIC_API_KEY", "k"),
            ("MODEL_ID", "claude-test"),
        ]),
        lines,
        &mut out,
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "Hello!\nA long sto\n[stop: max_tokens]\n"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].body["messages"],
        json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"text","text":"Hello!"}]},
            {"role":"user","content":"tell me a story"}
        ])
    );
}

#[derive(Parser)]
struct Harness {
    #[command(flatten)]
    run: RunArgs,
}

#[test]
fn the_flags_parse() {
    let h = Harness::parse_from([
        "x",
        "--prompt",
        "hi",
        "--provider",
        "openai",
        "--model",
        "m",
        "--max-turns",
        "3",
        "--no-stream",
        "--no-eager",
        "--json",
        "--timeout",
        "90s",
    ]);
    assert_eq!(h.run.prompt, "hi");
    assert_eq!(h.run.model.provider, ProviderChoice::Openai);
    assert_eq!(h.run.model.max_turns, 3);
    assert!(h.run.json);
    let o = h.run.model.stream_options();
    assert!(!o.stream && !o.eager);
    assert_eq!(
        h.run.model.timeout,
        Some(std::time::Duration::from_secs(90))
    );
    let h = Harness::parse_from(["x", "--prompt", "hi", "--no-stream", "--stream"]);
    assert!(h.run.model.stream_options().stream);
    let h = Harness::parse_from(["x", "--prompt", "hi"]);
    assert!(
        h.run.model.stream_options().stream,
        "streaming is the default"
    );
    assert_eq!(h.run.model.max_turns, 8);
    assert_eq!(h.run.model.max_tokens, 8000);
    assert!(Harness::try_parse_from(["x", "--prompt", "hi", "--max-turns", "0"]).is_err());
}
