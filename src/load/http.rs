//! The load generator's HTTP side: one keep-alive HTTP/1.1 connection per simulated session to a
//! `switchboard serve` server, carrying that session's turns.
//!
//! A deliberately small client (request with `Content-Length`, answer framed by
//! `Content-Length`, which is how the server frames every non-streamed answer), so that what is
//! measured is the server and the network hop rather than a general-purpose client's machinery.
//! A turn goes out as the Anthropic assistant message a harness would send; the answer's
//! `tool_result` blocks come back as results (their error code read from the `Error [code]:`
//! prefix), so the same exactly-once, in-order check applies as in-process. A refused request
//! (`overloaded`, a closed connection…) answers every call of its turn with an error, so the run
//! goes on and the table shows it.

use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult};

/// Largest answer head accepted.
const MAX_HEAD: usize = 64 * 1024;

/// Where a server is and how to authenticate.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `HOST:PORT`.
    pub authority: String,
    /// The bearer token, if the server wants one.
    pub token: Option<String>,
}

impl Endpoint {
    /// Parses `http://HOST:PORT` (a trailing `/` is allowed; `https` is not supported).
    pub fn parse(url: &str, token: Option<String>) -> Result<Endpoint, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--target must be http://HOST:PORT, not {url:?}"))?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("--target must be http://HOST:PORT, not {url:?}"));
        }
        Ok(Endpoint {
            authority: authority.to_string(),
            token,
        })
    }
}

/// One keep-alive connection.
#[derive(Debug)]
pub struct Connection {
    endpoint: Arc<Endpoint>,
    stream: Option<TcpStream>,
    out: Vec<u8>,
    buf: Vec<u8>,
}

impl Connection {
    /// A connection to `endpoint`, opened on first use (and again after a failure).
    pub fn new(endpoint: Arc<Endpoint>) -> Self {
        Connection {
            endpoint,
            stream: None,
            out: Vec::with_capacity(2048),
            buf: Vec::with_capacity(4096),
        }
    }

    /// Sends one request and reads its answer: `(status, body)`.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), String> {
        let result = self.exchange(method, path, body).await;
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), String> {
        if self.stream.is_none() {
            let tcp = TcpStream::connect(&self.endpoint.authority)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", self.endpoint.authority))?;
            let _ = tcp.set_nodelay(true);
            self.stream = Some(tcp);
            self.buf.clear();
        }
        self.out.clear();
        self.out.extend_from_slice(method.as_bytes());
        self.out.push(b' ');
        self.out.extend_from_slice(path.as_bytes());
        self.out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        self.out
            .extend_from_slice(self.endpoint.authority.as_bytes());
        if let Some(token) = &self.endpoint.token {
            self.out.extend_from_slice(b"\r\nauthorization: Bearer ");
            self.out.extend_from_slice(token.as_bytes());
        }
        self.out
            .extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
        self.out
            .extend_from_slice(body.len().to_string().as_bytes());
        self.out.extend_from_slice(b"\r\n\r\n");
        self.out.extend_from_slice(body);
        let Some(stream) = self.stream.as_mut() else {
            return Err("not connected".into());
        };
        stream
            .write_all(&self.out)
            .await
            .map_err(|e| format!("cannot send: {e}"))?;
        // The head.
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if self.buf.len() > MAX_HEAD {
                return Err("the answer's head is too large".into());
            }
            read_more(stream, &mut self.buf).await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end])
            .map_err(|_| "the answer's head is not UTF-8".to_string())?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| "no status in the answer".to_string())?;
        let length = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .ok_or_else(|| "the answer has no content-length".to_string())?;
        while self.buf.len() < head_end + length {
            read_more(stream, &mut self.buf).await?;
        }
        let body = self.buf[head_end..head_end + length].to_vec();
        self.buf.drain(..head_end + length);
        Ok((status, body))
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), String> {
    let mut chunk = [0u8; 16 * 1024];
    let n = stream
        .read(&mut chunk)
        .await
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    if n == 0 {
        return Err("the server closed the connection".into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// One session of the server, reached over its own connection.
#[derive(Debug)]
pub struct HttpSession {
    conn: Connection,
    dispatch_path: String,
    session_path: String,
    body: Vec<u8>,
}

impl HttpSession {
    /// Opens a session on the server (a fresh workspace) over a new connection.
    pub async fn open(endpoint: Arc<Endpoint>) -> Result<HttpSession, String> {
        let mut conn = Connection::new(endpoint);
        let (status, body) = conn.request("POST", "/v1/sessions", b"{}").await?;
        if status != 201 {
            return Err(format!(
                "POST /v1/sessions answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let doc: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("POST /v1/sessions answered no JSON: {e}"))?;
        let id = doc["session_id"]
            .as_str()
            .ok_or("POST /v1/sessions answered no session_id")?;
        Ok(HttpSession {
            conn,
            dispatch_path: format!("/v1/sessions/{id}/dispatch"),
            session_path: format!("/v1/sessions/{id}"),
            body: Vec::with_capacity(2048),
        })
    }

    /// Dispatches a turn as an Anthropic assistant message; one result per call, in the
    /// answer's order (an HTTP failure answers every call with an error).
    pub async fn dispatch(&mut self, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
        self.body.clear();
        let message = AssistantMessage {
            role: "assistant",
            content: calls
                .iter()
                .map(|c| ToolUse {
                    kind: "tool_use",
                    id: &c.id,
                    name: &c.name,
                    input: &c.arguments,
                })
                .collect(),
        };
        // Writing to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.body, &message);
        let body = std::mem::take(&mut self.body);
        let answer = self.conn.request("POST", &self.dispatch_path, &body).await;
        self.body = body;
        match answer {
            Ok((200, bytes)) => decode(&calls, &bytes),
            Ok((status, bytes)) => {
                let (code, detail) = http_error(status, &bytes);
                answer_all(&calls, code, &detail)
            }
            Err(e) => answer_all(&calls, ErrorCode::ExecutionError, &e),
        }
    }

    /// Deletes the session (best effort).
    pub async fn close(mut self) {
        let path = std::mem::take(&mut self.session_path);
        let _ = self.conn.request("DELETE", &path, b"").await;
    }
}

#[derive(serde::Serialize)]
struct AssistantMessage<'a> {
    role: &'static str,
    content: Vec<ToolUse<'a>>,
}

#[derive(serde::Serialize)]
struct ToolUse<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    name: &'a str,
    input: &'a Value,
}

#[derive(serde::Deserialize)]
struct UserMessage<'a> {
    #[serde(borrow)]
    content: Vec<ToolResultBlock<'a>>,
}

#[derive(serde::Deserialize)]
struct ToolResultBlock<'a> {
    #[serde(borrow)]
    tool_use_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    content: std::borrow::Cow<'a, str>,
    #[serde(default)]
    is_error: bool,
}

/// The results of a 200 answer.
fn decode(calls: &[ToolCall], bytes: &[u8]) -> Vec<ToolDispatchResult> {
    let Ok(answer) = serde_json::from_slice::<UserMessage<'_>>(bytes) else {
        return answer_all(
            calls,
            ErrorCode::ExecutionError,
            "the answer is not a tool_result message",
        );
    };
    answer
        .content
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            // The call's own id when the answer names it (the common case): no new string.
            let id = match calls.get(i) {
                Some(c) if *c.id == *b.tool_use_id => Arc::clone(&c.id),
                _ => Arc::from(&*b.tool_use_id),
            };
            let name = calls
                .get(i)
                .map_or_else(|| Arc::from(""), |c| Arc::clone(&c.name));
            let error = b.is_error.then(|| {
                b.content
                    .strip_prefix("Error [")
                    .and_then(|rest| rest.split_once(']'))
                    .and_then(|(code, _)| ErrorCode::parse(code))
                    .unwrap_or(ErrorCode::ExecutionError)
            });
            ToolDispatchResult {
                tool_use_id: id,
                tool_name: name,
                content: b.content.into_owned(),
                blocks: None,
                error,
                timing: Timing::default(),
            }
        })
        .collect()
}

fn http_error(status: u16, bytes: &[u8]) -> (ErrorCode, String) {
    let text = String::from_utf8_lossy(bytes);
    let code = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string));
    let engine_code = match code.as_deref() {
        Some("overloaded") => ErrorCode::Overloaded,
        Some("shutting_down") => ErrorCode::Cancelled,
        _ => ErrorCode::ExecutionError,
    };
    (engine_code, format!("HTTP {status}: {text}"))
}

fn answer_all(calls: &[ToolCall], code: ErrorCode, detail: &str) -> Vec<ToolDispatchResult> {
    let ids = calls
        .iter()
        .map(|c| (Arc::clone(&c.id), Arc::clone(&c.name)));
    ToolDispatchResult::all_failed(ids, code, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_host_and_port_is_a_target() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:7420/", None)
                .unwrap()
                .authority,
            "127.0.0.1:7420"
        );
        for bad in ["https://h:1", "127.0.0.1:1", "http://", "http://h:1/v1"] {
            assert!(Endpoint::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn answers_decode_with_their_error_codes() {
        let calls = vec![
            ToolCall::new("a", "noop", serde_json::json!({})),
            ToolCall::new("b", "nope", serde_json::json!({})),
        ];
        let body = br#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"},{"type":"tool_result","tool_use_id":"b","content":"Error [unknown_tool]: tool is not registered: nope","is_error":true}]}"#;
        let r = decode(&calls, body);
        assert_eq!(r.len(), 2);
        assert_eq!((&*r[0].tool_use_id, r[0].error), ("a", None));
        assert_eq!(r[1].error, Some(ErrorCode::UnknownTool));
        let (code, _) = http_error(503, br#"{"error":{"code":"overloaded","message":"m"}}"#);
        assert_eq!(code, ErrorCode::Overloaded);
    }
}
