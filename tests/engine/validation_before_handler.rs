//! Arguments are validated against the registered schema before any handler runs; an invalid call
//! is answered `invalid_arguments` naming the JSON pointer of what is wrong, and never reaches the
//! handler.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use serde_json::{Value, json};
use switchboard::{Engine, ErrorCode, Handler, ToolSpec};

fn read_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1},
            "options": {
                "type": "object",
                "properties": {"depth": {"type": "integer"}}
            }
        },
        "required": ["path"],
        "additionalProperties": false
    })
}

/// An engine whose `read` tool (inline) and `read_async` tool (async) count their invocations.
fn counted_engine() -> (Engine, Arc<AtomicUsize>) {
    let counter = Arc::new(AtomicUsize::new(0));
    let c1 = Arc::clone(&counter);
    let c2 = Arc::clone(&counter);
    let engine = engine(vec![
        counting_tool_with_schema("read", read_schema(), c1),
        ToolSpec::new(
            "read_async",
            "Counts, asynchronously.",
            read_schema(),
            Handler::future(move |_args, _ctx| {
                let c = Arc::clone(&c2);
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    Ok("ran".to_string())
                }
            }),
        ),
    ]);
    (engine, counter)
}

/// Dispatches one call to each tool and returns both results; asserts the handler never ran.
async fn refused(args: Value) -> Vec<String> {
    let (engine, counter) = counted_engine();
    let results = run_turn(
        &engine,
        vec![
            call("inline", "read", args.clone()),
            call("async", "read_async", args.clone()),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["inline", "async"]);
    for r in &results {
        assert_eq!(
            r.error,
            Some(ErrorCode::InvalidArguments),
            "{args}: {}",
            r.content
        );
        assert!(
            r.content.starts_with("Error [invalid_arguments]: "),
            "{}",
            r.content
        );
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        0,
        "{args} must never reach a handler"
    );
    results.into_iter().map(|r| r.content).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_required_property_never_reaches_the_handler() {
    for content in refused(json!({"limit": 3})).await {
        assert!(content.contains("(root)"), "{content}");
        assert!(content.contains("path"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_is_refused_naming_its_json_pointer() {
    for content in refused(json!({"path": 7})).await {
        assert!(content.contains("/path"), "{content}");
    }
    for content in refused(json!({"path": "a", "options": {"depth": "deep"}})).await {
        assert!(content.contains("/options/depth"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_of_digits_is_not_coerced_to_an_integer() {
    for content in refused(json!({"path": "a", "limit": "10"})).await {
        assert!(content.contains("/limit"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boolean_is_not_coerced_to_an_integer() {
    for content in refused(json!({"path": "a", "limit": true})).await {
        assert!(content.contains("/limit"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_below_the_minimum_is_refused_naming_its_pointer() {
    for content in refused(json!({"path": "a", "limit": 0})).await {
        assert!(content.contains("/limit"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extra_property_is_refused_when_additional_properties_are_false() {
    for content in refused(json!({"path": "a", "extra": 1})).await {
        assert!(content.contains("extra"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_that_are_not_an_object_never_reach_the_handler() {
    for (args, kind) in [
        (json!([1, 2]), "array"),
        (json!("path=a"), "string"),
        (json!(null), "null"),
        (json!(3), "integer"),
    ] {
        for content in refused(args).await {
            assert_eq!(
                content,
                format!("Error [invalid_arguments]: arguments must be an object, got {kind}")
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_arguments_reach_the_handler_once_per_call() {
    let (engine, counter) = counted_engine();
    let results = run_turn(
        &engine,
        vec![
            call("a", "read", json!({"path": "a"})),
            call("b", "read", json!({"path": "a", "limit": 10})),
            call(
                "c",
                "read_async",
                json!({"path": "a", "options": {"depth": 2}}),
            ),
            call("d", "read", json!({"path": "a", "limit": "10"})),
        ],
    )
    .await;
    assert_eq!(outcomes(&results), ["ok", "ok", "ok", "invalid_arguments"]);
    assert_eq!(counter.load(Ordering::SeqCst), 3);
}
