//! The registry is the single source of a tool: it keeps its own copy, hands out copies, refuses
//! bad registrations, and runtime changes are what the next dispatch sees.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use serde_json::{Value, json};
use switchboard::{CatalogFormat, RegistryError};
use switchboard::{Engine, ErrorCode, Handler, ToolSpec};

fn limit_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"limit": {"type": "integer"}},
        "required": ["limit"],
        "additionalProperties": false
    })
}

fn spec(name: &str, schema: Value) -> ToolSpec {
    ToolSpec::new(
        name,
        "A test tool.",
        schema,
        Handler::inline(|_, _| Ok("ran")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_callers_copy_of_a_schema_after_registration_changes_nothing() {
    let engine = engine(vec![]);
    let mut mine = spec("limited", limit_schema());
    engine.register(mine.clone()).await.unwrap();

    // The caller rewrites its own copy: `limit` becomes a string and a new field is required.
    mine.input_schema["properties"]["limit"]["type"] = json!("string");
    mine.input_schema["required"] = json!(["limit", "other"]);
    mine.description = "changed".into();

    let results = run_turn(
        &engine,
        vec![
            call("int", "limited", json!({"limit": 3})),
            call("str", "limited", json!({"limit": "3"})),
        ],
    )
    .await;
    assert_eq!(outcomes(&results), ["ok", "invalid_arguments"]);

    let catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    assert_eq!(catalog.len(), 1);
    assert_eq!(catalog[0]["input_schema"], limit_schema());
    assert_eq!(catalog[0]["description"], "A test tool.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_a_returned_catalog_changes_nothing() {
    let engine = engine(vec![spec("limited", limit_schema())]);
    let mut catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    catalog[0]["input_schema"]["properties"]["limit"]["type"] = json!("string");
    catalog[0]["name"] = json!("renamed");
    catalog.push(json!({"name": "injected"}));

    assert_eq!(
        engine.catalog(CatalogFormat::Anthropic).await.unwrap(),
        vec![
            json!({"name": "limited", "description": "A test tool.", "input_schema": limit_schema()})
        ]
    );
    let results = run_turn(
        &engine,
        vec![
            call("a", "limited", json!({"limit": 1})),
            call("b", "limited", json!({"limit": "1"})),
            call("c", "renamed", json!({"limit": 1})),
        ],
    )
    .await;
    assert_eq!(
        outcomes(&results),
        ["ok", "invalid_arguments", "unknown_tool"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_refuses_bad_names_duplicates_and_bad_schemas() {
    let engine = engine(vec![spec("taken", limit_schema())]);

    assert_eq!(
        engine.register(spec("", limit_schema())).await,
        Err(RegistryError::EmptyName)
    );
    assert!(matches!(
        engine.register(spec("has space", limit_schema())).await,
        Err(RegistryError::InvalidName(_))
    ));
    assert!(matches!(
        engine.register(spec(&"a".repeat(65), limit_schema())).await,
        Err(RegistryError::InvalidName(_))
    ));
    assert!(matches!(
        engine.register(spec("dotted.name", limit_schema())).await,
        Err(RegistryError::InvalidName(_))
    ));
    let duplicate = engine.register(spec("taken", limit_schema())).await;
    assert_eq!(duplicate, Err(RegistryError::Duplicate("taken".into())));
    assert_eq!(
        duplicate.unwrap_err().to_string(),
        "duplicate tool name: taken"
    );
    assert!(matches!(
        engine
            .register(spec("not_object", json!({"type": "string"})))
            .await,
        Err(RegistryError::BadSchema { .. })
    ));
    assert!(matches!(
        engine.register(spec("array_schema", json!([1, 2]))).await,
        Err(RegistryError::BadSchema { .. })
    ));
    assert!(matches!(
        engine
            .register(spec(
                "broken",
                json!({"type": "object", "properties": {"a": {"type": "nonsense"}}})
            ))
            .await,
        Err(RegistryError::BadSchema { .. })
    ));
    // Nothing refused was registered.
    assert_eq!(engine.tool_count().await, 1);

    // The first registration survived the duplicate attempt unchanged.
    let results = run_turn(&engine, vec![call("t", "taken", json!({"limit": 1}))]).await;
    assert_eq!(results[0].content, "ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_and_maximal_names_are_accepted() {
    let engine = engine(vec![]);
    engine
        .register(spec("mcp__server__tool", limit_schema()))
        .await
        .unwrap();
    engine
        .register(spec(&"b".repeat(64), limit_schema()))
        .await
        .unwrap();
    engine
        .register(spec("a-Z_0-9", limit_schema()))
        .await
        .unwrap();
    let results = run_turn(
        &engine,
        vec![call("m", "mcp__server__tool", json!({"limit": 1}))],
    )
    .await;
    assert_eq!(results[0].content, "ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_registration_and_removal_are_seen_by_the_next_dispatch() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = engine(vec![echo_tool("echo")]);
    let session = engine.session();

    let before = run_turn(&engine, vec![call("1", "late", json!({}))]).await;
    assert_eq!(before[0].error, Some(ErrorCode::UnknownTool));
    let before = session
        .dispatch(vec![call("1", "late", json!({}))])
        .await
        .expect("engine available");
    assert_eq!(before[0].error, Some(ErrorCode::UnknownTool));

    engine
        .register(counting_tool("late", Arc::clone(&counter)))
        .await
        .unwrap();
    // Every shared scheduler and the session's own must see it.
    for i in 0..8 {
        let r = run_turn(&engine, vec![call(&format!("e{i}"), "late", json!({}))]).await;
        assert_eq!(r[0].content, "ran", "{}", r[0].content);
    }
    let r = session
        .dispatch(vec![call("s", "late", json!({}))])
        .await
        .expect("engine available");
    assert_eq!(r[0].content, "ran");
    assert_eq!(counter.load(Ordering::SeqCst), 9);

    assert!(engine.unregister("late").await);
    assert!(!engine.unregister("late").await);
    for i in 0..8 {
        let r = run_turn(&engine, vec![call(&format!("u{i}"), "late", json!({}))]).await;
        assert_eq!(
            r[0].content,
            "Error [unknown_tool]: tool is not registered: late"
        );
    }
    let r = session
        .dispatch(vec![call("s2", "late", json!({}))])
        .await
        .expect("engine available");
    assert_eq!(r[0].error, Some(ErrorCode::UnknownTool));
    assert_eq!(
        counter.load(Ordering::SeqCst),
        9,
        "nothing ran after removal"
    );

    let catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    let names: Vec<_> = catalog.iter().map(|t| t["name"].clone()).collect();
    assert_eq!(names, [json!("echo")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_created_before_any_tool_exists_sees_later_registrations() {
    let engine = engine(vec![]);
    let session = engine.session();
    engine.register(echo_tool("echo")).await.unwrap();
    let r = session
        .dispatch(vec![call("a", "echo", json!({"text": "hi"}))])
        .await
        .expect("engine available");
    assert_eq!(r[0].content, "echo:hi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_comes_in_anthropic_openai_and_mcp_shapes_in_registration_order() {
    let engine = engine(vec![spec("first", limit_schema()), echo_tool("second")]);

    let anthropic = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    assert_eq!(
        anthropic[0],
        json!({"name": "first", "description": "A test tool.", "input_schema": limit_schema()})
    );
    assert_eq!(anthropic[1]["name"], "second");
    assert_eq!(anthropic[1]["input_schema"], text_schema());

    let openai = engine.catalog(CatalogFormat::OpenAi).await.unwrap();
    assert_eq!(
        openai[0],
        json!({"type": "function", "function": {
            "name": "first", "description": "A test tool.", "parameters": limit_schema()
        }})
    );
    assert_eq!(openai[1]["function"]["name"], "second");

    let mcp = engine.catalog(CatalogFormat::Mcp).await.unwrap();
    assert_eq!(
        mcp[0],
        json!({"name": "first", "description": "A test tool.", "inputSchema": limit_schema()})
    );
    assert_eq!(mcp[1]["inputSchema"], text_schema());
    assert_eq!(mcp.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_name_of_a_turn_resolves_exactly_as_spelled() {
    let engine = Engine::builder()
        .tool(spec("lookup", limit_schema()))
        .build()
        .unwrap();
    let calls = ["lookup", "nope", "Lookup", " lookup"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| switchboard::ToolCall::new(format!("c{i}"), name, json!({"limit": 1})))
        .collect();
    let results = engine.dispatch(calls).await.unwrap();
    let codes: Vec<Option<ErrorCode>> = results.iter().map(|r| r.error).collect();
    assert_eq!(
        codes,
        [
            None,
            Some(ErrorCode::UnknownTool),
            Some(ErrorCode::UnknownTool),
            Some(ErrorCode::UnknownTool)
        ]
    );
    assert_eq!(results[0].content, "ran");
    assert_eq!(
        results[3].content,
        "Error [unknown_tool]: tool is not registered:  lookup"
    );
}
