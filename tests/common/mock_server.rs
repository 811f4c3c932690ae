//! A local mock model server for the provider tests: bound to 127.0.0.1 on a free port, it speaks
//! Anthropic Messages (`POST /v1/messages`) and OpenAI Chat Completions
//! (`POST /v1/chat/completions`), whole or streamed (SSE, when the request says `"stream":
//! true`), from a script of turns. It records every request, can split argument text into
//! fragments of N characters and the body into chunks of N bytes, and can hold a stream open
//! after a given tool call is complete until an event shows up in a shared log (to prove eager
//! dispatch by the order of events). It logs `stream ended` just before it sends a stream's
//! last event.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::EventLog;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};

/// What one turn answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A Messages API response. A `tool_use` block may carry `"raw_input": "<text>"`: the
    /// argument text streamed instead of `input` (to send text that is not JSON).
    Anthropic(Value),
    /// A chat completion (`{"choices":[{"message":…,"finish_reason":…}]}`).
    OpenAi(Value),
    /// An error status with headers and a body.
    Status {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
}

/// One scripted turn.
#[derive(Debug, Clone)]
pub struct MockTurn {
    pub reply: Reply,
    /// Characters per argument (and text) fragment when streaming; 0 = one fragment.
    pub fragment: usize,
    /// Bytes per body chunk when streaming; 0 = one chunk per event.
    pub chunk_bytes: usize,
    /// Hold the stream after tool call `.0` (0-based) is complete until the log has an entry
    /// starting with `.1` (at most 5 s).
    pub hold: Option<(usize, String)>,
}

impl MockTurn {
    pub fn anthropic(response: Value) -> Self {
        Self::new(Reply::Anthropic(response))
    }
    pub fn openai(completion: Value) -> Self {
        Self::new(Reply::OpenAi(completion))
    }
    pub fn status(status: u16, headers: &[(&str, &str)], body: Value) -> Self {
        Self::new(Reply::Status {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_string(),
        })
    }
    fn new(reply: Reply) -> Self {
        MockTurn {
            reply,
            fragment: 0,
            chunk_bytes: 0,
            hold: None,
        }
    }
    pub fn fragments(mut self, chars: usize) -> Self {
        self.fragment = chars;
        self
    }
    pub fn chunks(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }
    pub fn hold_after_call(mut self, call: usize, until: &str) -> Self {
        self.hold = Some((call, until.to_string()));
        self
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
    pub at: Instant,
}

struct Shared {
    turns: Mutex<VecDeque<MockTurn>>,
    requests: Mutex<Vec<Recorded>>,
    log: EventLog,
}

/// The running server (stopped when dropped).
pub struct MockServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockServer {
    /// Starts serving `turns`, one per request, logging into `log`.
    pub async fn start(turns: Vec<MockTurn>, log: EventLog) -> MockServer {
        let shared = Arc::new(Shared {
            turns: Mutex::new(turns.into()),
            requests: Mutex::default(),
            log,
        });
        let app = Router::new()
            .route("/v1/messages", post(handle))
            .route("/v1/chat/completions", post(handle))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockServer { addr, shared, task }
    }

    /// `ANTHROPIC_BASE_URL` for this server.
    pub fn anthropic_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `OPENAI_BASE_URL` for this server.
    pub fn openai_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Turns not served yet.
    pub fn turns_left(&self) -> usize {
        self.shared.turns.lock().unwrap().len()
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let stream = body.get("stream") == Some(&Value::Bool(true));
    shared.requests.lock().unwrap().push(Recorded {
        path: uri.path().to_string(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body,
        at: Instant::now(),
    });
    let Some(turn) = shared.turns.lock().unwrap().pop_front() else {
        return plain(
            400,
            json!({"error":{"type":"mock","message":"no scripted turn left"}}).to_string(),
        );
    };
    match &turn.reply {
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let mut r = plain(*status, body.clone());
            for (k, v) in headers {
                r.headers_mut().insert(
                    k.parse::<axum::http::HeaderName>().unwrap(),
                    v.parse().unwrap(),
                );
            }
            r
        }
        Reply::Anthropic(doc) if !stream => plain(200, strip_raw(doc).to_string()),
        Reply::OpenAi(doc) if !stream => plain(200, doc.to_string()),
        Reply::Anthropic(doc) => sse(anthropic_events(doc, &turn), &turn, shared),
        Reply::OpenAi(doc) => sse(openai_events(doc, &turn), &turn, shared),
    }
}

fn plain(status: u16, body: String) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}

fn strip_raw(doc: &Value) -> Value {
    let mut doc = doc.clone();
    if let Some(blocks) = doc.get_mut("content").and_then(Value::as_array_mut) {
        for b in blocks {
            if let Some(obj) = b.as_object_mut() {
                obj.remove("raw_input");
            }
        }
    }
    doc
}

/// A piece of a streamed body.
enum Piece {
    Event(String),
    /// Tool call N is complete (from the client's point of view) once what came before is sent.
    CallComplete(usize),
    /// The next event is the last.
    Ending,
}

fn split(text: &str, chars: usize) -> Vec<String> {
    if chars == 0 || text.is_empty() {
        return vec![text.to_string()];
    }
    let chars_v: Vec<char> = text.chars().collect();
    chars_v.chunks(chars).map(|c| c.iter().collect()).collect()
}

fn named(kind: &str, data: Value) -> Piece {
    Piece::Event(format!("event: {kind}\ndata: {data}\n\n"))
}

fn anthropic_events(doc: &Value, turn: &MockTurn) -> Vec<Piece> {
    let mut out = vec![named(
        "message_start",
        json!({"type":"message_start","message":{"id":"msg_mock","type":"message","role":"assistant",
               "model":"mock","content":[],"stop_reason":null,"stop_sequence":null,
               "usage":{"input_tokens":1,"output_tokens":1}}}),
    )];
    let mut call = 0;
    for (i, block) in doc["content"].as_array().unwrap().iter().enumerate() {
        match block["type"].as_str().unwrap_or("") {
            "text" => {
                out.push(named("content_block_start", json!({"type":"content_block_start","index":i,"content_block":{"type":"text","text":""}})));
                for f in split(block["text"].as_str().unwrap_or(""), turn.fragment) {
                    out.push(named("content_block_delta", json!({"type":"content_block_delta","index":i,"delta":{"type":"text_delta","text":f}})));
                }
                out.push(named(
                    "content_block_stop",
                    json!({"type":"content_block_stop","index":i}),
                ));
            }
            "tool_use" => {
                out.push(named("content_block_start", json!({"type":"content_block_start","index":i,
                    "content_block":{"type":"tool_use","id":block["id"],"name":block["name"],"input":{}}})));
                let text = match block.get("raw_input") {
                    Some(Value::String(raw)) => raw.clone(),
                    _ => block["input"].to_string(),
                };
                for f in split(&text, turn.fragment) {
                    out.push(named("content_block_delta", json!({"type":"content_block_delta","index":i,"delta":{"type":"input_json_delta","partial_json":f}})));
                }
                out.push(named(
                    "content_block_stop",
                    json!({"type":"content_block_stop","index":i}),
                ));
                out.push(Piece::CallComplete(call));
                call += 1;
            }
            _ => {
                out.push(named(
                    "content_block_start",
                    json!({"type":"content_block_start","index":i,"content_block":block}),
                ));
                out.push(named(
                    "content_block_stop",
                    json!({"type":"content_block_stop","index":i}),
                ));
            }
        }
    }
    out.push(named("ping", json!({"type":"ping"})));
    out.push(named(
        "message_delta",
        json!({"type":"message_delta","delta":{"stop_reason":doc["stop_reason"],"stop_sequence":null},"usage":{"output_tokens":5}}),
    ));
    out.push(Piece::Ending);
    out.push(named("message_stop", json!({"type":"message_stop"})));
    out
}

fn chunk(delta: Value, finish: Value) -> Piece {
    Piece::Event(format!(
        "data: {}\n\n",
        json!({"id":"chatcmpl-mock","object":"chat.completion.chunk","model":"mock",
               "choices":[{"index":0,"delta":delta,"finish_reason":finish}]})
    ))
}

fn openai_events(doc: &Value, turn: &MockTurn) -> Vec<Piece> {
    let choice = &doc["choices"][0];
    let message = &choice["message"];
    let mut out = vec![chunk(json!({"role":"assistant","content":""}), Value::Null)];
    if let Some(text) = message["content"].as_str() {
        for f in split(text, turn.fragment) {
            out.push(chunk(json!({"content":f}), Value::Null));
        }
    }
    let calls = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (k, c) in calls.iter().enumerate() {
        out.push(chunk(
            json!({"tool_calls":[{"index":k,"id":c["id"],"type":"function","function":{"name":c["function"]["name"],"arguments":""}}]}),
            Value::Null,
        ));
        if k > 0 {
            out.push(Piece::CallComplete(k - 1));
        }
        for f in split(
            c["function"]["arguments"].as_str().unwrap_or(""),
            turn.fragment,
        ) {
            out.push(chunk(
                json!({"tool_calls":[{"index":k,"function":{"arguments":f}}]}),
                Value::Null,
            ));
        }
    }
    out.push(chunk(json!({}), choice["finish_reason"].clone()));
    if !calls.is_empty() {
        out.push(Piece::CallComplete(calls.len() - 1));
    }
    out.push(Piece::Ending);
    out.push(Piece::Event("data: [DONE]\n\n".into()));
    out
}

fn sse(pieces: Vec<Piece>, turn: &MockTurn, shared: Arc<Shared>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let chunk_bytes = turn.chunk_bytes;
    let hold = turn.hold.clone();
    tokio::spawn(async move {
        for piece in pieces {
            match piece {
                Piece::Event(text) => {
                    let bytes = text.into_bytes();
                    let size = if chunk_bytes == 0 {
                        bytes.len()
                    } else {
                        chunk_bytes
                    };
                    for c in bytes.chunks(size.max(1)) {
                        if tx.send(Bytes::copy_from_slice(c)).await.is_err() {
                            return;
                        }
                        tokio::task::yield_now().await;
                    }
                }
                Piece::CallComplete(k) => {
                    if let Some((call, until)) = &hold
                        && *call == k
                    {
                        let deadline = Instant::now() + Duration::from_secs(5);
                        while Instant::now() < deadline
                            && !shared.log.has_entry_starting_with(until)
                        {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                    }
                }
                Piece::Ending => shared.log.push("stream ended"),
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .unwrap()
}
