//! Client tools over real HTTP: declared at session creation, seen only by that session, called
//! through the same pipeline as a built-in (validation, planning, deadline, order) and answered
//! by the client over the turn's stream — exactly one answer per call.

use crate::serve_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use serve_common::*;

/// Creates a session with these client tools; returns `(id, workspace)`.
async fn session_with_tools(c: &reqwest::Client, s: &TestServer, tools: Value) -> (String, String) {
    let a = post(
        c,
        &s.url("/v1/sessions"),
        &json!({"tools": tools}).to_string(),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.text);
    let v = a.json();
    (
        v["session_id"].as_str().unwrap().to_string(),
        v["workspace"].as_str().unwrap().to_string(),
    )
}

fn lookup_tool() -> Value {
    json!({
        "name": "lookup",
        "description": "Looks a key up in the platform's store.",
        "input_schema": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
        "concurrency_safe": true,
    })
}

/// What a test's client does with one `call` event: the answer body to post, or none.
type Answerer = Arc<dyn Fn(&Value) -> Option<Value> + Send + Sync>;

/// A streamed turn as the client saw it: its events in order, and the answers it posted (call
/// id → HTTP status).
struct Streamed {
    events: Vec<(String, Value)>,
    posted: Arc<Mutex<HashMap<String, u16>>>,
}

impl Streamed {
    fn done(&self) -> &Value {
        let (event, data) = self.events.last().expect("events");
        assert_eq!(event, "done", "{:?}", self.events);
        data
    }

    fn calls(&self) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|(e, _)| e == "call")
            .map(|(_, d)| d)
            .collect()
    }
}

/// Dispatches `body` streamed in session `id` and answers each `call` event as `answer` says,
/// each answer posted from a task of its own (so calls of a stage are answered concurrently).
async fn run_turn(
    c: &reqwest::Client,
    s: &TestServer,
    id: &str,
    body: &str,
    answer: Answerer,
) -> Streamed {
    let mut response = c
        .post(s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(body.to_string())
        .send()
        .await
        .expect("dispatch");
    assert_eq!(response.status(), 200);
    let posted = Arc::new(Mutex::new(HashMap::new()));
    let mut events = Vec::new();
    let mut buffer = String::new();
    let mut answering = Vec::new();
    let bounded = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(chunk) = response.chunk().await.expect("stream") {
            buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                for (event, data) in serve_common::events(&block) {
                    let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                    if event == "call"
                        && let Some(reply) = answer(&data)
                    {
                        let call_id = data["call_id"].as_str().unwrap().to_string();
                        let url = s.url(&format!("/v1/sessions/{id}/calls/{call_id}"));
                        let (c, posted) = (c.clone(), Arc::clone(&posted));
                        answering.push(tokio::spawn(async move {
                            let a = post(&c, &url, &reply.to_string()).await;
                            posted.lock().unwrap().insert(call_id, a.status);
                        }));
                    }
                    events.push((event, data));
                }
            }
        }
    })
    .await;
    assert!(
        bounded.is_ok(),
        "the turn did not end within 60 s: {events:?}"
    );
    for task in answering {
        task.await.unwrap();
    }
    Streamed { events, posted }
}

fn text_answer(text: &str) -> Value {
    json!({"content": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_tools_join_only_their_sessions_catalog_and_bad_ones_are_refused_by_name() {
    let s = start(|c| {
        c.client_tools.max_tools = 2;
        c.client_tools.max_schema_bytes = 512;
    })
    .await;
    let c = client();
    let openai_shaped = json!({"type": "function", "function": {
        "name": "search", "description": "Web search.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
    let (id, _) = session_with_tools(&c, &s, json!([lookup_tool(), openai_shaped])).await;
    let (other, _) = session(&c, &s, None).await;
    let names = |catalog: &Value, key: &str| -> Vec<String> {
        catalog
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.pointer(key).unwrap().as_str().unwrap().to_string())
            .collect()
    };
    let mine = get(&c, &s.url(&format!("/v1/sessions/{id}/tools")))
        .await
        .json();
    let mine = names(&mine, "/name");
    assert!(mine.contains(&"read_file".to_string()), "{mine:?}");
    assert_eq!(&mine[mine.len() - 2..], ["lookup", "search"]);
    let as_openai = get(
        &c,
        &s.url(&format!("/v1/sessions/{id}/tools?format=openai")),
    )
    .await
    .json();
    assert!(names(&as_openai, "/function/name").contains(&"search".to_string()));
    let theirs = get(&c, &s.url(&format!("/v1/sessions/{other}/tools")))
        .await
        .json();
    assert!(!names(&theirs, "/name").contains(&"lookup".to_string()));
    let server = get(&c, &s.url("/v1/tools")).await.json();
    assert!(!names(&server, "/name").contains(&"lookup".to_string()));
    // The other session cannot call it: an unknown tool there.
    let a = dispatch(
        &c,
        &s,
        &other,
        &turn(&[("t1", "lookup", json!({"key": "k"}))]),
    )
    .await;
    assert_eq!(a.json()["content"][0]["is_error"], true, "{}", a.text);

    let refusals = [
        (
            json!([{"name": "read_file", "input_schema": {"type": "object"}}]),
            "read_file",
        ),
        (json!([lookup_tool(), lookup_tool()]), "lookup"),
        (
            json!([{"name": "broken", "input_schema": {"type": 12}}]),
            "broken",
        ),
        (
            json!([{"name": "big", "input_schema": {"type": "object", "description": "x".repeat(600)}}]),
            "big",
        ),
        (
            json!([lookup_tool(), {"name": "b", "input_schema": {}}, {"name": "c", "input_schema": {}}]),
            "--max-client-tools",
        ),
    ];
    for (tools, named) in refusals {
        let a = post(
            &c,
            &s.url("/v1/sessions"),
            &json!({"tools": tools}).to_string(),
        )
        .await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{}",
            a.text
        );
        assert!(a.text.contains(named), "{} should name {named}", a.text);
        assert!(!a.text.contains("tool tool"), "{}", a.text);
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_call_is_validated_then_handed_over_and_exactly_one_answer_counts() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session_with_tools(&c, &s, json!([lookup_tool()])).await;
    std::fs::write(format!("{ws}/notes.txt"), "local notes").unwrap();
    let body = turn(&[
        ("t1", "lookup", json!({"key": "alpha"})),
        ("t2", "lookup", json!({"key": 7})),
        ("t3", "read_file", json!({"path": "notes.txt"})),
        ("t4", "lookup", json!({"key": "fails"})),
    ]);
    let answer: Answerer = Arc::new(|call: &Value| {
        let key = call["input"]["key"].as_str().unwrap().to_string();
        Some(if key == "fails" {
            json!({"content": "the store is down", "is_error": true})
        } else {
            text_answer(&format!("value of {key}"))
        })
    });
    let turn = run_turn(&c, &s, &id, &body, answer).await;
    let done = turn.done().clone();
    let results = done["content"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    let ids: Vec<&str> = results
        .iter()
        .map(|r| r["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t1", "t2", "t3", "t4"]);
    assert_eq!(results[0]["content"], "value of alpha");
    assert_eq!(results[1]["is_error"], true);
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("invalid_arguments")
    );
    assert_eq!(results[2]["content"], "local notes");
    assert_eq!(results[3]["is_error"], true);
    let failed = results[3]["content"].as_str().unwrap();
    assert!(failed.contains("execution_error") && failed.contains("the store is down"));
    // The invalid call never reached the client; each valid one did, once.
    let calls = turn.calls();
    let called: Vec<&str> = calls
        .iter()
        .map(|c| c["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(called, ["t1", "t4"]);
    assert_eq!(calls[0]["name"], "lookup");
    assert_eq!(calls[0]["input"], json!({"key": "alpha"}));
    assert!(calls[0]["deadline_ms"].as_u64().unwrap() > 100_000);
    assert!(turn.posted.lock().unwrap().values().all(|s| *s == 200));
    // A second answer changes nothing; an unknown call is 404.
    let first = calls[0]["call_id"].as_str().unwrap();
    let again = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/calls/{first}")),
        &text_answer("other").to_string(),
    )
    .await;
    assert_eq!(
        (again.status, again.code().as_str()),
        (409, "already_answered")
    );
    let unknown = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/calls/c999")),
        &text_answer("x").to_string(),
    )
    .await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (404, "unknown_call")
    );
    let malformed = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/calls/{first}")),
        r#"{"content": 5}"#,
    )
    .await;
    assert_eq!(malformed.status, 400);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_needing_the_client_must_stream_and_otherwise_runs_nothing() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session_with_tools(&c, &s, json!([lookup_tool()])).await;
    let body = turn(&[
        (
            "t1",
            "write_file",
            json!({"path": "made.txt", "content": "x"}),
        ),
        ("t2", "lookup", json!({"key": "k"})),
    ]);
    let a = dispatch(&c, &s, &id, &body).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (400, "bad_request"),
        "{}",
        a.text
    );
    assert!(a.text.contains("stream=true"), "{}", a.text);
    assert!(!std::path::Path::new(&format!("{ws}/made.txt")).exists());
    // A turn of built-ins only needs no stream.
    let plain = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("t3", "glob", json!({"pattern": "*"}))]),
    )
    .await;
    assert_eq!(plain.status, 200, "{}", plain.text);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_deadline_a_call_is_timeout_and_a_late_answer_is_refused() {
    let s = start(|_| {}).await;
    let c = client();
    let mut quick = lookup_tool();
    quick["timeout_ms"] = json!(300);
    let (id, _) = session_with_tools(&c, &s, json!([quick])).await;
    let body = turn(&[("t1", "lookup", json!({"key": "k"}))]);
    let turn = run_turn(&c, &s, &id, &body, Arc::new(|_| None)).await;
    let result = &turn.done()["content"][0];
    assert_eq!(result["is_error"], true);
    // The engine words it; nothing the handler said while giving up passes for partial output.
    assert_eq!(
        result["content"].as_str().unwrap(),
        "Error [timeout]: timed out after 300ms",
        "{result}"
    );
    let call_id = turn.calls()[0]["call_id"].as_str().unwrap().to_string();
    let late = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/calls/{call_id}")),
        &text_answer("late").to_string(),
    )
    .await;
    assert_eq!((late.status, late.code().as_str()), (409, "call_closed"));
    assert!(late.text.contains("timeout"), "{}", late.text);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_racing_the_deadline_either_counts_or_the_call_is_timeout_never_cancelled() {
    let s = start(|_| {}).await;
    let c = client();
    let mut quick = lookup_tool();
    quick["timeout_ms"] = json!(200);
    let (id, _) = session_with_tools(&c, &s, json!([quick])).await;
    // Answers sent from just before to just after the deadline: whichever wins, the answer's fate
    // and the call's result agree.
    for (trial, delay_ms) in [185u64, 195, 198, 200, 202, 205, 215]
        .into_iter()
        .enumerate()
    {
        let body = turn(&[(&format!("t{trial}"), "lookup", json!({"key": "k"}))]);
        let answer: Answerer = Arc::new(move |_| {
            std::thread::sleep(Duration::from_millis(delay_ms));
            Some(text_answer("in time"))
        });
        let turn = run_turn(&c, &s, &id, &body, answer).await;
        let result = &turn.done()["content"][0];
        let call_id = turn.calls()[0]["call_id"].as_str().unwrap().to_string();
        let status = turn.posted.lock().unwrap()[&call_id];
        match status {
            200 => assert_eq!(result["content"], "in time", "{delay_ms} ms: {result}"),
            409 => assert_eq!(
                result["content"], "Error [timeout]: timed out after 200ms",
                "{delay_ms} ms: {result}"
            ),
            other => panic!("{delay_ms} ms: answer got {other}"),
        }
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_call_gets_its_calls_cancelled_and_nothing_waits() {
    let s = start(|_| {}).await;
    let c = client();
    // A deadline far away: only the stream's end can answer the call quickly.
    let mut slow = lookup_tool();
    slow["timeout_ms"] = json!(600_000);
    let (id, _) = session_with_tools(&c, &s, json!([slow])).await;
    let body = turn(&[("t1", "lookup", json!({"key": "k"}))]);
    let mut response = c
        .post(s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    let call_id = loop {
        let chunk = response.chunk().await.unwrap().expect("a call event");
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
        if let Some((_, data)) = events(&seen).into_iter().find(|(e, _)| e == "call") {
            let v: Value = serde_json::from_str(&data).unwrap();
            break v["call_id"].as_str().unwrap().to_string();
        }
    };
    drop(response);
    // The turn ends (its call answered `cancelled`, not left waiting ten minutes) with no
    // answer from anyone, and a late answer is refused.
    let info = s.url(&format!("/v1/sessions/{id}"));
    let ended = eventually(Duration::from_secs(10), || {
        let (c, info) = (c.clone(), info.clone());
        async move { get(&c, &info).await.json()["in_flight"] == 0 }
    })
    .await;
    assert!(ended, "the turn still waits for a client that left");
    let url = s.url(&format!("/v1/sessions/{id}/calls/{call_id}"));
    let late = post(&c, &url, &text_answer("too late").to_string()).await;
    assert_eq!(
        (late.status, late.code().as_str()),
        (409, "call_closed"),
        "{}",
        late.text
    );
    assert!(late.text.contains("cancelled"), "{}", late.text);
    let next = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("t2", "glob", json!({"pattern": "*"}))]),
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_access_orders_a_client_write_before_a_builtin_read_of_the_same_file() {
    let s = start(|_| {}).await;
    let c = client();
    let tools = json!([
        {"name": "save", "description": "Saves text to a workspace file.",
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}, "required": ["path", "text"]},
         "access": {"write": ["/path"]}},
        {"name": "peek", "description": "Reads nothing the others touch.",
         "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
         "concurrency_safe": true},
    ]);
    let (id, ws) = session_with_tools(&c, &s, tools).await;
    for round in 0..10 {
        let text = format!("version {round}");
        let body = turn(&[
            (
                &*format!("w{round}"),
                "save",
                json!({"path": "f.txt", "text": text}),
            ),
            (&*format!("r{round}"), "read_file", json!({"path": "f.txt"})),
        ]);
        let dir = ws.clone();
        let answer: Answerer = Arc::new(move |call: &Value| {
            // The client's effect lands before it answers, as a real tool's would.
            let path = format!("{dir}/{}", call["input"]["path"].as_str().unwrap());
            std::fs::write(path, call["input"]["text"].as_str().unwrap()).unwrap();
            Some(text_answer("saved"))
        });
        let turn = run_turn(&c, &s, &id, &body, answer).await;
        assert_eq!(turn.done()["content"][1]["content"], text, "round {round}");
    }
    // Two concurrency-safe client calls are handed over together: the client sees both before
    // it answers either (were they serialized, the second would never come, and the turn would
    // end in timeouts).
    let body = turn(&[
        ("p1", "peek", json!({"n": 1})),
        ("p2", "peek", json!({"n": 2})),
    ]);
    let mut response = c
        .post(s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    let ids = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let chunk = response.chunk().await.unwrap().expect("events");
            text.push_str(std::str::from_utf8(&chunk).unwrap());
            let calls: Vec<String> = events(&text)
                .into_iter()
                .filter(|(e, _)| e == "call")
                .map(|(_, d)| {
                    serde_json::from_str::<Value>(&d).unwrap()["call_id"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect();
            if calls.len() == 2 {
                break calls;
            }
        }
    })
    .await
    .expect("both calls handed over before either was answered");
    for call_id in ids {
        let a = post(
            &c,
            &s.url(&format!("/v1/sessions/{id}/calls/{call_id}")),
            &text_answer("ok").to_string(),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text);
    }
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let (last, data) = events(&text).pop().unwrap();
    assert_eq!(last, "done");
    let done: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(done["content"][0]["content"], "ok");
    assert_eq!(done["content"][1]["content"], "ok");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_sessions_mixing_client_and_builtin_calls_each_get_one_answer_per_call_in_order()
{
    let s = start(|_| {}).await;
    let c = client();
    let echo = json!({"name": "echo", "description": "Echoes.",
        "input_schema": {"type": "object", "properties": {"say": {"type": "string"}}, "required": ["say"]}});
    let mut sessions = Vec::new();
    for _ in 0..64 {
        sessions.push(session_with_tools(&c, &s, json!([echo.clone()])).await);
    }
    let runs = sessions.into_iter().enumerate().map(|(n, (id, _))| {
        let (c, s) = (c.clone(), &s);
        async move {
            let body = turn(&[
                ("a", "echo", json!({"say": format!("first {n}")})),
                (
                    "b",
                    "write_file",
                    json!({"path": "n.txt", "content": format!("{n}")}),
                ),
                ("c", "echo", json!({"say": format!("second {n}")})),
                ("d", "read_file", json!({"path": "n.txt"})),
                ("e", "bash", json!({"command": format!("echo shell {n}")})),
            ]);
            let answer: Answerer =
                Arc::new(|call: &Value| Some(text_answer(call["input"]["say"].as_str().unwrap())));
            let turn = run_turn(&c, s, &id, &body, answer).await;
            (n, turn)
        }
    });
    for (n, turn) in futures::future::join_all(runs).await {
        let done = turn.done();
        let contents: Vec<&str> = done["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["content"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(contents.len(), 5, "session {n}: {done}");
        assert_eq!(contents[0], format!("first {n}"));
        assert_eq!(contents[2], format!("second {n}"));
        assert_eq!(contents[3], format!("{n}"));
        assert_eq!(contents[4].trim(), format!("shell {n}"));
        // One `result` event per call, one `call` event per client call, one `done`.
        let count = |name: &str| turn.events.iter().filter(|(e, _)| e == name).count();
        assert_eq!((count("result"), count("call"), count("done")), (5, 2, 1));
        assert!(turn.posted.lock().unwrap().values().all(|s| *s == 200));
    }
    s.shutdown().await.unwrap();
}
