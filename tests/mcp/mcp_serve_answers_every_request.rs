//! `switchboard mcp-serve` answers every request, also those it cannot read, with the JSON-RPC
//! error code that says why and the request's id whenever the line shows one: params that are
//! not an object (-32602), arguments nested 100,000 levels deep (-32602), invalid UTF-8
//! (-32700), a 20 MB argument over the 16 MiB message limit (-32600), text that is not JSON
//! (-32700), a bad `jsonrpc` or id (-32600), an unknown method (-32601). Afterwards it still
//! serves calls. A raw JSON-RPC client over stdio against the real binary; each answer is
//! awaited under a guard, so a request left unanswered fails the test.

use crate::common;

use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

/// How long an answer may take before the request counts as unanswered (a guard against a
/// hang, not a measurement).
const ANSWER_GUARD: Duration = Duration::from_secs(30);

struct Serve {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Serve {
    fn start(ws: &std::path::Path) -> Serve {
        let mut child = common::cli::switchboard()
            .args(["mcp-serve", "--sandbox", "best-effort", "--workspace"])
            .arg(ws)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mcp-serve starts");
        let lines = common::cli::lines_of(child.stdout.take().unwrap());
        let mut serve = Serve {
            stdin: child.stdin.take(),
            child,
            lines,
        };
        let init = serve.ask(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "every-request-test", "version": "0"}}})
            .to_string()
            .as_bytes(),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        serve.write(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        serve
    }

    fn write(&mut self, line: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Writes one line and returns the next message the server writes.
    fn ask(&mut self, line: &[u8]) -> Value {
        self.write(line);
        let answer = self
            .lines
            .recv_timeout(ANSWER_GUARD)
            .unwrap_or_else(|e| panic!("no answer within {ANSWER_GUARD:?} ({e})"));
        serde_json::from_str(&answer).expect("a JSON line")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// Asserts that `answer` is an error with `code`, `id` (`Value::Null`: none), and a message
/// containing `says`.
fn assert_error(answer: &Value, code: i64, id: Value, says: &str) {
    assert_eq!(answer["error"]["code"], code, "{answer}");
    assert_eq!(
        answer.get("id").cloned().unwrap_or(Value::Null),
        id,
        "{answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{says:?} not in {answer}");
}

#[test]
fn every_request_gets_an_answer_with_the_right_code_and_its_id() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "x").unwrap();
    let mut serve = Serve::start(ws.path());

    let answer = serve.ask(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}"#);
    assert_error(&answer, -32602, json!(1), "invalid params for tools/call");
    let answer = serve.ask(br#"{"jsonrpc":"2.0","id":"s2","method":"tools/call","params":"x"}"#);
    assert_error(
        &answer,
        -32602,
        json!("s2"),
        "invalid params for tools/call",
    );
    let answer = serve.ask(
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"glob","arguments":[1]}}"#,
    );
    assert_error(&answer, -32602, json!(3), "invalid params for tools/call");

    let mut deep = br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"glob","arguments":{"pattern":"#.to_vec();
    deep.extend(std::iter::repeat_n(b'[', 100_000));
    deep.extend(std::iter::repeat_n(b']', 100_000));
    deep.extend_from_slice(b"}}}");
    assert_error(
        &serve.ask(&deep),
        -32602,
        json!(4),
        "nested deeper than 128 levels",
    );

    let utf8 = b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"glob\",\"arguments\":{\"pattern\":\"\xff\xfe\"}}}";
    assert_error(&serve.ask(utf8), -32700, json!(5), "not valid UTF-8");

    let mut big = br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"glob","arguments":{"pattern":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 20 * 1024 * 1024));
    big.extend_from_slice(b"\"}}}");
    assert_error(&serve.ask(&big), -32600, json!(6), "over the 16 MiB limit");

    let answer = serve.ask(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"#);
    assert_error(&answer, -32700, json!(7), "parse error");
    assert_error(&serve.ask(b"hello"), -32700, Value::Null, "parse error");
    let answer = serve.ask(br#"{"jsonrpc":"1.0","id":8,"method":"tools/list"}"#);
    assert_error(&answer, -32600, json!(8), "\"jsonrpc\" must be \"2.0\"");
    let answer = serve.ask(br#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#);
    assert_error(
        &answer,
        -32600,
        Value::Null,
        "the id must be a string or an integer",
    );
    // MCP forbids a null id (JSON-RPC only discourages it); such a request would otherwise pass
    // for a notification and never be answered, leaving a client without a timeout waiting.
    for line in [
        &br#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#[..],
        br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
        br#"{"jsonrpc":"2.0","id":null,"method":"no/such/notification"}"#,
    ] {
        assert_error(
            &serve.ask(line),
            -32600,
            Value::Null,
            "the id must be a string or an integer",
        );
    }
    let answer = serve.ask(br#"{"jsonrpc":"2.0","id":9,"method":"no/such","params":{}}"#);
    assert_error(&answer, -32601, json!(9), "no/such");

    // Still serving.
    let answer = serve.ask(
        br#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"glob","arguments":{"pattern":"*.txt"}}}"#,
    );
    assert_eq!(answer["id"], 10, "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("a.txt")),
        "{answer}"
    );
}
