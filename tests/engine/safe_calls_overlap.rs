//! Concurrency-safe calls of one stage really run at the same time — proven with barriers that a
//! serial run can never pass, not with a stopwatch.

use crate::common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::json;
use switchboard::{Engine, Handler, ToolError, ToolSpec};
use tokio::sync::Barrier;

fn barrier_turn(n: usize) -> Vec<switchboard::ToolCall> {
    (0..n)
        .map(|i| call(&format!("b{i}"), "meet", json!({})))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_safe_calls_of_one_turn_all_wait_on_the_same_barrier_together() {
    let barrier = Arc::new(Barrier::new(8));
    let engine = Engine::builder()
        .tool(barrier_tool("meet", barrier, Duration::from_secs(5)))
        .workers(2)
        .max_concurrency(8)
        .build()
        .unwrap();
    let results = run_turn(&engine, barrier_turn(8)).await;
    assert_eq!(
        ids(&results),
        ["b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"]
    );
    for r in &results {
        assert_eq!(r.content, "passed", "{}", r.content);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_engine_configuration_lets_an_eight_call_stage_overlap() {
    let barrier = Arc::new(Barrier::new(8));
    let engine = engine(vec![barrier_tool("meet", barrier, Duration::from_secs(5))]);
    let results = run_turn(&engine, barrier_turn(8)).await;
    assert_eq!(results.len(), 8);
    for r in &results {
        assert_eq!(r.content, "passed", "{}", r.content);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_blocking_handler_does_not_stall_the_runtime_its_async_neighbour_runs_on() {
    let (tx, rx) = mpsc::channel::<String>();
    let rx = Arc::new(Mutex::new(rx));
    let tx = Arc::new(Mutex::new(tx));
    let waiter = ToolSpec::new(
        "wait_for_value",
        "Blocks until a value arrives.",
        any_object(),
        Handler::blocking(move |_args, _ctx| {
            let rx = rx.lock().unwrap();
            rx.recv_timeout(Duration::from_secs(5))
                .map(|v| format!("received {v}"))
                .map_err(|e| ToolError::execution(format!("nothing received: {e}")))
        }),
    )
    .concurrency_safe(true);
    let sender = ToolSpec::new(
        "send_value",
        "Sends a value after yielding to the runtime.",
        any_object(),
        Handler::future(move |_args, _ctx| {
            let tx = Arc::clone(&tx);
            async move {
                // Give the blocking call every chance to start first.
                tokio::time::sleep(Duration::from_millis(20)).await;
                tx.lock()
                    .unwrap()
                    .send("42".to_string())
                    .map(|()| "sent".to_string())
                    .map_err(|e| ToolError::execution(e.to_string()))
            }
        }),
    )
    .concurrency_safe(true);
    let engine = engine(vec![waiter, sender]);
    let results = run_turn(
        &engine,
        vec![
            call("w", "wait_for_value", json!({})),
            call("s", "send_value", json!({})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["w", "s"]);
    assert_eq!(results[0].content, "received 42");
    assert_eq!(results[1].content, "sent");
}

// Paused time: the handler is in-process, so its timeout elapses at once and exactly.
#[tokio::test(start_paused = true)]
async fn a_global_cap_of_one_keeps_two_safe_calls_from_meeting_at_a_barrier() {
    let barrier = Arc::new(Barrier::new(2));
    let engine = Engine::builder()
        .tool(barrier_tool("meet", barrier, Duration::from_millis(300)))
        .max_concurrency(1)
        .build()
        .unwrap();
    let results = run_turn(&engine, barrier_turn(2)).await;
    assert_eq!(ids(&results), ["b0", "b1"]);
    assert!(
        !(results[0].is_ok() && results[1].is_ok()),
        "with one permit the two calls must not overlap: {results:?}"
    );
    assert!(
        results
            .iter()
            .any(|r| r.content == "Error [execution_error]: barrier timed out"),
        "the call holding the only permit waits alone and times out: {results:?}"
    );
}
