//! What a model says and how a test drives the agent loop with it: content blocks, Messages API
//! responses, chat completions and scripted answers; the loop configuration every agent test
//! uses; the engine of `echo`, `reader` and `writer` whose handlers log when they start and end
//! (to prove eager dispatch by the order of events); fast retry settings for the HTTP providers.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard::agent::{AgentLoop, LoopConfig, StreamOptions};
use switchboard::agent::{HttpConfig, RetryPolicy};
use switchboard::agent::{ModelResponse, Provider};
use switchboard::{Engine, Handler, ToolSpec};

use super::{EventLog, echo_tool};

/// Bound on any one step of an agent test: a hang fails instead of wedging the suite.
pub const BOUND: Duration = Duration::from_secs(20);

/// The model every test loop asks for.
pub const MODEL: &str = "mock-model";

/// The system prompt every test loop sends.
pub const SYSTEM: &str = "be brief";

/// A text block.
pub fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

/// A `tool_use` block.
pub fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

/// A Messages API response.
pub fn message(content: Vec<Value>, stop: &str) -> Value {
    json!({"id":"msg_1","type":"message","role":"assistant","model":"mock","content":content,
           "stop_reason":stop,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}})
}

/// A chat completion: optional text and `(id, name, arguments text)` calls.
pub fn completion(text: Option<&str>, calls: &[(&str, &str, &str)], finish: &str) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| json!({"id":id,"type":"function","function":{"name":name,"arguments":args}}))
        .collect();
    let mut msg = json!({"role":"assistant","content":text});
    if !tool_calls.is_empty() {
        msg["tool_calls"] = Value::Array(tool_calls);
    }
    json!({"id":"chatcmpl-1","object":"chat.completion","model":"mock",
           "choices":[{"index":0,"message":msg,"finish_reason":finish}]})
}

/// A scripted provider's answer.
pub fn answer(content: Vec<Value>, stop: &str) -> ModelResponse {
    ModelResponse {
        content,
        stop_reason: Some(stop.to_string()),
    }
}

/// [`MODEL`], [`SYSTEM`], 1000 tokens, at most `max_turns` turns.
pub fn config(max_turns: usize) -> LoopConfig {
    LoopConfig {
        model: MODEL.into(),
        system: SYSTEM.into(),
        max_tokens: 1000,
        max_turns,
    }
}

/// A loop of at most 8 turns on a fresh session of `engine`.
pub fn agent(engine: &Engine, provider: Arc<dyn Provider>, stream: bool, eager: bool) -> AgentLoop {
    AgentLoop::new(engine.session(), provider, config(8))
        .unwrap()
        .with_stream(StreamOptions { stream, eager })
}

/// An async tool that logs `started <name> <id>`, sleeps `ms` (default 0), logs
/// `finished <name> <id>` and answers `done <name>`.
pub fn logged_tool(name: &'static str, log: EventLog, safe: bool) -> ToolSpec {
    ToolSpec::new(
        name,
        "Logs when it starts and ends.",
        json!({"type":"object","properties":{"ms":{"type":"integer","minimum":0}}}),
        Handler::future(move |args, ctx| {
            let log = log.clone();
            async move {
                log.push(format!("started {name} {}", ctx.call_id));
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                if ms > 0 {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                log.push(format!("finished {name} {}", ctx.call_id));
                Ok(format!("done {name}"))
            }
        }),
    )
    .concurrency_safe(safe)
}

/// `echo`, `reader` (safe, logged), `writer` (serial, logged).
pub fn test_engine(log: &EventLog) -> Engine {
    Engine::builder()
        .tool(echo_tool("echo"))
        .tool(logged_tool("reader", log.clone(), true))
        .tool(logged_tool("writer", log.clone(), false))
        .build()
        .unwrap()
}

/// Fast retries: backoff 1 ms; one second of `retry-after` is 20 ms.
pub fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_retry_after: Duration::from_secs(1),
        retry_after_unit: Duration::from_millis(20),
    }
}

/// `url` with the key `test-key`, a 10 s timeout and `retry`.
pub fn http_config(url: String, retry: RetryPolicy) -> HttpConfig {
    HttpConfig {
        base_url: url,
        api_key: Some("test-key".into()),
        timeout: Duration::from_secs(10),
        retry,
    }
}
