//! `POST /v1/sessions/{id}/dispatch`: one turn of a session, answered with exactly what
//! `switchboard dispatch` prints for the same document, or streamed as Server-Sent Events (with
//! the calls' live progress unless `progress=false`). Also what a client sends about its
//! client-tool calls: their answers and progress reports (`…/calls/{call_id}[/progress]`).
//!
//! The turn runs on a task of its own, which holds everything the turn needs (its request
//! permit, its place in the session's turn order, the session itself) until the engine has
//! answered every call. A client that disconnects — mid-stream or while waiting for the answer
//! — drops only its view of the turn: the turn still completes (or is cancelled by `cancel`),
//! its permit and lock are released, and no other session is touched. Its client-tool calls
//! waiting for an answer are answered `cancelled` at once (nobody is left to answer them).
//!
//! Order of checks, so that a refused request has run nothing: shutting down → session known
//! (one kept in the journal but not open is reopened here, or refused and kept) →
//! a place in the session's share (`overloaded`, 503 with `Retry-After`, when the session has
//! `--max-session-turns` turns running or waiting already) → the turn id
//! (registered now, with the turn's cancellation token, so a turn-addressed or session cancel
//! reaches it while it waits, and a cancel that came first cancels it here) → body size and
//! encoding → decode (`bad_request`; also for a client-tool call in a turn that is not streamed)
//! → the session's turn lock → one of the server's places for running turns (`overloaded` when
//! `--max-requests` turns run already) → dispatch. Every answer names its turn in
//! `Switchboard-Turn-Id`. A turn accepted before shutdown began is answered call by call, each
//! call `cancelled` if the engine stopped before it ran.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt as _;
use tokio::sync::mpsc;

use super::app::{App, json_response, query_param, session_id};
use super::errors::ApiError;
use super::sse;
use crate::document::{DocumentError, decode_document, encode_document};
use crate::protocol::WireFormat;
use crate::tool::ProgressSink;

/// The header naming a turn (request and response).
pub const TURN_ID_HEADER: HeaderName = HeaderName::from_static("switchboard-turn-id");

/// What the query string and headers ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ask {
    format: WireFormat,
    stream: bool,
    /// A streamed turn carries its calls' live progress (`event: progress`) unless
    /// `progress=false`.
    progress: bool,
}

fn ask(query: Option<&str>, headers: &HeaderMap) -> Result<Ask, ApiError> {
    let format = match query_param(query, "format") {
        None | Some("anthropic") => WireFormat::Anthropic,
        Some("openai") => WireFormat::OpenAi,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "format must be anthropic or openai, not `{other}`"
            )));
        }
    };
    let by_query = match query_param(query, "stream") {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") | Some("") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "stream must be true or false, not `{other}`"
            )));
        }
    };
    let by_accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"));
    let progress = match query_param(query, "progress") {
        None | Some("true") | Some("1") | Some("") => true,
        Some("false") | Some("0") => false,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "progress must be true or false, not `{other}`"
            )));
        }
    };
    Ok(Ask {
        format,
        stream: by_query || by_accept,
        progress,
    })
}

/// The client's turn id (`turn_id=` or `Switchboard-Turn-Id`), if it sent one.
fn client_turn_id(query: Option<&str>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let by_header = match headers.get(&TURN_ID_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::BadRequest("the Switchboard-Turn-Id header is not printable text".into())
        })?),
    };
    let id = match (query_param(query, "turn_id"), by_header) {
        (Some(q), Some(h)) if q != h => {
            return Err(ApiError::BadRequest(format!(
                "turn_id={q} and Switchboard-Turn-Id: {h} disagree; send one"
            )));
        }
        (Some(id), _) | (None, Some(id)) => id,
        (None, None) => return Ok(None),
    };
    super::turns::check_turn_id(id)?;
    Ok(Some(id.to_string()))
}

/// The handler: the turn's answer (or refusal), naming the turn in `Switchboard-Turn-Id` once
/// its id is known.
pub async fn dispatch(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut turn_id = None;
    let mut body_read = false;
    let answer = run(
        &app,
        id,
        query.as_deref(),
        &headers,
        body,
        &mut turn_id,
        &mut body_read,
    )
    .await;
    let refused_unread = answer.is_err() && !body_read && has_body(&headers);
    let mut response = answer.unwrap_or_else(IntoResponse::into_response);
    if let Some(value) = turn_id.and_then(|t| HeaderValue::from_str(&t).ok()) {
        response.headers_mut().insert(TURN_ID_HEADER, value);
    }
    if refused_unread {
        // The connection cannot carry another request past a body nobody read: say so, so the
        // client opens a new one instead of finding this one reset.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Whether the request announced a body.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

async fn run(
    app: &Arc<App>,
    id: Result<Path<String>, PathRejection>,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
    turn_id: &mut Option<Arc<str>>,
    body_read: &mut bool,
) -> Result<Response, ApiError> {
    app.refuse_if_stopping()?;
    let id = session_id(id)?;
    let ask = ask(query, headers)?;
    let chosen = client_turn_id(query, headers)?;
    if let Some(dir) = app.sessions.lost(&id) {
        return lost(app, &id, &dir, ask, headers, body, body_read).await;
    }
    // A session kept in the journal but not open (after a restart) is reopened first.
    app.sessions.wake(&id).await?;
    let session = app.sessions.enter(&id)?;
    let share = session.admit()?;
    let chosen_turn: Option<Arc<str>> = chosen.map(Arc::from);
    let turn: Arc<str> = chosen_turn
        .clone()
        .unwrap_or_else(|| Arc::from(app.sessions.new_turn_id()));
    *turn_id = Some(Arc::clone(&turn));
    let cancel = session.turn_token();
    let mut registered = session.turn_ids().arrive(turn, cancel.clone())?;
    let text = app.read_body(headers, body).await;
    *body_read = text.is_ok();
    let text = text?;
    let mut calls = decode_document(ask.format, &text)
        .map_err(|reason| ApiError::BadRequest(reason.to_string()))?;
    // A turn id the client named is part of each call's identity: a retry re-sends it, and a
    // new turn reusing an old tool_use_id is a new call (one the server made names nothing).
    if let Some(named) = chosen_turn {
        for call in &mut calls {
            call.turn = Some(Arc::clone(&named));
        }
    }
    if !ask.stream
        && let Some(call) = calls
            .iter()
            .find(|c| session.session().has_own_tool(&c.name))
    {
        return Err(ApiError::BadRequest(format!(
            "`{}` is a client tool, which the client runs: dispatch with stream=true (or Accept: text/event-stream) and answer its `call` event",
            call.name
        )));
    }
    let place = session.turn_lock().lock_owned().await;
    // Only a running turn holds one of the server's places: turns waiting behind their own
    // session's running turn hold that session's share alone, so a session flooded with turns
    // keeps no other session from being served.
    let permit = Arc::clone(&app.requests)
        .try_acquire_owned()
        .map_err(|_| ApiError::Overloaded)?;
    registered.running();

    let (sink, results) = if ask.stream {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    // A streamed turn's calls report their live progress to it (`event: progress`).
    let (listener, progress) = if ask.stream && ask.progress {
        let (listener, events) = ProgressSink::channel(ProgressSink::DEFAULT_CAPACITY);
        (Some(listener), Some(events))
    } else {
        (None, None)
    };
    // A streamed turn carries its approval requests (`approval_required` events) and its
    // client-tool calls (`call` events); a turn without a stream has nobody to ask, and its
    // `ask` calls are refused.
    let engine_id = session.session().id().to_string();
    let approvals = ask.stream.then(|| app.approvals.subscribe(&engine_id));
    let delegated = match (ask.stream, session.delegate()) {
        (true, Some(delegate)) => Some(delegate.attach()),
        _ => None,
    };
    let unsubscribe = (app.approvals.clone(), engine_id);
    let format = ask.format;
    let table = Arc::clone(&app.sessions);
    let turn = async move {
        let _held = (permit, place, registered, share);
        let _unsubscribe = Unsubscribe(unsubscribe);
        session.count_turn(calls.len());
        let engine_session = session.session();
        let names: Vec<_> = calls
            .iter()
            .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name)))
            .collect();
        let results = match (sink, listener) {
            (sink, Some(listener)) => {
                engine_session
                    .dispatch_with_progress(calls, cancel, sink, listener)
                    .await
            }
            (Some(sink), None) => engine_session.dispatch_streaming(calls, cancel, sink).await,
            (None, None) => engine_session.dispatch_with_cancel(calls, cancel).await,
        };
        // The turn was accepted before the server began to stop: it is answered call by call
        // even when the engine stopped before the turn reached it (it waited behind its
        // session's running turn), each call `cancelled` as it never ran.
        let results = match results {
            Err(crate::engine::EngineError::ShutDown) => {
                crate::protocol::ToolDispatchResult::all_failed(
                    names,
                    crate::protocol::ErrorCode::Cancelled,
                    "the server shut down before this call ran",
                )
            }
            other => other?,
        };
        table.persist_revealed(&session).await;
        encode_document(format, &results)
    };

    if ask.stream {
        let task = tokio::spawn(turn);
        let results = results.unwrap_or_else(|| mpsc::unbounded_channel().1);
        return Ok(sse::stream(
            ask.format, results, progress, approvals, delegated, task,
        ));
    }
    // Not streamed: the turn runs on this request's task — no task of its own to spawn and a
    // worker to wake for it — and moves to a task of its own only if the request is dropped
    // first (its client went away): an accepted turn always runs to its end.
    match FinishOnDrop::new(AssertUnwindSafe(turn).catch_unwind()).await {
        Ok(Ok(answer)) => Ok(json_response(StatusCode::OK, answer)),
        Ok(Err(DocumentError::Engine(e))) => Err(ApiError::from(e)),
        Ok(Err(reason)) => Err(ApiError::BadRequest(reason.to_string())),
        Err(_) => Err(ApiError::Internal(
            "the turn's task failed: it panicked".into(),
        )),
    }
}

/// A future that, dropped before it is done, is finished on a task of its own (on the runtime
/// it was dropped in; none when the runtime itself is going away).
struct FinishOnDrop<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future + Send + 'static> FinishOnDrop<F> {
    fn new(future: F) -> Self {
        FinishOnDrop(Some(Box::pin(future)))
    }
}

impl<F: Future + Send + 'static> Future for FinishOnDrop<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(future) = self.0.as_mut() else {
            // Polled again after it finished: nothing more will come.
            return Poll::Pending;
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for FinishOnDrop<F> {
    fn drop(&mut self) {
        if let Some(future) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = future.await;
            });
        }
    }
}

/// A turn of a session taken over by a node that lacks its workspace directory (cluster mode,
/// no shared workspace root): every call is answered `workspace_lost`, nothing runs.
async fn lost(
    app: &Arc<App>,
    id: &str,
    dir: &std::path::Path,
    ask: Ask,
    headers: &HeaderMap,
    body: Body,
    body_read: &mut bool,
) -> Result<Response, ApiError> {
    let text = app.read_body(headers, body).await;
    *body_read = text.is_ok();
    let calls = decode_document(ask.format, &text?)
        .map_err(|reason| ApiError::BadRequest(reason.to_string()))?;
    let node = app.cluster.as_ref().map_or("", |c| c.node());
    let detail = format!(
        "session {id} moved to node {node}, where its workspace {} does not exist: cluster failover needs a workspace root that every node mounts; nothing ran",
        dir.display()
    );
    let results = crate::protocol::ToolDispatchResult::all_failed(
        calls
            .iter()
            .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name))),
        crate::protocol::ErrorCode::WorkspaceLost,
        &detail,
    );
    let answer = encode_document(ask.format, &results);
    if !ask.stream {
        return match answer {
            Ok(answer) => Ok(json_response(StatusCode::OK, answer)),
            Err(reason) => Err(ApiError::BadRequest(reason.to_string())),
        };
    }
    let (tx, rx) = mpsc::unbounded_channel();
    for (i, result) in results.into_iter().enumerate() {
        let _ = tx.send((i, result));
    }
    let task = tokio::spawn(async move { answer });
    Ok(sse::stream(ask.format, rx, None, None, None, task))
}

/// Stops routing the session's approval requests to this turn's stream when the turn ends.
struct Unsubscribe((crate::policy::Approvals, String));

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let (approvals, id) = &self.0;
        approvals.unsubscribe(id);
    }
}

/// `POST /v1/sessions/{id}/approvals/{approval_id}` with `{"allow": bool}`: answers an approval
/// request of the session's turn in flight. `404 unknown_approval` when there is none of that id
/// (answered already, timed out, or another session's).
pub async fn approve(
    State(app): State<Arc<App>>,
    ids: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path((id, approval_id)) =
        ids.map_err(|e| ApiError::BadRequest(format!("bad ids in the path: {e}")))?;
    let session = app.sessions.open(&id).await?;
    let text = app.read_body(&headers, body).await?;
    let allow = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("allow").and_then(serde_json::Value::as_bool))
        .ok_or_else(|| ApiError::BadRequest("the body must be {\"allow\": true|false}".into()))?;
    if !app
        .approvals
        .answer(session.session().id(), &approval_id, allow)
    {
        return Err(ApiError::UnknownApproval(approval_id));
    }
    let body = serde_json::json!({"approval_id": approval_id, "allow": allow}).to_string();
    Ok(json_response(StatusCode::OK, body))
}

/// `POST /v1/sessions/{id}/calls/{call_id}` with `{"content": string or blocks, "is_error":
/// bool}`: the client's answer to a client-tool call of the session's turn in flight. `409
/// already_answered` for a second answer, `409 call_closed` when the engine answered the call
/// itself first (its deadline passed, or it was cancelled), `404 unknown_call` otherwise.
pub async fn answer_call(
    State(app): State<Arc<App>>,
    ids: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let parse = super::client_tools::parse_answer;
    to_call(
        &app,
        ids,
        &headers,
        body,
        parse,
        |delegate, call_id, outcome| delegate.answer(call_id, outcome),
    )
    .await
}

/// `POST /v1/sessions/{id}/calls/{call_id}/progress` with `{"text", "stream"}` or
/// `{"progress", "total", "message"}`: the client's progress report of a client-tool call it is
/// running, to the turn's stream as `event: progress`. The same refusals as an answer once the
/// call is no longer waiting.
pub async fn call_progress(
    State(app): State<Arc<App>>,
    ids: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let parse = super::client_tools::parse_progress;
    to_call(
        &app,
        ids,
        &headers,
        body,
        parse,
        |delegate, call_id, report| delegate.progress(call_id, report),
    )
    .await
}

/// What a client sends about one of its calls (`…/calls/{call_id}` and below): the body read
/// with `parse` (a malformed one is `400`, whatever the call's state), `act` applied to the
/// session's client tools, then `200 {"call_id", "accepted": true}` or the refusal as its error.
async fn to_call<T>(
    app: &App,
    ids: Result<Path<(String, String)>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
    parse: fn(&str) -> Result<T, ApiError>,
    act: impl FnOnce(
        &super::client_tools::Delegate,
        &str,
        T,
    ) -> Result<(), super::client_tools::Refused>,
) -> Result<Response, ApiError> {
    use super::client_tools::Refused;
    let Path((id, call_id)) =
        ids.map_err(|e| ApiError::BadRequest(format!("bad ids in the path: {e}")))?;
    let session = app.sessions.open(&id).await?;
    let text = app.read_body(headers, body).await?;
    let what = parse(&text)?;
    let done = match session.delegate() {
        Some(delegate) => act(delegate, &call_id, what),
        None => Err(Refused::Unknown),
    };
    match done {
        Ok(()) => {
            let body = serde_json::json!({"call_id": call_id, "accepted": true}).to_string();
            Ok(json_response(StatusCode::OK, body))
        }
        Err(Refused::AlreadyAnswered) => Err(ApiError::AlreadyAnswered(call_id)),
        Err(Refused::Closed(how)) => Err(ApiError::CallClosed(call_id, how)),
        Err(Refused::Unknown) => Err(ApiError::UnknownCall(call_id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_is_asked_by_query_or_accept() {
        let none = HeaderMap::new();
        let mut sse = HeaderMap::new();
        sse.insert(header::ACCEPT, "text/event-stream".parse().unwrap());
        assert!(!ask(None, &none).unwrap().stream);
        assert!(ask(Some("stream=true"), &none).unwrap().stream);
        assert!(ask(None, &sse).unwrap().stream);
        assert_eq!(
            ask(Some("format=openai"), &none).unwrap().format,
            WireFormat::OpenAi
        );
        assert!(ask(Some("format=xml"), &none).is_err());
        assert!(ask(Some("stream=maybe"), &none).is_err());
    }

    #[test]
    fn turn_ids_come_from_the_query_or_the_header() {
        let none = HeaderMap::new();
        let mut named = HeaderMap::new();
        named.insert(TURN_ID_HEADER, "t-7".parse().unwrap());
        assert_eq!(client_turn_id(None, &none).unwrap(), None);
        assert_eq!(
            client_turn_id(Some("turn_id=t-1"), &none)
                .unwrap()
                .as_deref(),
            Some("t-1")
        );
        assert_eq!(
            client_turn_id(None, &named).unwrap().as_deref(),
            Some("t-7")
        );
        assert!(client_turn_id(Some("turn_id=t-1"), &named).is_err());
        assert!(client_turn_id(Some("turn_id=a%20b"), &none).is_err());
    }
}
