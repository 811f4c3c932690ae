//! Relaying an HTTP request to the node that owns its session, over NATS request-reply.
//!
//! Every node listens on `switchboard.forward.<node>`. A node that receives a request for a
//! session another node owns publishes it there with an inbox of its own as the reply subject
//! (one subscription per node for all its relays, [`Relays`]: no subscription made and removed
//! per relayed request, whose interest every NATS server of the cluster would learn), and
//! the owner answers it through its own HTTP stack (token check included) and streams the
//! answer back to the inbox as it is produced: a head (status and headers), the body's chunks
//! in order, then an end mark. A streamed turn's Server-Sent Events are relayed chunk by chunk,
//! in order. While its answer is not done, the owner sends a ping every `PING_EVERY` (250 ms), so a
//! silent owner (dead or paused) is noticed after [`SILENCE`] instead of never.
//!
//! Wire form. Request payload: a 4-byte big-endian length, the head as JSON (`method`, `uri`,
//! `headers`), then the body. Answer messages ([`Frame`]s) say what they are in NATS headers:
//! `Switchboard-Frame` (`head`, `data`, `end`, `whole` or `ping`) and `Switchboard-Seq` (head,
//! data and end count from 0; a gap means a lost message and cuts the answer); the payload is the
//! head as JSON or the data. An answer whose body is complete and small when it is ready (every
//! answer but a stream of events) goes as one `whole` message: the head as JSON behind a 4-byte
//! length, then the body.
//!
//! Nodes need to reach only NATS, never each other, and the client keeps its connection and its
//! `Authorization` header: a redirect would need the clients to follow it, and common HTTP
//! clients drop `Authorization` on a redirect to another host.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::ClusterError;
use crate::locks::lock;
use crate::metrics::{ClusterMetrics, ForwardOutcome};

/// The header a relayed request carries at its owner (the node it came through).
pub const FORWARDED_HEADER: HeaderName = HeaderName::from_static("switchboard-forwarded-by");
/// The header of a relayed request's answer whose node does not (or no longer) serve the session
/// (`session_moved`): the relaying node routes the request again, and drops the header.
pub const MOVED_HEADER: HeaderName = HeaderName::from_static("switchboard-moved");
/// How long a forwarding node waits without any message from the owner before it gives up: six
/// pings missed. An owner that died mid-answer is noticed this soon (a client with a 3 s timeout
/// would otherwise give up first), before its heartbeat has even expired; an owner that is only
/// slow is asked again by the client's retry, which joins the running turn.
pub const SILENCE: Duration = Duration::from_millis(1500);
/// How often an owner says it is still working on an answer.
const PING_EVERY: Duration = Duration::from_millis(250);
/// Largest data chunk in one answer message (under NATS's default 1 MiB payload limit).
const CHUNK: usize = 256 * 1024;

/// The subject node `node` takes relayed requests on.
pub fn subject(node: &str) -> String {
    format!("switchboard.forward.{node}")
}

/// What a handler answers a relayed request with.
pub type Handler = Arc<dyn Fn(Request<Body>) -> BoxFuture<'static, Response<Body>> + Send + Sync>;

#[derive(Debug, Serialize, Deserialize)]
struct Head {
    method: String,
    uri: String,
    headers: Vec<(String, String)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct AnswerHead {
    status: u16,
    headers: Vec<(String, String)>,
    /// Where the forwarding node says its client left (the owner then drops the answer, as if
    /// its own client had closed the connection).
    #[serde(default)]
    control: Option<String>,
}

/// Headers that belong to one hop, never relayed (a request's length is its relayed body's).
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "transfer-encoding" | "host" | "upgrade" | "te" | "trailer"
    )
}

fn headers_of(map: &axum::http::HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .filter(|(n, _)| !hop_by_hop(n.as_str()))
        .filter_map(|(n, v)| {
            v.to_str()
                .ok()
                .map(|v| (n.as_str().to_string(), v.to_string()))
        })
        .collect()
}

/// The header naming a relayed answer message's kind.
const FRAME_HEADER: &str = "Switchboard-Frame";
/// The header carrying a relayed answer message's sequence number.
const SEQ_HEADER: &str = "Switchboard-Seq";

/// What a relayed answer message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The answer's status and headers ([`AnswerHead`] as JSON), sequence 0.
    Head,
    /// A piece of the body, in order.
    Data,
    /// The body is complete.
    End,
    /// A whole answer in one message: the head (JSON, behind a 4-byte length), then the body.
    Whole,
    /// The owner is still working on the answer (no sequence).
    Ping,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Head => "head",
            Kind::Data => "data",
            Kind::End => "end",
            Kind::Whole => "whole",
            Kind::Ping => "ping",
        }
    }

    fn parse(name: &str) -> Option<Kind> {
        [Kind::Head, Kind::Data, Kind::End, Kind::Whole, Kind::Ping]
            .into_iter()
            .find(|k| k.name() == name)
    }
}

/// One message of a relayed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    kind: Kind,
    seq: u64,
    data: Bytes,
}

impl Frame {
    fn new(kind: Kind, seq: u64, data: impl Into<Bytes>) -> Frame {
        Frame {
            kind,
            seq,
            data: data.into(),
        }
    }

    fn ping() -> Frame {
        Frame::new(Kind::Ping, 0, Bytes::new())
    }

    fn headers(&self) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(FRAME_HEADER, self.kind.name());
        headers.insert(SEQ_HEADER, self.seq.to_string().as_str());
        headers
    }

    /// The frame `message` carries; `None` for a message that is none (it is ignored).
    fn of(message: &async_nats::Message) -> Option<Frame> {
        let headers = message.headers.as_ref()?;
        let kind = Kind::parse(headers.get(FRAME_HEADER)?.as_str())?;
        let seq = headers.get(SEQ_HEADER)?.as_str().parse().ok()?;
        Some(Frame::new(kind, seq, message.payload.clone()))
    }

    /// Publishes it to `reply`.
    async fn send(
        self,
        client: &async_nats::Client,
        reply: &async_nats::Subject,
    ) -> Result<(), async_nats::PublishError> {
        client
            .publish_with_headers(reply.clone(), self.headers(), self.data)
            .await
    }
}

/// Answers the requests relayed to node `node` with `handler` until `stop`; `Err` when it cannot
/// subscribe to its subject.
pub async fn serve(
    client: async_nats::Client,
    node: String,
    handler: Handler,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(), ClusterError> {
    let mut requests = client
        .subscribe(subject(&node))
        .await
        .map_err(|e| super::err("cannot listen for relayed requests", e))?;
    loop {
        let message = tokio::select! {
            m = requests.next() => match m { Some(m) => m, None => break },
            () = stop.cancelled() => break,
        };
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        let client = client.clone();
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            answer(client, reply, &message.payload, handler).await;
        });
    }
    Ok(())
}

/// The payload relaying a request: its head as JSON behind a 4-byte length, then its body.
fn encode_request(parts: &axum::http::request::Parts, body: &[u8]) -> Result<Vec<u8>, String> {
    let head = Head {
        method: parts.method.as_str().to_string(),
        uri: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        headers: headers_of(&parts.headers),
    };
    let head = serde_json::to_vec(&head).map_err(|e| e.to_string())?;
    Ok(with_head(&head, body))
}

/// A payload of a head (JSON) behind its 4-byte big-endian length, then a body: a relayed
/// request, and a `whole` answer.
fn with_head(head: &[u8], body: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + head.len() + body.len());
    payload.extend_from_slice(&(head.len() as u32).to_be_bytes());
    payload.extend_from_slice(head);
    payload.extend_from_slice(body);
    payload
}

/// The head and the body of a payload made by [`with_head`].
fn split_head(payload: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let len = payload
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("no head")?;
    let head = payload.get(4..4 + len).ok_or("a short head")?;
    Ok((head, &payload[4 + len..]))
}

/// The request a relayed message carries, marked as relayed.
fn decode_request(payload: &[u8]) -> Result<Request<Body>, String> {
    let (head, body) = split_head(payload)?;
    let head: Head = serde_json::from_slice(head).map_err(|e| e.to_string())?;
    let body = Bytes::copy_from_slice(body);
    let mut builder = Request::builder()
        .method(head.method.as_str())
        .uri(head.uri.as_str());
    for (name, value) in &head.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder = builder.header(FORWARDED_HEADER, "1");
    builder.body(Body::from(body)).map_err(|e| e.to_string())
}

/// Ticks every [`PING_EVERY`], the first one [`PING_EVERY`] from now.
fn pinger() -> tokio::time::Interval {
    tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY)
}

async fn answer(
    client: async_nats::Client,
    reply: async_nats::Subject,
    payload: &[u8],
    handler: Handler,
) {
    let response = match decode_request(payload) {
        Ok(request) => {
            let mut work = handler(request);
            // The first ping after one period (an interval's immediate first tick still waits for
            // the timer's next millisecond: 1 ms on every relayed request).
            let mut ping = pinger();
            loop {
                tokio::select! {
                    r = &mut work => break r,
                    _ = ping.tick() => {
                        let _ = Frame::ping().send(&client, &reply).await;
                    }
                }
            }
        }
        Err(e) => {
            let mut r = Response::new(Body::from(format!(
                "a relayed request does not decode: {e}"
            )));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r
        }
    };
    let (parts, body) = response.into_parts();
    // Complete and small already (not a stream): one message, and nothing to cancel.
    if axum::body::HttpBody::size_hint(&body)
        .exact()
        .is_some_and(|n| n <= CHUNK as u64)
    {
        // A body that breaks off says nothing more (the forwarder gives up after its silence).
        let Ok(bytes) = axum::body::to_bytes(body, CHUNK).await else {
            return;
        };
        let head = AnswerHead {
            status: parts.status.as_u16(),
            headers: headers_of(&parts.headers),
            control: None,
        };
        let _ = Frame::new(Kind::Whole, 0, encode_whole(&head, &bytes))
            .send(&client, &reply)
            .await;
        return;
    }
    let control = client.new_inbox();
    let mut left = client.subscribe(control.clone()).await.ok();
    let head = AnswerHead {
        status: parts.status.as_u16(),
        headers: headers_of(&parts.headers),
        control: left.as_ref().map(|_| control),
    };
    let head = serde_json::to_vec(&head).unwrap_or_default();
    let mut seq = 0u64;
    if Frame::new(Kind::Head, seq, head)
        .send(&client, &reply)
        .await
        .is_err()
    {
        return;
    }
    let mut data = body.into_data_stream();
    let mut ping = pinger();
    loop {
        let chunk = tokio::select! {
            c = data.next() => c,
            // The client left the forwarding node: drop the answer here too (a streamed turn's
            // client-tool calls are then answered `cancelled`, as on a direct connection).
            Some(_) = async {
                match left.as_mut() {
                    Some(l) => l.next().await,
                    None => std::future::pending().await,
                }
            } => return,
            _ = ping.tick() => {
                let _ = Frame::ping().send(&client, &reply).await;
                continue;
            }
        };
        match chunk {
            Some(Ok(bytes)) => {
                let mut at = 0;
                while at < bytes.len() {
                    let piece = bytes.slice(at..(at + CHUNK).min(bytes.len()));
                    at += piece.len();
                    seq += 1;
                    if Frame::new(Kind::Data, seq, piece)
                        .send(&client, &reply)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            // The answer broke off here: say nothing more, the forwarder cuts it too.
            Some(Err(_)) => return,
            None => break,
        }
    }
    let _ = Frame::new(Kind::End, seq + 1, Bytes::new())
        .send(&client, &reply)
        .await;
}

/// A `whole` frame's payload: `head` as JSON behind a 4-byte length, then `body`.
fn encode_whole(head: &AnswerHead, body: &[u8]) -> Bytes {
    let head = serde_json::to_vec(head).unwrap_or_default();
    with_head(&head, body).into()
}

/// The head and body of a `whole` frame's payload.
fn decode_whole(payload: &Bytes) -> Result<(AnswerHead, Bytes), String> {
    let (head, body) = split_head(payload)?;
    let head: AnswerHead = serde_json::from_slice(head).map_err(|e| e.to_string())?;
    Ok((head, payload.slice(payload.len() - body.len()..)))
}

/// The response a relayed answer's head describes, with `body`.
fn response_of(head: &AnswerHead, body: Body) -> Result<Response<Body>, Unreachable> {
    let mut builder = Response::builder().status(head.status);
    for (name, value) in &head.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            builder = builder.header(n, v);
        }
    }
    builder
        .body(body)
        .map_err(|e| Unreachable::Nats(e.to_string()))
}

/// Why a request could not be relayed: nothing was answered (safe to route again or refuse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// No node listens for node `node`'s requests.
    NoResponders,
    /// The owner said nothing for [`SILENCE`].
    Silent,
    /// The request is larger than NATS carries in one message.
    TooLarge(usize),
    /// NATS itself failed.
    Nats(String),
}

/// Answer messages a relay may have waiting before it reads them; more are dropped (the relay
/// then sees a gap in the sequence and cuts the answer, as a slow NATS subscriber would).
const RELAY_BACKLOG: usize = 8192;

/// The relays waiting for answers, by the last token of their inbox.
type Waiting = Arc<std::sync::Mutex<HashMap<u64, mpsc::Sender<async_nats::Message>>>>;

/// The answers of every request this node relays: one subscription to `<prefix>.*`, each
/// relayed request answered at `<prefix>.<n>` and its messages handed to it by `n`.
#[derive(Debug)]
pub struct Relays {
    client: async_nats::Client,
    prefix: String,
    next: std::sync::atomic::AtomicU64,
    waiting: Waiting,
    /// Ends the task that hands the messages out, with the last handle.
    _stop: tokio_util::sync::DropGuard,
}

impl Relays {
    /// Subscribes to this node's relay inbox and starts handing its messages out.
    pub async fn start(client: async_nats::Client) -> Result<Relays, ClusterError> {
        let prefix = client.new_inbox();
        let mut answers = client
            .subscribe(format!("{prefix}.*"))
            .await
            .map_err(|e| super::err("cannot listen for relayed answers", e))?;
        let waiting: Waiting = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let (handed, stopped) = (Arc::clone(&waiting), stop.clone());
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    m = answers.next() => match m { Some(m) => m, None => break },
                    () = stopped.cancelled() => break,
                };
                let Some(n) = message
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                let relay = lock(&handed).get(&n).cloned();
                if let Some(relay) = relay {
                    // Full: dropped, and the relay cuts its answer at the gap.
                    let _ = relay.try_send(message);
                }
            }
        });
        Ok(Relays {
            client,
            prefix,
            next: std::sync::atomic::AtomicU64::new(0),
            waiting,
            _stop: stop.drop_guard(),
        })
    }

    /// A fresh inbox for one relayed request, and its messages; forgotten when dropped.
    fn open(&self) -> Inbox {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (sender, answers) = mpsc::channel(RELAY_BACKLOG);
        lock(&self.waiting).insert(n, sender);
        Inbox {
            subject: format!("{}.{n}", self.prefix),
            answers,
            n,
            waiting: Arc::clone(&self.waiting),
        }
    }
}

/// One relayed request's inbox ([`Relays::open`]).
struct Inbox {
    subject: String,
    answers: mpsc::Receiver<async_nats::Message>,
    n: u64,
    waiting: Waiting,
}

impl Inbox {
    async fn next(&mut self) -> Option<async_nats::Message> {
        self.answers.recv().await
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        lock(&self.waiting).remove(&self.n);
    }
}

/// Relays a request (its head and whole body) to node `node` and returns the owner's answer,
/// whose body streams as the owner sends it (cut, as an error, if the owner goes silent or a
/// message is lost).
pub async fn forward(
    relays: &Relays,
    node: &str,
    parts: &axum::http::request::Parts,
    body: Bytes,
    metrics: &ClusterMetrics,
) -> Result<Response<Body>, Unreachable> {
    let client = &relays.client;
    let payload = encode_request(parts, &body).map_err(Unreachable::Nats)?;
    let limit = client.server_info().max_payload;
    if payload.len() > limit {
        return Err(Unreachable::TooLarge(limit));
    }
    let mut answers = relays.open();
    client
        .publish_with_reply(subject(node), answers.subject.clone(), payload.into())
        .await
        .map_err(|e| Unreachable::Nats(e.to_string()))?;
    // The head, skipping pings.
    let head = loop {
        let message = match tokio::time::timeout(SILENCE, answers.next()).await {
            Err(_) => {
                metrics.forward(ForwardOutcome::Unreachable);
                return Err(Unreachable::Silent);
            }
            Ok(None) => return Err(Unreachable::Nats("the relay inbox closed".into())),
            Ok(Some(m)) => m,
        };
        if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            metrics.forward(ForwardOutcome::Unreachable);
            return Err(Unreachable::NoResponders);
        }
        match Frame::of(&message) {
            Some(Frame {
                kind: Kind::Head,
                data,
                ..
            }) => {
                break serde_json::from_slice::<AnswerHead>(&data)
                    .map_err(|e| Unreachable::Nats(format!("a bad answer head: {e}")))?;
            }
            Some(Frame {
                kind: Kind::Whole,
                data,
                ..
            }) => {
                let (head, body) = decode_whole(&data)
                    .map_err(|e| Unreachable::Nats(format!("a bad answer: {e}")))?;
                metrics.forward(ForwardOutcome::Ok);
                return response_of(&head, Body::from(body));
            }
            _ => continue,
        }
    };
    metrics.forward(ForwardOutcome::Ok);
    let left = ClientLeft {
        client: client.clone(),
        control: head.control.clone(),
        finished: false,
    };
    let metrics = metrics.clone();
    let events = head.headers.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case("content-type") && value.starts_with("text/event-stream")
    });
    let state = Relay {
        answers,
        next: 1,
        done: false,
        events,
        partial: Vec::new(),
        left,
    };
    let body = futures::stream::unfold(state, move |mut state| {
        let metrics = metrics.clone();
        async move {
            let item = state.next_chunk(&metrics).await?;
            Some((item, state))
        }
    });
    response_of(&head, Body::from_stream(body))
}

/// The forwarding side of one relayed answer, read as the client reads the body.
struct Relay {
    answers: Inbox,
    /// The sequence number the next data or end message must carry.
    next: u64,
    done: bool,
    /// The answer is a stream of Server-Sent Events: it is passed on whole events at a time, and
    /// a cut ends it with an `error` event.
    events: bool,
    /// Of a stream of events, the bytes of an event not complete yet.
    partial: Vec<u8>,
    left: ClientLeft,
}

impl Relay {
    /// The next body chunk; an error when the answer broke off (for a stream of events, a last
    /// `error` event with the code `node_unreachable`, then its end); `None` at its end.
    async fn next_chunk(
        &mut self,
        metrics: &ClusterMetrics,
    ) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        let events = self.events;
        loop {
            let cut = |what: &str| {
                metrics.forward(ForwardOutcome::Cut);
                if events {
                    return Some(Ok(cut_event(what)));
                }
                Some(Err(std::io::Error::other(what.to_string())))
            };
            let Ok(Some(message)) = tokio::time::timeout(SILENCE, self.answers.next()).await else {
                self.done = true;
                return cut("the owner of the session stopped answering");
            };
            let Some(frame) = Frame::of(&message) else {
                continue;
            };
            if matches!(frame.kind, Kind::Data | Kind::End) && frame.seq != self.next {
                self.done = true;
                return cut("a relayed answer lost a message");
            }
            match frame.kind {
                Kind::Data if self.events => {
                    self.next += 1;
                    self.partial.extend_from_slice(&frame.data);
                    // Whole events only: a cut never leaves the client half an event.
                    let Some(end) = self.partial.windows(2).rposition(|w| w == b"\n\n") else {
                        continue;
                    };
                    let rest = self.partial.split_off(end + 2);
                    let whole = std::mem::replace(&mut self.partial, rest);
                    return Some(Ok(Bytes::from(whole)));
                }
                Kind::Data => {
                    self.next += 1;
                    return Some(Ok(frame.data));
                }
                Kind::End => {
                    self.done = true;
                    self.left.finished = true;
                    if !self.partial.is_empty() {
                        return Some(Ok(Bytes::from(std::mem::take(&mut self.partial))));
                    }
                    return None;
                }
                Kind::Head | Kind::Whole | Kind::Ping => continue,
            }
        }
    }
}

/// The `error` event that ends a relayed stream of events cut off by `what`: what the client
/// would read from its own node (the turn's calls may have run: the retry with the same turn
/// id is answered from the journal).
fn cut_event(what: &str) -> Bytes {
    let message = format!(
        "{what}; the turn's calls may have run: send the turn again with the same turn id (calls \
         that ran are answered from the journal, the others run)"
    );
    let data = serde_json::json!({"error": {"code": "node_unreachable", "message": message}});
    Bytes::from(format!("event: error\ndata: {data}\n\n"))
}

/// Tells the owner, when dropped before the answer's end, that the client left.
struct ClientLeft {
    client: async_nats::Client,
    control: Option<String>,
    finished: bool,
}

impl Drop for ClientLeft {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let (Some(control), Ok(runtime)) =
            (self.control.take(), tokio::runtime::Handle::try_current())
        {
            let client = self.client.clone();
            runtime.spawn(async move {
                let _ = client.publish(control, Bytes::new()).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_request_arrives_as_sent_and_marked() {
        let request = Request::builder()
            .method("POST")
            .uri("/v1/sessions/s1/dispatch?stream=true")
            .header("authorization", "Bearer t")
            .header("connection", "keep-alive")
            .body(())
            .unwrap();
        let (parts, ()) = request.into_parts();
        let payload = encode_request(&parts, b"{\"content\": []}").unwrap();
        let relayed = decode_request(&payload).unwrap();
        assert_eq!(relayed.method(), "POST");
        assert_eq!(relayed.uri(), "/v1/sessions/s1/dispatch?stream=true");
        assert_eq!(relayed.headers()["authorization"], "Bearer t");
        assert!(
            relayed.headers().get("connection").is_none(),
            "hop-by-hop dropped"
        );
        assert!(relayed.headers().contains_key(&FORWARDED_HEADER));
        assert!(decode_request(b"\x00\x00").is_err());
        assert!(decode_request(b"\x00\x00\x00\xffshort").is_err());
    }

    #[test]
    fn a_cut_stream_of_events_ends_with_an_error_event() {
        let text = String::from_utf8(cut_event("the owner stopped answering").to_vec()).unwrap();
        assert!(text.starts_with("event: error\ndata: "), "{text}");
        assert!(text.ends_with("\n\n"));
        let data: serde_json::Value =
            serde_json::from_str(text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap())
                .unwrap();
        assert_eq!(data["error"]["code"], "node_unreachable");
        assert!(
            data["error"]["message"]
                .as_str()
                .unwrap()
                .contains("the owner stopped answering")
        );
    }

    fn message(
        headers: Option<async_nats::HeaderMap>,
        payload: &'static [u8],
    ) -> async_nats::Message {
        async_nats::Message {
            subject: "_INBOX.x".into(),
            reply: None,
            payload: Bytes::from_static(payload),
            headers,
            status: None,
            description: None,
            length: payload.len(),
        }
    }

    #[test]
    fn answer_frames_carry_kind_and_sequence_in_headers() {
        for kind in [Kind::Head, Kind::Data, Kind::End, Kind::Whole, Kind::Ping] {
            let frame = Frame::new(kind, 7, Bytes::from_static(b"abc"));
            let got = Frame::of(&message(Some(frame.headers()), b"abc"));
            assert_eq!(got, Some(frame));
        }
        let headers = Frame::new(Kind::Data, 3, Bytes::new()).headers();
        assert_eq!(headers.get(FRAME_HEADER).unwrap().as_str(), "data");
        assert_eq!(headers.get(SEQ_HEADER).unwrap().as_str(), "3");
    }

    #[test]
    fn a_whole_answer_carries_its_head_and_body() {
        let head = AnswerHead {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            control: None,
        };
        let payload = encode_whole(&head, b"{\"ok\": true}");
        let (back, body) = decode_whole(&payload).unwrap();
        assert_eq!(back.status, 201);
        assert_eq!(back.headers, head.headers);
        assert_eq!(&body[..], b"{\"ok\": true}");
        let response = response_of(&back, Body::from(body)).unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["content-type"], "application/json");
        assert!(decode_whole(&Bytes::from_static(b"\x00\x00\x00\x09{}")).is_err());
        assert!(decode_whole(&Bytes::from_static(b"\x00")).is_err());
    }

    #[test]
    fn a_message_that_is_no_frame_is_ignored() {
        // The magic-byte frames of earlier versions, and headers that do not parse.
        assert_eq!(Frame::of(&message(None, b"D\0\0\0\0\0\0\0\x01abc")), None);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(FRAME_HEADER, "data");
        assert_eq!(
            Frame::of(&message(Some(headers.clone()), b"")),
            None,
            "no sequence"
        );
        headers.insert(SEQ_HEADER, "x");
        assert_eq!(
            Frame::of(&message(Some(headers), b"")),
            None,
            "a sequence that is no number"
        );
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(FRAME_HEADER, "other");
        headers.insert(SEQ_HEADER, "1");
        assert_eq!(
            Frame::of(&message(Some(headers), b"")),
            None,
            "an unknown kind"
        );
    }
}
