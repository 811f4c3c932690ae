//! MCP tools as registry entries: a listed tool becomes a [`ToolSpec`] whose handler is a
//! `tools/call` to its server.
//!
//! * Description and `inputSchema` come from `tools/list`; the registry compiles the schema (a tool
//!   whose schema does not compile is skipped with a warning naming it).
//! * Policy: `annotations.readOnlyHint: true` → concurrency-safe, otherwise serial; the server's
//!   `parallel` key overrides; `timeout_ms` is the tool's timeout, `max_concurrency` its cap.
//! * A call waits (within its deadline) while its server starts or restarts, sends `tools/call`
//!   with the raw name, and maps the result: text blocks as text, images as image blocks (checked
//!   and counted against the output cap by [`ToolOutput::capped`]: an Anthropic `tool_result`
//!   shows them, an OpenAI tool message carries their note), audio as a note (no wire carries it),
//!   embedded text resources as their text, other resources and links as notes,
//!   `structuredContent` as JSON text when no text block is given; `isError: true` →
//!   `execution_error` with the text (images as notes).
//! * A response the transport could not read (over the message limit, a lone surrogate escape,
//!   …) answers the call at once: `execution_error` naming the cause. A block of an unknown
//!   kind is a note; the known blocks are kept.
//! * Every `tools/call` carries the call's idempotency key in its `_meta`, under
//!   [`IDEMPOTENCY_META_KEY`]: the same for every copy of the call, so a server can recognise a
//!   call it has already run (see `docs/idempotency.md`).
//! * Timeout or cancellation drops the request; the server is then sent `notifications/cancelled`
//!   with the request id, and the late response is dropped. A server that exits mid-call answers the call
//!   `execution_error` at once.
//! * When the turn has a progress listener, the server's `notifications/progress` for the call
//!   (the progress token rmcp puts in every request's `_meta`) go to the call's
//!   [`crate::tool::Progress`] as values (`progress`, `total`, `message`).

use std::sync::Arc;
use std::time::Instant;

use rmcp::ServiceError;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, ContentBlock, RequestMetaObject, ResourceContents, ServerResult, Tool,
};
use rmcp::service::PeerRequestOptions;
use serde_json::Value;

use super::link::{Link, Live, Shared, ToolEntry};
use super::names;
use super::wire::unreadable_cause;
use crate::protocol::ErrorCode;
use crate::tool::{
    Block, Effect, Handler, ToolContext, ToolError, ToolOutcome, ToolOutput, ToolSpec,
};

/// The `_meta` key of a `tools/call` that holds the call's idempotency key
/// ([`ToolContext::idempotency_key`]). MCP reserves prefixes whose second label is `mcp` or
/// `modelcontextprotocol`; this one is Switchboard's own, in reverse-DNS form.
pub const IDEMPOTENCY_META_KEY: &str = "io.switchboard/idempotency-key";

/// How long a call whose connection closed waits for the supervisor to notice the exit.
const EXIT_NOTICE: std::time::Duration = std::time::Duration::from_secs(5);

/// A server's listed tools as specs, with the listing entry of each (same order) and the tools
/// left out (raw name, why).
pub(crate) struct Built {
    pub specs: Vec<ToolSpec>,
    pub entries: Vec<ToolEntry>,
    pub skipped: Vec<(String, String)>,
}

/// The specs (and the listing entries) for a server's listed tools. Registry names are distinct
/// (see [`names`]); a raw name the server lists twice is skipped the second time.
pub(crate) fn build(shared: &Arc<Shared>, listed: Vec<Tool>) -> Built {
    let raws: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    let names = names::registry_names(&shared.name, &raws);
    let mut built = Built {
        specs: Vec::with_capacity(listed.len()),
        entries: Vec::with_capacity(listed.len()),
        skipped: Vec::new(),
    };
    for (tool, name) in listed.iter().zip(names) {
        let Some(name) = name else {
            let why = if raws.iter().filter(|r| **r == tool.name.as_ref()).count() > 1 {
                "the server lists this name more than once; only the first is used"
            } else {
                "no free registry name was found for it"
            };
            built.skipped.push((tool.name.to_string(), why.to_string()));
            continue;
        };
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        let idempotent = tool
            .annotations
            .as_ref()
            .and_then(|a| a.idempotent_hint)
            .unwrap_or(false);
        // What a second run would do: the server entry's `effect`, else the tool's hints.
        let effect = shared.spec.effect.unwrap_or(if read_only {
            Effect::ReadOnly
        } else if idempotent {
            Effect::Idempotent
        } else {
            Effect::SideEffect
        });
        let safe = shared.spec.parallel.unwrap_or(read_only);
        let raw: Arc<str> = Arc::from(tool.name.as_ref());
        let server = Arc::clone(shared);
        let handler_raw = Arc::clone(&raw);
        let mut spec = ToolSpec::new(
            name.clone(),
            tool.description.as_deref().unwrap_or_default(),
            Value::Object((*tool.input_schema).clone()),
            Handler::future(move |args, ctx| {
                let server = Arc::clone(&server);
                let raw = Arc::clone(&handler_raw);
                async move { call(&server, &raw, args, ctx).await }
            }),
        )
        .concurrency_safe(safe)
        .timeout(shared.spec.timeout)
        .defer(shared.spec.defer)
        .effect(effect);
        if let Some(n) = shared.spec.max_concurrency {
            spec = spec.max_concurrency(n);
        }
        built.specs.push(spec);
        built.entries.push(ToolEntry {
            name,
            raw_name: raw.to_string(),
            concurrency_safe: safe,
        });
    }
    built
}

/// The error a handler answers with when told to stop: `timeout` past its deadline, otherwise
/// `cancelled`.
fn stopped(shared: &Shared, ctx: &ToolContext) -> ToolError {
    let code = stop_code(ctx);
    let what = match code {
        ErrorCode::Timeout => format!("timed out after {} ms", shared.spec.timeout.as_millis()),
        _ => "cancelled".to_string(),
    };
    ToolError::new(
        code,
        format!(
            "{what}; notifications/cancelled sent to MCP server {}",
            shared.name
        ),
    )
}

fn stop_code(ctx: &ToolContext) -> ErrorCode {
    if Instant::now() >= ctx.deadline {
        ErrorCode::Timeout
    } else {
        ErrorCode::Cancelled
    }
}

fn stop_word(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::Timeout => "timed out",
        _ => "cancelled",
    }
}

/// Waits until the server is up (or down for good), or the call is told to stop.
async fn live(shared: &Shared, ctx: &ToolContext) -> Result<Arc<Live>, ToolError> {
    let mut rx = shared.link.subscribe();
    loop {
        let link = rx.borrow_and_update().clone();
        match link {
            Link::Up(live) if !live.exited.is_cancelled() && !live.peer.is_transport_closed() => {
                return Ok(live);
            }
            Link::Down(reason) => {
                return Err(ToolError::execution(format!(
                    "MCP server {} is down: {reason}",
                    shared.name
                )));
            }
            Link::Stopped => {
                return Err(ToolError::new(
                    ErrorCode::Cancelled,
                    format!("MCP server {} was shut down", shared.name),
                ));
            }
            Link::Up(_) | Link::Starting | Link::Restarting => {}
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() {
                return Err(ToolError::execution(format!("MCP server {} is gone", shared.name)));
            },
            _ = ctx.cancel.cancelled() => {
                let code = stop_code(ctx);
                return Err(ToolError::new(code, format!(
                    "{} while waiting for MCP server {} to start", stop_word(code), shared.name
                )));
            }
        }
    }
}

/// One `tools/call`.
async fn call(shared: &Shared, raw: &str, args: Value, ctx: ToolContext) -> ToolOutcome {
    let live = live(shared, &ctx).await?;
    let mut params = CallToolRequestParams::new(raw.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    let mut meta = RequestMetaObject::new();
    meta.0.0.insert(
        IDEMPOTENCY_META_KEY.to_string(),
        Value::String(ctx.idempotency_key()),
    );
    params.meta = Some(meta);
    let started = Instant::now();
    // Dropping this future (on stop, or when the engine drops the handler) sends
    // `notifications/cancelled` for the request; its late response is then dropped.
    let request = send_call(&live, params, &ctx);
    let answer = tokio::select! {
        r = request => r,
        _ = ctx.cancel.cancelled() => {
            shared.metrics.request(started.elapsed());
            return Err(stopped(shared, &ctx));
        }
        _ = live.exited.cancelled() => {
            shared.metrics.request(started.elapsed());
            return Err(ToolError::execution(live.reason().to_string()));
        }
    };
    shared.metrics.request(started.elapsed());
    match answer {
        Ok(result) => map_result(result),
        Err(ServiceError::TransportClosed) => {
            // Answer once the supervisor has seen the exit too, so the next call waits for the
            // restart instead of finding the dead connection (bounded by this call's deadline).
            tokio::select! {
                _ = live.exited.cancelled() => {}
                _ = ctx.cancel.cancelled() => {}
                _ = tokio::time::sleep(EXIT_NOTICE) => {}
            }
            Err(ToolError::execution(format!(
                "MCP server {} exited: the connection closed during the call",
                shared.name
            )))
        }
        Err(ServiceError::McpError(e)) => Err(ToolError::execution(match unreadable_cause(&e) {
            Some(cause) => format!(
                "MCP server {} sent a response that could not be read: {cause}",
                shared.name
            ),
            None => format!(
                "MCP server {} answered error {}: {}",
                shared.name, e.code.0, e.message
            ),
        })),
        Err(e) => Err(ToolError::execution(format!(
            "MCP server {}: {e}",
            shared.name
        ))),
    }
}

/// One `tools/call`, as [`rmcp::Peer::call_tool`] sends it — a request dropped before its answer
/// is cancelled (`notifications/cancelled`), an empty or `_meta`-only reply is a result with no
/// content, any other reply that is no `CallToolResult` is unexpected — but sent through the
/// lower-level request API, so that the request's progress token (rmcp gives every request one)
/// is known and, when the turn has a listener, routed to the call before the server can report.
async fn send_call(
    live: &Live,
    params: CallToolRequestParams,
    ctx: &ToolContext,
) -> Result<CallToolResult, ServiceError> {
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = live
        .peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await?;
    let _route = ctx.progress.is_on().then(|| {
        live.progress
            .route(handle.progress_token.clone(), ctx.progress.clone())
    });
    let mut abandoned = Abandoned(Some((live.peer.clone(), handle.id.clone())));
    let answer = handle.await_response().await;
    abandoned.0 = None;
    match answer? {
        ServerResult::CallToolResult(result) => Ok(result),
        // A result with nothing in it (`{}`, or only `_meta`): a call that answered nothing.
        ServerResult::EmptyResult(_) | ServerResult::TaskAckResult(_) => {
            Ok(CallToolResult::default())
        }
        ServerResult::CustomResult(custom)
            if custom
                .0
                .as_object()
                .is_some_and(|o| o.keys().all(|k| k == "_meta")) =>
        {
            Ok(CallToolResult::default())
        }
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// A request given up before its answer: the server is told (`notifications/cancelled`).
struct Abandoned(Option<(rmcp::Peer<rmcp::RoleClient>, rmcp::model::RequestId)>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some((peer, id)) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let params = CancelledNotificationParam::new(
                    Some(id),
                    Some("request abandoned by the caller".into()),
                );
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
}

/// Maps a `tools/call` result to the call's output (see the module docs).
pub fn map_result(result: CallToolResult) -> ToolOutcome {
    let mut blocks: Vec<Block> = Vec::with_capacity(result.content.len() + 1);
    let mut has_text = false;
    for block in result.content {
        blocks.push(match block {
            ContentBlock::Text(t) => {
                has_text = true;
                Block::Text(t.text)
            }
            ContentBlock::Image(i) => Block::image(i.mime_type, i.data),
            // An Anthropic tool_result has no audio block: a note on every wire.
            ContentBlock::Audio(a) => Block::Text(format!(
                "[audio: {}, {} bytes base64, not shown]",
                a.mime_type,
                a.data.len()
            )),
            ContentBlock::Resource(r) => match r.resource {
                ResourceContents::TextResourceContents { text, .. } => {
                    has_text = true;
                    Block::Text(text)
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => Block::Text(format!(
                    "[resource {uri}: {}, {} bytes base64, not shown]",
                    mime_type.as_deref().unwrap_or("unknown type"),
                    blob.len()
                )),
                _ => Block::Text("[resource content, not shown]".to_string()),
            },
            ContentBlock::ResourceLink(link) => {
                Block::Text(format!("[resource link: {} ({})]", link.uri, link.name))
            }
            other => {
                let kind = serde_json::to_value(&other)
                    .ok()
                    .and_then(|v| v["type"].as_str().map(str::to_string))
                    .unwrap_or_default();
                Block::Text(format!("[{kind} content, not shown]"))
            }
        });
    }
    if !has_text && let Some(structured) = &result.structured_content {
        blocks.insert(0, Block::Text(structured.to_string()));
    }
    let output = ToolOutput::blocks(blocks);
    if result.is_error == Some(true) {
        // Errors are text: an image in one is its note.
        let text = output.into_text();
        Err(ToolError::execution(if text.is_empty() {
            "the MCP server reported an error without detail".to_string()
        } else {
            text
        }))
    } else {
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::TINY_PNG;
    use serde_json::json;

    fn result(v: Value) -> CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn content_blocks_map_to_text_and_images_in_order() {
        let r = result(json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "data": TINY_PNG, "mimeType": "image/png"},
            {"type": "audio", "data": "UklG", "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAA", "mimeType": "application/zip"}}
        ]}));
        let out = map_result(r).unwrap();
        let image_note = format!(
            "[image: image/png, {} bytes base64, not shown]",
            TINY_PNG.len()
        );
        let audio_note = "[audio: audio/wav, 4 bytes base64, not shown]";
        let zip_note = "[resource file:///b: application/zip, 4 bytes base64, not shown]";
        assert_eq!(
            out.as_str(),
            format!("hello\n{image_note}\n{audio_note}\ninside\n{zip_note}")
        );
        assert_eq!(
            out.images().unwrap(),
            &[
                Block::text("hello"),
                Block::image("image/png", TINY_PNG),
                Block::text(audio_note),
                Block::text("inside"),
                Block::text(zip_note),
            ]
        );
    }

    #[test]
    fn an_error_with_an_image_is_text_with_its_note() {
        let r = result(json!({"isError": true, "content": [
            {"type": "text", "text": "render failed"},
            {"type": "image", "data": TINY_PNG, "mimeType": "image/png"}
        ]}));
        let e = map_result(r).unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert_eq!(
            e.detail,
            format!(
                "render failed\n[image: image/png, {} bytes base64, not shown]",
                TINY_PNG.len()
            )
        );
    }

    #[test]
    fn structured_content_stands_in_when_there_is_no_text() {
        let r = result(json!({"content": [], "structuredContent": {"t": 1}}));
        assert_eq!(map_result(r).unwrap(), r#"{"t":1}"#);
        let r = result(
            json!({"content": [{"type": "text", "text": "x"}], "structuredContent": {"t": 1}}),
        );
        assert_eq!(map_result(r).unwrap(), "x");
    }

    #[test]
    fn is_error_becomes_an_execution_error_with_the_servers_text() {
        let r =
            result(json!({"content": [{"type": "text", "text": "no such city"}], "isError": true}));
        let e = map_result(r).unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert_eq!(e.detail, "no such city");
    }
}
