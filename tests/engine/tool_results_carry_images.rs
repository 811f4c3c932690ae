//! A custom tool that answers with an image, through the engine: the Anthropic answer carries an
//! `image` block in the `tool_result`'s content array, the OpenAI answer carries the image's note,
//! text-only results beside it stay plain strings, and an image over the output cap becomes its
//! note on every wire; in an agent loop, the request body sent to each provider carries the
//! same (an image block to Anthropic, the note to OpenAI).

use crate::common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::EventLog;
use common::mock_server::MockServer;
use common::model::{BOUND, agent};
use common::wire::{Call, Stop, Wire};
use common::{TURN_BOUND, any_object, echo_tool};
use serde_json::{Value, json};
use switchboard::protocol::document::dispatch_document;
use switchboard::{Block, Engine, Handler, ToolOutput, ToolSpec, WireFormat};
use tokio_util::sync::CancellationToken;

/// A 1×1 PNG in base64.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// A PNG of 3,000 bytes more (4,096 bytes of base64).
fn big_png() -> String {
    let mut bytes = STANDARD.decode(PNG).unwrap();
    bytes.resize(bytes.len() + 3_000, 0);
    STANDARD.encode(bytes)
}

/// An async tool answering with text, an image and more text.
fn screenshot(name: &str, image: String) -> ToolSpec {
    ToolSpec::new(
        name,
        "Takes a screenshot.",
        any_object(),
        Handler::future(move |_args: Value, _ctx| {
            let image = image.clone();
            async move {
                Ok(ToolOutput::blocks([
                    Block::text("Here is the screen:"),
                    Block::image("image/png", image),
                    Block::text("(1×1)"),
                ]))
            }
        }),
    )
    .concurrency_safe(true)
}

fn engine() -> Engine {
    Engine::builder()
        .tool(screenshot("shot", PNG.to_string()))
        // Room for its text and the note, not for its image.
        .tool(screenshot("big_shot", big_png()).output_cap(1_000))
        .tool(echo_tool("echo"))
        .build()
        .unwrap()
}

async fn answer(engine: &Engine, format: WireFormat, doc: Value) -> Value {
    let text = tokio::time::timeout(
        TURN_BOUND,
        dispatch_document(engine, format, &doc.to_string(), CancellationToken::new()),
    )
    .await
    .expect("answered in time")
    .expect("dispatched");
    serde_json::from_str(&text).unwrap()
}

fn note(extra: &str) -> String {
    format!(
        "[image: image/png, {} bytes base64, not shown{extra}]",
        PNG.len()
    )
}

#[tokio::test]
async fn an_anthropic_tool_result_carries_the_image_as_an_image_block() {
    let engine = engine();
    let doc = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "shot", "input": {}},
        {"type": "tool_use", "id": "b", "name": "echo", "input": {"text": "hi"}},
        {"type": "tool_use", "id": "c", "name": "big_shot", "input": {}}
    ]});
    let answer = answer(&engine, WireFormat::Anthropic, doc).await;
    let blocks = &answer["content"];
    assert_eq!(
        blocks[0],
        json!({"type": "tool_result", "tool_use_id": "a", "content": [
            {"type": "text", "text": "Here is the screen:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "text", "text": "(1×1)"}
        ]})
    );
    assert_eq!(
        blocks[1],
        json!({"type": "tool_result", "tool_use_id": "b", "content": "echo:hi"})
    );
    let over = format!(
        "[image: image/png, {} bytes base64, not shown: over the 1000-byte output cap]",
        big_png().len()
    );
    assert_eq!(
        blocks[2],
        json!({"type": "tool_result", "tool_use_id": "c",
               "content": format!("Here is the screen:\n{over}\n(1×1)")})
    );
    engine.shutdown(std::time::Duration::from_secs(1)).await;
}

#[tokio::test]
async fn an_openai_tool_message_carries_the_images_note() {
    let engine = engine();
    let doc = json!({"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "shot", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"hi\"}"}}
    ]});
    let answer = answer(&engine, WireFormat::OpenAi, doc).await;
    assert_eq!(
        answer,
        json!([
            {"role": "tool", "tool_call_id": "a",
             "content": format!("Here is the screen:\n{}\n(1×1)", note(""))},
            {"role": "tool", "tool_call_id": "b", "content": "echo:hi"}
        ])
    );
    engine.shutdown(std::time::Duration::from_secs(1)).await;
}

#[tokio::test]
async fn the_dispatch_result_holds_the_text_rendering_and_the_blocks() {
    let engine = engine();
    let results = engine
        .dispatch(vec![
            common::call("a", "shot", json!({})),
            common::call("b", "echo", json!({"text": "x"})),
        ])
        .await
        .unwrap();
    assert_eq!(
        results[0].content,
        format!("Here is the screen:\n{}\n(1×1)", note(""))
    );
    assert_eq!(
        results[0].blocks.as_deref().unwrap()[1],
        Block::image("image/png", PNG)
    );
    assert_eq!(results[1].blocks, None);
    engine.shutdown(std::time::Duration::from_secs(1)).await;
}

/// One loop turn calling `shot`, against the mock server speaking `wire`: the second request's
/// history, after the assistant message.
async fn results_sent_back(wire: Wire) -> Vec<Value> {
    let calls: [Call; 1] = [("t1", "shot", "{}")];
    let server = MockServer::start(
        vec![
            wire.turn(None, &calls, Stop::ToolUse),
            wire.final_answer("Seen."),
        ],
        EventLog::default(),
    )
    .await;
    let engine = engine();
    let mut agent = agent(&engine, wire.provider(&server), false, false);
    let r = tokio::time::timeout(BOUND, agent.run("look"))
        .await
        .expect("the loop ended within the bound")
        .unwrap();
    assert_eq!(r.final_text, "Seen.");
    let history = wire.conversation(&server.requests()[1].body);
    // Exactly what dispatch encodes for the wire.
    assert_eq!(history[2..], wire.result_messages(&r.dispatches[0])[..]);
    engine.shutdown(std::time::Duration::from_secs(1)).await;
    history[2..].to_vec()
}

#[tokio::test]
async fn the_anthropic_request_body_carries_the_image_block() {
    let sent = results_sent_back(Wire::Anthropic).await;
    assert_eq!(
        sent[0]["content"][0]["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}})
    );
}

#[tokio::test]
async fn the_openai_request_body_carries_the_images_note() {
    let sent = results_sent_back(Wire::OpenAi).await;
    assert_eq!(
        sent[0],
        json!({"role": "tool", "tool_call_id": "t1",
               "content": format!("Here is the screen:\n{}\n(1×1)", note(""))})
    );
}
