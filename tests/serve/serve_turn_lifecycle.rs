//! One turn's life in `switchboard serve` over real HTTP on 127.0.0.1:0: streaming, cancel and
//! delete during a running command, a client that disconnects mid-stream, overload with nothing
//! run, and shutdown with every request in flight answered in full.

use crate::serve_common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use serve_common::*;

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
    // The command's output came as progress, before its result (serve_progress.rs has more).
    let progress = rest.iter().position(|(e, _)| e == "progress").unwrap();
    let bash_result = rest
        .iter()
        .position(|(e, d)| e == "result" && d.contains("\"index\":1"))
        .unwrap();
    assert!(progress < bash_result);
    assert!(
        rest[progress].1.contains("\"text\":\"slept\\n\""),
        "{}",
        rest[progress].1
    );
    let order: Vec<u64> = rest
        .iter()
        .filter(|(event, _)| event != "progress")
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

/// Whether session `id` comes to hold no turn within 10 s (its permits given back).
async fn settles(c: &reqwest::Client, s: &TestServer, id: &str) -> bool {
    let url = s.url(&format!("/v1/sessions/{id}"));
    eventually(Duration::from_secs(10), || {
        let (c, url) = (c.clone(), url.clone());
        async move { get(&c, &url).await.json()["in_flight"] == 0 }
    })
    .await
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
    assert!(appears(&started, Duration::from_secs(20)).await);
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
    assert!(appears(&started, Duration::from_secs(20)).await);
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
    assert!(appears(&c_txt, Duration::from_secs(20)).await);
    assert!(std::path::Path::new(&format!("{ws}/b.txt")).exists());
    // …and leaves nothing held: the only request permit is free again, the session is idle.
    assert!(settles(&c, &s, &id).await, "the session is still busy");
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
async fn a_client_that_goes_away_before_a_plain_answer_leaves_its_turn_running_to_its_end() {
    // Not streamed: the turn runs on the request's own task, and moves to a task of its own
    // when the request is dropped (the client gave up waiting): it still runs to its end once.
    let s = start(|c| c.max_requests = 1).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let body = turn(&[
        ("a", "write_file", json!({"path": "a.txt", "content": "a"})),
        (
            "b",
            "bash",
            json!({"command": "sleep 0.6; echo b >> b.txt"}),
        ),
        ("c", "write_file", json!({"path": "c.txt", "content": "c"})),
    ]);
    let gave_up = c
        .post(s.url(&format!("/v1/sessions/{id}/dispatch")))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_millis(200))
        .body(body.clone())
        .send()
        .await;
    assert!(gave_up.is_err(), "answered before the client gave up");
    let c_txt = std::path::PathBuf::from(format!("{ws}/c.txt"));
    assert!(appears(&c_txt, Duration::from_secs(20)).await);
    assert!(settles(&c, &s, &id).await, "the session is still busy");
    // The same turn sent again is answered from the session's memory: nothing runs twice.
    let again = dispatch(&c, &s, &id, &body).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(
        std::fs::read_to_string(format!("{ws}/b.txt")).unwrap(),
        "b\n",
        "the command ran once"
    );
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
    assert!(appears(&started, Duration::from_secs(20)).await);
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
    assert!(appears(&started, Duration::from_secs(20)).await);
    s.begin_shutdown();
    // The signal reaches the server a moment later; from then on new work is refused.
    let fresh = client();
    let url = s.url("/v1/sessions");
    let mut refused = post(&fresh, &url, "{}").await;
    for _ in 0..500 {
        if refused.status != 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        refused = post(&fresh, &url, "{}").await;
    }
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
