//! A harness's retry is safe: a turn sent again to a session gets the same answer without running
//! anything, also streamed; and with `--journal`, after the real server is killed with SIGKILL and
//! started again, the session is still there under its id, answered calls get their stored
//! answers, and a side-effect call that was running is answered `outcome_unknown` — never run a
//! second time.

use crate::serve_common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use serve_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_sent_again_gets_the_same_bytes_and_runs_nothing() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let body = turn(&[
        (
            "t1",
            "bash",
            json!({"command": "echo one >> log; echo ran"}),
        ),
        ("t2", "read_file", json!({"path": "log"})),
    ]);
    let first = dispatch(&c, &s, &id, &body).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let again = dispatch(&c, &s, &id, &body).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(first.text, again.text, "byte-identical");
    // Streamed, the retry gets the same results as events.
    let streamed = send(
        c.post(s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
            .bearer_auth(TOKEN)
            .body(body.clone()),
    )
    .await;
    let results: Vec<Value> = events(&streamed.text)
        .into_iter()
        .filter(|(kind, _)| kind == "result")
        .map(|(_, data)| serde_json::from_str(&data).unwrap())
        .collect();
    assert_eq!(results.len(), 2, "{}", streamed.text);
    assert_eq!(
        file_lines(format!("{ws}/log")),
        ["one"],
        "the command ran once"
    );
    // The same id with other arguments is refused, and nothing runs.
    let other = turn(&[("t1", "bash", json!({"command": "echo two >> log"}))]);
    let refused = dispatch(&c, &s, &id, &other).await;
    assert_eq!(refused.json()["content"][0]["is_error"], true);
    assert!(
        refused.text.contains("was used with other arguments"),
        "{}",
        refused.text
    );
    assert_eq!(file_lines(format!("{ws}/log")), ["one"]);
    s.shutdown().await.unwrap();
}

use serde_json::Value;

/// The real binary with a journal, on a free loopback port; its base URL from its ready line.
fn serve_with_journal(root: &std::path::Path, journal: &std::path::Path) -> (Child, String) {
    let (child, base, _) = serve_journaled(root, journal, &[]);
    (child, base)
}

async fn post_to(c: &reqwest::Client, url: String, body: String) -> Answer {
    send(c.post(url).body(body)).await
}

#[test]
fn after_a_sigkill_and_a_restart_the_session_answers_from_its_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    let journal = tmp.path().join("journal");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut child, base) = serve_with_journal(&root, &journal);
    let c = client();
    let (id, ws, done_body, done_answer, slow_body) = rt.block_on(async {
        let created = post_to(&c, format!("{base}/v1/sessions"), "{}".into()).await;
        assert_eq!(created.status, 201, "{}", created.text);
        let id = created.json()["session_id"].as_str().unwrap().to_string();
        let ws = created.json()["workspace"].as_str().unwrap().to_string();
        let done_body = turn(&[(
            "done-1",
            "bash",
            json!({"command": "echo done-1 >> log; echo ok"}),
        )]);
        let done = post_to(
            &c,
            format!("{base}/v1/sessions/{id}/dispatch"),
            done_body.clone(),
        )
        .await;
        assert_eq!(done.status, 200, "{}", done.text);
        // A call that is running when the server dies.
        let slow_body = turn(&[(
            "slow-1",
            "bash",
            json!({"command": "echo slow-1 >> log; sleep 60"}),
        )]);
        let url = format!("{base}/v1/sessions/{id}/dispatch");
        let (c2, b2) = (c.clone(), slow_body.clone());
        tokio::spawn(async move { c2.post(url).body(b2).send().await });
        (id, ws, done_body, done.text, slow_body)
    });
    let log = format!("{ws}/log");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while file_lines(&log).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow call never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let (mut child, base) = serve_with_journal(&root, &journal);
    rt.block_on(async {
        let url = format!("{base}/v1/sessions/{id}/dispatch");
        let again = post_to(&c, url.clone(), done_body).await;
        assert_eq!(again.status, 200, "the session is back: {}", again.text);
        assert_eq!(again.text, done_answer, "the stored answer, byte for byte");
        let unknown = post_to(&c, url.clone(), slow_body.clone()).await;
        assert_eq!(unknown.status, 200, "{}", unknown.text);
        let block = &unknown.json()["content"][0];
        assert_eq!(block["is_error"], true);
        assert!(
            block["content"]
                .as_str()
                .unwrap()
                .starts_with("Error [outcome_unknown]"),
            "{block}"
        );
        // Final: asked again, the same answer.
        let twice = post_to(&c, url, slow_body).await;
        assert_eq!(twice.text, unknown.text);
    });
    assert_eq!(
        file_lines(&log),
        ["done-1", "slow-1"],
        "each side effect happened once"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_damaged_journal_stops_start_up_and_says_how_to_move_it_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let journal = tmp.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    std::fs::write(journal.join("journal.redb"), vec![0x42u8; 16384]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .arg("serve")
        .arg("--workspace-root")
        .arg(tmp.path().join("ws"))
        .arg("--journal")
        .arg(&journal)
        .args(["--listen", "127.0.0.1:0", "--no-auth"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("journal.redb") && err.contains("damaged") && err.contains("mv "),
        "{err}"
    );
    // The file is left as it was.
    assert_eq!(
        std::fs::read(journal.join("journal.redb")).unwrap(),
        vec![0x42u8; 16384]
    );
}
