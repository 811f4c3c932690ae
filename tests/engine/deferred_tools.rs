//! Deferred loading: what the catalog shows of a large tool set, what `tool_search` finds and
//! reveals, and that deferral never changes what the boundary accepts.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::{Value, json};
use switchboard::metrics::{
    CATALOG_BYTES_AVOIDED, DEFERRED_CALLS_UNREVEALED_TOTAL, TOOL_SEARCH_HITS_TOTAL,
    TOOL_SEARCH_TOTAL,
};
use switchboard::tools::builtin_tools;
use switchboard::{
    Block, CatalogFormat, Defer, DeferralConfig, Engine, ErrorCode, Handler, SessionOptions,
    ToolDispatchResult, ToolSpec,
};

/// A tool that answers its name and counts its runs.
fn tool(name: &str, description: &str, defer: Defer, runs: &Arc<AtomicUsize>) -> ToolSpec {
    let runs = Arc::clone(runs);
    let answer = name.to_string();
    ToolSpec::new(
        name,
        description,
        json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}),
        Handler::inline(move |_, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(answer.clone())
        }),
    )
    .defer(defer)
}

/// The five built-ins (never deferred) and three `auto` tools of a ticket system.
fn tickets(runs: &Arc<AtomicUsize>) -> Vec<ToolSpec> {
    let mut specs = builtin_tools();
    specs.push(tool(
        "create_ticket",
        "Open a new support ticket for a customer.",
        Defer::Auto,
        runs,
    ));
    specs.push(tool(
        "close_ticket",
        "Close a resolved support ticket.",
        Defer::Auto,
        runs,
    ));
    specs.push(tool(
        "refund_order",
        "Refund a customer's order in full.",
        Defer::Auto,
        runs,
    ));
    specs
}

fn small_catalog() -> DeferralConfig {
    DeferralConfig {
        auto_above: 6,
        ..DeferralConfig::default()
    }
}

/// The ticket tools on an engine that defers above 6 tools (so their `auto` tools are deferred).
fn deferring(runs: &Arc<AtomicUsize>) -> Engine {
    Engine::builder()
        .tools(tickets(runs))
        .deferral(small_catalog())
        .build()
        .unwrap()
}

fn names(catalog: &[Value]) -> Vec<String> {
    catalog
        .iter()
        .map(|t| {
            t.get("name")
                .or_else(|| t.pointer("/function/name"))
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect()
}

fn deferred(catalog: &[Value]) -> Vec<String> {
    catalog
        .iter()
        .filter(|t| t.get("defer_loading") == Some(&json!(true)))
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn references(result: &ToolDispatchResult) -> Vec<String> {
    result
        .blocks
        .iter()
        .flat_map(|b| b.iter())
        .filter_map(|b| match b {
            Block::ToolReference(r) => Some(r.tool_name.clone()),
            _ => None,
        })
        .collect()
}

fn search(id: &str, query: &str) -> switchboard::ToolCall {
    call(id, "tool_search", json!({"query": query}))
}

const BUILTINS: [&str; 5] = ["bash", "read_file", "write_file", "edit_file", "glob"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_catalog_defers_nothing_and_has_no_search() {
    let runs = Arc::new(AtomicUsize::new(0));
    // 8 tools: under the default threshold of 30.
    let engine = Engine::builder().tools(tickets(&runs)).build().unwrap();
    let catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    assert_eq!(catalog.len(), 8);
    assert!(deferred(&catalog).is_empty());
    assert!(!names(&catalog).contains(&"tool_search".to_string()));
    let results = engine.dispatch(vec![search("s", "ticket")]).await.unwrap();
    assert_eq!(results[0].error, Some(ErrorCode::UnknownTool));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_catalog_defers_its_auto_tools_on_both_wires() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = deferring(&runs);
    let anthropic = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    // Every tool is listed, the search first; only the auto tools are deferred; no entry
    // carries cache_control.
    assert_eq!(names(&anthropic)[0], "tool_search");
    assert_eq!(anthropic.len(), 9);
    assert_eq!(
        deferred(&anthropic),
        ["create_ticket", "close_ticket", "refund_order"]
    );
    assert!(anthropic.iter().all(|t| t.get("cache_control").is_none()));
    let openai = engine.catalog(CatalogFormat::OpenAi).await.unwrap();
    let mut want = vec!["tool_search".to_string()];
    want.extend(BUILTINS.map(String::from));
    assert_eq!(names(&openai), want);
    // MCP clients defer tools themselves: the MCP shape lists every tool, no search.
    let mcp = engine.catalog(CatalogFormat::Mcp).await.unwrap();
    assert_eq!(mcp.len(), 8);
    assert!(!names(&mcp).contains(&"tool_search".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_reveals_what_it_found_and_the_openai_catalog_appends_it_in_order() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = deferring(&runs);
    let session = engine.session();
    let results = session
        .dispatch(vec![call(
            "s1",
            "tool_search",
            json!({"query": "refund the customer's order", "max_results": 1}),
        )])
        .await
        .unwrap();
    assert_eq!(results[0].error, None, "{}", results[0].content);
    assert_eq!(references(&results[0]), ["refund_order"]);
    // The text rendering (what an OpenAI tool message carries) has the definition.
    assert!(
        results[0].content.contains(r#""name":"refund_order""#),
        "{}",
        results[0].content
    );
    let results = session
        .dispatch(vec![search(
            "s2",
            "select:close_ticket,create_ticket,bash,nope",
        )])
        .await
        .unwrap();
    assert_eq!(references(&results[0]), ["close_ticket", "create_ticket"]);
    assert!(
        results[0]
            .content
            .contains("Already loaded (call directly): bash."),
        "{}",
        results[0].content
    );
    assert!(results[0].content.contains("No tool named: nope."));
    let openai = names(&session.catalog(CatalogFormat::OpenAi).await.unwrap());
    let mut want = vec!["tool_search".to_string()];
    want.extend(BUILTINS.map(String::from));
    want.extend(["refund_order", "close_ticket", "create_ticket"].map(String::from));
    assert_eq!(openai, want);
    // Another session has been shown nothing.
    let other = names(
        &engine
            .session()
            .catalog(CatalogFormat::OpenAi)
            .await
            .unwrap(),
    );
    assert_eq!(other.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_tool_called_by_name_unsearched_is_validated_and_run() {
    let runs = Arc::new(AtomicUsize::new(0));
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let engine = metrics::with_local_recorder(&recorder, || {
        Engine::builder()
            .tools(tickets(&runs))
            .deferral(small_catalog())
            .build()
            .unwrap()
    });
    let session = engine.session();
    let results = session
        .dispatch(vec![
            call("a", "refund_order", json!({"id": 7})),
            call("b", "close_ticket", json!({"id": "seven"})),
        ])
        .await
        .unwrap();
    assert_eq!(results[0].error, None);
    assert_eq!(results[0].content, "refund_order");
    // Checked against its full schema, like any call.
    assert_eq!(results[1].error, Some(ErrorCode::InvalidArguments));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The call revealed it: the OpenAI catalog now has it.
    let openai = names(&session.catalog(CatalogFormat::OpenAi).await.unwrap());
    assert_eq!(openai.last().unwrap(), "refund_order");
    // A search, then a call of what it found: one hit; a second call is no second hit.
    session
        .dispatch(vec![search("s", "close a resolved ticket")])
        .await
        .unwrap();
    for id in ["c1", "c2"] {
        let r = session
            .dispatch(vec![call(id, "close_ticket", json!({"id": 1}))])
            .await
            .unwrap();
        assert_eq!(r[0].error, None);
    }
    let mut counters = std::collections::HashMap::new();
    let mut avoided = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        match value {
            DebugValue::Counter(n) => {
                let label: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                counters.insert(format!("{}{label:?}", key.name()), n);
            }
            DebugValue::Histogram(samples) if key.name() == CATALOG_BYTES_AVOIDED => {
                avoided.extend(samples.into_iter().map(|s| s.into_inner()));
            }
            _ => {}
        }
    }
    assert_eq!(counters[&format!("{DEFERRED_CALLS_UNREVEALED_TOTAL}[]")], 1);
    assert_eq!(counters[&format!("{TOOL_SEARCH_HITS_TOTAL}[]")], 1);
    assert_eq!(
        counters[&format!("{TOOL_SEARCH_TOTAL}[\"form=keywords\"]")],
        1
    );
    assert_eq!(
        counters[&format!("{TOOL_SEARCH_TOTAL}[\"form=select\"]")],
        0
    );
    // One catalog served while deferring: it kept create_ticket (never revealed) out.
    assert_eq!(avoided.len(), 1);
    assert!(avoided[0] > 50.0, "{avoided:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_are_invalid_arguments_and_never_hang() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = deferring(&runs);
    let cases = [
        json!({"query": "regex:(unclosed"}),
        json!({"query": format!("regex:{}", "a".repeat(201))}),
        json!({"query": "regex:(\\w{1000}){1000}"}),
        json!({"query": "select:"}),
        json!({"query": ""}),
        json!({"query": "ticket", "max_results": 0}),
        json!({"query": "ticket", "max_results": 21}),
        json!({"query": "ticket", "extra": 1}),
    ];
    for (i, args) in cases.iter().enumerate() {
        let results = tokio::time::timeout(
            TURN_BOUND,
            engine.dispatch(vec![call(&format!("q{i}"), "tool_search", args.clone())]),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            results[0].error,
            Some(ErrorCode::InvalidArguments),
            "{args}: {}",
            results[0].content
        );
    }
    // A pattern with required terms and a regex that matches in descriptions.
    let r = engine
        .dispatch(vec![
            search("a", "+support ticket"),
            search("b", "regex:customer"),
        ])
        .await
        .unwrap();
    let mut required = references(&r[0]);
    required.sort();
    assert_eq!(required, ["close_ticket", "create_ticket"]);
    assert_eq!(references(&r[1]), ["create_ticket", "refund_order"]);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_in_flight_keeps_the_index_it_was_planned_with() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut specs = tickets(&runs);
    specs.push(sleeping_tool("sleep", false));
    let engine = Engine::builder()
        .tools(specs)
        .deferral(small_catalog())
        .build()
        .unwrap();
    let session = engine.session();
    // sleep is serial: the search runs after it, with the turn's snapshot.
    let turn = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .dispatch(vec![
                    call("z", "sleep", json!({"ms": 300})),
                    search("s", "select:archive_ticket"),
                ])
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    engine
        .register(tool(
            "archive_ticket",
            "Archive an old ticket.",
            Defer::Always,
            &runs,
        ))
        .await
        .unwrap();
    let results = turn.await.unwrap();
    assert!(references(&results[1]).is_empty());
    assert!(
        results[1]
            .content
            .contains("No tool named: archive_ticket.")
    );
    let results = session
        .dispatch(vec![search("s2", "select:archive_ticket")])
        .await
        .unwrap();
    assert_eq!(references(&results[0]), ["archive_ticket"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_own_tools_are_searched_with_the_engines() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = deferring(&runs);
    let session = engine
        .session_with(SessionOptions::new().tools([tool(
            "lookup_invoice",
            "Look up a customer's invoice.",
            Defer::Always,
            &runs,
        )]))
        .await
        .unwrap();
    let results = session
        .dispatch(vec![search("s", "customer")])
        .await
        .unwrap();
    let mut found = references(&results[0]);
    found.sort();
    assert_eq!(found, ["create_ticket", "lookup_invoice", "refund_order"]);
    let anthropic = session.catalog(CatalogFormat::Anthropic).await.unwrap();
    assert_eq!(
        deferred(&anthropic),
        [
            "create_ticket",
            "close_ticket",
            "refund_order",
            "lookup_invoice"
        ]
    );
    // The engine's own catalog does not have the session's tool.
    let engine_catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    assert!(!names(&engine_catalog).contains(&"lookup_invoice".to_string()));
}

/// A deferred tool with `params` string parameters, each described at some length: 25 of them
/// make a definition of about 3.4 KB, the size an OpenAI tool message used to cut mid-JSON.
fn wide_tool(name: &str, params: usize, runs: &Arc<AtomicUsize>) -> ToolSpec {
    let runs = Arc::clone(runs);
    let properties: serde_json::Map<String, Value> = (0..params)
        .map(|i| {
            (
                format!("field_{i:02}"),
                json!({"type": "string", "description": format!("The value of field {i} of the invoice record, as printed on the paper form, or blank when the form leaves it blank")}),
            )
        })
        .collect();
    ToolSpec::new(
        name,
        "Files an invoice record with every field of the paper form.",
        json!({"type": "object", "properties": properties}),
        Handler::inline(move |_, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(String::new())
        }),
    )
    .defer(Defer::Always)
}

/// Every definition an answer carries, on every wire, parsed: the OpenAI tool message's lines
/// after the first, and each reference block's definition (what MCP sends as a text block).
fn definitions_on_every_wire(result: &ToolDispatchResult) -> Vec<Value> {
    let openai = switchboard::protocol::encode_openai(std::slice::from_ref(result));
    let message = openai[0]["content"].as_str().unwrap().to_string();
    let from_openai: Vec<Value> = message
        .lines()
        .skip(1)
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a definition does not parse ({e}): {line}"))
        })
        .collect();
    let from_blocks: Vec<Value> = result
        .blocks
        .iter()
        .flat_map(|b| b.iter())
        .filter_map(|b| match b {
            Block::ToolReference(r) => Some(serde_json::from_str(&r.definition).unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(from_openai, from_blocks);
    // The Anthropic wire carries one reference per tool, no definition.
    let anthropic = switchboard::protocol::encode_anthropic(std::slice::from_ref(result));
    let refs: Vec<&str> = anthropic["content"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_reference")
        .map(|b| b["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(refs, references(result));
    from_openai
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_found_definition_is_whole_on_every_wire() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tools([wide_tool("file_invoice", 25, &runs)])
        .build()
        .unwrap();
    let catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    let entry = catalog
        .iter()
        .find(|t| t["name"] == "file_invoice")
        .unwrap();
    let session = engine.session();
    let results = session
        .dispatch(vec![search("s1", "invoice record")])
        .await
        .unwrap();
    assert_eq!(results[0].error, None, "{}", results[0].content);
    let definitions = definitions_on_every_wire(&results[0]);
    assert_eq!(definitions.len(), 1);
    assert!(definitions[0].to_string().len() > 3_000);
    assert_eq!(definitions[0]["input_schema"], entry["input_schema"]);
    assert_eq!(definitions[0]["description"], entry["description"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_past_its_cap_returns_fewer_whole_tools_and_says_how_many_were_left_out() {
    let runs = Arc::new(AtomicUsize::new(0));
    // Twenty tools of about 8.5 KB each: 170 KB of definitions, past the answer's cap.
    let tools: Vec<ToolSpec> = (0..20)
        .map(|i| wide_tool(&format!("file_invoice_{i:02}"), 64, &runs))
        .collect();
    let engine = Engine::builder().tools(tools).build().unwrap();
    let session = engine.session();
    let results = session
        .dispatch(vec![call(
            "s1",
            "tool_search",
            json!({"query": "invoice record", "max_results": 20}),
        )])
        .await
        .unwrap();
    assert_eq!(results[0].error, None, "{}", results[0].content);
    let kept = references(&results[0]);
    assert!(!kept.is_empty() && kept.len() < 20, "{kept:?}");
    let definitions = definitions_on_every_wire(&results[0]);
    assert_eq!(definitions.len(), kept.len());
    // The answer's cap: 80,000 bytes of text rendering.
    assert!(results[0].content.len() <= 80_000);
    let left = 20 - kept.len();
    let first_line = results[0].content.lines().next().unwrap();
    assert!(
        first_line.contains(&format!("{left} more tools matched but were left out")),
        "{first_line}"
    );
    // Only what was returned is shown to the session.
    let openai = names(&session.catalog(CatalogFormat::OpenAi).await.unwrap());
    assert_eq!(openai.len(), 1 + kept.len(), "{openai:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regex_answers_and_a_costly_one_says_why() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = deferring(&runs);
    let session = engine.session();
    let results = session
        .dispatch(vec![
            search("s1", r"regex:^(create|close)_t\w+"),
            search("s2", r"regex:\w{3}.{180}zzqxj"),
        ])
        .await
        .unwrap();
    assert_eq!(results[0].error, None, "{}", results[0].content);
    assert_eq!(references(&results[0]), ["create_ticket", "close_ticket"]);
    // Over three tools the automaton stays small: an answer, not a refusal.
    assert_eq!(results[1].error, None, "{}", results[1].content);
    assert!(references(&results[1]).is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
