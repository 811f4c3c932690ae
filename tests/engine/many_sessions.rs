//! Many tasks dispatching at once, through shared schedulers and their own sessions: every turn
//! still gets one result per call, in order, with each task's own answers.

use crate::common;

use common::*;
use serde_json::json;
use switchboard::{ErrorCode, ToolCall, ToolDispatchResult};

const TASKS: usize = 64;
const TURNS: usize = 20;

/// One mixed turn of task `t`, turn `n`: ok (inline and async), unknown, invalid, handler error.
fn mixed_turn(t: usize, n: usize) -> Vec<ToolCall> {
    let id = |k: usize| format!("task{t}-turn{n}-call{k}");
    let mut calls = vec![
        call(&id(0), "echo", json!({"text": format!("t{t}n{n}")})),
        call(&id(1), "ghost", json!({})),
        call(&id(2), "async_echo", json!({"text": format!("a{t}n{n}")})),
        call(&id(3), "echo", json!({"text": t})),
        call(&id(4), "fail", json!({})),
    ];
    // Vary the shape a little so turns differ in length and stage layout.
    if n.is_multiple_of(2) {
        calls.push(call(&id(5), "sleep", json!({"ms": 1})));
        calls.push(call(&id(6), "echo", json!({"text": format!("tail{t}")})));
    }
    calls
}

fn check_turn(t: usize, n: usize, calls_ids: &[String], results: &[ToolDispatchResult]) {
    assert_eq!(ids(results), calls_ids, "task {t} turn {n}");
    assert_eq!(results[0].content, format!("echo:t{t}n{n}"));
    assert_eq!(results[1].error, Some(ErrorCode::UnknownTool));
    assert_eq!(results[2].content, format!("async-echo:a{t}n{n}"));
    assert_eq!(results[3].error, Some(ErrorCode::InvalidArguments));
    assert_eq!(results[4].error, Some(ErrorCode::ExecutionError));
    if n.is_multiple_of(2) {
        assert_eq!(results[5].content, "slept 1");
        assert_eq!(results[6].content, format!("echo:tail{t}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_dispatching_at_once_each_get_their_own_answers_in_order() {
    let engine = engine(vec![
        echo_tool("echo"),
        async_echo_tool("async_echo"),
        failing_tool("fail", ErrorCode::ExecutionError, "nope"),
        sleeping_tool("sleep", false),
    ]);
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::with_capacity(TASKS);
    for t in 0..TASKS {
        let engine = engine.clone();
        let start = std::sync::Arc::clone(&start);
        tasks.push(tokio::spawn(async move {
            let session = (!t.is_multiple_of(2)).then(|| engine.session());
            start.wait().await;
            let mut answered = 0;
            for n in 0..TURNS {
                let calls = mixed_turn(t, n);
                let calls_ids: Vec<String> = calls.iter().map(|c| c.id.to_string()).collect();
                let results = match &session {
                    Some(s) => s.dispatch(calls).await.expect("engine available"),
                    None => engine.dispatch(calls).await.expect("engine available"),
                };
                check_turn(t, n, &calls_ids, &results);
                answered += results.len();
            }
            answered
        }));
    }
    let all = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        futures::future::join_all(tasks),
    )
    .await
    .expect("every task finished");
    let per_task = (TURNS / 2) * 7 + (TURNS / 2) * 5;
    for (t, answered) in all.into_iter().enumerate() {
        let answered = answered.unwrap_or_else(|e| panic!("task {t} failed: {e}"));
        assert_eq!(answered, per_task, "task {t}");
    }
}
