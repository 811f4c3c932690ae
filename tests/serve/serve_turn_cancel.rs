//! Turn-addressed cancel over real HTTP: a turn named by the client (or by the server) is
//! cancelled by its id whether it runs, waits behind the session's earlier turns, or has not
//! arrived yet; and the session id the client knows is the one audit lines carry.

use crate::serve_common;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use serve_common::*;

async fn dispatch_turn(
    c: &reqwest::Client,
    s: &TestServer,
    id: &str,
    turn_id: &str,
    body: &str,
) -> Answer {
    send(
        c.post(s.url(&format!("/v1/sessions/{id}/dispatch")))
            .bearer_auth(TOKEN)
            .header("Switchboard-Turn-Id", turn_id)
            .body(body.to_string()),
    )
    .await
}

async fn cancel_turn(c: &reqwest::Client, s: &TestServer, id: &str, turn_id: &str) -> Value {
    let a = post(
        c,
        &s.url(&format!("/v1/sessions/{id}/turns/{turn_id}/cancel")),
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.json()
}

fn all_cancelled(answer: &Answer) -> bool {
    answer.json()["content"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| {
            b["content"]
                .as_str()
                .unwrap()
                .starts_with("Error [cancelled]")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_comes_first_cancels_its_turn_on_arrival_and_nothing_runs() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let early = cancel_turn(&c, &s, &id, "turn-1").await;
    assert_eq!(early["state"], "early");
    let body = turn(&[
        ("b", "bash", json!({"command": "touch ran; sleep 1"})),
        ("w", "write_file", json!({"path": "w.txt", "content": "x"})),
    ]);
    let a = dispatch_turn(&c, &s, &id, "turn-1", &body).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.headers["switchboard-turn-id"], "turn-1");
    assert!(all_cancelled(&a), "{}", a.text);
    assert!(!Path::new(&format!("{ws}/ran")).exists());
    assert!(!Path::new(&format!("{ws}/w.txt")).exists());
    // Cancelling it again says it finished; a turn of another id runs normally.
    assert_eq!(
        cancel_turn(&c, &s, &id, "turn-1").await["state"],
        "finished"
    );
    let other = dispatch_turn(
        &c,
        &s,
        &id,
        "turn-2",
        &turn(&[("e", "bash", json!({"command": "echo ok"}))]),
    )
    .await;
    assert_eq!(other.json()["content"][0]["content"], "ok");
    // The early cancel was used up: the same turn id again runs (its calls new ones).
    let again = dispatch_turn(
        &c,
        &s,
        &id,
        "turn-1",
        &turn(&[("e2", "bash", json!({"command": "echo again"}))]),
    )
    .await;
    assert_eq!(again.json()["content"][0]["content"], "again");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_turn_is_cancelled_by_id_while_the_running_one_goes_on() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let first = {
        let (c, url) = (
            c.clone(),
            s.url(&format!("/v1/sessions/{id}/dispatch?turn_id=first")),
        );
        let body = turn(&[(
            "a",
            "bash",
            json!({"command": "touch first; sleep 1; echo first done"}),
        )]);
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let started = format!("{ws}/first");
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = started.clone();
            async move { Path::new(&p).exists() }
        })
        .await
    );
    let second = {
        let (c, url) = (
            c.clone(),
            s.url(&format!("/v1/sessions/{id}/dispatch?turn_id=second")),
        );
        let body = turn(&[("b", "bash", json!({"command": "touch second"}))]);
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    // Wait until the second turn is queued (registered), then cancel it by id.
    let queued = eventually(Duration::from_secs(10), || {
        let (c, url) = (c.clone(), s.url(&format!("/v1/sessions/{id}")));
        async move { get(&c, &url).await.json()["in_flight"] == 2 }
    })
    .await;
    assert!(queued);
    let state = cancel_turn(&c, &s, &id, "second").await;
    assert_eq!(state["state"], "queued");
    let first = first.await.unwrap();
    assert_eq!(first.json()["content"][0]["content"], "first done");
    let second = second.await.unwrap();
    assert!(all_cancelled(&second), "{}", second.text);
    assert_eq!(second.headers["switchboard-turn-id"], "second");
    assert!(!Path::new(&format!("{ws}/second")).exists());
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_turn_is_cancelled_by_id_and_ids_are_made_and_checked() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let running = {
        let (c, url) = (
            c.clone(),
            s.url(&format!("/v1/sessions/{id}/dispatch?turn_id=long")),
        );
        let body = turn(&[("a", "bash", json!({"command": "touch started; sleep 30"}))]);
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let started = format!("{ws}/started");
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = started.clone();
            async move { Path::new(&p).exists() }
        })
        .await
    );
    // The same id while it runs is a copy of that turn (a retry): it waits for the first, a
    // cancel of the id reaches both, and the copy gets the first's answer — nothing runs twice.
    let copy = {
        let (c, url) = (
            c.clone(),
            s.url(&format!("/v1/sessions/{id}/dispatch?turn_id=long")),
        );
        let body = turn(&[("a", "bash", json!({"command": "touch started; sleep 30"}))]);
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let both = eventually(Duration::from_secs(10), || {
        let (c, url) = (c.clone(), s.url(&format!("/v1/sessions/{id}")));
        async move { get(&c, &url).await.json()["in_flight"] == 2 }
    })
    .await;
    assert!(both);
    assert_eq!(cancel_turn(&c, &s, &id, "long").await["state"], "running");
    let answer = running.await.unwrap();
    assert!(all_cancelled(&answer), "{}", answer.text);
    let copy = copy.await.unwrap();
    assert_eq!(copy.status, 200, "{}", copy.text);
    assert_eq!(copy.text, answer.text);
    // Once it ended, the id sent again with another call: under the same turn, a new call (the
    // turn and the tool_use_id are its identity), which runs.
    let again = dispatch_turn(
        &c,
        &s,
        &id,
        "long",
        &turn(&[("x", "bash", json!({"command": "touch twice"}))]),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert!(Path::new(&format!("{ws}/twice")).exists());
    // Without an id the server makes one and says it.
    let plain = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("e", "glob", json!({"pattern": "*"}))]),
    )
    .await;
    let made = plain.headers["switchboard-turn-id"].to_str().unwrap();
    assert!(made.starts_with('t') && made.len() > 8, "{made}");
    // A bad id is refused before anything runs.
    let bad = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/dispatch?turn_id=a%2Fb")),
        &turn(&[("x", "bash", json!({"command": "touch bad"}))]),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(!Path::new(&format!("{ws}/bad")).exists());
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_lines_carry_the_session_id_the_client_knows() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let log_path = log.clone();
    let s = start(move |c| c.policy.audit_log = Some(log_path)).await;
    let c = client();
    let (id, _) = session(&c, &s, None).await;
    let a = dispatch(
        &c,
        &s,
        &id,
        &turn(&[("g", "glob", json!({"pattern": "*"}))]),
    )
    .await;
    assert_eq!(a.status, 200);
    s.shutdown().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let line: Value = serde_json::from_str(text.lines().next().expect("an audit line")).unwrap();
    assert_eq!(line["session"], id.as_str(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_id_is_part_of_its_calls_identity() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    // A provider that numbers its calls `call_0` in every response, with the same arguments:
    // under two turn ids, two calls — each runs once.
    let body = turn(&[(
        "call_0",
        "bash",
        json!({"command": "echo x >> ledger; wc -l < ledger"}),
    )]);
    let first = dispatch_turn(&c, &s, &id, "resp-1", &body).await;
    let second = dispatch_turn(&c, &s, &id, "resp-2", &body).await;
    assert_eq!(first.json()["content"][0]["content"], "1");
    assert_eq!(second.json()["content"][0]["content"], "2");
    // A retry re-sends its turn id: the stored answer, byte for byte, and nothing runs.
    let again = dispatch_turn(&c, &s, &id, "resp-1", &body).await;
    assert_eq!(again.text, first.text);
    let lines = std::fs::read_to_string(format!("{ws}/ledger")).unwrap();
    assert_eq!(lines.lines().count(), 2);
    s.shutdown().await.unwrap();
}
