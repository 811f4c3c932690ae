//! The router: every route of the HTTP API in one table ([`route_table`]), the small handlers (sessions, tools, health, metrics, the OpenAPI
//! file) and the request-metrics layer. The dispatch handler lives in `dispatch.rs`.
//!
//! The router is built only from the table, and a test checks the table against
//! `openapi.json` both ways, so the description and the server cannot drift apart. Everything
//! under `/v1` passes the bearer-token check first ([`require_token`], with `auth.rs`'s [`super::Auth`]); `/healthz` and `/metrics` do not.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{MatchedPath, Path, RawQuery, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use serde_json::{Value, json};

use super::app::{App, json_response, query_param, session_id};
use super::dispatch;
use super::errors::ApiError;
use super::sessions::NewSession;
use crate::registry::CatalogFormat;

/// The OpenAPI 3.1 description, served as is at `GET /v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// One route: method, path template, whether it needs the token, and its handler.
pub struct RouteDef {
    /// HTTP method.
    pub method: Method,
    /// Path template (`{id}` for a path parameter, as in OpenAPI).
    pub path: &'static str,
    /// True for `/v1` routes (bearer token required).
    pub authenticated: bool,
    /// The handler.
    pub(crate) handler: MethodRouter<Arc<App>>,
}

/// Every route of the server.
pub fn route_table() -> Vec<RouteDef> {
    let v1 = |method, path, handler| RouteDef {
        method,
        path,
        authenticated: true,
        handler,
    };
    let open = |method, path, handler| RouteDef {
        method,
        path,
        authenticated: false,
        handler,
    };
    vec![
        v1(Method::POST, "/v1/sessions", post(create_session)),
        v1(Method::GET, "/v1/sessions/{id}", get(session_info)),
        v1(Method::DELETE, "/v1/sessions/{id}", delete(delete_session)),
        v1(
            Method::POST,
            "/v1/sessions/{id}/dispatch",
            post(dispatch::dispatch),
        ),
        v1(
            Method::POST,
            "/v1/sessions/{id}/cancel",
            post(cancel_session),
        ),
        v1(
            Method::POST,
            "/v1/sessions/{id}/approvals/{approval_id}",
            post(dispatch::approve),
        ),
        v1(
            Method::POST,
            "/v1/sessions/{id}/calls/{call_id}",
            post(dispatch::answer_call),
        ),
        v1(
            Method::POST,
            "/v1/sessions/{id}/calls/{call_id}/progress",
            post(dispatch::call_progress),
        ),
        v1(
            Method::POST,
            "/v1/sessions/{id}/turns/{turn_id}/cancel",
            post(cancel_turn),
        ),
        v1(Method::GET, "/v1/sessions/{id}/tools", get(session_tools)),
        v1(Method::GET, "/v1/tools", get(tools)),
        v1(Method::POST, "/v1/admin/drain", post(super::cluster::drain)),
        v1(Method::GET, "/v1/openapi.json", get(openapi)),
        open(Method::GET, "/healthz", get(healthz)),
        open(Method::GET, "/metrics", get(metrics)),
    ]
}

/// The route templates (the `route` label values of the HTTP metrics).
pub fn route_templates() -> Vec<&'static str> {
    let mut paths: Vec<_> = route_table().iter().map(|r| r.path).collect();
    paths.sort_unstable();
    paths.dedup();
    paths
}

/// The router over `app`.
pub fn router(app: Arc<App>) -> Router {
    let mut v1 = Router::new();
    let mut open = Router::new();
    for r in route_table() {
        if r.authenticated {
            v1 = v1.route(r.path, r.handler);
        } else {
            open = open.route(r.path, r.handler);
        }
    }
    // Layers run outside in: the token check first, then (cluster mode) routing to the node
    // owning the session.
    let v1 = v1
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            super::cluster::route,
        ))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            require_token,
        ));
    open.merge(v1)
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            record_request,
        ))
        .with_state(app)
}

/// Middleware of the `/v1` routes: `unauthorized` (401) unless the bearer token is right.
pub async fn require_token(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if app.auth.allows(header) {
        next.run(request).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

async fn record_request(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = app.http_metrics.route(
        request
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str),
    );
    let response = next.run(request).await;
    app.http_metrics
        .request(route, response.status().as_u16(), started.elapsed());
    response
}

async fn create_session(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    app.refuse_if_stopping()?;
    app.refuse_if_draining()?;
    let text = app.read_body(&headers, body).await?;
    let new = new_session(&text)?;
    let session = app.sessions.create(new).await?;
    let mut answer = json!({
        "session_id": session.id(),
        "workspace": session.workspace().to_string_lossy(),
        "tools": session.client_tool_names(),
    });
    if let Some(cluster) = &app.cluster {
        answer["node"] = json!(cluster.node());
    }
    Ok(json_response(StatusCode::CREATED, answer.to_string()))
}

/// The fields a create-session body may carry.
const SESSION_FIELDS: &str = "workspace, tools, sandbox, policy";

/// A create-session body: empty, or an object of `workspace` (a name), `tools` (client tool
/// definitions), `sandbox` (a narrower mode, or `{"mode", "allow_network"}`) and `policy` (the
/// name of a stricter policy the server offers).
fn new_session(text: &str) -> Result<NewSession, ApiError> {
    let mut new = NewSession::default();
    if text.trim().is_empty() {
        return Ok(new);
    }
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(fields) = doc else {
        return Err(ApiError::BadRequest(format!(
            "the body must be a JSON object of {SESSION_FIELDS}"
        )));
    };
    for (key, value) in fields {
        match (key.as_str(), value) {
            (_, Value::Null) => {}
            ("workspace", Value::String(s)) => new.workspace = Some(s),
            ("workspace", _) => {
                return Err(ApiError::BadRequest("`workspace` must be a string".into()));
            }
            ("tools", tools) => new.tools = Some(tools),
            ("policy", Value::String(name)) => new.policy = Some(name),
            ("policy", _) => {
                return Err(ApiError::BadRequest(
                    "`policy` must be the name of a session policy the server offers".into(),
                ));
            }
            ("sandbox", Value::String(mode)) => new.sandbox = Some(parse_mode(&mode)?),
            ("sandbox", Value::Object(o)) => {
                for (k, v) in o {
                    match (k.as_str(), v) {
                        ("mode", Value::String(mode)) => new.sandbox = Some(parse_mode(&mode)?),
                        ("allow_network", Value::Bool(b)) => new.allow_network = Some(b),
                        _ => {
                            return Err(ApiError::BadRequest(format!(
                                "`sandbox.{k}`: the sandbox object takes `mode` (a string) and `allow_network` (a bool)"
                            )));
                        }
                    }
                }
            }
            ("sandbox", _) => {
                return Err(ApiError::BadRequest(
                    "`sandbox` must be a mode or {\"mode\", \"allow_network\"}".into(),
                ));
            }
            (unknown, _) => {
                return Err(ApiError::BadRequest(format!(
                    "unknown field `{unknown}` (accepted: {SESSION_FIELDS})"
                )));
            }
        }
    }
    Ok(new)
}

fn parse_mode(mode: &str) -> Result<crate::sandbox::SandboxMode, ApiError> {
    mode.parse()
        .map_err(|e: crate::sandbox::SandboxError| ApiError::BadRequest(format!("`sandbox`: {e}")))
}

/// `GET /v1/sessions/{id}/tools?format=…`: the session's catalog (the server's tools, then its
/// client tools).
async fn session_tools(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = session_id(id)?;
    let format = catalog_format(query.as_deref())?;
    let session = app.sessions.open(&id).await?;
    let catalog = session
        .session()
        .catalog(format)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(json_response(
        StatusCode::OK,
        Value::Array(catalog).to_string(),
    ))
}

/// `POST /v1/sessions/{id}/turns/{turn_id}/cancel`: cancels that turn, wherever it is.
async fn cancel_turn(
    State(app): State<Arc<App>>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, turn_id)) =
        ids.map_err(|e| ApiError::BadRequest(format!("bad ids in the path: {e}")))?;
    super::turns::check_turn_id(&turn_id)?;
    let session = app.sessions.open(&id).await?;
    let found = session.turn_ids().cancel(&turn_id);
    let body = json!({"turn_id": turn_id, "state": found.as_str()});
    Ok(json_response(StatusCode::OK, body.to_string()))
}

async fn session_info(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(id)?;
    let session = app.sessions.open(&id).await?;
    let mut info = session.info();
    if let Some(cluster) = &app.cluster {
        info["node"] = serde_json::json!(cluster.node());
    }
    Ok(json_response(StatusCode::OK, info.to_string()))
}

async fn cancel_session(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(id)?;
    let session = app.sessions.open(&id).await?;
    session.cancel_turns();
    Ok(json_response(StatusCode::OK, session.info().to_string()))
}

async fn delete_session(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(id)?;
    if let Some(dir) = app.sessions.forget_lost(&id) {
        // A session taken over without its workspace: closed for good all the same.
        let info =
            json!({"session_id": id, "workspace": dir.to_string_lossy(), "workspace_lost": true});
        return Ok(json_response(StatusCode::OK, info.to_string()));
    }
    // A session kept in the journal but not open (after a restart): forgotten all the same.
    if let Some(info) = app.sessions.remove_dormant(&id).await? {
        return Ok(json_response(StatusCode::OK, info.to_string()));
    }
    let session = app.sessions.remove(&id)?;
    Ok(json_response(StatusCode::OK, session.info().to_string()))
}

async fn tools(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let format = catalog_format(query.as_deref())?;
    let catalog = app
        .engine
        .catalog(format)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(json_response(
        StatusCode::OK,
        Value::Array(catalog).to_string(),
    ))
}

fn catalog_format(query: Option<&str>) -> Result<CatalogFormat, ApiError> {
    match query_param(query, "format") {
        None | Some("anthropic") => Ok(CatalogFormat::Anthropic),
        Some("openai") => Ok(CatalogFormat::OpenAi),
        Some("mcp") => Ok(CatalogFormat::Mcp),
        Some(other) => Err(ApiError::BadRequest(format!(
            "format must be anthropic, openai or mcp, not `{other}`"
        ))),
    }
}

async fn openapi() -> Response {
    json_response(StatusCode::OK, OPENAPI_JSON.to_string())
}

/// Readiness, and the sandbox in force for the sessions' commands (mode, Landlock ABI, network,
/// limits), so an operator can check confinement without reading the start-up log. With a
/// journal, its health too: while it cannot record calls (a full disk, its file removed) the
/// answer is `503` with `"status": "degraded"` — side-effect calls are refused meanwhile.
async fn healthz(State(app): State<Arc<App>>) -> Response {
    let mut body = serde_json::json!({"status": "ok", "sandbox": app.engine.sandbox().describe()});
    let mut status = StatusCode::OK;
    if let Some(journal) = app.engine.journal() {
        body["journal"] = match journal.health() {
            Ok(()) => serde_json::json!({"status": "ok"}),
            Err(e) => {
                status = StatusCode::SERVICE_UNAVAILABLE;
                body["status"] = "degraded".into();
                let detail = match e {
                    crate::journal::JournalError::Io { detail, .. } => detail,
                    other => other.to_string(),
                };
                serde_json::json!({"status": "failing", "error": detail})
            }
        };
    }
    json_response(status, body.to_string())
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = app
        .prometheus
        .as_ref()
        .map_or_else(String::new, crate::exporter::MetricsHandle::render);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_found_by_exact_key() {
        assert_eq!(
            query_param(Some("format=openai&stream=true"), "stream"),
            Some("true")
        );
        assert_eq!(query_param(Some("stream"), "stream"), Some(""));
        assert_eq!(query_param(Some("xstream=1"), "stream"), None);
        assert_eq!(query_param(None, "stream"), None);
    }

    #[test]
    fn create_bodies_are_strict() {
        assert_eq!(new_session("").unwrap().workspace, None);
        assert_eq!(new_session("{}").unwrap().workspace, None);
        assert_eq!(
            new_session(r#"{"workspace":"p"}"#)
                .unwrap()
                .workspace
                .as_deref(),
            Some("p")
        );
        let narrowed =
            new_session(r#"{"sandbox":{"mode":"read-only","allow_network":false}}"#).unwrap();
        assert_eq!(
            narrowed.sandbox,
            Some(crate::sandbox::SandboxMode::ReadOnly)
        );
        assert_eq!(narrowed.allow_network, Some(false));
        for bad in [
            "[]",
            "nope",
            r#"{"workspace":1}"#,
            r#"{"other":"x"}"#,
            r#"{"sandbox":"tight"}"#,
            r#"{"sandbox":{"mode":"read-only","net":true}}"#,
        ] {
            assert!(new_session(bad).is_err(), "{bad}");
        }
    }
}
