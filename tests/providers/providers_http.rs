//! Both HTTP providers (Anthropic Messages, OpenAI Chat Completions) against the local mock
//! server, every test written once and run for each (`anthropic::…`, `openai::…`; the wire
//! shapes are in `tests/common/wire.rs`): exactly the registry catalog out and exactly the
//! encoded results back, streamed or not; streamed arguments assembled however they are split;
//! bad arguments answered `invalid_arguments`; retries, auth errors, missing keys, stop reasons;
//! eager dispatch proven by the order of events.

use crate::common;

use std::time::Duration;

use common::EventLog;
use common::mock_server::{MockServer, MockTurn};
use common::model::{BOUND, MODEL, SYSTEM, agent, config, fast_retry, test_engine};
use common::outcomes;
use common::wire::{Call, Stop, Wire};
use serde_json::Value;
use switchboard::Engine;
use switchboard::agent::{AgentError, AgentLoop, LoopResult, StopReason, StreamOptions};
use switchboard::agent::{HttpConfig, RetryPolicy};
use switchboard::agent::{MALFORMED_INPUT_KEY, ProviderError};

/// Runs each named scenario (an `async fn(Wire)` below) once per provider, as
/// `anthropic::<name>` and `openai::<name>`.
macro_rules! for_each_wire {
    ($($scenario:ident),* $(,)?) => {
        mod anthropic {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Wire::Anthropic).await;
                }
            )*
        }
        mod openai {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Wire::OpenAi).await;
                }
            )*
        }
    };
}

for_each_wire!(
    whole_answers_carry_the_catalog_and_then_exactly_the_encoded_results,
    streamed_answers_carry_the_catalog_and_then_exactly_the_encoded_results,
    streamed_arguments_assemble_however_they_are_split,
    bad_json_arguments_are_answered_invalid_arguments_and_the_loop_continues,
    a_429_is_retried_after_its_retry_after,
    a_503_is_retried,
    server_errors_are_retried_up_to_the_bound_then_named,
    a_401_names_the_variable_to_check_and_is_not_retried,
    connection_failures_are_retried_then_reported,
    a_missing_key_is_refused_before_any_request_where_the_endpoint_needs_one,
    max_tokens_and_max_turns_stop_the_loop,
    eager_dispatch_starts_a_safe_call_before_the_stream_ends,
    a_serial_call_ends_eager_dispatch_and_waits_for_the_stream,
    without_eager_dispatch_every_call_waits_for_the_end_of_the_stream,
);

/// A mock server scripted with `turns`, the event log it and the handlers write to, and the
/// engine of `echo`, `reader` and `writer`.
struct Scene {
    log: EventLog,
    server: MockServer,
    engine: Engine,
}

impl Scene {
    async fn new(turns: Vec<MockTurn>) -> Scene {
        let log = EventLog::default();
        let server = MockServer::start(turns, log.clone()).await;
        let engine = test_engine(&log);
        Scene {
            log,
            server,
            engine,
        }
    }

    /// A loop talking to the server through `wire`'s provider.
    fn agent(&self, wire: Wire, stream: bool, eager: bool) -> AgentLoop {
        agent(&self.engine, wire.provider(&self.server), stream, eager)
    }

    /// Runs `prompt` to its end, bounded by [`BOUND`]; panics on an error.
    async fn run(&self, wire: Wire, stream: bool, eager: bool, prompt: &str) -> LoopResult {
        let mut agent = self.agent(wire, stream, eager);
        tokio::time::timeout(BOUND, agent.run(prompt))
            .await
            .expect("the loop ended within the bound")
            .unwrap()
    }
}

async fn whole_answers_carry_the_catalog_and_then_exactly_the_encoded_results(wire: Wire) {
    catalog_and_results(wire, false).await;
}

async fn streamed_answers_carry_the_catalog_and_then_exactly_the_encoded_results(wire: Wire) {
    catalog_and_results(wire, true).await;
}

async fn catalog_and_results(wire: Wire, stream: bool) {
    let calls: [Call; 3] = [
        ("t1", "echo", r#"{"text":"hi"}"#),
        ("t2", "nope", "{}"),
        ("t3", "echo", r#"{"text":5}"#),
    ];
    let scene = Scene::new(vec![
        wire.turn(Some("Checking."), &calls, Stop::ToolUse)
            .fragments(4),
        wire.final_answer("All done."),
    ])
    .await;
    let r = scene.run(wire, stream, true, "go").await;
    assert_eq!(r.stop_reason, StopReason::FinalAnswer);
    assert_eq!(r.provider_stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(r.final_text, "All done.");
    assert_eq!(r.turns, 2);
    assert_eq!(r.tool_calls, 3);
    assert_eq!(
        outcomes(&r.dispatches[0]),
        ["ok", "unknown_tool", "invalid_arguments"]
    );
    assert_eq!(r.dispatches[0][0].content, "echo:hi");

    let requests = scene.server.requests();
    assert_eq!(requests.len(), 2);
    let catalog = scene.engine.catalog(wire.catalog_format()).await.unwrap();
    for req in &requests {
        wire.assert_endpoint_and_key(req);
        assert_eq!(req.body["tools"], Value::Array(catalog.clone()));
        assert_eq!(req.body["model"], MODEL);
        assert_eq!(wire.system_prompt(&req.body), SYSTEM);
        assert_eq!(req.body["max_tokens"], 1000);
        assert_eq!(req.body.get("stream").is_some(), stream);
    }
    assert_eq!(
        wire.conversation(&requests[0].body),
        [wire.prompt_message("go")]
    );
    let second = wire.conversation(&requests[1].body);
    let results = wire.result_messages(&r.dispatches[0]);
    assert_eq!(second.len(), 2 + results.len());
    assert_eq!(second[1], wire.assistant_message(Some("Checking."), &calls));
    assert_eq!(second[2..], results[..]);
}

/// Argument text with escapes (`\"`, `\\`, `\u00e9`, a surrogate pair) and multi-byte UTF-8.
const RAW_ARGS: &str = r#"{"text":"caf\u00e9 \"q\" \\ naïve 😀 \ud83d\ude00"}"#;
const ECHOED: &str = "echo:café \"q\" \\ naïve 😀 😀";

/// One-character argument fragments in body chunks of one to three bytes, so fragments split
/// inside UTF-8 characters and escapes; two calls, so arguments assemble per call.
async fn streamed_arguments_assemble_however_they_are_split(wire: Wire) {
    let calls: [Call; 2] = [
        ("t1", "echo", RAW_ARGS),
        ("t2", "echo", r#"{"text":"2nd"}"#),
    ];
    for chunk in [1, 2, 3] {
        let scene = Scene::new(vec![
            wire.turn(Some("Echo: é😀"), &calls, Stop::ToolUse)
                .fragments(1)
                .chunks(chunk),
            wire.final_answer("ok").chunks(chunk),
        ])
        .await;
        let r = scene.run(wire, true, true, "echo").await;
        assert_eq!(r.dispatches[0][0].content, ECHOED, "chunks of {chunk}");
        assert_eq!(r.dispatches[0][1].content, "echo:2nd", "chunks of {chunk}");
        let history = wire.conversation(&scene.server.requests()[1].body);
        assert_eq!(
            history[1],
            wire.assistant_message(Some("Echo: é😀"), &calls),
            "chunks of {chunk}"
        );
    }
}

async fn bad_json_arguments_are_answered_invalid_arguments_and_the_loop_continues(wire: Wire) {
    let calls: [Call; 2] = [
        ("t1", "echo", r#"{"text": "unterminated"#),
        ("t2", "echo", r#"{"text":"fine"}"#),
    ];
    for stream in [false, true] {
        if !wire.can_send_unparsable_arguments(stream) {
            continue;
        }
        for fragment in [2, 3] {
            let scene = Scene::new(vec![
                wire.turn(None, &calls, Stop::ToolUse).fragments(fragment),
                wire.final_answer("Recovered."),
            ])
            .await;
            let r = scene.run(wire, stream, true, "go").await;
            assert_eq!(r.stop_reason, StopReason::FinalAnswer);
            assert_eq!(r.final_text, "Recovered.");
            assert_eq!(outcomes(&r.dispatches[0]), ["invalid_arguments", "ok"]);
            assert!(
                r.dispatches[0][0].content.contains("not valid JSON"),
                "{}",
                r.dispatches[0][0].content
            );
            // The history sent back is valid for the API: the bad call's arguments are an empty
            // object, and no private marker leaks.
            let history = wire.conversation(&scene.server.requests()[1].body);
            assert_eq!(history[1], wire.assistant_message(None, &calls));
            assert!(!history[1].to_string().contains(MALFORMED_INPUT_KEY));
            assert_eq!(history[2..], wire.result_messages(&r.dispatches[0])[..]);
        }
    }
}

async fn a_429_is_retried_after_its_retry_after(wire: Wire) {
    for stream in [false, true] {
        let scene = Scene::new(vec![
            wire.error(
                429,
                &[("retry-after", "3")],
                "rate_limit_error",
                "slow down",
            ),
            wire.final_answer("after the wait"),
        ])
        .await;
        // Backoff would wait 30 s; `retry-after: 3` means 3 × 20 ms here.
        let retry = RetryPolicy {
            base_delay: Duration::from_secs(30),
            max_delay: Duration::from_secs(30),
            ..fast_retry()
        };
        let provider = wire.provider_at(wire.url(&scene.server), retry);
        let mut agent = agent(&scene.engine, provider, stream, true);
        let r = tokio::time::timeout(Duration::from_secs(10), agent.run("go"))
            .await
            .expect("retry-after was honoured, not the 30 s backoff")
            .unwrap();
        assert_eq!(r.final_text, "after the wait");
        let requests = scene.server.requests();
        assert_eq!(requests.len(), 2);
        assert!(requests[1].at.duration_since(requests[0].at) >= Duration::from_millis(60));
        assert_eq!(requests[0].body, requests[1].body);
    }
}

async fn a_503_is_retried(wire: Wire) {
    let scene = Scene::new(vec![
        wire.error(503, &[("retry-after", "0")], "overloaded", "busy"),
        wire.final_answer("ok"),
    ])
    .await;
    let mut agent = scene.agent(wire, true, true);
    assert_eq!(agent.run("go").await.unwrap().final_text, "ok");
    assert_eq!(scene.server.requests().len(), 2);
}

async fn server_errors_are_retried_up_to_the_bound_then_named(wire: Wire) {
    let err = || wire.error(529, &[], "overloaded_error", "Overloaded");
    let scene = Scene::new(vec![err(), err(), err(), err(), err()]).await;
    let e = scene.agent(wire, true, true).run("go").await.unwrap_err();
    assert_eq!(scene.server.requests().len(), 4);
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
        format!(
            "{}: HTTP 529 after 4 attempts: overloaded_error: Overloaded",
            wire.name()
        )
    );
}

async fn a_401_names_the_variable_to_check_and_is_not_retried(wire: Wire) {
    for stream in [false, true] {
        let scene = Scene::new(vec![wire.error(
            401,
            &[],
            "authentication_error",
            "invalid key",
        )])
        .await;
        let mut agent = scene.agent(wire, stream, true);
        let e = agent.run("go").await.unwrap_err().to_string();
        assert_eq!(scene.server.requests().len(), 1);
        assert!(e.contains("HTTP 401"), "{e}");
        assert!(
            e.ends_with(&format!("(check {})", wire.key_variable())),
            "{e}"
        );
        assert_eq!(
            e,
            format!(
                "{}: HTTP 401: authentication_error: invalid key (check {})",
                wire.name(),
                wire.key_variable()
            )
        );
    }
}

async fn connection_failures_are_retried_then_reported(wire: Wire) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let engine = test_engine(&EventLog::default());
    let url = wire.base_url(&format!("http://127.0.0.1:{port}"));
    let mut agent = agent(&engine, wire.provider_at(url, fast_retry()), true, true);
    let e = agent.run("go").await.unwrap_err().to_string();
    assert!(e.contains("cannot reach"), "{e}");
    assert!(e.contains("after 4 attempts"), "{e}");
}

/// The public endpoint always needs a key; a local server needs one only on Anthropic, and an
/// OpenAI-compatible local server without a key gets no `Authorization` header.
async fn a_missing_key_is_refused_before_any_request_where_the_endpoint_needs_one(wire: Wire) {
    let missing = ProviderError::MissingKey(wire.key_variable().into());
    let e = wire
        .provider_for(HttpConfig::new(wire.public_url(), None))
        .err()
        .expect("the public endpoint needs a key");
    assert_eq!(e, missing);
    assert!(e.is_config());

    let scene = Scene::new(vec![wire.final_answer("local")]).await;
    let local = wire.provider_for(HttpConfig::new(wire.url(&scene.server), None));
    if wire.local_server_needs_a_key() {
        assert_eq!(local.err(), Some(missing));
        assert!(scene.server.requests().is_empty());
    } else {
        let mut local = agent(&scene.engine, local.unwrap(), false, true);
        assert_eq!(local.run("hi").await.unwrap().final_text, "local");
        assert!(
            !scene.server.requests()[0]
                .headers
                .contains_key("authorization")
        );
    }
}

async fn max_tokens_and_max_turns_stop_the_loop(wire: Wire) {
    for stream in [false, true] {
        let scene = Scene::new(vec![wire.turn(Some("I was cut o"), &[], Stop::MaxTokens)]).await;
        let mut a = scene.agent(wire, stream, true);
        let r = a.run("write a novel").await.unwrap();
        assert_eq!(r.stop_reason, StopReason::MaxTokens);
        assert_eq!(r.final_text, "I was cut o");
        assert_eq!(r.provider_stop_reason.as_deref(), Some("max_tokens"));

        let calls = |i: usize| {
            let id = format!("e{i}");
            let text = format!("turn {i}");
            wire.turn(
                Some(&text),
                &[(&id, "echo", r#"{"text":"x"}"#)],
                Stop::ToolUse,
            )
        };
        let server = MockServer::start(vec![calls(0), calls(1), calls(2)], scene.log.clone()).await;
        let mut a = AgentLoop::new(scene.engine.session(), wire.provider(&server), config(2))
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
fn eager_turns(wire: Wire, hold: bool) -> Vec<MockTurn> {
    let mut first = wire
        .turn(
            Some("Reading first."),
            &[
                ("a", "reader", "{}"),
                ("b", "echo", r#"{"text":"b"}"#),
                ("c", "writer", "{}"),
                ("d", "reader", "{}"),
            ],
            Stop::ToolUse,
        )
        .fragments(2);
    if hold {
        // The stream stays open after call a is complete until its handler has started.
        first = first.hold_after_call(0, "started reader a");
    }
    vec![first, wire.final_answer("done")]
}

async fn eager_dispatch_starts_a_safe_call_before_the_stream_ends(wire: Wire) {
    let scene = Scene::new(eager_turns(wire, true)).await;
    let r = scene.run(wire, true, true, "go").await;
    let at = |prefix: &str| scene.log.first_starting_with(prefix);
    assert!(at("started reader a") < at("stream ended"));
    // The serial call waited for the stream and for every call before it.
    assert!(at("stream ended") < at("started writer c"));
    assert!(at("finished reader a") < at("started writer c"));
    assert!(at("finished writer c") < at("started reader d"));
    // a certainly started eagerly; b did too unless its block arrived in the same network read
    // as the end of the stream (then it simply runs with the rest of the turn).
    assert!(matches!(r.eager[..], [1] | [2]), "{:?}", r.eager);
    let results = &r.dispatches[0];
    let ids = common::ids(results);
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(outcomes(results), ["ok", "ok", "ok", "ok"]);
    assert_eq!(
        wire.conversation(&scene.server.requests()[1].body)[2..],
        wire.result_messages(results)[..]
    );
}

/// [reader a, writer b, reader c], one-character fragments: only a starts eagerly.
async fn a_serial_call_ends_eager_dispatch_and_waits_for_the_stream(wire: Wire) {
    let scene = Scene::new(vec![
        wire.turn(
            None,
            &[
                ("a", "reader", "{}"),
                ("b", "writer", "{}"),
                ("c", "reader", "{}"),
            ],
            Stop::ToolUse,
        )
        .fragments(1)
        .hold_after_call(0, "started reader a"),
        wire.final_answer("done"),
    ])
    .await;
    let r = scene.run(wire, true, true, "go").await;
    let at = |prefix: &str| scene.log.first_starting_with(prefix);
    assert!(at("started reader a") < at("stream ended"));
    assert!(at("stream ended") < at("started writer b"));
    assert!(at("finished writer b") < at("started reader c"));
    assert_eq!(r.eager, [1]);
    let ids = common::ids(&r.dispatches[0]);
    assert_eq!(ids, ["a", "b", "c"]);
}

async fn without_eager_dispatch_every_call_waits_for_the_end_of_the_stream(wire: Wire) {
    let scene = Scene::new(eager_turns(wire, false)).await;
    let r = scene.run(wire, true, false, "go").await;
    assert!(
        scene.log.first_starting_with("stream ended")
            < scene.log.first_starting_with("started reader a")
    );
    assert_eq!(r.eager, [0]);
    assert_eq!(outcomes(&r.dispatches[0]), ["ok", "ok", "ok", "ok"]);
}
