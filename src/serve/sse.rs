//! The Server-Sent Events answer of a streamed dispatch: one `event: result` per call as it is
//! answered, data `{"index": i, "result": <block or message>}`, then one `event: done` whose data
//! is the complete ordered answer, byte for byte the non-streaming body. Between them, `event:
//! approval_required` for a call that waits for the client's approval, `event: call` for a
//! client-tool call the client runs (`{"call_id", "tool_use_id", "name", "input",
//! "deadline_ms", "idempotency_key"}`), and `event: progress` for a running call's live
//! progress (`{"tool_use_id", "seq", "kind": "output", "stream", "text"}` or `{…, "kind":
//! "progress", "progress", "total", "message"}`; off with `progress=false`), each call's before
//! its `result`.
//!
//! A forwarding task turns the engine's per-call results (the collector's result sink) into
//! events; when the client goes away the forwarder stops and drops its end of the sink, while
//! the turn's own task runs on to the end. Every index gets exactly one `result` event: should a
//! turn be answered without passing the collector (an engine already shut down), the missing
//! ones are sent from the final answer before `done`. Comments every 15 s keep idle
//! connections alive through proxies while a long call runs.

use std::collections::BTreeSet;
use std::convert::Infallible;

use super::client_tools::Attached;
use crate::document::DocumentError;
use crate::protocol::{ToolDispatchResult, WireFormat};
use crate::tool::ProgressEvent;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Events buffered for a slow client before the forwarder waits for it.
const BUFFERED_EVENTS: usize = 64;

fn encode(format: WireFormat, result: &ToolDispatchResult) -> Value {
    match format {
        WireFormat::Anthropic => result.to_anthropic_block(),
        WireFormat::OpenAi => result.to_openai_message(),
    }
}

fn result_event(index: usize, result: Value) -> Event {
    Event::default()
        .event("result")
        .data(json!({"index": index, "result": result}).to_string())
}

/// The per-call items of a complete answer (the user message's content, or the array).
fn items(format: WireFormat, answer: &str) -> Vec<Value> {
    let Ok(doc) = serde_json::from_str::<Value>(answer) else {
        return Vec::new();
    };
    let list = match format {
        WireFormat::Anthropic => doc.get("content").cloned(),
        WireFormat::OpenAi => Some(doc),
    };
    match list {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

/// The SSE response of a turn whose results arrive on `results`, its calls' live progress on
/// `progress`, and whose complete answer is what `turn` returns.
pub fn stream(
    format: WireFormat,
    mut results: mpsc::UnboundedReceiver<(usize, ToolDispatchResult)>,
    mut progress: Option<mpsc::Receiver<ProgressEvent>>,
    mut approvals: Option<mpsc::UnboundedReceiver<crate::policy::ApprovalRequest>>,
    delegated: Option<(mpsc::UnboundedReceiver<Value>, Attached)>,
    turn: JoinHandle<Result<String, DocumentError>>,
) -> Response {
    let (tx, mut rx) = mpsc::channel::<Event>(BUFFERED_EVENTS);
    // The stream's body holds the turn's link to its client-tool calls: when the client goes
    // away, hyper drops the body, and the calls still waiting for it are answered `cancelled`.
    let (mut calls, attached) = match delegated {
        Some((calls, attached)) => (Some(calls), Some(attached)),
        None => (None, None),
    };
    tokio::spawn(async move {
        let mut sent = BTreeSet::new();
        loop {
            let event = tokio::select! {
                biased;
                // Before results: a call's progress was sent before its result was, and goes
                // out first (its events are rate-limited, so they cannot starve the results).
                Some(update) = async {
                    match progress.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => Event::default().event("progress").data(update.to_json().to_string()),
                next = results.recv() => match next {
                    Some((index, result)) => {
                        sent.insert(index);
                        result_event(index, encode(format, &result))
                    }
                    None => break,
                },
                Some(request) = async {
                    match approvals.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => approval_event(&request),
                Some(call) = async {
                    match calls.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => Event::default().event("call").data(call.to_string()),
            };
            if tx.send(event).await.is_err() {
                return; // the client went away; the turn runs on by itself
            }
        }
        let answer = match turn.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(reason)) => {
                let refused = match reason {
                    DocumentError::Engine(e) => super::errors::ApiError::from(e),
                    other => super::errors::ApiError::BadRequest(other.to_string()),
                };
                return error(&tx, refused.code(), &refused.message()).await;
            }
            Err(e) => {
                let message = format!("the turn's task failed: {e}");
                return error(&tx, "internal", &message).await;
            }
        };
        for (index, item) in items(format, &answer).into_iter().enumerate() {
            if !sent.contains(&index) && tx.send(result_event(index, item)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Event::default().event("done").data(answer)).await;
    });
    let events = futures::stream::poll_fn(move |cx| {
        let _link = &attached;
        rx.poll_recv(cx).map(|e| e.map(Ok::<_, Infallible>))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `event: approval_required`, data: the request (`approval_id`, `tool_use_id`, `tool_name`,
/// `tool_input`, `subject`, `rule`).
fn approval_event(request: &crate::policy::ApprovalRequest) -> Event {
    let data = serde_json::to_string(request).unwrap_or_else(|_| "{}".into());
    Event::default().event("approval_required").data(data)
}

async fn error(tx: &mpsc::Sender<Event>, code: &str, message: &str) {
    let data = json!({"error": {"code": code, "message": message}}).to_string();
    let _ = tx.send(Event::default().event("error").data(data)).await;
}
