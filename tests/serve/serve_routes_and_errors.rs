//! `switchboard serve` over real HTTP on 127.0.0.1:0: the bearer token, every route and every
//! error code with its status and JSON shape, the catalog, and the OpenAPI description checked
//! against the router both ways.

use crate::serve_common;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use serve_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_needs_the_right_bearer_token_and_health_does_not() {
    let s = start(|_| {}).await;
    let c = client();
    let url = s.url("/v1/tools");
    let missing = send(c.get(&url)).await;
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (401, "unauthorized")
    );
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    let wrong = send(c.get(&url).bearer_auth("test-token-012345678")).await;
    assert_eq!((wrong.status, wrong.code().as_str()), (401, "unauthorized"));
    let longer = send(c.get(&url).bearer_auth(format!("{TOKEN}0"))).await;
    assert_eq!(longer.status, 401);
    let basic = send(
        c.get(&url)
            .header("authorization", format!("Basic {TOKEN}")),
    )
    .await;
    assert_eq!(basic.status, 401);
    let right = send(c.get(&url).bearer_auth(TOKEN)).await;
    assert_eq!(right.status, 200, "{}", right.text);
    // Refused before anything else: no session is created without the token.
    let create = send(c.post(s.url("/v1/sessions")).body("{}")).await;
    assert_eq!(create.status, 401);
    assert_eq!(workspace_count(&s.root.path().join("ws")), 0);
    let health = send(c.get(s.url("/healthz"))).await;
    assert_eq!(health.status, 200);
    let health = health.json();
    assert_eq!(health["status"], "ok");
    // The sandbox in force is shown (issue: mode, Landlock ABI).
    assert!(health["sandbox"]["mode"].is_string(), "{health}");
    assert!(health["sandbox"]["landlock_abi"].is_u64(), "{health}");
    let metrics = send(c.get(s.url("/metrics"))).await;
    assert_eq!(metrics.status, 200);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_dispatches_exactly_what_the_cli_prints() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, Some("proj")).await;
    assert_eq!(
        std::path::Path::new(&ws),
        s.root.path().join("ws/proj").canonicalize().unwrap()
    );
    let body = turn(&[
        ("a", "write_file", json!({"path": "x.txt", "content": "hi"})),
        ("b", "read_file", json!({"path": "x.txt"})),
        ("c", "nope", json!({})),
    ]);
    let a = dispatch(&c, &s, &id, &body).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.headers["content-type"], "application/json");
    // What `switchboard dispatch` prints for the same document in a copy of the workspace.
    let cli_ws = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["dispatch", "--workspace"])
        .arg(cli_ws.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(body.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert_eq!(a.text, String::from_utf8(out.stdout).unwrap().trim_end());
    assert_eq!(
        std::fs::read_to_string(format!("{ws}/x.txt")).unwrap(),
        "hi"
    );

    // OpenAI shape in and out.
    let openai = json!({"role": "assistant", "tool_calls": [
        {"id": "o1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"x.txt\"}"}},
        {"id": "o2", "type": "function", "function": {"name": "read_file", "arguments": "{not json"}}
    ]});
    let url = s.url(&format!("/v1/sessions/{id}/dispatch?format=openai"));
    let a = post(&c, &url, &openai.to_string()).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let msgs = a.json();
    assert_eq!(
        msgs[0],
        json!({"role": "tool", "tool_call_id": "o1", "content": "hi"})
    );
    assert!(
        msgs[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [invalid_arguments]")
    );

    let info = get(&c, &s.url(&format!("/v1/sessions/{id}"))).await;
    assert_eq!(
        info.json(),
        json!({"session_id": id, "workspace": ws, "turns": 2, "calls": 5, "in_flight": 0})
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_has_its_status_and_shape() {
    let s = start(|c| {
        c.max_sessions = 2;
        c.max_body = 1024;
    })
    .await;
    let c = client();
    let (id, _) = session(&c, &s, None).await;
    let cases = [
        (
            post(
                &c,
                &s.url(&format!("/v1/sessions/{id}/dispatch")),
                "not json",
            )
            .await,
            400,
            "bad_request",
        ),
        (
            post(
                &c,
                &s.url(&format!("/v1/sessions/{id}/dispatch")),
                r#"{"foo": 1}"#,
            )
            .await,
            400,
            "bad_request",
        ),
        (
            post(
                &c,
                &s.url(&format!("/v1/sessions/{id}/dispatch?format=xml")),
                "{}",
            )
            .await,
            400,
            "bad_request",
        ),
        (
            post(
                &c,
                &s.url(&format!("/v1/sessions/{id}/dispatch")),
                &"x".repeat(2000),
            )
            .await,
            413,
            "payload_too_large",
        ),
        (
            post(&c, &s.url("/v1/sessions/nope/dispatch"), "{}").await,
            404,
            "unknown_session",
        ),
        (
            post(&c, &s.url("/v1/sessions/nope/cancel"), "").await,
            404,
            "unknown_session",
        ),
        (
            get(&c, &s.url("/v1/sessions/nope")).await,
            404,
            "unknown_session",
        ),
        (
            get(&c, &s.url("/v1/sessions/%FF")).await,
            400,
            "bad_request",
        ),
        (
            post(&c, &s.url("/v1/sessions/%FF/dispatch"), "{}").await,
            400,
            "bad_request",
        ),
        (
            send(c.delete(s.url("/v1/sessions/nope")).bearer_auth(TOKEN)).await,
            404,
            "unknown_session",
        ),
        (
            post(&c, &s.url("/v1/sessions"), "[1]").await,
            400,
            "bad_request",
        ),
        (
            post(&c, &s.url("/v1/sessions"), r#"{"workspace": 3}"#).await,
            400,
            "bad_request",
        ),
        (
            get(&c, &s.url("/v1/tools?format=yaml")).await,
            400,
            "bad_request",
        ),
        (get(&c, &s.url("/v1/nothing")).await, 404, "not_found"),
        (
            send(c.put(s.url("/v1/tools")).bearer_auth(TOKEN)).await,
            405,
            "method_not_allowed",
        ),
    ];
    for (answer, status, code) in cases {
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (status, code),
            "{}",
            answer.text
        );
        assert!(
            answer.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert_eq!(answer.headers["content-type"], "application/json");
    }
    // A body without Content-Length (chunked) is bounded too.
    let chunked = raw_chunked_post(&s, &format!("/v1/sessions/{id}/dispatch"), 40, 100).await;
    assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
    assert!(chunked.contains("payload_too_large"), "{chunked}");

    let _second = session(&c, &s, Some("w")).await;
    let third = post(&c, &s.url("/v1/sessions"), "{}").await;
    assert_eq!(
        (third.status, third.code().as_str()),
        (429, "too_many_sessions")
    );
    // Deleting one frees a place; later requests for it are 404.
    let deleted = send(
        c.delete(s.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(deleted.status, 200);
    let gone = dispatch(&c, &s, &id, &turn(&[])).await;
    assert_eq!(
        (gone.status, gone.code().as_str()),
        (404, "unknown_session")
    );
    session(&c, &s, None).await;
    s.shutdown().await.unwrap();
}

/// Sends `chunks` chunks of `size` bytes with `Transfer-Encoding: chunked` (no length given)
/// and returns the raw answer.
async fn raw_chunked_post(s: &TestServer, path: &str, chunks: usize, size: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..chunks {
        let chunk = format!("{size:x}\r\n{}\r\n", "y".repeat(size));
        if tcp.write_all(chunk.as_bytes()).await.is_err() {
            break; // the server answered and closed early
        }
    }
    let _ = tcp.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_and_the_openapi_file_are_served() {
    let s = start(|_| {}).await;
    let c = client();
    let anthropic = get(&c, &s.url("/v1/tools")).await.json();
    let names: BTreeSet<_> = anthropic
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["bash", "edit_file", "glob", "read_file", "write_file"]
            .map(String::from)
            .into()
    );
    assert!(anthropic[0]["input_schema"].is_object());
    let openai = get(&c, &s.url("/v1/tools?format=openai")).await.json();
    assert_eq!(openai[0]["type"], "function");
    let mcp = get(&c, &s.url("/v1/tools?format=mcp")).await.json();
    assert!(mcp[0]["inputSchema"].is_object());
    let spec = get(&c, &s.url("/v1/openapi.json")).await;
    assert_eq!(spec.status, 200);
    assert_eq!(spec.text, switchboard::serve::OPENAPI_JSON);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_tools_are_registered_only_when_asked() {
    let s = start(|c| c.load_tools = true).await;
    let c = client();
    let names: Vec<String> = get(&c, &s.url("/v1/tools"))
        .await
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    for tool in [
        "noop",
        "noop_serial",
        "sleep",
        "sleep_serial",
        "cpu",
        "cpu_serial",
        "bash",
    ] {
        assert!(
            names.iter().any(|n| n == tool),
            "{tool} missing from {names:?}"
        );
    }
    s.shutdown().await.unwrap();
}

/// Every route of the router is described in openapi.json, and every path and method there is
/// a route: each one is also called and answered by its handler, not by the fallbacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_description_and_the_router_list_the_same_routes() {
    let spec: Value = serde_json::from_str(switchboard::serve::OPENAPI_JSON).unwrap();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut described = BTreeSet::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if [
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                described.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let routed: BTreeSet<_> = switchboard::serve::route_table()
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect();
    assert_eq!(described, routed);

    let s = start(|_| {}).await;
    let c = client();
    let (id, _) = session(&c, &s, None).await;
    for (method, path) in &routed {
        if method == "DELETE" || path == "/v1/admin/drain" {
            continue; // called last, below
        }
        let url = s.url(
            &path
                .replace("{id}", &id)
                .replace("{turn_id}", "t1")
                .replace("{call_id}", "c1"),
        );
        let request = c
            .request(method.parse().unwrap(), url)
            .bearer_auth(TOKEN)
            .body(if path.ends_with("dispatch") {
                turn(&[])
            } else if path.contains("{approval_id}") {
                r#"{"allow": true}"#.to_string()
            } else if path.ends_with("{call_id}/progress") {
                r#"{"text": "x"}"#.to_string()
            } else if path.contains("{call_id}") {
                r#"{"content": "x"}"#.to_string()
            } else {
                String::new()
            });
        let a = send(request).await;
        if path.contains("{approval_id}") {
            // The handler's own answer: no approval of that id is waiting.
            assert_eq!(
                (a.status, a.code()),
                (404, "unknown_approval".into()),
                "{path}"
            );
            continue;
        }
        if path.contains("{call_id}") {
            // The handler's own answer: the session has no client call of that id.
            assert_eq!((a.status, a.code()), (404, "unknown_call".into()), "{path}");
            continue;
        }
        assert!(
            (200..300).contains(&a.status),
            "{method} {path}: {} {}",
            a.status,
            a.text
        );
    }
    let a = send(
        c.delete(s.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(a.status, 200);
    // Drain last: a drained server opens no new session.
    let drained = send(c.post(s.url("/v1/admin/drain")).bearer_auth(TOKEN)).await;
    assert_eq!(drained.status, 200, "{}", drained.text);
    assert_eq!(drained.json()["draining"], true);
    let refused = send(c.post(s.url("/v1/sessions")).bearer_auth(TOKEN).body("{}")).await;
    assert_eq!(
        (refused.status, refused.code()),
        (503, "shutting_down".into())
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_refused_before_its_body_is_read_says_the_connection_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start(|_| {}).await;
    let c = client();
    let (id, _) = session(&c, &s, None).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let body = turn(&[("t1", "glob", serde_json::json!({"pattern": "*"}))]);
    let raw = |path: String| {
        let (addr, body) = (addr.clone(), body.clone());
        async move {
            let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            tcp.write_all(head.as_bytes()).await.unwrap();
            let mut answer = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut answer))
                .await
                .unwrap()
                .unwrap();
            String::from_utf8_lossy(&answer[..n]).to_lowercase()
        }
    };
    // Refused before the body is read (an unknown session): the client is told to reconnect.
    let refused = raw("/v1/sessions/snosuch/dispatch".to_string()).await;
    assert!(refused.starts_with("http/1.1 4"), "{refused}");
    assert!(refused.contains("connection: close"), "{refused}");
    // Answered after reading it: the connection stays open for the next request.
    let answered = raw(format!("/v1/sessions/{id}/dispatch")).await;
    assert!(answered.starts_with("http/1.1 200"), "{answered}");
    assert!(!answered.contains("connection: close"), "{answered}");
    s.shutdown().await.unwrap();
}
