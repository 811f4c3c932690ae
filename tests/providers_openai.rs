//! The OpenAI Chat Completions–compatible provider against the local mock server: the catalog as
//! functions, the Anthropic-shaped history converted (assistant `tool_calls` with string
//! arguments, `role: tool` results), streamed `tool_calls` assembled per index, bad arguments
//! answered `invalid_arguments`, the key error, stop reasons, eager dispatch.

mod common_mock;

use common_mock::*;
use serde_json::{Value, json};
use switchboard::agent_loop::StopReason;
use switchboard::protocol::encode_openai;
use switchboard::provider::{EventLog, ProviderError};
use switchboard::providers::{HttpConfig, OPENAI_BASE_URL, OpenAiProvider};
use switchboard::registry::CatalogFormat;

async fn catalog_and_results(stream: bool) {
    let log = EventLog::default();
    let server = MockServer::start(
        vec![
            MockTurn::openai(completion(
                Some("Checking."),
                &[
                    ("c1", "echo", r#"{"text":"hi"}"#),
                    ("c2", "nope", "{}"),
                    ("c3", "echo", r#"{"text":5}"#),
                ],
                "tool_calls",
            ))
            .fragments(4),
            MockTurn::openai(completion(Some("All done."), &[], "stop")),
        ],
        log.clone(),
    )
    .await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, openai(&server), stream, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.stop_reason, StopReason::FinalAnswer);
    assert_eq!(r.provider_stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(r.final_text, "All done.");
    assert_eq!(
        outcomes(&r.dispatches[0]),
        ["ok", "unknown_tool", "invalid_arguments"]
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let catalog = engine.catalog(CatalogFormat::OpenAi).await.unwrap();
    for req in &requests {
        assert_eq!(req.path, "/v1/chat/completions");
        assert_eq!(req.headers["authorization"], "Bearer test-key");
        assert_eq!(req.body["tools"], Value::Array(catalog.clone()));
        assert_eq!(req.body["model"], "mock-model");
        assert_eq!(req.body["max_tokens"], 1000);
        assert_eq!(req.body.get("stream").is_some(), stream);
    }
    assert_eq!(
        requests[0].body["messages"],
        json!([{"role":"system","content":"be brief"},{"role":"user","content":"go"}])
    );
    let second = requests[1].body["messages"].as_array().unwrap();
    assert_eq!(second.len(), 6);
    assert_eq!(
        second[2],
        json!({"role":"assistant","content":"Checking.","tool_calls":[
            {"id":"c1","type":"function","function":{"name":"echo","arguments":"{\"text\":\"hi\"}"}},
            {"id":"c2","type":"function","function":{"name":"nope","arguments":"{}"}},
            {"id":"c3","type":"function","function":{"name":"echo","arguments":"{\"text\":5}"}}
        ]})
    );
    assert_eq!(
        Value::Array(second[3..].to_vec()),
        encode_openai(&r.dispatches[0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_answers_carry_the_catalog_and_then_exactly_the_encoded_results() {
    catalog_and_results(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answers_carry_the_catalog_and_then_exactly_the_encoded_results() {
    catalog_and_results(true).await;
}

const RAW_ARGS: &str = r#"{"text":"caf\u00e9 \"q\" \\ naïve 😀 \ud83d\ude00"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_arguments_assemble_per_index_however_they_are_split() {
    for chunk in [1, 3] {
        let log = EventLog::default();
        let server = MockServer::start(
            vec![
                MockTurn::openai(completion(
                    Some("é😀"),
                    &[
                        ("c1", "echo", RAW_ARGS),
                        ("c2", "echo", r#"{"text":"2nd"}"#),
                    ],
                    "tool_calls",
                ))
                .fragments(1)
                .chunks(chunk),
                MockTurn::openai(completion(Some("ok"), &[], "stop")),
            ],
            log.clone(),
        )
        .await;
        let engine = test_engine(&log);
        let mut agent = agent(&engine, openai(&server), true, true);
        let r = tokio::time::timeout(BOUND, agent.run("echo"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.dispatches[0][0].content, "echo:café \"q\" \\ naïve 😀 😀");
        assert_eq!(r.dispatches[0][1].content, "echo:2nd");
        assert_eq!(server.requests()[1].body["messages"][2]["content"], "é😀");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_arguments_are_answered_invalid_arguments_and_the_loop_continues() {
    for stream in [false, true] {
        let log = EventLog::default();
        let server = MockServer::start(
            vec![
                MockTurn::openai(completion(
                    None,
                    &[
                        ("c1", "echo", r#"{"text": "unterminated"#),
                        ("c2", "echo", r#"{"text":"ok"}"#),
                    ],
                    "tool_calls",
                ))
                .fragments(2),
                MockTurn::openai(completion(Some("Recovered."), &[], "stop")),
            ],
            log.clone(),
        )
        .await;
        let engine = test_engine(&log);
        let mut agent = agent(&engine, openai(&server), stream, true);
        let r = tokio::time::timeout(BOUND, agent.run("go"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.final_text, "Recovered.");
        assert_eq!(outcomes(&r.dispatches[0]), ["invalid_arguments", "ok"]);
        assert!(r.dispatches[0][0].content.contains("not valid JSON"));
        let second = &server.requests()[1].body["messages"];
        assert_eq!(second[2]["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(second[3], encode_openai(&r.dispatches[0])[0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_names_openai_api_key_and_a_missing_key_is_refused_for_the_public_endpoint() {
    let log = EventLog::default();
    let server = MockServer::start(
        vec![MockTurn::status(
            401,
            &[],
            json!({"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}),
        )],
        log.clone(),
    )
    .await;
    let engine = test_engine(&log);
    let mut first = agent(&engine, openai(&server), true, true);
    let e = first.run("go").await.unwrap_err().to_string();
    assert!(e.contains("HTTP 401"), "{e}");
    assert!(e.ends_with("(check OPENAI_API_KEY)"), "{e}");
    assert_eq!(server.requests().len(), 1);

    assert_eq!(
        OpenAiProvider::new(HttpConfig::new(OPENAI_BASE_URL, None)).unwrap_err(),
        ProviderError::MissingKey("OPENAI_API_KEY".into())
    );
    // A local server needs no key, and gets no Authorization header.
    let server = MockServer::start(
        vec![MockTurn::openai(completion(Some("local"), &[], "stop"))],
        log.clone(),
    )
    .await;
    let provider = OpenAiProvider::new(HttpConfig::new(server.openai_url(), None)).unwrap();
    let mut local = agent(&engine, std::sync::Arc::new(provider), false, true);
    assert_eq!(local.run("hi").await.unwrap().final_text, "local");
    assert!(!server.requests()[0].headers.contains_key("authorization"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_reason_length_is_max_tokens() {
    for stream in [false, true] {
        let log = EventLog::default();
        let server = MockServer::start(
            vec![MockTurn::openai(completion(Some("cut o"), &[], "length"))],
            log.clone(),
        )
        .await;
        let engine = test_engine(&log);
        let mut agent = agent(&engine, openai(&server), stream, true);
        let r = agent.run("go").await.unwrap();
        assert_eq!(r.stop_reason, StopReason::MaxTokens);
        assert_eq!(r.final_text, "cut o");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_retried() {
    let log = EventLog::default();
    let server = MockServer::start(
        vec![
            MockTurn::status(
                503,
                &[("retry-after", "0")],
                json!({"error":{"message":"busy"}}),
            ),
            MockTurn::openai(completion(Some("ok"), &[], "stop")),
        ],
        log.clone(),
    )
    .await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, openai(&server), true, true);
    assert_eq!(agent.run("go").await.unwrap().final_text, "ok");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_dispatch_starts_a_safe_call_before_the_stream_ends() {
    let log = EventLog::default();
    let server = MockServer::start(
        vec![
            MockTurn::openai(completion(
                None,
                &[
                    ("a", "reader", "{}"),
                    ("b", "writer", "{}"),
                    ("c", "reader", "{}"),
                ],
                "tool_calls",
            ))
            .fragments(1)
            .hold_after_call(0, "started reader a"),
            MockTurn::openai(completion(Some("done"), &[], "stop")),
        ],
        log.clone(),
    )
    .await;
    let engine = test_engine(&log);
    let mut agent = agent(&engine, openai(&server), true, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    assert!(position(&log, "started reader a") < position(&log, "stream ended"));
    assert!(position(&log, "stream ended") < position(&log, "started writer b"));
    assert!(position(&log, "finished writer b") < position(&log, "started reader c"));
    assert_eq!(r.eager, [1]);
    let ids: Vec<&str> = r.dispatches[0].iter().map(|r| &*r.tool_use_id).collect();
    assert_eq!(ids, ["a", "b", "c"]);
}
