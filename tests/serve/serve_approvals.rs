//! `serve --policy`: a call an `ask` rule holds is announced on its turn's stream
//! (`approval_required`) and answered by `POST /v1/sessions/{id}/approvals/{approval_id}`; a
//! turn without a stream cannot be asked and is denied.

use crate::serve_common;

use std::time::Duration;

use serde_json::{Value, json};
use serve_common::{TOKEN, client, dispatch, post, session, start, turn};

const POLICY: &str = r#"{"permissions": {"ask": ["write_file(notes/**)"], "default": "allow"}}"#;

async fn server() -> (serve_common::TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.json");
    std::fs::write(&path, POLICY).unwrap();
    let s = start(|c| {
        c.policy.file = Some(path.clone());
        c.policy.approval_timeout = Duration::from_secs(20);
    })
    .await;
    (s, dir)
}

/// Streams a turn, answering its one approval with `allow`; returns the SSE events and what
/// `notes/a.md` holds afterwards.
async fn streamed_turn_answering(allow: bool) -> (Vec<(String, String)>, Option<String>) {
    let (s, _dir) = server().await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let body = turn(&[
        (
            "w",
            "write_file",
            json!({"path": "notes/a.md", "content": "hello"}),
        ),
        ("r", "glob", json!({"pattern": "*"})),
    ]);
    let mut response = c
        .post(s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    let read = async {
        while let Some(chunk) = response.chunk().await.unwrap() {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if let Some((_, data)) = serve_common::events(&text)
                .into_iter()
                .find(|(e, _)| e == "approval_required")
                && !text.contains("approved-sent")
            {
                let req: Value = serde_json::from_str(&data).unwrap();
                assert_eq!(req["tool_use_id"], "w");
                assert_eq!(req["tool_name"], "write_file");
                assert_eq!(req["subject"], "notes/a.md");
                assert_eq!(req["rule"], "write_file(notes/**)");
                let approval = req["approval_id"].as_str().unwrap();
                let url = s.url(&format!("/v1/sessions/{id}/approvals/{approval}"));
                let answer = post(&c, &url, &json!({"allow": allow}).to_string()).await;
                assert_eq!(answer.status, 200, "{}", answer.text);
                let again = post(&c, &url, &json!({"allow": allow}).to_string()).await;
                assert_eq!(again.status, 404);
                assert_eq!(again.code(), "unknown_approval");
                text.push_str("\n\n: approved-sent\n\n");
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the stream ended");
    let written = std::fs::read_to_string(format!("{ws}/notes/a.md")).ok();
    (serve_common::events(&text), written)
}

fn done(events: &[(String, String)]) -> Value {
    let (_, data) = events
        .iter()
        .find(|(e, _)| e == "done")
        .expect("a done event");
    serde_json::from_str(data).unwrap()
}

#[tokio::test]
async fn an_approved_call_runs_after_its_approval_required_event() {
    let (events, written) = streamed_turn_answering(true).await;
    let answer = done(&events);
    assert_eq!(answer["content"][0]["tool_use_id"], "w");
    assert!(answer["content"][0].get("is_error").is_none(), "{answer}");
    assert_eq!(written.as_deref(), Some("hello"));
}

#[tokio::test]
async fn a_refused_call_is_denied_and_nothing_is_written() {
    let (events, written) = streamed_turn_answering(false).await;
    let answer = done(&events);
    let content = answer["content"][0]["content"].as_str().unwrap();
    assert!(
        content.starts_with("Error [permission_denied]"),
        "{content}"
    );
    assert_eq!(answer["content"][1]["tool_use_id"], "r");
    assert_eq!(written, None);
}

#[tokio::test]
async fn a_turn_without_a_stream_cannot_be_asked_and_is_denied() {
    let (s, _dir) = server().await;
    let c = client();
    let (id, _) = session(&c, &s, None).await;
    let body = turn(&[(
        "w",
        "write_file",
        json!({"path": "notes/a.md", "content": "x"}),
    )]);
    let a = dispatch(&c, &s, &id, &body).await;
    assert_eq!(a.status, 200);
    let content = a.json()["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        content.contains("no client is listening for approvals"),
        "{content}"
    );
    let bad = post(&c, &s.url(&format!("/v1/sessions/{id}/approvals/a1")), "{}").await;
    assert_eq!(bad.status, 400);
}
