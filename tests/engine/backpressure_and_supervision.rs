//! Backpressure and supervision: full waiting lines answer `overloaded` without running anything,
//! per-tool caps are real, a dead worker is replaced without losing an answer, and a tool that
//! keeps panicking is switched off instead of crashing again and again.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{TURN_BOUND, any_object, ids};
use serde_json::json;
use switchboard::{Engine, ErrorCode, Handler, ToolCall, ToolError, ToolSpec};
use tokio::sync::{Barrier, Semaphore};

fn calls(name: &str, n: usize) -> Vec<ToolCall> {
    (0..n)
        .map(|i| ToolCall::new(format!("c{i}"), name, json!({})))
        .collect()
}

fn codes(results: &[switchboard::ToolDispatchResult]) -> Vec<Option<ErrorCode>> {
    results.iter().map(|r| r.error).collect()
}

/// An async, concurrency-safe tool that counts its runs and waits for a permit of `gate`.
fn gated(name: &str, runs: Arc<AtomicUsize>, gate: Arc<Semaphore>) -> ToolSpec {
    ToolSpec::new(
        name,
        "waits for the gate",
        any_object(),
        Handler::future(move |_, _| {
            let (runs, gate) = (Arc::clone(&runs), Arc::clone(&gate));
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _permit = gate
                    .acquire()
                    .await
                    .map_err(|e| ToolError::execution(e.to_string()))?;
                Ok("through".to_string())
            }
        }),
    )
    .concurrency_safe(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waiting_line_answers_overloaded_and_runs_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let engine = Engine::builder()
        .tool(gated("gated", Arc::clone(&runs), Arc::clone(&gate)))
        .max_concurrency(1)
        .max_queued(1)
        .build()
        .unwrap();
    let turn = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .dispatch(calls("gated", 4))
                .await
                .expect("engine available")
        })
    };
    // One call runs (and waits at the gate), one waits for the cap, two find the line full.
    tokio::time::timeout(TURN_BOUND, async {
        while runs.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the first call started");
    gate.add_permits(10);
    let results = tokio::time::timeout(TURN_BOUND, turn)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        codes(&results),
        [
            None,
            None,
            Some(ErrorCode::Overloaded),
            Some(ErrorCode::Overloaded)
        ]
    );
    assert!(results[2].content.starts_with("Error [overloaded]: "));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "overloaded calls must not run"
    );
}

/// A safe tool that records how many of its calls run at once, and tries to meet a partner at
/// a barrier of two for 200 ms.
fn pair(max: usize, most: Arc<AtomicUsize>) -> ToolSpec {
    let barrier = Arc::new(Barrier::new(2));
    let running = Arc::new(AtomicUsize::new(0));
    ToolSpec::new(
        "pair",
        "meets a partner",
        any_object(),
        Handler::future(move |_, _| {
            let (barrier, running, most) = (
                Arc::clone(&barrier),
                Arc::clone(&running),
                Arc::clone(&most),
            );
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let met = tokio::time::timeout(Duration::from_millis(200), barrier.wait()).await;
                running.fetch_sub(1, Ordering::SeqCst);
                met.map(|_| "met".to_string())
                    .map_err(|_| ToolError::execution("no partner arrived"))
            }
        }),
    )
    .concurrency_safe(true)
    .max_concurrency(max)
}

// Paused time: the handler is in-process, so its timeout elapses at once and exactly.
#[tokio::test(start_paused = true)]
async fn a_per_tool_cap_keeps_that_tool_from_running_twice_at_once() {
    let most = Arc::new(AtomicUsize::new(0));
    let capped = Engine::builder()
        .tool(pair(1, Arc::clone(&most)))
        .build()
        .unwrap();
    let results = tokio::time::timeout(TURN_BOUND, capped.dispatch(calls("pair", 2)))
        .await
        .unwrap()
        .expect("engine available");
    assert_eq!(results.len(), 2);
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "a cap of 1 let two calls run at once"
    );

    let most = Arc::new(AtomicUsize::new(0));
    let uncapped = Engine::builder()
        .tool(pair(2, Arc::clone(&most)))
        .build()
        .unwrap();
    let results = tokio::time::timeout(TURN_BOUND, uncapped.dispatch(calls("pair", 2)))
        .await
        .unwrap()
        .expect("engine available");
    assert_eq!(
        codes(&results),
        [None, None],
        "with a cap of 2 both calls meet"
    );
    assert_eq!(most.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_is_replaced_and_no_call_loses_its_answer() {
    let gate = Arc::new(Semaphore::new(1_000));
    let engine = Engine::builder()
        .tool(gated("work", Arc::default(), gate))
        .workers(2)
        .build()
        .unwrap();
    for slot in 0..engine.worker_count() {
        engine.kill_worker(slot);
    }
    // A turn may still reach a dying worker: its calls are then answered `execution_error`
    // (once each) and the worker is replaced; soon every turn is served again.
    let mut served = false;
    for _ in 0..50 {
        let results = tokio::time::timeout(TURN_BOUND, engine.dispatch(calls("work", 3)))
            .await
            .unwrap()
            .expect("engine available");
        assert_eq!(results.len(), 3);
        assert_eq!(ids(&results), ["c0", "c1", "c2"]);
        if results.iter().all(|r| r.is_ok()) {
            served = true;
            break;
        }
        assert!(
            results
                .iter()
                .all(|r| r.is_ok() || r.content.contains("worker unavailable")),
            "{results:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(served, "the pool never recovered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_keeps_panicking_is_switched_off_instead_of_looping() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let engine = Engine::builder()
        .tool(ToolSpec::new(
            "crashy",
            "always panics",
            any_object(),
            Handler::inline::<_, String>(move |_, _| {
                counted.fetch_add(1, Ordering::SeqCst);
                panic!("boom")
            }),
        ))
        .build()
        .unwrap();
    for _ in 0..6 {
        let r = engine
            .dispatch(calls("crashy", 1))
            .await
            .expect("engine available");
        assert!(r[0].content.contains("panicked"), "{}", r[0].content);
    }
    // More than 5 panics within 10 s: the next calls are answered at once, without running.
    let r = engine
        .dispatch(calls("crashy", 2))
        .await
        .expect("engine available");
    assert_eq!(codes(&r), [Some(ErrorCode::ExecutionError); 2]);
    assert!(r[0].content.contains("is disabled"), "{}", r[0].content);
    assert_eq!(runs.load(Ordering::SeqCst), 6);
}
