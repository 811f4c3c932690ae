//! `POST /v1/sessions/{id}/dispatch`: one turn of a session, answered with exactly what
//! `switchboard dispatch` prints for the same document, or streamed as Server-Sent Events.
//!
//! The turn runs on a task of its own, which holds everything the turn needs (its request
//! permit, its place in the session's turn order, the session itself) until the engine has
//! answered every call. A client that disconnects — mid-stream or while waiting for the answer
//! — drops only its view of the turn: the turn still completes (or is cancelled by `cancel`),
//! its permit and lock are released, and no other session is touched.
//!
//! Order of checks, so that a refused request has run nothing: shutting down → session known →
//! a request permit (`overloaded`, 503 with `Retry-After`, when none is left) → body size and
//! encoding → the turn's cancellation token (taken on arrival, so `cancel` reaches turns still
//! waiting) → the session's turn lock → decode (`bad_request`) → dispatch.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use tokio::sync::{mpsc, oneshot};

use super::app::{App, json_response, query_param, read_body, session_id};
use super::errors::ApiError;
use super::sse;
use crate::document::{DocumentError, dispatch_document_with};
use crate::protocol::WireFormat;

/// What the query string and headers ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ask {
    format: WireFormat,
    stream: bool,
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
    Ok(Ask {
        format,
        stream: by_query || by_accept,
    })
}

/// The handler.
pub async fn dispatch(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    app.refuse_if_stopping()?;
    let id = session_id(id)?;
    let ask = ask(query.as_deref(), &headers)?;
    let session = app.sessions.enter(&id)?;
    let permit = Arc::clone(&app.requests)
        .try_acquire_owned()
        .map_err(|_| ApiError::Overloaded)?;
    let text = read_body(&headers, body, app.max_body).await?;
    let cancel = session.turn_token();
    let turn = session.turn_lock().lock_owned().await;

    let (started_tx, started_rx) = oneshot::channel::<()>();
    let (sink, results) = if ask.stream {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    // A streamed turn carries its approval requests (`approval_required` events); a turn
    // without a stream has nobody to ask, and its `ask` calls are refused.
    let engine_id = session.session().id().to_string();
    let approvals = ask.stream.then(|| app.approvals.subscribe(&engine_id));
    let unsubscribe = (app.approvals.clone(), engine_id);
    let task = tokio::spawn(async move {
        let _held = (permit, turn);
        let _unsubscribe = Unsubscribe(unsubscribe);
        let engine_session = session.session().clone();
        let counted = &session;
        dispatch_document_with(ask.format, &text, |calls| {
            let _ = started_tx.send(());
            counted.count_turn(calls.len());
            async move {
                match sink {
                    Some(sink) => engine_session.dispatch_streaming(calls, cancel, sink).await,
                    None => engine_session.dispatch_with_cancel(calls, cancel).await,
                }
            }
        })
        .await
    });

    if ask.stream && started_rx.await.is_ok() {
        let results = results.unwrap_or_else(|| mpsc::unbounded_channel().1);
        return Ok(sse::stream(ask.format, results, approvals, task));
    }
    match task.await {
        Ok(Ok(answer)) => Ok(json_response(StatusCode::OK, answer)),
        Ok(Err(DocumentError::Engine(e))) => Err(ApiError::from(e)),
        Ok(Err(reason)) => Err(ApiError::BadRequest(reason.to_string())),
        Err(e) => Err(ApiError::Internal(format!("the turn's task failed: {e}"))),
    }
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
    let session = app.sessions.get(&id)?;
    let text = read_body(&headers, body, app.max_body).await?;
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
}
