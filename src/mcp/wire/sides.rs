//! What each end does with the lines it reads (see the parent module): the client of a stdio
//! server and `mcp-serve` decode a line as a message of their peer; what does not decode is
//! answered (a request), repaired or answered for (a response of ours, client only), or skipped.

use rmcp::model::{
    CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, ErrorCode, ErrorData,
    JsonRpcMessage, PaginatedRequestParams, RequestId, ServerJsonRpcMessage, ServerRequest,
    ServerResult,
};
use rmcp::service::TxJsonRpcMessage;
use rmcp::{RoleClient, RoleServer};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Asked, Ledger, Read, Side, unreadable};
use crate::mcp::lines::{MAX_MESSAGE, Outline, outline};
use crate::mcp::recover::{self, cause};
use crate::sandbox::human_bytes;

/// The answer to a request whose id is null (or another value that is neither a string nor an
/// integer, where the request otherwise decodes as a notification).
const NULL_ID: &str =
    "invalid request: the id must be a string or an integer (MCP does not allow null)";

/// An error answer of `Role` to the peer.
fn answer<Role: Side>(code: ErrorCode, id: Option<RequestId>, message: String) -> Read<Role> {
    Read::Answer(TxJsonRpcMessage::<Role>::error(
        ErrorData::new(code, message, None),
        id,
    ))
}

/// The top-level members of a message, each kept as its raw text (nesting of any depth and bad
/// escapes inside them pass).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

/// What to answer for a line that did not decode as a message of this end (see the module
/// docs), `error` being why.
fn refuse<Role: Side>(text: &[u8], error: &serde_json::Error) -> Read<Role> {
    let seen = outline(text);
    let notification = seen.method.is_some() && !seen.has_id;
    let anonymous = !seen.has_id && !Role::ANSWERS_ANONYMOUS;
    let skip = |what: &str| {
        tracing::debug!("MCP: skipping {what} that cannot be read: {}", cause(error));
        Read::Skip
    };
    if std::str::from_utf8(text).is_err() {
        if notification || anonymous {
            return skip("a line");
        }
        return answer(
            ErrorCode::PARSE_ERROR,
            seen.id,
            "parse error: the message is not valid UTF-8".into(),
        );
    }
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(text) {
        if notification || anonymous {
            return skip("a line");
        }
        return answer(
            ErrorCode::PARSE_ERROR,
            seen.id,
            format!("parse error: {}", cause(&e)),
        );
    }
    let Ok(envelope) = serde_json::from_slice::<Envelope>(text) else {
        if anonymous {
            return skip("a line");
        }
        return answer(
            ErrorCode::INVALID_REQUEST,
            None,
            "invalid request: not a JSON-RPC request object".into(),
        );
    };
    if envelope.method.is_none() && (envelope.result.is_some() || envelope.error.is_some()) {
        return skip("a response");
    }
    let Some(id) = envelope.id else {
        // `"id": null` reads as no id; MCP forbids it (JSON-RPC only discourages it), and a
        // request sent with it must not pass for a notification, which is never answered.
        if seen.has_id && Role::ANSWERS_ANONYMOUS {
            return answer(ErrorCode::INVALID_REQUEST, None, NULL_ID.into());
        }
        if envelope.method.is_some() || !Role::ANSWERS_ANONYMOUS {
            return skip("a notification");
        }
        return answer(
            ErrorCode::INVALID_REQUEST,
            None,
            "invalid request: no method and no id".into(),
        );
    };
    let Ok(id) = serde_json::from_str::<RequestId>(id.get()) else {
        return answer(
            ErrorCode::INVALID_REQUEST,
            None,
            "invalid request: the id must be a string or an integer".into(),
        );
    };
    if envelope.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return answer(
            ErrorCode::INVALID_REQUEST,
            Some(id),
            "invalid request: \"jsonrpc\" must be \"2.0\"".into(),
        );
    }
    let Some(method) = envelope
        .method
        .and_then(|m| serde_json::from_str::<String>(m.get()).ok())
    else {
        return answer(
            ErrorCode::INVALID_REQUEST,
            Some(id),
            "invalid request: \"method\" must be a string".into(),
        );
    };
    if Role::SERVES.contains(&method.as_str()) {
        let detail = params_error(&method, envelope.params).unwrap_or_else(|| cause(error));
        return answer(
            ErrorCode::INVALID_PARAMS,
            Some(id),
            format!("invalid params for {method}: {detail}"),
        );
    }
    answer(
        ErrorCode::METHOD_NOT_FOUND,
        Some(id),
        format!("method not found: {method}"),
    )
}

/// Why the params of a `method` request do not decode (for the methods `mcp-serve` serves;
/// `None` for the others).
fn params_error(method: &str, params: Option<&RawValue>) -> Option<String> {
    let text = params.map_or("null", RawValue::get);
    let decoded = match method {
        "tools/call" => serde_json::from_str::<CallToolRequestParams>(text).map(drop),
        "tools/list" => serde_json::from_str::<Option<PaginatedRequestParams>>(text).map(drop),
        _ => return None,
    };
    match decoded {
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            Some("nested deeper than 128 levels".into())
        }
        Err(e) => Some(cause(&e)),
        Ok(()) => None,
    }
}

/// The methods of a client's requests (`mcp-serve` answers the others `-32601`).
const CLIENT_REQUESTS: &[&str] = &[
    "ping",
    "initialize",
    "server/discover",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/directory/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "skills/list",
    "skills/get",
];

/// The methods of a server's requests to its client.
const SERVER_REQUESTS: &[&str] = &[
    "ping",
    "roots/list",
    "sampling/createMessage",
    "elicitation/create",
];

impl Side for RoleServer {
    const SERVES: &'static [&'static str] = CLIENT_REQUESTS;
    const ANSWERS_ANONYMOUS: bool = true;

    fn sending(_: &TxJsonRpcMessage<Self>, _: &Ledger) {}

    fn read(text: &[u8], _: &Ledger) -> Read<Self> {
        match serde_json::from_slice::<ClientJsonRpcMessage>(text) {
            // A known method whose params did not decode falls through to the custom request.
            Ok(JsonRpcMessage::Request(r))
                if matches!(&r.request, ClientRequest::CustomRequest(c)
                    if Self::SERVES.contains(&c.method.as_str())) =>
            {
                let method = r.request.method().to_string();
                let raw = match &r.request {
                    ClientRequest::CustomRequest(c) => c
                        .params
                        .as_ref()
                        .and_then(|p| serde_json::value::to_raw_value(p).ok()),
                    _ => None,
                };
                let detail = params_error(&method, raw.as_deref())
                    .unwrap_or_else(|| "they do not match the method".into());
                answer(
                    ErrorCode::INVALID_PARAMS,
                    Some(r.id),
                    format!("invalid params for {method}: {detail}"),
                )
            }
            // A request whose id is neither a string nor an integer (null, a boolean) decodes as
            // a notification, which is never answered: MCP forbids such ids, so it is an
            // invalid request, answered with a null id as JSON-RPC asks.
            Ok(JsonRpcMessage::Notification(_)) if outline(text).has_id => {
                answer(ErrorCode::INVALID_REQUEST, None, NULL_ID.into())
            }
            Ok(message) => Read::Deliver(message),
            Err(e) => refuse(text, &e),
        }
    }

    fn oversized(len: u64, seen: Outline, _: &Ledger) -> Read<Self> {
        oversized_request(len, seen)
    }
}

/// The answer to an oversized line that is not a response of ours.
fn oversized_request<Role: Side>(len: u64, seen: Outline) -> Read<Role> {
    let notification = seen.method.is_some() && !seen.has_id;
    if notification || (!seen.has_id && !Role::ANSWERS_ANONYMOUS) {
        tracing::warn!("MCP: skipping a message of {len} bytes (the limit is {MAX_MESSAGE})");
        return Read::Skip;
    }
    answer(
        ErrorCode::INVALID_REQUEST,
        seen.id,
        format!(
            "invalid request: the message is {len} bytes, over the {} limit",
            human_bytes(MAX_MESSAGE as u64)
        ),
    )
}

impl Side for RoleClient {
    const SERVES: &'static [&'static str] = SERVER_REQUESTS;
    const ANSWERS_ANONYMOUS: bool = false;

    fn sending(item: &TxJsonRpcMessage<Self>, ledger: &Ledger) {
        match item {
            JsonRpcMessage::Request(r) => {
                let asked = match &r.request {
                    ClientRequest::ListToolsRequest(_) => Asked::ToolsList,
                    ClientRequest::CallToolRequest(_) => Asked::ToolsCall,
                    _ => Asked::Other,
                };
                ledger.note(r.id.clone(), asked);
            }
            // A request given up: its late response, if any, is not ours to repair.
            JsonRpcMessage::Notification(n) => {
                if let rmcp::model::ClientNotification::CancelledNotification(c) = &n.notification
                    && let Some(id) = &c.params.request_id
                {
                    ledger.take(id);
                }
            }
            _ => {}
        }
    }

    fn read(text: &[u8], ledger: &Ledger) -> Read<Self> {
        match serde_json::from_slice::<ServerJsonRpcMessage>(text) {
            Ok(JsonRpcMessage::Response(response)) => {
                let asked = ledger.take(&response.id);
                // A result that decodes only as some other kind (rmcp's results are an untagged
                // union ending in a catch-all) is one that could not be read as what was asked.
                let expected = match (asked, &response.result) {
                    (Some(Asked::ToolsList), result) => {
                        matches!(result, ServerResult::ListToolsResult(_))
                    }
                    (Some(Asked::ToolsCall), result) => {
                        !matches!(result, ServerResult::CustomResult(_))
                    }
                    _ => true,
                };
                match asked {
                    Some(asked) if !expected => {
                        let id = response.id;
                        recovered(
                            text,
                            id,
                            asked,
                            "the result has an unexpected shape",
                            ledger,
                        )
                    }
                    _ => Read::Deliver(JsonRpcMessage::Response(response)),
                }
            }
            Ok(JsonRpcMessage::Error(error)) => {
                if let Some(id) = &error.id {
                    ledger.take(id);
                }
                Read::Deliver(JsonRpcMessage::Error(error))
            }
            Ok(JsonRpcMessage::Request(r))
                if matches!(&r.request, ServerRequest::CustomRequest(c)
                    if Self::SERVES.contains(&c.method.as_str())) =>
            {
                answer(
                    ErrorCode::INVALID_PARAMS,
                    Some(r.id),
                    "invalid params".into(),
                )
            }
            Ok(message) => Read::Deliver(message),
            Err(e) => {
                let seen = outline(text);
                let ours = seen.method.is_none().then_some(seen.id).flatten();
                match ours.and_then(|id| ledger.take(&id).map(|asked| (id, asked))) {
                    Some((id, asked)) => recovered(text, id, asked, &cause(&e), ledger),
                    None => refuse(text, &e),
                }
            }
        }
    }

    fn oversized(len: u64, seen: Outline, ledger: &Ledger) -> Read<Self> {
        if seen.method.is_none()
            && let Some(id) = seen.id.clone()
            && ledger.take(&id).is_some()
        {
            let cause = format!(
                "the response is {len} bytes, over the {} limit of a message",
                human_bytes(MAX_MESSAGE as u64)
            );
            return Read::Deliver(JsonRpcMessage::error(unreadable(cause), Some(id)));
        }
        oversized_request(len, seen)
    }
}

/// The response to our request `id` whose line `text` did not decode (`why`): what can be kept
/// of a `tools/list` page or a `tools/call` result, else an [`unreadable`] error naming the cause.
fn recovered(
    text: &[u8],
    id: RequestId,
    asked: Asked,
    why: &str,
    ledger: &Ledger,
) -> Read<RoleClient> {
    let result = match asked {
        Asked::ToolsList => recover::tools_page(text).map(|(page, unread)| {
            if !unread.is_empty() {
                ledger.unread.extend(unread);
            }
            ServerResult::ListToolsResult(page)
        }),
        Asked::ToolsCall => recover::call_result(text).map(ServerResult::CallToolResult),
        Asked::Other => Err(why.to_string()),
    };
    Read::Deliver(match result {
        Ok(result) => JsonRpcMessage::response(result, id),
        Err(cause) => JsonRpcMessage::error(unreadable(cause), Some(id)),
    })
}
