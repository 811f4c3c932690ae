//! The error answers of the HTTP API: one JSON shape, `{"error": {"code", "message"}}`, with a
//! stable snake_case code and a fitting status.
//!
//! Every failure a client or a model can cause is one of these with a 4xx status (or 503 when
//! the server refuses work it could do later); a tool failure is never an HTTP error, it stays
//! a result inside a 200. Only a fault of the server itself (a workspace directory it cannot
//! create, an engine gone) is `internal` 500.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Seconds a client is told to wait (`Retry-After`) after `overloaded`.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// Seconds a client is told to wait (`Retry-After`) before naming again a session kept in the
/// journal that the full table cannot reopen yet: a place frees when a session is deleted or
/// closed as idle, seldom within a second.
pub const KEPT_RETRY_AFTER_SECONDS: u64 = 5;

/// Seconds a client is told to wait (`Retry-After`) when the cluster's NATS servers cannot
/// serve a request (no quorum, a stream or bucket without a leader): an election takes a few
/// seconds.
pub const CLUSTER_RETRY_AFTER_SECONDS: u64 = 2;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// No bearer token, or the wrong one (401).
    Unauthorized,
    /// No session of this id: never created, deleted, or closed after being idle (404).
    UnknownSession(String),
    /// No pending approval of this id in the session (404).
    UnknownApproval(String),
    /// No client call of this id in the session (404).
    UnknownCall(String),
    /// The client answered this call already (409).
    AlreadyAnswered(String),
    /// The engine answered this call itself (deadline passed, cancelled) (409): id and how.
    CallClosed(String, &'static str),
    /// Not JSON, not an accepted shape, a bad workspace name or query parameter (400).
    BadRequest(String),
    /// The body is bigger than `--max-body` (413).
    PayloadTooLarge(usize),
    /// As many sessions are open as the server allows (429): the number, and what set it
    /// (`--max-sessions`, or the open-file limit).
    TooManySessions(usize, &'static str),
    /// A session kept in the journal that could not be reopened after a restart is named while
    /// the table is full (429 `too_many_sessions` with `Retry-After`): its id, the number of
    /// sessions open, and what set it. It stays kept and is reopened when a place frees.
    SessionKept(String, usize, &'static str),
    /// Too many turns running across sessions; nothing ran (503 with `Retry-After`).
    Overloaded,
    /// This session has as many turns running or waiting as one session may have
    /// (`--max-session-turns`); nothing ran (503 `overloaded` with `Retry-After`).
    SessionBusy(usize),
    /// The request's body did not arrive within `--read-timeout` (408).
    RequestTimeout(std::time::Duration),
    /// The server is stopping (503).
    ShuttingDown,
    /// No such route (404).
    NotFound,
    /// The route exists, not with this method (405).
    MethodNotAllowed,
    /// Cluster mode: another node took the session over while this node worked on the request
    /// (503 with `Retry-After`; a node re-routes such a request itself where it can).
    SessionMoved(String),
    /// Cluster mode: the node owning the session did not answer (503 with `Retry-After`: its
    /// lease expires within the TTL, then another node takes the session over).
    NodeUnreachable(String, u64),
    /// Cluster mode: the NATS servers could not serve what the request needs (no quorum, no
    /// leader for a moment, none reachable) within a bounded wait; nothing ran (503 with
    /// `Retry-After`).
    ClusterUnavailable(String),
    /// A fault of the server itself, never of the request (500).
    Internal(String),
}

/// Marks a response as `session_moved` (its request may be routed again).
#[derive(Debug, Clone, Copy)]
pub struct Moved;

/// Why a bearer token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenProblem {
    /// Empty (or only white space).
    #[error("the token is empty")]
    Empty,
    /// Holds a character that is not printable ASCII, or a space.
    #[error("the token must be printable ASCII without spaces")]
    NotPrintable,
}

/// Why the sidecar could not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The bearer token is not usable.
    #[error(transparent)]
    Auth(#[from] TokenProblem),
    /// The workspace root cannot be created or resolved.
    #[error("cannot {action} the workspace root {}: {source}", path.display())]
    WorkspaceRoot {
        /// `create` or `resolve`.
        action: &'static str,
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The permission policy is refused (a bad rule, an unreadable file).
    #[error(transparent)]
    Policy(#[from] crate::command::PolicyFlagsError),
    /// Cluster mode cannot start (NATS unreachable, no JetStream, a node id in use).
    #[error("cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The engine cannot be built (for example, its sandbox cannot be enforced here).
    #[error(transparent)]
    Engine(#[from] crate::registry::RegistryError),
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The server stopped on an error of its own.
    #[error("the server stopped: {0}")]
    Stopped(#[source] tokio::task::JoinError),
}

impl From<crate::engine::EngineError> for ApiError {
    /// An engine fault: `shutting_down` when the engine is shut down, else a fault of the server.
    fn from(e: crate::engine::EngineError) -> Self {
        match e {
            crate::engine::EngineError::ShutDown => ApiError::ShuttingDown,
            crate::engine::EngineError::Moved(id) => ApiError::SessionMoved(id),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl ApiError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::UnknownSession(_) => "unknown_session",
            ApiError::UnknownApproval(_) => "unknown_approval",
            ApiError::UnknownCall(_) => "unknown_call",
            ApiError::AlreadyAnswered(_) => "already_answered",
            ApiError::CallClosed(..) => "call_closed",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::TooManySessions(..) | ApiError::SessionKept(..) => "too_many_sessions",
            ApiError::Overloaded | ApiError::SessionBusy(_) => "overloaded",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::SessionMoved(_) => "session_moved",
            ApiError::NodeUnreachable(..) => "node_unreachable",
            ApiError::ClusterUnavailable(_) => "cluster_unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::UnknownSession(_)
            | ApiError::UnknownApproval(_)
            | ApiError::UnknownCall(_)
            | ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::AlreadyAnswered(_) | ApiError::CallClosed(..) => StatusCode::CONFLICT,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::TooManySessions(..) | ApiError::SessionKept(..) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Overloaded
            | ApiError::SessionBusy(_)
            | ApiError::ShuttingDown
            | ApiError::SessionMoved(_)
            | ApiError::NodeUnreachable(..)
            | ApiError::ClusterUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The human-readable message.
    pub fn message(&self) -> String {
        match self {
            ApiError::Unauthorized => {
                "missing or wrong bearer token (send `Authorization: Bearer <token>`)".into()
            }
            ApiError::UnknownSession(id) => {
                format!("no session `{id}` (never created, deleted, or closed after being idle)")
            }
            ApiError::UnknownApproval(id) => format!(
                "no approval `{id}` is waiting in this session (answered already, timed out, or never asked)"
            ),
            ApiError::UnknownCall(id) => format!("no client call `{id}` in this session"),
            ApiError::AlreadyAnswered(id) => {
                format!("call `{id}` was answered already; its first answer stands")
            }
            ApiError::CallClosed(id, how) => {
                format!("call `{id}` can no longer be answered: {how}")
            }
            ApiError::BadRequest(m) | ApiError::Internal(m) => m.clone(),
            ApiError::PayloadTooLarge(limit) => {
                format!("the request body is larger than {limit} bytes (--max-body)")
            }
            ApiError::TooManySessions(max, by) => {
                format!("{max} sessions are open already ({by}); delete one first")
            }
            ApiError::SessionKept(id, max, by) => format!(
                "session `{id}` is kept in the journal but not open: {max} sessions are open already ({by}); it is reopened when a request names it and a place is free (retry in {KEPT_RETRY_AFTER_SECONDS} s, or delete another session); nothing ran"
            ),
            ApiError::Overloaded => format!(
                "too many turns running (--max-requests); nothing ran, retry in {RETRY_AFTER_SECONDS} s"
            ),
            ApiError::SessionBusy(max) => format!(
                "this session has {max} turns running or waiting already (--max-session-turns); nothing ran, retry in {RETRY_AFTER_SECONDS} s"
            ),
            ApiError::RequestTimeout(limit) => format!(
                "the request body did not arrive within {} s (--read-timeout)",
                limit.as_secs_f64()
            ),
            ApiError::ShuttingDown => "the server is shutting down".into(),
            ApiError::SessionMoved(id) => format!(
                "session `{id}` moved to another node while this request ran here; retry it (with the same turn id, calls that ran are answered from the journal)"
            ),
            ApiError::NodeUnreachable(detail, after) => format!(
                "the node owning this session does not answer ({detail}); retry in {after} s, when its lease has expired and another node takes the session over"
            ),
            ApiError::ClusterUnavailable(detail) => format!(
                "the cluster's NATS servers cannot serve this request now ({detail}); nothing ran, retry in {CLUSTER_RETRY_AFTER_SECONDS} s"
            ),
            ApiError::NotFound => "no such route (see GET /v1/openapi.json)".into(),
            ApiError::MethodNotAllowed => "this route does not take that method".into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code(), "message": self.message()}}).to_string();
        let mut response = (
            self.status(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response();
        let headers = response.headers_mut();
        match self {
            ApiError::Overloaded | ApiError::SessionBusy(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
            }
            ApiError::SessionKept(..) => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(KEPT_RETRY_AFTER_SECONDS),
                );
            }
            ApiError::SessionMoved(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
                response.extensions_mut().insert(Moved);
            }
            ApiError::NodeUnreachable(_, after) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(after));
            }
            ApiError::ClusterUnavailable(_) => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(CLUSTER_RETRY_AFTER_SECONDS),
                );
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_server_faults_are_500() {
        let client_caused = [
            ApiError::Unauthorized,
            ApiError::UnknownSession("x".into()),
            ApiError::UnknownApproval("a1".into()),
            ApiError::UnknownCall("c1".into()),
            ApiError::AlreadyAnswered("c1".into()),
            ApiError::CallClosed("c1".into(), "late"),
            ApiError::BadRequest("x".into()),
            ApiError::PayloadTooLarge(1),
            ApiError::TooManySessions(1, "--max-sessions"),
            ApiError::SessionKept("s1".into(), 1, "--max-sessions"),
            ApiError::Overloaded,
            ApiError::SessionBusy(1),
            ApiError::RequestTimeout(std::time::Duration::from_secs(1)),
            ApiError::ShuttingDown,
            ApiError::NotFound,
            ApiError::MethodNotAllowed,
            ApiError::SessionMoved("s1".into()),
            ApiError::NodeUnreachable("silent".into(), 10),
            ApiError::ClusterUnavailable("no quorum".into()),
        ];
        for e in client_caused {
            assert!(
                !e.status().is_server_error() || e.status() == StatusCode::SERVICE_UNAVAILABLE,
                "{e:?}"
            );
        }
        assert_eq!(ApiError::Internal("x".into()).status(), 500);
    }

    #[test]
    fn a_kept_session_is_too_many_sessions_with_when_to_retry() {
        let e = ApiError::SessionKept("s1".into(), 4, "--max-sessions");
        assert_eq!(e.code(), "too_many_sessions");
        let text = e.message();
        assert!(
            text.contains("s1") && text.contains("kept") && text.contains("reopened"),
            "{text}"
        );
        let r = e.into_response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
    }

    #[test]
    fn nats_trouble_is_a_retryable_503() {
        let e = ApiError::ClusterUnavailable("no stream leader".into());
        assert_eq!(e.code(), "cluster_unavailable");
        assert!(e.message().contains("no stream leader"), "{}", e.message());
        let r = e.into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn overloaded_says_when_to_retry() {
        for e in [ApiError::Overloaded, ApiError::SessionBusy(4)] {
            assert_eq!(e.code(), "overloaded");
            let r = e.into_response();
            assert_eq!(r.status(), 503);
            assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        }
    }
}
