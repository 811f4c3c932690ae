//! [`App`]: the shared state every HTTP handler sees, and the small request helpers the route
//! handlers and the dispatch handler share (query parameters, the session id in the path, a
//! bounded body, a JSON answer).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::auth::Auth;
use super::errors::ApiError;
use super::sessions::SessionTable;
use crate::engine::Engine;
use crate::metrics::HttpMetrics;

/// What every handler sees.
#[derive(Debug)]
pub struct App {
    /// The engine every session dispatches through.
    pub engine: Engine,
    /// The open sessions.
    pub sessions: Arc<SessionTable>,
    /// How `/v1` requests are authenticated.
    pub auth: Auth,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// One permit per turn running (a session runs one at a time); none left → `overloaded`.
    pub requests: Arc<Semaphore>,
    /// How long a request's body may take to arrive (`request_timeout` beyond).
    pub read_timeout: std::time::Duration,
    /// Cancelled when the server starts shutting down: new work is refused `shutting_down`.
    pub stopping: CancellationToken,
    /// The Prometheus recorder's handle, if one is installed (`/metrics`).
    pub prometheus: Option<crate::exporter::MetricsHandle>,
    /// Request counters and latency.
    pub http_metrics: HttpMetrics,
    /// Approvals waiting for a client's answer (the policy's approver).
    pub approvals: crate::policy::Approvals,
    /// Cluster mode: this node's link to the cluster.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Set by `POST /v1/admin/drain` or shutdown: no new session is placed here.
    pub draining: std::sync::atomic::AtomicBool,
}

impl App {
    /// Places no new sessions here from now on.
    pub fn drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(cluster) = &self.cluster {
            cluster.drain();
        }
    }

    /// `shutting_down` for a new session once the node is draining.
    pub fn refuse_if_draining(&self) -> Result<(), ApiError> {
        if self.draining.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ApiError::ShuttingDown);
        }
        Ok(())
    }

    /// This node's load, for its cluster heartbeat.
    pub fn cluster_load(&self) -> crate::cluster::Load {
        let (sessions, full) = self.sessions.load();
        crate::cluster::Load {
            sessions,
            in_flight: self.engine.turns_in_flight(),
            full,
        }
    }

    /// `shutting_down` once the server is stopping.
    pub fn refuse_if_stopping(&self) -> Result<(), ApiError> {
        if self.stopping.is_cancelled() {
            return Err(ApiError::ShuttingDown);
        }
        Ok(())
    }

    /// Reads a request's body: at most `--max-body` bytes (`payload_too_large`), all of it within
    /// `--read-timeout` (`request_timeout`), so a stalled upload holds its request for a bounded
    /// time.
    pub async fn read_body(
        &self,
        headers: &axum::http::HeaderMap,
        body: Body,
    ) -> Result<String, ApiError> {
        tokio::time::timeout(self.read_timeout, read_body(headers, body, self.max_body))
            .await
            .map_err(|_| ApiError::RequestTimeout(self.read_timeout))?
    }
}

/// The value of query parameter `key` (the first one), if present.
pub fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// The `{id}` of a session route; an id that does not decode (not UTF-8) is `bad_request`.
pub fn session_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(id)| id)
        .map_err(|e| ApiError::BadRequest(format!("bad session id in the path: {e}")))
}

/// Reads a body of at most `limit` bytes as UTF-8 text (`payload_too_large` beyond).
pub async fn read_body(
    headers: &axum::http::HeaderMap,
    body: Body,
    limit: usize,
) -> Result<String, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    let mut bytes = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::BadRequest(format!("cannot read the body: {e}")))?;
        if bytes.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not UTF-8: {e}")))
}

/// A `200`/`201` JSON answer.
pub fn json_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}
