//! The Anthropic provider against the local mock server: exactly the registry catalog out, exactly
//! the encoded results back, streamed or not; streamed arguments assembled however they are split;
//! bad arguments answered `invalid_arguments`; retries, auth errors, stop reasons; eager dispatch
//! proven by the order of events.

mod common_mock;

use std::time::Duration;

use common_mock::*;
use serde_json::{Value, json};
use switchboard::agent_loop::{AgentError, AgentLoop, StopReason, StreamOptions};
use switchboard::protocol::encode_anthropic;
use switchboard::provider::{EventLog, MALFORMED_INPUT_KEY, ProviderError};
use switchboard::providers::{AnthropicProvider, HttpConfig, RetryPolicy};
use switchboard::registry::CatalogFormat;

async fn catalog_and_results(stream: bool) {
    let log = EventLog::default();
    let server = MockServer::start(
        vec![
            MockTurn::anthropic(message(
                vec![
                    text("Checking."),
                    tool_use("t1", "echo", json!({"text": "hi"})),
                    tool_use("t2", "nope", json!({})),
                    tool_use("t3", "echo", json!({"text": 5})),
                ],
                "tool_use",
            )),
            MockTurn::anthropic(message(vec![text("All done.")], "end_turn")),
        ],
        log.clone(),
    )
    .await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, anthropic(&server), stream, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.stop_reason, StopReason::FinalAnswer);
    assert_eq!(r.final_text, "All done.");
    assert_eq!(r.turns, 2);
    assert_eq!(r.tool_calls, 3);
    assert_eq!(
        outcomes(&r.dispatches[0]),
        ["ok", "unknown_tool", "invalid_arguments"]
    );
    assert_eq!(r.dispatches[0][0].content, "echo:hi");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    for req in &requests {
        assert_eq!(req.path, "/v1/messages");
        assert_eq!(req.headers["x-api-key"], "test-key");
        assert_eq!(req.headers["anthropic-version"], "2023-06-01");
        assert_eq!(req.body["tools"], Value::Array(catalog.clone()));
        assert_eq!(req.body["model"], "mock-model");
        assert_eq!(req.body["system"], "be brief");
        assert_eq!(req.body["max_tokens"], 1000);
        assert_eq!(req.body.get("stream").is_some(), stream);
    }
    assert_eq!(
        requests[0].body["messages"],
        json!([{"role": "user", "content": "go"}])
    );
    let second = requests[1].body["messages"].as_array().unwrap();
    assert_eq!(second.len(), 3);
    assert_eq!(
        second[1],
        json!({"role":"assistant","content":[
            text("Checking."),
            tool_use("t1", "echo", json!({"text": "hi"})),
            tool_use("t2", "nope", json!({})),
            tool_use("t3", "echo", json!({"text": 5})),
        ]})
    );
    assert_eq!(second[2], encode_anthropic(&r.dispatches[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_answers_carry_the_catalog_and_then_exactly_the_encoded_results() {
    catalog_and_results(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answers_carry_the_catalog_and_then_exactly_the_encoded_results() {
    catalog_and_results(true).await;
}

/// Argument text with escapes (`\"`, `\\`, `\u00e9`, a surrogate pair) and multi-byte UTF-8.
const RAW_ARGS: &str = r#"{"text":"caf\u00e9 \"q\" \\ naïve 😀 \ud83d\ude00"}"#;
const ECHOED: &str = "echo:café \"q\" \\ naïve 😀 😀";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_split_into_one_char_deltas_and_one_to_three_byte_chunks_assemble() {
    for chunk in [1, 2, 3] {
        let log = EventLog::default();
        let mut block = tool_use("t1", "echo", json!({}));
        block["raw_input"] = RAW_ARGS.into();
        let server = MockServer::start(
            vec![
                MockTurn::anthropic(message(vec![text("Echo: é😀"), block], "tool_use"))
                    .fragments(1)
                    .chunks(chunk),
                MockTurn::anthropic(message(vec![text("ok")], "end_turn")).chunks(chunk),
            ],
            log.clone(),
        )
        .await;
        let engine = test_engine(&log);
        let mut agent = agent(&engine, anthropic(&server), true, true);
        let r = tokio::time::timeout(BOUND, agent.run("echo"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.dispatches[0][0].content, ECHOED, "chunks of {chunk}");
        let history = &server.requests()[1].body["messages"];
        assert_eq!(history[1]["content"][0]["text"], "Echo: é😀");
        assert_eq!(
            history[1]["content"][1]["input"],
            serde_json::from_str::<Value>(RAW_ARGS).unwrap()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_arguments_are_answered_invalid_arguments_and_the_loop_continues() {
    let log = EventLog::default();
    let mut bad = tool_use("t1", "echo", json!({}));
    bad["raw_input"] = r#"{"text": "unterminated"#.into();
    let server = MockServer::start(
        vec![
            MockTurn::anthropic(message(
                vec![bad, tool_use("t2", "echo", json!({"text": "fine"}))],
                "tool_use",
            ))
            .fragments(3),
            MockTurn::anthropic(message(vec![text("Recovered.")], "end_turn")),
        ],
        log.clone(),
    )
    .await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, anthropic(&server), true, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.stop_reason, StopReason::FinalAnswer);
    assert_eq!(r.final_text, "Recovered.");
    assert_eq!(outcomes(&r.dispatches[0]), ["invalid_arguments", "ok"]);
    assert!(
        r.dispatches[0][0].content.contains("not valid JSON"),
        "{}",
        r.dispatches[0][0].content
    );
    // The history sent back is valid for the API: `input: {}` and no private marker.
    let history = &server.requests()[1].body["messages"];
    assert_eq!(history[1]["content"][0]["input"], json!({}));
    assert!(history[1]["content"][0].get(MALFORMED_INPUT_KEY).is_none());
    assert_eq!(history[2], encode_anthropic(&r.dispatches[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_after_its_retry_after() {
    for stream in [false, true] {
        let log = EventLog::default();
        let server = MockServer::start(
            vec![
                MockTurn::status(
                    429,
                    &[("retry-after", "3")],
                    json!({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}),
                ),
                MockTurn::anthropic(message(vec![text("after the wait")], "end_turn")),
            ],
            log.clone(),
        )
        .await;
        let engine = test_engine(&log);
        // Backoff would wait 30 s; `retry-after: 3` means 3 × 20 ms here.
        let retry = RetryPolicy {
            base_delay: Duration::from_secs(30),
            max_delay: Duration::from_secs(30),
            ..fast_retry()
        };
        let provider = AnthropicProvider::new(http_config(server.anthropic_url(), retry)).unwrap();
        let mut agent = agent(&engine, std::sync::Arc::new(provider), stream, true);
        let r = tokio::time::timeout(Duration::from_secs(10), agent.run("go"))
            .await
            .expect("retry-after was honoured, not the 30 s backoff")
            .unwrap();
        assert_eq!(r.final_text, "after the wait");
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        assert!(requests[1].at.duration_since(requests[0].at) >= Duration::from_millis(60));
        assert_eq!(requests[0].body, requests[1].body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_up_to_the_bound_then_named() {
    let log = EventLog::default();
    let err = || {
        MockTurn::status(
            529,
            &[],
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
        )
    };
    let server = MockServer::start(vec![err(), err(), err(), err(), err()], log.clone()).await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, anthropic(&server), true, true);
    let e = agent.run("go").await.unwrap_err();
    assert_eq!(server.requests().len(), 4);
    assert!(matches!(
        e,
        AgentError::Provider(ProviderError::Status {
            status: 529,
            attempts: 4,
            ..
        })
    ));
    assert_eq!(
        e.to_string(),
        "anthropic: HTTP 529 after 4 attempts: overloaded_error: Overloaded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_names_the_variable_to_check_and_is_not_retried() {
    let log = EventLog::default();
    let server = MockServer::start(
        vec![MockTurn::status(
            401,
            &[],
            json!({"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}),
        )],
        log.clone(),
    )
    .await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, anthropic(&server), false, true);
    let e = agent.run("go").await.unwrap_err();
    assert_eq!(server.requests().len(), 1);
    assert_eq!(
        e.to_string(),
        "anthropic: HTTP 401: authentication_error: invalid x-api-key (check ANTHROPIC_API_KEY)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_are_retried_then_reported() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let log = EventLog::default();
    let engine = test_engine(&log);
    let provider = AnthropicProvider::new(http_config(
        format!("http://127.0.0.1:{port}"),
        fast_retry(),
    ))
    .unwrap();
    let mut agent = agent(&engine, std::sync::Arc::new(provider), true, true);
    let e = agent.run("go").await.unwrap_err().to_string();
    assert!(e.contains("cannot reach"), "{e}");
    assert!(e.contains("after 4 attempts"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_refused_before_any_request() {
    let e = AnthropicProvider::new(HttpConfig::new("http://127.0.0.1:9", None)).unwrap_err();
    assert_eq!(e, ProviderError::MissingKey("ANTHROPIC_API_KEY".into()));
    assert!(e.is_config());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_and_max_turns_stop_the_loop() {
    for stream in [false, true] {
        let log = EventLog::default();
        let server = MockServer::start(
            vec![MockTurn::anthropic(message(
                vec![text("I was cut o")],
                "max_tokens",
            ))],
            log.clone(),
        )
        .await;
        let engine = test_engine(&log);
        let mut a = agent(&engine, anthropic(&server), stream, true);
        let r = a.run("write a novel").await.unwrap();
        assert_eq!(r.stop_reason, StopReason::MaxTokens);
        assert_eq!(r.final_text, "I was cut o");
        assert_eq!(r.provider_stop_reason.as_deref(), Some("max_tokens"));

        let calls = |i: usize| {
            MockTurn::anthropic(message(
                vec![
                    text(&format!("turn {i}")),
                    tool_use(&format!("e{i}"), "echo", json!({"text": "x"})),
                ],
                "tool_use",
            ))
        };
        let server = MockServer::start(vec![calls(0), calls(1), calls(2)], log.clone()).await;
        let mut a = AgentLoop::new(engine.session(), anthropic(&server), config(2))
            .unwrap()
            .with_stream(StreamOptions {
                stream,
                eager: true,
            });
        let r = a.run("loop").await.unwrap();
        assert_eq!(r.stop_reason, StopReason::MaxTurns);
        assert_eq!(r.turns, 2);
        assert_eq!(r.final_text, "turn 1");
        assert_eq!(server.requests().len(), 2);
        assert_eq!(server.turns_left(), 1);
    }
}

/// [reader a, echo b, writer c, reader d]: a and b qualify for eager dispatch; c is serial, so
/// it and everything after it wait for the end of the stream.
fn eager_turns(hold: bool) -> Vec<MockTurn> {
    let mut first = MockTurn::anthropic(message(
        vec![
            text("Reading first."),
            tool_use("a", "reader", json!({})),
            tool_use("b", "echo", json!({"text": "b"})),
            tool_use("c", "writer", json!({})),
            tool_use("d", "reader", json!({})),
        ],
        "tool_use",
    ))
    .fragments(2);
    if hold {
        // The stream stays open after call a is complete until its handler has started.
        first = first.hold_after_call(0, "started reader a");
    }
    vec![
        first,
        MockTurn::anthropic(message(vec![text("done")], "end_turn")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_dispatch_starts_a_safe_call_before_the_stream_ends() {
    let log = EventLog::default();
    let server = MockServer::start(eager_turns(true), log.clone()).await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, anthropic(&server), true, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    assert!(position(&log, "started reader a") < position(&log, "stream ended"));
    // The serial call waited for the stream and for every call before it.
    assert!(position(&log, "stream ended") < position(&log, "started writer c"));
    assert!(position(&log, "finished reader a") < position(&log, "started writer c"));
    assert!(position(&log, "finished writer c") < position(&log, "started reader d"));
    // a certainly started eagerly; b did too unless its block arrived in the same network read
    // as the end of the stream (then it simply runs with the rest of the turn).
    assert!(matches!(r.eager[..], [1] | [2]), "{:?}", r.eager);
    let results = &r.dispatches[0];
    let ids: Vec<&str> = results.iter().map(|r| &*r.tool_use_id).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(outcomes(results), ["ok", "ok", "ok", "ok"]);
    assert_eq!(
        server.requests()[1].body["messages"][2],
        encode_anthropic(results)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_eager_dispatch_every_call_waits_for_the_end_of_the_stream() {
    let log = EventLog::default();
    let server = MockServer::start(eager_turns(false), log.clone()).await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, anthropic(&server), true, false);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    assert!(position(&log, "stream ended") < position(&log, "started reader a"));
    assert_eq!(r.eager, [0]);
    assert_eq!(outcomes(&r.dispatches[0]), ["ok", "ok", "ok", "ok"]);
}
