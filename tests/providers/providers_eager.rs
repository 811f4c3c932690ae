//! Eager dispatch with the scripted provider's simulated stream: a safe call starts before the
//! stream ends (proven by the order of logged events), serial calls wait for everything before
//! them, results stay in call order, duplicates cannot un-run a started call, and a provider
//! without real streaming still works with streaming on.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::EventLog;
use common::model::{self, BOUND, answer, config, test_engine, text, tool_use};
use common::outcomes;
use futures::future::BoxFuture;
use serde_json::json;
use switchboard::agent::{AgentLoop, StreamOptions};
use switchboard::agent::{
    MALFORMED_INPUT_KEY, ModelRequest, ModelResponse, Provider, ProviderError, ScriptedProvider,
};
use switchboard::protocol::encode_anthropic;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_safe_call_starts_while_the_scripted_stream_is_still_running() {
    let log = EventLog::default();
    let engine = test_engine(&log);
    let provider = Arc::new(
        ScriptedProvider::new([
            answer(
                vec![
                    text("Reading."),
                    tool_use("a", "reader", json!({"ms": 5})),
                    tool_use("b", "reader", json!({})),
                    tool_use("c", "writer", json!({})),
                ],
                "tool_use",
            ),
            answer(vec![text("done")], "end_turn"),
        ])
        .with_stream_delays(Duration::from_millis(1), Duration::ZERO)
        .with_log(log.shared())
        .hold_after_block(2, "started reader b"),
    );
    let mut agent = model::agent(&engine, provider.clone(), true, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    assert!(log.first_starting_with("started reader a") < log.first_starting_with("stream ended"));
    assert!(log.first_starting_with("started reader b") < log.first_starting_with("stream ended"));
    assert!(
        log.first_starting_with("finished reader a") < log.first_starting_with("started writer c")
    );
    assert!(log.first_starting_with("stream ended") < log.first_starting_with("started writer c"));
    assert_eq!(r.eager, [2]);
    let ids = common::ids(&r.dispatches[0]);
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(
        provider.requests()[1].messages[2],
        encode_anthropic(&r.dispatches[0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_id_stops_eager_dispatch_and_refuses_the_calls_not_started() {
    let log = EventLog::default();
    let engine = test_engine(&log);
    let blocks = || {
        vec![
            tool_use("x", "reader", json!({})),
            tool_use("x", "reader", json!({})),
            tool_use("y", "echo", json!({"text": "y"})),
        ]
    };
    let provider = Arc::new(
        ScriptedProvider::new([
            answer(blocks(), "tool_use"),
            answer(vec![text("done")], "end_turn"),
        ])
        .with_log(log.shared())
        .hold_after_block(0, "started reader x"),
    );
    let mut agent = model::agent(&engine, provider, true, true);
    let r = agent.run("go").await.unwrap();
    // The first x had started and cannot be un-run: it keeps its real result.
    assert_eq!(r.eager, [1]);
    assert_eq!(
        outcomes(&r.dispatches[0]),
        ["ok", "invalid_arguments", "invalid_arguments"]
    );
    assert!(r.dispatches[0][1].content.contains("duplicate tool_use_id"));
    assert_eq!(
        log.events()
            .iter()
            .filter(|e| e.starts_with("started"))
            .count(),
        1
    );

    // Without eager dispatch the engine's own rule applies: nothing of the turn runs.
    let log = EventLog::default();
    let engine = test_engine(&log);
    let provider = Arc::new(ScriptedProvider::new([
        answer(blocks(), "tool_use"),
        answer(vec![text("done")], "end_turn"),
    ]));
    let mut agent = model::agent(&engine, provider, true, false);
    let r = agent.run("go").await.unwrap();
    assert_eq!(
        outcomes(&r.dispatches[0]),
        [
            "invalid_arguments",
            "invalid_arguments",
            "invalid_arguments"
        ]
    );
    assert!(log.events().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_marked_malformed_is_answered_invalid_arguments_and_kept_clean_in_history() {
    let log = EventLog::default();
    let engine = test_engine(&log);
    let bad = || {
        let mut b = tool_use("m", "echo", json!({}));
        b[MALFORMED_INPUT_KEY] = "tool arguments are not valid JSON (EOF)".into();
        b
    };
    for stream in [false, true] {
        let provider = Arc::new(ScriptedProvider::new([
            answer(vec![bad()], "tool_use"),
            answer(vec![text("ok")], "end_turn"),
        ]));
        let mut agent = AgentLoop::new(engine.session(), provider.clone(), config(4))
            .unwrap()
            .with_stream(StreamOptions {
                stream,
                eager: true,
            });
        let r = agent.run("go").await.unwrap();
        assert_eq!(
            r.dispatches[0][0].content,
            "Error [invalid_arguments]: tool arguments are not valid JSON (EOF)"
        );
        assert_eq!(
            provider.requests()[1].messages[1],
            json!({"role":"assistant","content":[tool_use("m", "echo", json!({}))]})
        );
    }
}

/// A provider that only implements `complete`: the default `complete_streaming` is used.
struct WholeOnly(ScriptedProvider);

impl Provider for WholeOnly {
    fn name(&self) -> &str {
        "whole-only"
    }
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        self.0.complete(request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_without_streaming_still_works_with_streaming_on() {
    let log = EventLog::default();
    let engine = test_engine(&log);
    let provider = Arc::new(WholeOnly(ScriptedProvider::new([
        answer(
            vec![
                tool_use("a", "reader", json!({})),
                tool_use("b", "echo", json!({"text": "b"})),
            ],
            "tool_use",
        ),
        answer(vec![text("done")], "end_turn"),
    ])));
    let mut agent = model::agent(&engine, provider, true, true);
    let r = agent.run("go").await.unwrap();
    assert_eq!(r.final_text, "done");
    assert_eq!(outcomes(&r.dispatches[0]), ["ok", "ok"]);
}

/// A provider whose streamed blocks disagree with its final answer (streams `a`, `b`; answers
/// `a`, `c`, `d`).
struct Disagreeing {
    turn: std::sync::atomic::AtomicUsize,
}

impl Provider for Disagreeing {
    fn name(&self) -> &str {
        "disagreeing"
    }
    fn complete<'a>(
        &'a self,
        _request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(async { Ok(answer(vec![text("done")], "end_turn")) })
    }
    fn complete_streaming<'a>(
        &'a self,
        request: &'a ModelRequest,
        events: switchboard::agent::EventSink,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(async move {
            if self.turn.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                return self.complete(request).await;
            }
            for id in ["a", "b"] {
                let _ = events.send(switchboard::agent::StreamEvent::BlockComplete(tool_use(
                    id,
                    "reader",
                    json!({}),
                )));
            }
            Ok(answer(
                vec![
                    tool_use("a", "reader", json!({})),
                    tool_use("c", "reader", json!({})),
                    tool_use("d", "reader", json!({})),
                ],
                "tool_use",
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_results_that_disagree_with_the_final_answer_never_answer_the_wrong_call() {
    let log = EventLog::default();
    let engine = test_engine(&log);
    let provider = Arc::new(Disagreeing {
        turn: Default::default(),
    });
    let mut agent = model::agent(&engine, provider, true, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .expect("bounded")
        .unwrap();
    let ids = common::ids(&r.dispatches[0]);
    assert_eq!(ids, ["a", "c", "d"]);
    assert_eq!(outcomes(&r.dispatches[0]), ["ok", "ok", "ok"]);
}

/// `put` (writes the named resource `key`; has effects, so never eager) and `get` (reads it;
/// concurrency-safe), both logging `started`/`finished <name> <id>`.
fn keyed_engine(log: &EventLog) -> switchboard::Engine {
    use switchboard::{Access, Handler, Resource, ToolSpec};
    let keyed = |name: &'static str, write: bool| {
        let log = log.clone();
        ToolSpec::new(
            name,
            "Logs when it starts and ends.",
            json!({"type": "object", "properties": {"key": {"type": "string"}, "ms": {"type": "integer"}},
                   "required": ["key"]}),
            Handler::future(move |args: serde_json::Value, ctx| {
                let log = log.clone();
                async move {
                    log.push(format!("started {name} {}", ctx.call_id));
                    let ms = args.get("ms").and_then(serde_json::Value::as_u64).unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    log.push(format!("finished {name} {}", ctx.call_id));
                    Ok(format!("done {name}"))
                }
            }),
        )
        .concurrency_safe(!write)
        .access(move |args, _| {
            let key = args["key"].as_str().unwrap_or_default().to_string();
            let resource = Resource::named(key);
            Ok(if write {
                Access::write(resource)
            } else {
                Access::read(resource)
            })
        })
    };
    switchboard::Engine::builder()
        .tool(keyed("put", true))
        .tool(keyed("get", false))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_starts_while_streaming_behind_an_unrelated_write_but_not_behind_its_own() {
    let log = EventLog::default();
    let engine = keyed_engine(&log);
    let provider = Arc::new(
        ScriptedProvider::new([
            answer(
                vec![
                    tool_use("w", "put", json!({"key": "a", "ms": 5})),
                    tool_use("rb", "get", json!({"key": "b"})),
                    tool_use("ra", "get", json!({"key": "a"})),
                ],
                "tool_use",
            ),
            answer(vec![text("done")], "end_turn"),
        ])
        .with_stream_delays(Duration::from_millis(1), Duration::ZERO)
        .with_log(log.shared())
        .hold_after_block(1, "started get rb"),
    );
    let mut agent = model::agent(&engine, provider, true, true);
    let r = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .unwrap()
        .unwrap();
    // `rb` reads another resource than the unstarted write `w`: it started while streaming.
    assert!(log.first_starting_with("started get rb") < log.first_starting_with("stream ended"));
    // `ra` reads what `w` writes: it waited for the write, which waited for the stream.
    assert!(log.first_starting_with("stream ended") < log.first_starting_with("started put w"));
    assert!(log.first_starting_with("finished put w") < log.first_starting_with("started get ra"));
    assert_eq!(r.eager, [1]);
    assert_eq!(common::ids(&r.dispatches[0]), ["w", "rb", "ra"]);
    assert_eq!(outcomes(&r.dispatches[0]), ["ok", "ok", "ok"]);
}
