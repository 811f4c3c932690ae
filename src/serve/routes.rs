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

use super::app::{App, json_response, query_param, read_body, session_id};
use super::dispatch;
use super::errors::ApiError;
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
        v1(Method::GET, "/v1/tools", get(tools)),
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
    let v1 = v1.route_layer(middleware::from_fn_with_state(
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
    let text = read_body(&headers, body, app.max_body).await?;
    let name = workspace_name(&text)?;
    let session = app.sessions.create(name.as_deref())?;
    let answer = json!({
        "session_id": session.id(),
        "workspace": session.workspace().to_string_lossy(),
    });
    Ok(json_response(StatusCode::CREATED, answer.to_string()))
}

/// The `workspace` of a create-session body: empty, `{}` or `{"workspace": NAME}`.
fn workspace_name(text: &str) -> Result<Option<String>, ApiError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut fields) = doc else {
        return Err(ApiError::BadRequest(
            "the body must be a JSON object: {} or {\"workspace\": NAME}".into(),
        ));
    };
    let name = match fields.remove("workspace") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => {
            return Err(ApiError::BadRequest("`workspace` must be a string".into()));
        }
    };
    if let Some(unknown) = fields.keys().next() {
        return Err(ApiError::BadRequest(format!(
            "unknown field `{unknown}` (only `workspace` is accepted)"
        )));
    }
    Ok(name)
}

async fn session_info(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(id)?;
    let session = app.sessions.get(&id)?;
    Ok(json_response(StatusCode::OK, session.info().to_string()))
}

async fn cancel_session(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(id)?;
    let session = app.sessions.get(&id)?;
    session.cancel_turns();
    Ok(json_response(StatusCode::OK, session.info().to_string()))
}

async fn delete_session(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(id)?;
    let session = app.sessions.remove(&id)?;
    Ok(json_response(StatusCode::OK, session.info().to_string()))
}

async fn tools(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let format = match query_param(query.as_deref(), "format") {
        None | Some("anthropic") => CatalogFormat::Anthropic,
        Some("openai") => CatalogFormat::OpenAi,
        Some("mcp") => CatalogFormat::Mcp,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "format must be anthropic, openai or mcp, not `{other}`"
            )));
        }
    };
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

async fn openapi() -> Response {
    json_response(StatusCode::OK, OPENAPI_JSON.to_string())
}

/// Liveness, and the sandbox in force for the sessions' commands (mode, Landlock ABI, network,
/// limits), so an operator can check confinement without reading the start-up log.
async fn healthz(State(app): State<Arc<App>>) -> Response {
    let body = serde_json::json!({"status": "ok", "sandbox": app.engine.sandbox().describe()});
    json_response(StatusCode::OK, body.to_string())
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
        assert_eq!(workspace_name("").unwrap(), None);
        assert_eq!(workspace_name("{}").unwrap(), None);
        assert_eq!(
            workspace_name(r#"{"workspace":"p"}"#).unwrap().as_deref(),
            Some("p")
        );
        for bad in ["[]", "nope", r#"{"workspace":1}"#, r#"{"other":"x"}"#] {
            assert!(workspace_name(bad).is_err(), "{bad}");
        }
    }
}
