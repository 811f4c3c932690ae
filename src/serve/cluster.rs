//! Cluster mode in the HTTP front end: every request for a session is served by the node that
//! owns it, whichever node it arrived at (see [`crate::cluster`] for ownership and
//! [`crate::cluster::forward`] for the relay).
//!
//! For a request naming a session, after the token check:
//! - this node owns it (and its heartbeat stands) → served here;
//! - another live node owns it → relayed there over NATS, its answer streamed back;
//! - its owner is dead (heartbeat expired) → this node takes it over (lease epoch + 1, journal
//!   claimed, which fences the old owner), reopens it from the journal and serves it;
//! - nobody knows it → `unknown_session`.
//!
//! A turn during which another node took the session over (this node's journal write was
//! refused) is routed again, to the new owner, when it was not streamed; a stream is ended with
//! `session_moved`, and the client's retry (same turn id) is answered by the new owner.
//!
//! `POST /v1/sessions` is placed here unless this node is draining or at its session limit;
//! then it goes to the live node with the fewest calls in flight.
//!
//! Also here: NATS trouble while routing is `503 cluster_unavailable` after a bounded wait
//! ([`NATS_WAIT`] per step); a node that cannot reopen a session it took over gives it back
//! and relays the request to a node with room; and self-fencing ([`fence_when_stale`]): a node
//! whose heartbeat is stale for half the TTL lets go of its sessions and serves none.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::app::{App, json_response};
use super::errors::{ApiError, Moved};
use crate::cluster::forward::{self, FORWARDED_HEADER, MOVED_HEADER, Unreachable};
use crate::cluster::{Cluster, Route};

/// How many times a request is routed before the node gives up (the owner changed under it each
/// time).
const ROUTE_TRIES: usize = 3;

/// How long one step of routing (reading a key, taking a session over, claiming its journal) may
/// wait for the NATS servers before the request is answered `cluster_unavailable` (503): an
/// election after a server died takes a few seconds; no quorum at all, much longer.
const NATS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `step`, bounded by [`NATS_WAIT`]; NATS trouble is `cluster_unavailable`.
async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    step: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(NATS_WAIT, step).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(ApiError::ClusterUnavailable(format!("{what}: {e}"))),
        Err(_) => Err(ApiError::ClusterUnavailable(format!(
            "{what}: no answer within {} s",
            NATS_WAIT.as_secs()
        ))),
    }
}

/// The session a path names: `/v1/sessions/{id}` and everything under it.
fn session_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// What to do with a request for a session.
enum Decision {
    Here,
    /// Relay it to this node (`true`: a route used lately, not read again from the buckets).
    There(String, bool),
}

/// Middleware of the `/v1` routes in cluster mode.
pub async fn route(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(cluster) = app.cluster.clone() else {
        return next.run(request).await;
    };
    let path = request.uri().path().to_string();
    if request.method() == Method::POST && path == "/v1/sessions" {
        return place(&app, &cluster, request, next).await;
    }
    let Some(id) = session_of(&path).map(str::to_string) else {
        return next.run(request).await;
    };
    let relayed = request.headers().contains_key(&FORWARDED_HEADER);
    let (parts, body) = request.into_parts();
    let body = match app.read_body(&parts.headers, body).await {
        Ok(text) => axum::body::Bytes::from(text),
        Err(e) => return e.into_response(),
    };
    // A relayed request the session's owner no longer serves says so to the relaying node,
    // which routes it again.
    let answer = |mut response: Response| {
        if relayed && response.extensions().get::<Moved>().is_some() {
            response
                .headers_mut()
                .insert(MOVED_HEADER, axum::http::HeaderValue::from_static("1"));
        }
        response
    };
    let mut last = None;
    for _ in 0..ROUTE_TRIES {
        let decision = match decide(&app, &cluster, &id, relayed).await {
            Ok(d) => d,
            Err(e) => return answer(e.into_response()),
        };
        match decision {
            Decision::Here => {
                let request = Request::from_parts(parts.clone(), Body::from(body.clone()));
                let response = next.clone().run(request).await;
                if response.extensions().get::<Moved>().is_none() || relayed {
                    return answer(response);
                }
                // Taken over while the turn ran here: the new owner answers it.
                last = Some(response);
            }
            Decision::There(node, recent) => {
                match forward::forward(
                    cluster.relays(),
                    &node,
                    &parts,
                    body.clone(),
                    cluster.metrics(),
                )
                .await
                {
                    Ok(mut response) if response.headers().contains_key(&MOVED_HEADER) => {
                        // Not (or no longer) that node's session: routed again from its key.
                        cluster.forget_route(&id);
                        response.headers_mut().remove(&MOVED_HEADER);
                        last = Some(response);
                    }
                    Ok(response) => return response,
                    Err(Unreachable::TooLarge(limit)) => {
                        return ApiError::PayloadTooLarge(limit).into_response();
                    }
                    Err(Unreachable::NoResponders) if recent => {
                        // The node of a route used lately is gone: nothing was answered, so
                        // the request is routed again from the session's key.
                        cluster.forget_route(&id);
                    }
                    Err(why) => {
                        cluster.forget_route(&id);
                        return ApiError::NodeUnreachable(
                            format!("node {node}: {why:?}"),
                            cluster.ttl().as_secs().max(1),
                        )
                        .into_response();
                    }
                }
            }
        }
    }
    last.unwrap_or_else(|| ApiError::SessionMoved(id).into_response())
}

/// Where session `id` is served; takes it over when its owner is dead.
async fn decide(
    app: &App,
    cluster: &Cluster,
    id: &str,
    relayed: bool,
) -> Result<Decision, ApiError> {
    // Fenced while this node's heartbeat is stale (another node may be about to take over); a
    // node that just resumed from a pause renews it within moments, so wait a little first.
    let deadline = std::time::Instant::now() + cluster.ttl() / 2;
    while !cluster.fresh() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    if !cluster.fresh() {
        return Err(ApiError::ClusterUnavailable(format!(
            "node {}'s heartbeat has not been renewed for half the lease TTL; it serves no session until it is",
            cluster.node()
        )));
    }
    let open_here = app.sessions.has(id);
    if open_here && served_here(app, cluster, id).await? {
        return Ok(Decision::Here);
    }
    if open_here {
        // Its lease lapsed while this node was away, and another node took it.
        app.sessions.drop_local(id);
    }
    if !relayed && let Some(node) = cluster.recent_route(id) {
        return Ok(Decision::There(node, true));
    }
    for _ in 0..ROUTE_TRIES {
        match bounded("reading the session's owner", cluster.route(id)).await? {
            Route::Unknown => return Ok(Decision::Here),
            Route::Here(owner) => {
                // Its key names this node's run, but the session is not open: it was let go
                // (fenced) and nobody took it since; take it back at a new epoch.
                // One takeover at a time here; another request may have done it meanwhile.
                let _taking = cluster.taking_over(id).await;
                if served_here(app, cluster, id).await? {
                    return Ok(Decision::Here);
                }
                if let Some((current, revision)) =
                    bounded("reading the session's owner", cluster.owner(id)).await?
                    && current == owner
                {
                    match take_over(app, cluster, id, &owner, revision).await? {
                        Taken::Here => return Ok(Decision::Here),
                        Taken::Elsewhere => {}
                        Taken::Unopened(e) if !relayed => return elsewhere(cluster, e).await,
                        Taken::Unopened(e) => return Err(e),
                    }
                }
            }
            Route::There(owner) => {
                if relayed {
                    // Relayed here, but another node owns it: the relaying node routes again.
                    return Err(ApiError::SessionMoved(id.to_string()));
                }
                return Ok(Decision::There(owner.node, false));
            }
            Route::Orphan(owner, revision) => {
                // A node without room does not take it over (its reopen would fail and leave the
                // session's key naming a node that cannot serve it): a node with room does.
                if app.sessions.load().1
                    && let Some(target) =
                        bounded("reading the live nodes", cluster.placement(true)).await?
                {
                    return Ok(Decision::There(target.node, false));
                }
                let _taking = cluster.taking_over(id).await;
                if served_here(app, cluster, id).await? {
                    return Ok(Decision::Here);
                }
                match take_over(app, cluster, id, &owner, revision).await? {
                    Taken::Here => return Ok(Decision::Here),
                    Taken::Elsewhere => {}
                    Taken::Unopened(e) if !relayed => return elsewhere(cluster, e).await,
                    Taken::Unopened(e) => return Err(e),
                }
            }
        }
    }
    Err(ApiError::SessionMoved(id.to_string()))
}

/// Whether session `id` is served here now: open here, and this node holds its lease (not lost
/// to a refused journal write, and its key names this node). A key that cannot be read is
/// `cluster_unavailable` (the session is not let go for it).
async fn served_here(app: &App, cluster: &Cluster, id: &str) -> Result<bool, ApiError> {
    Ok(app.sessions.has(id) && bounded("reading the session's owner", cluster.owns(id)).await?)
}

/// What came of taking a session over.
enum Taken {
    /// Taken and reopened here.
    Here,
    /// Another node was faster.
    Elsewhere,
    /// Taken, but it would not reopen here (why): released again, for a node that can.
    Unopened(ApiError),
}

/// After this node could not reopen a session it took over (`why`, and released it): the request
/// goes to another live node with room, which takes it over; `why` when there is none.
async fn elsewhere(cluster: &Cluster, why: ApiError) -> Result<Decision, ApiError> {
    match bounded("reading the live nodes", cluster.placement(true)).await? {
        Some(target) => Ok(Decision::There(target.node, false)),
        None => Err(why),
    }
}

/// Takes session `id` over from `owner` (its key at `revision`) and reopens it here.
async fn take_over(
    app: &App,
    cluster: &Cluster,
    id: &str,
    owner: &crate::cluster::Owner,
    revision: u64,
) -> Result<Taken, ApiError> {
    // Let go here earlier (fenced): its old turns finish first (they were cancelled), so that
    // none of their writes lands in the journal of the session taken back.
    let deadline = std::time::Instant::now() + NATS_WAIT;
    while app.sessions.departed_busy(id) {
        if std::time::Instant::now() >= deadline {
            return Err(ApiError::ClusterUnavailable(format!(
                "an earlier run of session {id} on this node is still finishing its turns"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let Some(lease) = bounded(
        "taking the session over",
        cluster.take_over(id, owner, revision),
    )
    .await?
    else {
        return Ok(Taken::Elsewhere);
    };
    let epoch = lease.epoch();
    let claimed = match tokio::time::timeout(NATS_WAIT, cluster.claim(id, Arc::clone(&lease))).await
    {
        Ok(claimed) => claimed,
        Err(_) => Err(crate::journal::JournalError::Io {
            file: cluster.stream_name().into(),
            detail: format!("no answer within {} s", NATS_WAIT.as_secs()),
            source: None,
        }),
    };
    match claimed {
        Ok(crate::journal::replicated::Claimed::Session(bytes)) => {
            if owner.node != cluster.node() {
                cluster.metrics().failover();
            }
            tracing::info!(session = %id, from = %owner.node, epoch, "cluster: session taken over");
            if let Err(e) = app.sessions.adopt(id, &bytes, lease).await {
                tracing::warn!(session = %id, error = %e.message(), "cluster: a session taken over does not reopen here; released for another node");
                cluster.release(id, epoch).await;
                return Ok(Taken::Unopened(ApiError::Internal(format!(
                    "session {id} cannot be reopened on node {}: {}",
                    cluster.node(),
                    e.message()
                ))));
            }
            Ok(Taken::Here)
        }
        Ok(crate::journal::replicated::Claimed::Unknown) => {
            cluster.forget(id).await;
            Ok(Taken::Here)
        }
        Err(crate::journal::JournalError::Fenced { .. }) => {
            cluster.let_go(id);
            Ok(Taken::Elsewhere)
        }
        Err(e) => {
            cluster.let_go(id);
            Err(ApiError::ClusterUnavailable(format!(
                "cannot read session {id}'s journal to take it over: {e}"
            )))
        }
    }
}

/// Self-fencing: checks this node's heartbeat every twelfth of the lease TTL until `stop`; once
/// it has not been renewed for half the TTL, lets go of every session held here — their running
/// commands are stopped (process trees, as a cancel does) and nothing more runs for them — well
/// before another node may take them over (a full TTL after the last renewal). Once the
/// heartbeat is renewed, the next request for such a session takes it back (at a new epoch)
/// from the journal. What stays unfenced: a node frozen with its commands (a machine or VM
/// paused) runs them on when it resumes, until this check's next tick.
pub async fn fence_when_stale(
    cluster: Arc<Cluster>,
    sessions: Arc<super::sessions::SessionTable>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick =
        tokio::time::interval((cluster.ttl() / 12).max(std::time::Duration::from_millis(20)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => break,
        }
        if cluster.fresh() {
            continue;
        }
        let held = cluster.held();
        if held.is_empty() {
            continue;
        }
        tracing::warn!(
            node = %cluster.node(),
            sessions = held.len(),
            "cluster: this node's heartbeat has not been renewed for half the lease TTL: its sessions' running commands are stopped and nothing runs for them until it is"
        );
        cluster.metrics().self_fenced(held.len());
        for id in held {
            sessions.drop_local(&id);
        }
    }
}

/// `POST /v1/sessions` in cluster mode: here, or on the least-loaded live node when this one is
/// draining or full.
async fn place(app: &App, cluster: &Cluster, request: Request, next: Next) -> Response {
    if request.headers().contains_key(&FORWARDED_HEADER) {
        return next.run(request).await;
    }
    let (_, full) = app.sessions.load();
    let target = match bounded("reading the live nodes", cluster.placement(full)).await {
        Ok(target) => target,
        Err(e) => return e.into_response(),
    };
    let Some(target) = target else {
        if cluster.draining() {
            return ApiError::ShuttingDown.into_response();
        }
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let body = match app.read_body(&parts.headers, body).await {
        Ok(text) => axum::body::Bytes::from(text),
        Err(e) => return e.into_response(),
    };
    match forward::forward(
        cluster.relays(),
        &target.node,
        &parts,
        body,
        cluster.metrics(),
    )
    .await
    {
        Ok(response) => response,
        Err(why) => ApiError::NodeUnreachable(
            format!("node {}: {why:?}", target.node),
            cluster.ttl().as_secs().max(1),
        )
        .into_response(),
    }
}

/// `POST /v1/admin/drain`: this node places no new sessions from now on (they go to other
/// nodes, or are refused `shutting_down` on a single node); its sessions and turns go on.
pub async fn drain(State(app): State<Arc<App>>) -> Response {
    app.drain();
    if let Some(cluster) = &app.cluster
        && let Err(e) = cluster.heartbeat(app.cluster_load()).await
    {
        tracing::warn!(error = %e, "cluster: the draining heartbeat was not put");
    }
    let (sessions, _) = app.sessions.load();
    let body = serde_json::json!({"draining": true, "sessions": sessions}).to_string();
    json_response(StatusCode::OK, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_paths_name_their_session() {
        assert_eq!(session_of("/v1/sessions/s1"), Some("s1"));
        assert_eq!(session_of("/v1/sessions/s1/dispatch"), Some("s1"));
        assert_eq!(session_of("/v1/sessions"), None);
        assert_eq!(session_of("/v1/sessions/"), None);
        assert_eq!(session_of("/v1/tools"), None);
    }
}
