//! Exactly one result per call, in call order — under panics, unknown tools, handler errors,
//! duplicate or empty ids and undecodable arguments.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use serde_json::json;
use switchboard::protocol::decode_openai;
use switchboard::{ErrorCode, ToolCall};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_of_any_kind_is_one_execution_error_and_the_engine_keeps_serving() {
    let engine = engine(vec![
        echo_tool("echo"),
        panicking_tool("panic_inline", Kind::Inline),
        panicking_tool("panic_async", Kind::Async),
        panicking_tool("panic_blocking", Kind::Blocking),
    ]);
    let turn = vec![
        call("c0", "echo", json!({"text": "before"})),
        call("c1", "panic_inline", json!({})),
        call("c2", "panic_async", json!({})),
        call("c3", "echo", json!({"text": "middle"})),
        call("c4", "panic_blocking", json!({})),
        call("c5", "echo", json!({"text": "after"})),
    ];
    let results = run_turn(&engine, turn).await;

    assert_eq!(ids(&results), ["c0", "c1", "c2", "c3", "c4", "c5"]);
    assert_eq!(
        outcomes(&results),
        [
            "ok",
            "execution_error",
            "execution_error",
            "ok",
            "execution_error",
            "ok"
        ]
    );
    assert_eq!(results[0].content, "echo:before");
    assert_eq!(results[3].content, "echo:middle");
    assert_eq!(results[5].content, "echo:after");
    for (i, name) in [
        (1, "panic_inline"),
        (2, "panic_async"),
        (4, "panic_blocking"),
    ] {
        let r = &results[i];
        assert!(
            r.content.starts_with("Error [execution_error]: ") && r.content.contains("panicked"),
            "{}: {}",
            name,
            r.content
        );
        assert!(r.content.contains(&format!("boom-{name}")), "{}", r.content);
        assert_eq!(&*r.tool_name, name);
    }

    // The engine is still there for the next turn, panicking tools included.
    let next = run_turn(
        &engine,
        vec![
            call("n0", "panic_async", json!({})),
            call("n1", "echo", json!({"text": "still here"})),
        ],
    )
    .await;
    assert_eq!(ids(&next), ["n0", "n1"]);
    assert_eq!(next[0].error, Some(ErrorCode::ExecutionError));
    assert_eq!(next[1].content, "echo:still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tool_is_answered_unknown_tool_naming_it_exactly() {
    let engine = engine(vec![echo_tool("echo")]);
    let results = run_turn(
        &engine,
        vec![
            call("a", "deploy", json!({})),
            call("b", "", json!({})),
            call("c", "Echo", json!({"text": "x"})),
            call("d", " echo", json!({"text": "x"})),
            call("e", "echo", json!({"text": "x"})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        results[0].content,
        "Error [unknown_tool]: tool is not registered: deploy"
    );
    assert_eq!(
        results[1].content,
        "Error [unknown_tool]: tool is not registered: <empty>"
    );
    assert_eq!(
        results[2].content,
        "Error [unknown_tool]: tool is not registered: Echo"
    );
    assert_eq!(
        results[3].content,
        "Error [unknown_tool]: tool is not registered:  echo"
    );
    for r in &results[..4] {
        assert_eq!(r.error, Some(ErrorCode::UnknownTool));
    }
    assert!(results[4].is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_is_answered_with_the_handlers_own_code() {
    let engine = engine(vec![
        failing_tool(
            "deny",
            ErrorCode::PermissionDenied,
            "path escapes workspace: /etc",
        ),
        failing_tool("fail", ErrorCode::ExecutionError, "exit status 3"),
        echo_tool("echo"),
    ]);
    let results = run_turn(
        &engine,
        vec![
            call("1", "deny", json!({})),
            call("2", "echo", json!({"text": "ok"})),
            call("3", "fail", json!({})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["1", "2", "3"]);
    assert_eq!(results[0].error, Some(ErrorCode::PermissionDenied));
    assert_eq!(
        results[0].content,
        "Error [permission_denied]: path escapes workspace: /etc"
    );
    assert!(results[1].is_ok());
    assert_eq!(results[2].error, Some(ErrorCode::ExecutionError));
    assert_eq!(results[2].content, "Error [execution_error]: exit status 3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_tool_use_id_makes_every_call_invalid_and_runs_nothing() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = engine(vec![counting_tool("count", Arc::clone(&counter))]);
    let results = run_turn(
        &engine,
        vec![
            call("x", "count", json!({})),
            call("y", "count", json!({})),
            call("x", "count", json!({})),
            call("z", "nope", json!({})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["x", "y", "x", "z"]);
    for r in &results {
        assert_eq!(r.error, Some(ErrorCode::InvalidArguments), "{}", r.content);
        assert!(r.content.starts_with("Error [invalid_arguments]: "));
        assert!(r.content.contains("duplicate"), "{}", r.content);
    }
    assert_eq!(counter.load(Ordering::SeqCst), 0, "no call may run");

    // Many calls (beyond any small-turn fast path) with one duplicate at the end.
    let mut calls: Vec<ToolCall> = (0..40)
        .map(|i| call(&format!("id{i}"), "count", json!({})))
        .collect();
    calls.push(call("id7", "count", json!({})));
    let results = run_turn(&engine, calls).await;
    assert_eq!(results.len(), 41);
    assert!(
        results
            .iter()
            .all(|r| r.error == Some(ErrorCode::InvalidArguments))
    );
    assert_eq!(counter.load(Ordering::SeqCst), 0, "no call may run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_id_makes_only_that_call_invalid() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = engine(vec![counting_tool("count", Arc::clone(&counter))]);
    let results = run_turn(
        &engine,
        vec![
            call("a", "count", json!({})),
            call("", "count", json!({})),
            call("b", "count", json!({})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["a", "", "b"]);
    assert_eq!(outcomes(&results), ["ok", "invalid_arguments", "ok"]);
    assert_eq!(counter.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_arguments_that_are_not_json_fail_only_that_call() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = engine(vec![
        counting_tool("count", Arc::clone(&counter)),
        echo_tool("echo"),
    ]);
    let doc = json!({"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"hi\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "count", "arguments": "{not json"}},
        {"id": "call_3", "type": "function", "function": {"name": "count", "arguments": "{}"}}
    ]});
    let calls = decode_openai(&doc).expect("the document has the right shape");
    let results = run_turn(&engine, calls).await;
    assert_eq!(ids(&results), ["call_1", "call_2", "call_3"]);
    assert_eq!(outcomes(&results), ["ok", "invalid_arguments", "ok"]);
    assert_eq!(results[0].content, "echo:hi");
    assert!(
        results[1]
            .content
            .starts_with("Error [invalid_arguments]: "),
        "{}",
        results[1].content
    );
    assert_eq!(counter.load(Ordering::SeqCst), 1, "only call_3 ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_turn_gets_an_empty_answer() {
    let engine = engine(vec![echo_tool("echo")]);
    assert!(run_turn(&engine, Vec::new()).await.is_empty());
    let session = engine.session();
    assert!(
        session
            .dispatch(Vec::new())
            .await
            .expect("engine available")
            .is_empty()
    );
}
