//! `switchboard serve` over real HTTP on 127.0.0.1:0: auth, every route and error code,
//! workspaces, streaming, cancellation, disconnects, idle expiry, overload, shutdown, many
//! sessions, and the OpenAPI description against the router.

mod serve_common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

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
    assert_eq!(
        std::fs::read_dir(s.root.path().join("ws")).unwrap().count(),
        0
    );
    let health = send(c.get(s.url("/healthz"))).await;
    assert_eq!(
        (health.status, health.json()),
        (200, json!({"status": "ok"}))
    );
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
async fn bad_workspace_names_are_refused_and_create_nothing() {
    let s = start(|_| {}).await;
    let c = client();
    let long = "n".repeat(200);
    for name in [
        "..",
        ".",
        "a/b",
        "",
        long.as_str(),
        "../escape",
        "/tmp",
        "a\\b",
        "ä",
    ] {
        let a = post(
            &c,
            &s.url("/v1/sessions"),
            &json!({"workspace": name}).to_string(),
        )
        .await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{name:?}: {}",
            a.text
        );
    }
    assert_eq!(
        std::fs::read_dir(s.root.path().join("ws")).unwrap().count(),
        0
    );
    assert!(!s.root.path().join("escape").exists());
    // A name that exists as a symlink (planted to lead out of the root) or a file is refused.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), s.root.path().join("ws/linked")).unwrap();
    std::fs::write(s.root.path().join("ws/plain"), "x").unwrap();
    for name in ["linked", "plain"] {
        let a = post(
            &c,
            &s.url("/v1/sessions"),
            &json!({"workspace": name}).to_string(),
        )
        .await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{name}: {}",
            a.text
        );
    }
    let ok = "n".repeat(128);
    session(&c, &s, Some(&ok)).await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_cannot_reach_each_others_workspace() {
    let s = start(|_| {}).await;
    let c = client();
    let (a, a_ws) = session(&c, &s, Some("alpha")).await;
    let (b, b_ws) = session(&c, &s, None).await;
    assert_ne!(a_ws, b_ws);
    let w = dispatch(
        &c,
        &s,
        &a,
        &turn(&[(
            "w",
            "write_file",
            json!({"path": "secret.txt", "content": "only alpha"}),
        )]),
    )
    .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let probes = turn(&[
        ("r1", "read_file", json!({"path": "../alpha/secret.txt"})),
        (
            "r2",
            "read_file",
            json!({"path": format!("{a_ws}/secret.txt")}),
        ),
        (
            "r3",
            "write_file",
            json!({"path": "../alpha/secret.txt", "content": "b was here"}),
        ),
        (
            "r4",
            "edit_file",
            json!({"path": format!("{a_ws}/secret.txt"), "old_text": "only", "new_text": "not only"}),
        ),
        ("r5", "glob", json!({"pattern": "**/secret.txt"})),
    ]);
    let answer = dispatch(&c, &s, &b, &probes).await.json();
    let blocks = answer["content"].as_array().unwrap();
    for block in &blocks[..4] {
        let text = block["content"].as_str().unwrap();
        assert!(text.starts_with("Error [permission_denied]"), "{block}");
        assert_eq!(block["is_error"], true);
    }
    assert_eq!(blocks[4]["content"], "(no matches)");
    assert_eq!(
        std::fs::read_to_string(format!("{a_ws}/secret.txt")).unwrap(),
        "only alpha"
    );
    // A second session naming the same workspace shares it (documented).
    let (a2, _) = session(&c, &s, Some("alpha")).await;
    let shared = dispatch(
        &c,
        &s,
        &a2,
        &turn(&[("r", "read_file", json!({"path": "secret.txt"}))]),
    )
    .await;
    assert_eq!(shared.json()["content"][0]["content"], "only alpha");
    s.shutdown().await.unwrap();
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
    assert_eq!(spec.text, switchboard::serve::routes::OPENAPI_JSON);
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
    let spec: Value = serde_json::from_str(switchboard::serve::routes::OPENAPI_JSON).unwrap();
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
    let routed: BTreeSet<_> = switchboard::serve::routes::route_table()
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect();
    assert_eq!(described, routed);

    let s = start(|_| {}).await;
    let c = client();
    let (id, _) = session(&c, &s, None).await;
    for (method, path) in &routed {
        if method == "DELETE" {
            continue; // called last, below
        }
        let url = s.url(&path.replace("{id}", &id));
        let request = c
            .request(method.parse().unwrap(), url)
            .bearer_auth(TOKEN)
            .body(if path.ends_with("dispatch") {
                turn(&[])
            } else {
                String::new()
            });
        let a = send(request).await;
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
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_sends_each_result_once_as_it_finishes_then_the_whole_answer() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    std::fs::write(format!("{ws}/x.txt"), "x").unwrap();
    let body = turn(&[
        ("r", "read_file", json!({"path": "x.txt"})),
        ("b", "bash", json!({"command": "sleep 0.2; echo slept"})),
        ("g", "glob", json!({"pattern": "*.txt"})),
        ("u", "no_such_tool", json!({})),
    ]);
    let url = s.url(&format!("/v1/sessions/{id}/dispatch?stream=true"));
    let streamed = post(&c, &url, &body).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    assert!(
        streamed.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = events(&streamed.text);
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last.0, "done");
    let done: Value = serde_json::from_str(&last.1).unwrap();
    let order: Vec<u64> = rest
        .iter()
        .map(|(event, data)| {
            assert_eq!(event, "result");
            let v: Value = serde_json::from_str(data).unwrap();
            let i = v["index"].as_u64().unwrap();
            assert_eq!(
                v["result"], done["content"][i as usize],
                "result {i} differs from done"
            );
            i
        })
        .collect();
    // The refused call is answered first (before anything runs), then the stages in order.
    assert_eq!(order, [3, 0, 1, 2]);
    assert_eq!(done["content"][1]["content"], "slept");
    // `done` is byte for byte the non-streaming answer (asked with Accept this time).
    let plain = dispatch(&c, &s, &id, &body).await;
    assert_eq!(plain.text, last.1);
    let by_accept = send(
        c.post(s.url(&format!("/v1/sessions/{id}/dispatch")))
            .bearer_auth(TOKEN)
            .header("accept", "text/event-stream")
            .body(body.clone()),
    )
    .await;
    assert_eq!(events_of(&by_accept.text).last().unwrap().1, plain.text);
    // Bad input to a streamed request is a plain 400, not a stream.
    let bad = post(&c, &url, "nope").await;
    assert_eq!((bad.status, bad.code().as_str()), (400, "bad_request"));
    s.shutdown().await.unwrap();
}

fn events_of(text: &str) -> Vec<(String, String)> {
    events(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answers_a_running_sleep_within_two_seconds_and_the_session_goes_on() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let body = turn(&[
        (
            "b",
            "bash",
            json!({"command": "touch started; sleep 30; echo never"}),
        ),
        (
            "w",
            "write_file",
            json!({"path": "after.txt", "content": "no"}),
        ),
    ]);
    let running = {
        let (c, url) = (c.clone(), s.url(&format!("/v1/sessions/{id}/dispatch")));
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let started = std::path::PathBuf::from(format!("{ws}/started"));
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = started.clone();
            async move { p.exists() }
        })
        .await
    );
    let t0 = Instant::now();
    let cancel = post(&c, &s.url(&format!("/v1/sessions/{id}/cancel")), "").await;
    assert_eq!(cancel.status, 200);
    let answer = running.await.unwrap();
    let elapsed = t0.elapsed();
    assert!(elapsed < Duration::from_secs(2), "cancel took {elapsed:?}");
    assert_eq!(answer.status, 200);
    let blocks = answer.json()["content"].as_array().unwrap().clone();
    assert_eq!(blocks.len(), 2);
    for b in &blocks {
        assert!(
            b["content"]
                .as_str()
                .unwrap()
                .starts_with("Error [cancelled]"),
            "{b}"
        );
    }
    assert!(!std::path::Path::new(&format!("{ws}/after.txt")).exists());
    // The session is still usable: cancel affects turns in flight, not later ones.
    let later = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("e", "bash", json!({"command": "echo again"}))]),
    )
    .await;
    assert_eq!(later.json()["content"][0]["content"], "again");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_cancels_the_running_turn_which_still_gets_its_answer() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let body = turn(&[("b", "bash", json!({"command": "touch started; sleep 30"}))]);
    let running = {
        let (c, url) = (c.clone(), s.url(&format!("/v1/sessions/{id}/dispatch")));
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let started = std::path::PathBuf::from(format!("{ws}/started"));
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = started.clone();
            async move { p.exists() }
        })
        .await
    );
    let deleted = send(
        c.delete(s.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(deleted.status, 200);
    let answer = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status, 200);
    assert!(
        answer.json()["content"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [cancelled]")
    );
    assert_eq!(
        get(&c, &s.url(&format!("/v1/sessions/{id}"))).await.status,
        404
    );
    assert!(std::path::Path::new(&ws).exists(), "the workspace stays");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_leaves_its_turn_running_and_nothing_behind() {
    let s = start(|c| c.max_requests = 1).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let (other, _) = session(&c, &s, None).await;
    let body = turn(&[
        ("a", "write_file", json!({"path": "a.txt", "content": "a"})),
        ("b", "bash", json!({"command": "sleep 0.5; echo b > b.txt"})),
        ("c", "write_file", json!({"path": "c.txt", "content": "c"})),
    ]);
    let mut response = c
        .post(s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    let first = response.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("event: result"));
    drop(response); // disconnect after the first result
    // The turn still runs to its end…
    let c_txt = std::path::PathBuf::from(format!("{ws}/c.txt"));
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = c_txt.clone();
            async move { p.exists() }
        })
        .await
    );
    assert!(std::path::Path::new(&format!("{ws}/b.txt")).exists());
    // …and leaves nothing held: the only request permit is free again, the session is idle.
    let info_url = s.url(&format!("/v1/sessions/{id}"));
    assert!(
        eventually(Duration::from_secs(10), || {
            let (c, url) = (c.clone(), info_url.clone());
            async move { get(&c, &url).await.json()["in_flight"] == 0 }
        })
        .await
    );
    let next = dispatch(
        &c,
        &s,
        &other,
        &turn(&[("x", "glob", json!({"pattern": "*"}))]),
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text);
    let again = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("r", "read_file", json!({"path": "c.txt"}))]),
    )
    .await;
    assert_eq!(again.json()["content"][0]["content"], "c");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_closed_and_their_workspaces_stay() {
    let s = start(|c| c.idle_timeout = Duration::from_millis(300)).await;
    let c = client();
    let (id, ws) = session(&c, &s, Some("keep")).await;
    let w = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("w", "write_file", json!({"path": "f", "content": "kept"}))]),
    )
    .await;
    assert_eq!(w.status, 200);
    let url = s.url(&format!("/v1/sessions/{id}"));
    let mut closed = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if get(&c, &url).await.status == 404 {
            closed = true;
            break;
        }
    }
    assert!(closed, "the idle session was never closed");
    assert_eq!(std::fs::read_to_string(format!("{ws}/f")).unwrap(), "kept");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_requests_in_flight_bound_the_answer_is_overloaded_and_nothing_runs() {
    let s = start(|c| c.max_requests = 1).await;
    let c = client();
    let (busy, ws) = session(&c, &s, None).await;
    let (other, other_ws) = session(&c, &s, None).await;
    let body = turn(&[("b", "bash", json!({"command": "touch started; sleep 30"}))]);
    let running = {
        let (c, url) = (c.clone(), s.url(&format!("/v1/sessions/{busy}/dispatch")));
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let started = std::path::PathBuf::from(format!("{ws}/started"));
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = started.clone();
            async move { p.exists() }
        })
        .await
    );
    let refused = dispatch(
        &c,
        &s,
        &other,
        &turn(&[(
            "w",
            "write_file",
            json!({"path": "ran.txt", "content": "x"}),
        )]),
    )
    .await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (503, "overloaded")
    );
    assert_eq!(refused.headers["retry-after"], "1");
    assert!(!std::path::Path::new(&format!("{other_ws}/ran.txt")).exists());
    let info = get(&c, &s.url(&format!("/v1/sessions/{other}")))
        .await
        .json();
    assert_eq!(
        (info["turns"].clone(), info["calls"].clone()),
        (json!(0), json!(0))
    );
    post(&c, &s.url(&format!("/v1/sessions/{busy}/cancel")), "").await;
    assert_eq!(running.await.unwrap().status, 200);
    let retried = dispatch(
        &c,
        &s,
        &other,
        &turn(&[(
            "w",
            "write_file",
            json!({"path": "ran.txt", "content": "x"}),
        )]),
    )
    .await;
    assert_eq!(retried.status, 200);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_shutdown_new_work_is_refused_and_the_running_turn_gets_its_full_answer() {
    let mut s = start(|c| c.grace = Duration::from_millis(300)).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let body = turn(&[
        ("a", "write_file", json!({"path": "a.txt", "content": "a"})),
        ("b", "bash", json!({"command": "touch started; sleep 30"})),
        ("c", "write_file", json!({"path": "c.txt", "content": "c"})),
    ]);
    let running = {
        let (c, url) = (c.clone(), s.url(&format!("/v1/sessions/{id}/dispatch")));
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let started = std::path::PathBuf::from(format!("{ws}/started"));
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = started.clone();
            async move { p.exists() }
        })
        .await
    );
    s.begin_shutdown();
    let fresh = client();
    let refused = post(&fresh, &s.url("/v1/sessions"), "{}").await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (503, "shutting_down")
    );
    let answer = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status, 200);
    let blocks = answer.json()["content"].as_array().unwrap().clone();
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[0]["content"], "Wrote 1 bytes to a.txt");
    assert!(
        blocks[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [cancelled]")
    );
    assert!(
        blocks[2]["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [cancelled]")
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_sessions_of_fifty_turns_each_get_every_result_once_in_order() {
    let s = start(|c| c.load_tools = true).await;
    let mut tasks = Vec::new();
    for n in 0..64 {
        let s_url = s.url("");
        tasks.push(tokio::spawn(async move {
            let c = client();
            let a = post(&c, &format!("{s_url}/v1/sessions"), "{}").await;
            let id = a.json()["session_id"].as_str().unwrap().to_string();
            let url = format!("{s_url}/v1/sessions/{id}/dispatch");
            for t in 0..50 {
                let calls: Vec<(String, &str, Value)> = (0..4)
                    .map(|k| {
                        let tool = if k % 2 == 0 { "noop" } else { "noop_serial" };
                        (
                            format!("s{n}t{t}c{k}"),
                            tool,
                            json!({"text": format!("{n}/{t}/{k}"), "n": 0}),
                        )
                    })
                    .collect();
                let refs: Vec<(&str, &str, Value)> = calls
                    .iter()
                    .map(|(i, t, v)| (i.as_str(), *t, v.clone()))
                    .collect();
                let answer = post(&c, &url, &turn(&refs)).await;
                assert_eq!(answer.status, 200, "{}", answer.text);
                let blocks = answer.json()["content"].as_array().unwrap().clone();
                assert_eq!(blocks.len(), 4);
                for (k, b) in blocks.iter().enumerate() {
                    assert_eq!(b["tool_use_id"], format!("s{n}t{t}c{k}"));
                    assert_eq!(b["content"], format!("{n}/{t}/{k}"));
                }
            }
            let info = get(&c, &format!("{s_url}/v1/sessions/{id}")).await.json();
            assert_eq!(
                (info["turns"].clone(), info["calls"].clone()),
                (json!(50), json!(200))
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.shutdown().await.unwrap();
}
