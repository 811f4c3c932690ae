//! MCP tools as registry entries: a listed tool becomes a [`ToolSpec`] whose handler is a
//! `tools/call` to its server.
//!
//! * Description and `inputSchema` come from `tools/list`; the registry compiles the schema (a tool
//!   whose schema does not compile is skipped with a warning naming it).
//! * Policy: `annotations.readOnlyHint: true` → concurrency-safe, otherwise serial; the server's
//!   `parallel` key overrides; `timeout_ms` is the tool's timeout, `max_concurrency` its cap.
//! * A call waits (within its deadline) while its server starts or restarts, sends `tools/call`
//!   with the raw name, and maps the result: text blocks as text, images and audio as a note,
//!   embedded text resources as their text, `structuredContent` as JSON text when no text block is
//!   given; `isError: true` → `execution_error`.
//! * Timeout or cancellation drops the request; rmcp then sends `notifications/cancelled` with the
//!   request id, and the late response is dropped. A server that exits mid-call answers the call
//!   `execution_error` at once.

use std::sync::Arc;
use std::time::Instant;

use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use serde_json::Value;

use super::names;
use super::server_conn::{Link, Live, Shared, ToolEntry};
use crate::protocol::ErrorCode;
use crate::tool::{Handler, ToolContext, ToolError, ToolOutcome, ToolSpec};

/// How long a call whose connection closed waits for the supervisor to notice the exit.
const EXIT_NOTICE: std::time::Duration = std::time::Duration::from_secs(5);

/// The specs (and the listing entries) for a server's listed tools.
pub(crate) fn build(shared: &Arc<Shared>, listed: Vec<Tool>) -> (Vec<ToolSpec>, Vec<ToolEntry>) {
    let raws: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    let names = names::registry_names(&shared.name, &raws);
    let mut specs = Vec::with_capacity(listed.len());
    let mut entries = Vec::with_capacity(listed.len());
    for (tool, name) in listed.iter().zip(names) {
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
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
        .timeout(shared.spec.timeout);
        if let Some(n) = shared.spec.max_concurrency {
            spec = spec.max_concurrency(n);
        }
        specs.push(spec);
        entries.push(ToolEntry {
            name,
            raw_name: raw.to_string(),
            concurrency_safe: safe,
        });
    }
    (specs, entries)
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
    let started = Instant::now();
    // Dropping this future (on stop, or when the engine drops the handler) makes rmcp send
    // `notifications/cancelled` for the request; its late response is then dropped.
    let request = live.peer.call_tool(params);
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
        Err(ServiceError::McpError(e)) => Err(ToolError::execution(format!(
            "MCP server {} answered error {}: {}",
            shared.name, e.code.0, e.message
        ))),
        Err(e) => Err(ToolError::execution(format!(
            "MCP server {}: {e}",
            shared.name
        ))),
    }
}

/// Maps a `tools/call` result to the model's text (see the module docs).
pub fn map_result(result: CallToolResult) -> ToolOutcome {
    let mut parts: Vec<String> = Vec::new();
    let mut has_text = false;
    for block in &result.content {
        let v = serde_json::to_value(block).unwrap_or(Value::Null);
        let kind = v["type"].as_str().unwrap_or("");
        match kind {
            "text" => {
                has_text = true;
                parts.push(v["text"].as_str().unwrap_or_default().to_string());
            }
            "image" | "audio" => parts.push(format!(
                "[{kind}: {}, {} bytes base64, not shown]",
                v["mimeType"].as_str().unwrap_or("unknown type"),
                v["data"].as_str().map_or(0, str::len)
            )),
            "resource" => {
                let r = &v["resource"];
                let uri = r["uri"].as_str().unwrap_or("");
                match r["text"].as_str() {
                    Some(text) => {
                        has_text = true;
                        parts.push(text.to_string());
                    }
                    None => parts.push(format!(
                        "[resource {uri}: {}, {} bytes base64, not shown]",
                        r["mimeType"].as_str().unwrap_or("unknown type"),
                        r["blob"].as_str().map_or(0, str::len)
                    )),
                }
            }
            "resource_link" => parts.push(format!(
                "[resource link: {} ({})]",
                v["uri"].as_str().unwrap_or(""),
                v["name"].as_str().unwrap_or("")
            )),
            other => parts.push(format!("[{other} content, not shown]")),
        }
    }
    if !has_text && let Some(structured) = &result.structured_content {
        parts.insert(0, structured.to_string());
    }
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        Err(ToolError::execution(if text.is_empty() {
            "the MCP server reported an error without detail".to_string()
        } else {
            text
        }))
    } else {
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(v: Value) -> CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn content_blocks_map_to_text() {
        let r = result(json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAA", "mimeType": "application/zip"}}
        ]}));
        assert_eq!(
            map_result(r).unwrap(),
            "hello\n[image: image/png, 8 bytes base64, not shown]\ninside\n\
             [resource file:///b: application/zip, 4 bytes base64, not shown]"
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
