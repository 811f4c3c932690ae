//! Deadlines, session cancellation and engine shutdown: a call that cannot finish is still
//! answered, once, and nothing runs after its session or engine is gone.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchboard::{EngineError, ErrorCode, Handler, ToolSpec};
use tokio::sync::Notify;

/// An async tool that announces its start and then sleeps 30 s, ignoring cancellation.
fn stubborn_tool(name: &str, started: Arc<Notify>) -> ToolSpec {
    ToolSpec::new(
        name,
        "Sleeps for a long time and ignores cancellation.",
        any_object(),
        Handler::future(move |_args, _ctx| {
            let started = Arc::clone(&started);
            async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok("finished after 30 s".to_string())
            }
        }),
    )
    .concurrency_safe(true)
}

// Paused time: the handler is in-process, so its timeout elapses at once and exactly.
#[tokio::test(start_paused = true)]
async fn an_async_call_past_its_deadline_is_answered_timeout_and_the_turn_returns() {
    let slow = ToolSpec::new(
        "slow",
        "Sleeps 30 s.",
        any_object(),
        Handler::future(|_args, _ctx| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok("woke up".to_string())
        }),
    )
    .concurrency_safe(true)
    .timeout(Duration::from_millis(100));
    let engine = engine(vec![slow, echo_tool("echo")]);
    let results = run_turn(
        &engine,
        vec![
            call("s", "slow", json!({})),
            call("e", "echo", json!({"text": "fine"})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["s", "e"]);
    assert_eq!(results[0].error, Some(ErrorCode::Timeout));
    assert!(
        results[0].content.starts_with("Error [timeout]: "),
        "{}",
        results[0].content
    );
    assert_eq!(results[1].content, "echo:fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_past_its_deadline_is_answered_timeout_not_with_its_late_result() {
    let slow = ToolSpec::new(
        "slow_blocking",
        "Keeps working a little past its deadline, then succeeds.",
        any_object(),
        Handler::blocking(|_args, ctx| {
            let until = ctx.deadline + Duration::from_millis(300);
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok("finished late".to_string())
        }),
    )
    .timeout(Duration::from_millis(100));
    let engine = engine(vec![slow]);
    let results = run_turn(&engine, vec![call("b", "slow_blocking", json!({}))]).await;
    assert_eq!(ids(&results), ["b"]);
    assert_eq!(
        results[0].error,
        Some(ErrorCode::Timeout),
        "{}",
        results[0].content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_session_answers_its_running_and_later_calls_cancelled_only() {
    let started = Arc::new(Notify::new());
    let counter = Arc::new(AtomicUsize::new(0));
    let async_counter = Arc::new(AtomicUsize::new(0));
    let ac = Arc::clone(&async_counter);
    let counting_async = ToolSpec::new(
        "count_async",
        "Counts, asynchronously.",
        any_object(),
        Handler::future(move |_args, _ctx| {
            let ac = Arc::clone(&ac);
            async move {
                ac.fetch_add(1, Ordering::SeqCst);
                Ok("ran".to_string())
            }
        }),
    );
    let engine = engine(vec![
        stubborn_tool("long", Arc::clone(&started)),
        counting_tool("count", Arc::clone(&counter)),
        counting_async,
    ]);
    let doomed = engine.session();
    let bystander = engine.session();

    let running = {
        let doomed = doomed.clone();
        tokio::spawn(async move {
            doomed
                .dispatch(vec![
                    call("l", "long", json!({})),
                    // Not concurrency-safe: a stage of its own, after the long call.
                    call("after", "count_async", json!({})),
                ])
                .await
                .expect("engine available")
        })
    };
    tokio::time::timeout(TURN_BOUND, started.notified())
        .await
        .expect("the long call started");
    doomed.cancel();
    assert!(doomed.is_cancelled());

    let results = tokio::time::timeout(TURN_BOUND, running)
        .await
        .expect("the cancelled turn returned")
        .unwrap();
    assert_eq!(ids(&results), ["l", "after"]);
    assert_eq!(results[0].error, Some(ErrorCode::Cancelled));
    assert_eq!(results[1].error, Some(ErrorCode::Cancelled));
    assert!(results[0].content.starts_with("Error [cancelled]: "));

    // Later turns of the cancelled session are answered without running anything.
    let later = tokio::time::timeout(
        TURN_BOUND,
        doomed.dispatch(vec![
            call("x", "count", json!({})),
            call("y", "count_async", json!({})),
            call("z", "ghost", json!({})),
        ]),
    )
    .await
    .unwrap()
    .expect("a cancelled session still answers its turns");
    assert_eq!(ids(&later), ["x", "y", "z"]);
    assert_eq!(later[0].error, Some(ErrorCode::Cancelled));
    assert_eq!(later[1].error, Some(ErrorCode::Cancelled));
    assert_eq!(counter.load(Ordering::SeqCst), 0);
    assert_eq!(async_counter.load(Ordering::SeqCst), 0);

    // Another session and the engine's shared dispatch are unaffected.
    assert!(!bystander.is_cancelled());
    let other = tokio::time::timeout(
        TURN_BOUND,
        bystander.dispatch(vec![
            call("o1", "count", json!({})),
            call("o2", "count_async", json!({})),
        ]),
    )
    .await
    .unwrap()
    .expect("engine available");
    assert_eq!(outcomes(&other), ["ok", "ok"]);
    let shared = run_turn(&engine, vec![call("s1", "count", json!({}))]).await;
    assert_eq!(outcomes(&shared), ["ok"]);
    assert_eq!(counter.load(Ordering::SeqCst), 2);
    assert_eq!(async_counter.load(Ordering::SeqCst), 1);
}

// Paused time: the handler is in-process, so its timeout elapses at once and exactly.
#[tokio::test(start_paused = true)]
async fn shutdown_answers_a_stubborn_call_cancelled_and_refuses_later_turns_without_running() {
    let started = Arc::new(Notify::new());
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = engine(vec![
        stubborn_tool("long", Arc::clone(&started)),
        counting_tool("count", Arc::clone(&counter)),
    ]);
    let session = engine.session();

    let in_flight = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .dispatch(vec![
                    call("q", "count", json!({})),
                    call("l", "long", json!({})),
                ])
                .await
                .expect("engine available")
        })
    };
    tokio::time::timeout(TURN_BOUND, started.notified())
        .await
        .expect("the long call started");

    tokio::time::timeout(TURN_BOUND, engine.shutdown(Duration::from_millis(100)))
        .await
        .expect("shutdown finished");

    let results = tokio::time::timeout(TURN_BOUND, in_flight)
        .await
        .expect("the in-flight turn returned")
        .unwrap();
    assert_eq!(ids(&results), ["q", "l"]);
    assert!(results[0].is_ok(), "{}", results[0].content);
    assert_eq!(
        results[1].error,
        Some(ErrorCode::Cancelled),
        "{}",
        results[1].content
    );
    assert_eq!(counter.load(Ordering::SeqCst), 1);

    // Later turns are refused as an engine fault, not answered as tool failures.
    let after = tokio::time::timeout(
        TURN_BOUND,
        engine.dispatch(vec![
            call("a", "count", json!({})),
            call("b", "ghost", json!({})),
        ]),
    )
    .await
    .unwrap();
    assert!(matches!(after, Err(EngineError::ShutDown)), "{after:?}");
    let after = tokio::time::timeout(
        TURN_BOUND,
        session.dispatch(vec![call("c", "count", json!({}))]),
    )
    .await
    .unwrap();
    assert!(matches!(after, Err(EngineError::ShutDown)), "{after:?}");
    assert_eq!(
        counter.load(Ordering::SeqCst),
        1,
        "nothing ran after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_nothing_in_flight_returns_and_later_turns_are_refused() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = engine(vec![counting_tool("count", Arc::clone(&counter))]);
    let first = run_turn(&engine, vec![call("1", "count", json!({}))]).await;
    assert!(first[0].is_ok());
    tokio::time::timeout(TURN_BOUND, engine.shutdown(Duration::from_secs(5)))
        .await
        .expect("an idle engine shuts down without waiting for the grace period to matter");
    let after = engine.dispatch(vec![call("2", "count", json!({}))]).await;
    assert!(matches!(after, Err(EngineError::ShutDown)), "{after:?}");
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}
