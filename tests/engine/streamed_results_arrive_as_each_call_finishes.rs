//! A streamed turn (`Session::dispatch_streaming`) hands over each result the moment its call
//! answers — also inside one concurrent stage run on a worker — while the turn's own answer
//! stays complete and in call order. Proven with a gate, not a clock: the slow call cannot
//! finish until the test has seen the fast call's result.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use switchboard::{Engine, Handler, ToolCall, ToolSpec};
use tokio::sync::Notify;

fn schema() -> serde_json::Value {
    json!({"type": "object", "additionalProperties": false})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_result_of_a_concurrent_stage_is_streamed_as_it_answers() {
    let gate = Arc::new(Notify::new());
    let held = Arc::clone(&gate);
    let engine = Engine::builder()
        .tool(
            ToolSpec::new(
                "slow",
                "Waits for the test's gate.",
                schema(),
                Handler::future(move |_, _| {
                    let held = Arc::clone(&held);
                    async move {
                        held.notified().await;
                        Ok("slow".to_string())
                    }
                }),
            )
            .concurrency_safe(true),
        )
        .tool(
            ToolSpec::new(
                "fast",
                "Answers at once (but asynchronously, so the stage goes to a worker).",
                schema(),
                Handler::future(|_, _| async { Ok("fast".to_string()) }),
            )
            .concurrency_safe(true),
        )
        .build()
        .unwrap();
    let session = engine.session();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let calls = vec![
        ToolCall::new("a", "slow", json!({})),
        ToolCall::new("b", "fast", json!({})),
        ToolCall::new("c", "missing", json!({})),
    ];
    let turn = {
        let (session, token) = (session.clone(), session.turn_token());
        tokio::spawn(async move { session.dispatch_streaming(calls, token, tx).await })
    };
    let within = Duration::from_secs(30);
    let first = tokio::time::timeout(within, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.0, &*first.1.tool_use_id),
        (2, "c"),
        "the refused call first"
    );
    let second = tokio::time::timeout(within, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (second.0, second.1.content.as_str()),
        (1, "fast"),
        "before the slow call ends"
    );
    assert!(!turn.is_finished());
    gate.notify_one();
    let third = tokio::time::timeout(within, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((third.0, third.1.content.as_str()), (0, "slow"));
    let results = turn.await.unwrap().expect("engine available");
    let ids: Vec<&str> = results.iter().map(|r| &*r.tool_use_id).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(rx.recv().await.is_none(), "no result is sent twice");
    engine.shutdown(Duration::from_secs(1)).await;
}
