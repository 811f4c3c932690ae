//! Shared helpers for the black-box integration tests, one concept a file: here the test tools,
//! call builders, engine runners and the event log that proves an order; [`direct`] calls a
//! tool's handler as the engine would; [`cli`] runs the built binary and reads its output;
//! [`model`] and [`mock_server`] script a model (scripted answers, a local HTTP server speaking
//! both wire formats) and [`wire`] describes each HTTP provider's shapes so one suite runs for
//! both; [`workspace`] makes workspaces on disk; [`tmpfs`] mounts a small disk that fills up. Every test binary includes the whole tree
//! (`#[path = "../common/mod.rs"] mod common;` in each area's `main.rs`), so unused items are
//! allowed.
#![allow(dead_code)]

pub mod answers;
pub mod cli;
pub mod direct;
pub mod mcp;
pub mod mock_server;
pub mod model;
pub mod nats;
pub mod sandbox;
pub mod tmpfs;
pub mod wire;
pub mod workspace;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use switchboard::Workspace;
use switchboard::tools::builtin_tools;
use switchboard::{
    Engine, ErrorCode, Handler, ToolCall, ToolDispatchResult, ToolError, ToolOutcome, ToolSpec,
};

/// Upper bound for any single turn in these tests: a hang fails the test instead of wedging it.
pub const TURN_BOUND: Duration = Duration::from_secs(10);

/// A `tool_use_id` never used before in this test process: `<tag>-<n>`. A session answers an
/// id it has seen from its stored answers, so a test that means a new call needs a new id.
pub fn fresh(tag: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{tag}-{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// A call as the model would send it.
pub fn call(id: &str, name: &str, args: Value) -> ToolCall {
    ToolCall::new(id, name, args)
}

/// The loosest object schema.
pub fn any_object() -> Value {
    json!({"type": "object"})
}

/// `{"text": string}` (required).
pub fn text_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"]
    })
}

/// `{"ms": integer}` (required).
pub fn ms_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"ms": {"type": "integer", "minimum": 0}},
        "required": ["ms"]
    })
}

/// The `text` argument, or an empty string.
pub fn text_arg(args: &Value) -> String {
    args.get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// An inline, concurrency-safe tool answering `echo:<text>`.
pub fn echo_tool(name: &str) -> ToolSpec {
    ToolSpec::new(
        name,
        "Echoes its text argument.",
        text_schema(),
        Handler::inline(|args, _ctx| Ok(format!("echo:{}", text_arg(args)))),
    )
    .concurrency_safe(true)
}

/// An async, concurrency-safe tool answering `async-echo:<text>` after yielding once.
pub fn async_echo_tool(name: &str) -> ToolSpec {
    ToolSpec::new(
        name,
        "Echoes its text argument, asynchronously.",
        text_schema(),
        Handler::future(|args, _ctx| async move {
            tokio::task::yield_now().await;
            Ok(format!("async-echo:{}", text_arg(&args)))
        }),
    )
    .concurrency_safe(true)
}

/// An inline tool that counts its invocations and answers `ran`.
pub fn counting_tool(name: &str, counter: Arc<AtomicUsize>) -> ToolSpec {
    ToolSpec::new(
        name,
        "Counts how often it runs.",
        any_object(),
        Handler::inline(move |_args, _ctx| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok("ran".to_string())
        }),
    )
    .concurrency_safe(true)
}

/// A tool that counts invocations with a given schema.
pub fn counting_tool_with_schema(name: &str, schema: Value, counter: Arc<AtomicUsize>) -> ToolSpec {
    ToolSpec::new(
        name,
        "Counts how often it runs.",
        schema,
        Handler::inline(move |_args, _ctx| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok("ran".to_string())
        }),
    )
}

/// An inline tool that always fails with `code` and `detail`.
pub fn failing_tool(name: &str, code: ErrorCode, detail: &str) -> ToolSpec {
    let detail = detail.to_string();
    ToolSpec::new(
        name,
        "Always fails.",
        any_object(),
        Handler::inline::<_, String>(move |_args, _ctx| Err(ToolError::new(code, detail.clone()))),
    )
    .concurrency_safe(true)
}

/// The three handler kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Handler::inline`.
    Inline,
    /// `Handler::future`.
    Async,
    /// `Handler::blocking`.
    Blocking,
}

fn explode(message: &str) -> ToolOutcome {
    panic!("{message}")
}

/// A concurrency-safe tool of the given kind that panics with `boom-<name>`.
pub fn panicking_tool(name: &str, kind: Kind) -> ToolSpec {
    let message = format!("boom-{name}");
    let handler = match kind {
        Kind::Inline => Handler::inline(move |_args, _ctx| explode(&message)),
        Kind::Async => Handler::future(move |_args, _ctx| {
            let message = message.clone();
            async move {
                tokio::task::yield_now().await;
                explode(&message)
            }
        }),
        Kind::Blocking => Handler::blocking(move |_args, _ctx| explode(&message)),
    };
    ToolSpec::new(name, "Always panics.", any_object(), handler).concurrency_safe(true)
}

/// An async tool that sleeps `ms` milliseconds (its argument) and answers `slept <ms>`.
pub fn sleeping_tool(name: &str, safe: bool) -> ToolSpec {
    ToolSpec::new(
        name,
        "Sleeps for `ms` milliseconds.",
        ms_schema(),
        Handler::future(|args, _ctx| async move {
            let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(format!("slept {ms}"))
        }),
    )
    .concurrency_safe(safe)
}

/// An async, concurrency-safe tool that waits on a shared barrier for at most `wait`; it answers
/// `passed` when every party arrived, and fails `barrier timed out` otherwise.
pub fn barrier_tool(name: &str, barrier: Arc<tokio::sync::Barrier>, wait: Duration) -> ToolSpec {
    ToolSpec::new(
        name,
        "Waits until every party of a barrier arrived.",
        any_object(),
        Handler::future(move |_args, _ctx| {
            let barrier = Arc::clone(&barrier);
            async move {
                match tokio::time::timeout(wait, barrier.wait()).await {
                    Ok(_) => Ok("passed".to_string()),
                    Err(_) => Err(ToolError::execution("barrier timed out")),
                }
            }
        }),
    )
    .concurrency_safe(true)
}

/// A shared, ordered log of events pushed by handlers, the mock server and the scripted
/// provider: the library's [`switchboard::agent::EventLog`] underneath, so the same log can be
/// handed to `ScriptedProvider::with_log`. Proves an order ("handler started" before "stream
/// ended") without a stopwatch.
#[derive(Debug, Clone, Default)]
pub struct EventLog(switchboard::agent::EventLog);

impl EventLog {
    /// Appends one event.
    pub fn push(&self, event: impl Into<String>) {
        switchboard::agent::log_event(&self.0, event);
    }
    /// The library's handle on the same log.
    pub fn shared(&self) -> switchboard::agent::EventLog {
        Arc::clone(&self.0)
    }
    /// Everything logged so far.
    pub fn events(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    /// Position of `event` in the log (panics if absent).
    pub fn position(&self, event: &str) -> usize {
        let events = self.events();
        events
            .iter()
            .position(|e| e == event)
            .unwrap_or_else(|| panic!("event {event:?} not in log {events:?}"))
    }
    /// Position of the first event starting with `prefix` (panics if there is none).
    pub fn first_starting_with(&self, prefix: &str) -> usize {
        let events = self.events();
        events
            .iter()
            .position(|e| e.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {events:?}"))
    }
    /// Whether an event starting with `prefix` was logged.
    pub fn has_entry_starting_with(&self, prefix: &str) -> bool {
        self.events().iter().any(|e| e.starts_with(prefix))
    }
}

/// An async tool that logs `start <i>`, sleeps `ms`, logs `end <i>` (`i` and `ms` are arguments).
pub fn logging_tool(name: &str, safe: bool, log: EventLog) -> ToolSpec {
    ToolSpec::new(
        name,
        "Logs its start and end.",
        json!({
            "type": "object",
            "properties": {"i": {"type": "integer"}, "ms": {"type": "integer"}},
            "required": ["i", "ms"]
        }),
        Handler::future(move |args, _ctx| {
            let log = log.clone();
            async move {
                let i = args["i"].as_i64().unwrap_or(-1);
                let ms = args["ms"].as_u64().unwrap_or(0);
                log.push(format!("start {i}"));
                tokio::time::sleep(Duration::from_millis(ms)).await;
                log.push(format!("end {i}"));
                Ok(format!("done {i}"))
            }
        }),
    )
    .concurrency_safe(safe)
}

/// Builds an engine with the given tools (panics if any is refused).
pub fn engine(tools: Vec<ToolSpec>) -> Engine {
    Engine::builder()
        .tools(tools)
        .build()
        .expect("engine builds")
}

/// An engine of the five built-in tools plus `extra`, serving `ws` (panics if it does not build).
pub fn builtin_engine(ws: &Workspace, extra: Vec<ToolSpec>) -> Engine {
    Engine::builder()
        .tools(builtin_tools())
        .tools(extra)
        .workspace(ws.clone())
        .build()
        .expect("engine builds")
}

/// Dispatches one turn, bounded by [`TURN_BOUND`] so a hang fails instead of wedging the suite.
pub async fn run_turn(engine: &Engine, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
    tokio::time::timeout(TURN_BOUND, engine.dispatch(calls))
        .await
        .expect("the turn was answered within the bound")
        .expect("the engine is available")
}

/// A turn's answer as the wire sends it (Anthropic blocks), to compare answers byte for byte.
pub fn wire(results: &[ToolDispatchResult]) -> String {
    serde_json::to_string(
        &results
            .iter()
            .map(|r| r.to_anthropic_block())
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

/// The `tool_use_id`s of results, in order.
pub fn ids(results: &[ToolDispatchResult]) -> Vec<String> {
    results.iter().map(|r| r.tool_use_id.to_string()).collect()
}

/// The outcome labels (`ok` or an error code) of results, in order.
pub fn outcomes(results: &[ToolDispatchResult]) -> Vec<&'static str> {
    results.iter().map(ToolDispatchResult::outcome).collect()
}

/// One shared two-thread runtime for a property test's cases (a proptest body is synchronous;
/// building a runtime per case would dominate its time).
pub fn proptest_runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}
