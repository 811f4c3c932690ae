//! A restart never forgets a journaled session. With a lower `--max-sessions`, or with the
//! workspace root moved away, the real server started again keeps every session of its journal:
//! those it cannot reopen now are refused with a clear error (`too_many_sessions` with
//! `Retry-After` while the table is full, `internal` naming the missing workspace) and reopened
//! when a request names them once they can be — same workspace, and a re-sent turn gets its
//! stored answer byte for byte. Only `DELETE` and the idle timeout end them.

use crate::serve_common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use serve_common::*;

/// One session of the first run: its id, its workspace, its first turn and that turn's answer.
struct Held {
    id: String,
    ws: String,
    first: String,
    answer: String,
}

async fn call(request: reqwest::RequestBuilder) -> Answer {
    send(request).await
}

/// Creates a session (in workspace `name`, or a fresh one) and sends it a turn whose command
/// leaves one line in its workspace's `log` and answers something a second run could not
/// repeat (the time in nanoseconds).
async fn hold(c: &reqwest::Client, base: &str, name: Option<&str>, n: usize) -> Held {
    let body = name.map_or_else(|| "{}".to_string(), |n| json!({"workspace": n}).to_string());
    let created = call(c.post(format!("{base}/v1/sessions")).body(body)).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json()["session_id"].as_str().unwrap().to_string();
    let ws = created.json()["workspace"].as_str().unwrap().to_string();
    let first = turn(&[(
        &format!("first-{n}"),
        "bash",
        json!({"command": format!("echo once >> log; echo answer-{n}-$(date +%s%N)")}),
    )]);
    let answered = call(
        c.post(format!("{base}/v1/sessions/{id}/dispatch"))
            .body(first.clone()),
    )
    .await;
    assert_eq!(answered.status, 200, "{}", answered.text);
    assert_eq!(answered.json()["content"][0]["is_error"], json!(null));
    Held {
        id,
        ws,
        first,
        answer: answered.text,
    }
}

/// Sends session `s` its first turn again.
async fn resend(c: &reqwest::Client, base: &str, s: &Held) -> Answer {
    call(
        c.post(format!("{base}/v1/sessions/{}/dispatch", s.id))
            .body(s.first.clone()),
    )
    .await
}

/// The lines the server logged at start that say sessions were kept but not reopened.
fn kept_lines(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| l.contains("kept but not reopened"))
        .collect()
}

fn dirs(tmp: &Path) -> (PathBuf, PathBuf) {
    (tmp.join("ws"), tmp.join("journal"))
}

#[test]
fn a_restart_with_fewer_places_keeps_every_session_and_reopens_each_when_a_place_frees() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, journal) = dirs(tmp.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();

    // First run: 12 sessions, half of them in a named workspace, each with one answered turn.
    let (child, base, _) = serve_journaled(&root, &journal, &[]);
    let sessions: Vec<Held> = rt.block_on(async {
        let mut sessions = Vec::new();
        for n in 0..12 {
            let name = format!("proj-{n}");
            let name = (n % 2 == 1).then_some(name.as_str());
            sessions.push(hold(&c, &base, name, n).await);
        }
        sessions
    });
    terminate(child);

    // Restarted with 4 places: 4 sessions open, the other 8 are kept — one log line says so.
    let (child, base, log) = serve_journaled(&root, &journal, &["--max-sessions", "4"]);
    let deleted: Vec<&Held> = rt.block_on(async {
        let (mut open, mut kept) = (Vec::new(), Vec::new());
        for s in &sessions {
            let again = resend(&c, &base, s).await;
            match again.status {
                200 => {
                    assert_eq!(again.text, s.answer, "the stored answer, byte for byte");
                    open.push(s);
                }
                429 => {
                    assert_eq!(again.code(), "too_many_sessions", "{}", again.text);
                    assert_eq!(
                        again
                            .headers
                            .get("retry-after")
                            .map(|v| v.to_str().unwrap()),
                        Some("5"),
                        "{}",
                        again.text
                    );
                    let message = again.json()["error"]["message"]
                        .as_str()
                        .unwrap()
                        .to_string();
                    assert!(
                        message.contains(&s.id)
                            && message.contains("kept")
                            && message.contains("reopened when")
                            && message.contains("--max-sessions"),
                        "{message}"
                    );
                    kept.push(s);
                }
                _ => panic!("session {}: {} {}", s.id, again.status, again.text),
            }
        }
        assert_eq!((open.len(), kept.len()), (4, 8));
        // Any request naming a kept session gets the same answer while the table is full, and
        // a new session finds no place either.
        let info = call(c.get(format!("{base}/v1/sessions/{}", kept[0].id))).await;
        assert_eq!(
            (info.status, info.code().as_str()),
            (429, "too_many_sessions")
        );
        let new = call(c.post(format!("{base}/v1/sessions")).body("{}")).await;
        assert_eq!(
            (new.status, new.code().as_str()),
            (429, "too_many_sessions")
        );

        // Two open sessions deleted: two kept ones get in, on demand, with their answers.
        for s in &open[..2] {
            let gone = call(c.delete(format!("{base}/v1/sessions/{}", s.id))).await;
            assert_eq!(gone.status, 200, "{}", gone.text);
        }
        let (mut reopened, mut waiting) = (Vec::new(), Vec::new());
        for s in &kept {
            let again = resend(&c, &base, s).await;
            match again.status {
                200 => {
                    assert_eq!(again.text, s.answer, "the stored answer, byte for byte");
                    reopened.push(*s);
                }
                429 => waiting.push(*s),
                _ => panic!("session {}: {} {}", s.id, again.status, again.text),
            }
        }
        assert_eq!((reopened.len(), waiting.len()), (2, 6));
        // A reopened session is the same session: its workspace, with its file in it.
        let back = reopened[0];
        let info = call(c.get(format!("{base}/v1/sessions/{}", back.id))).await;
        assert_eq!(info.status, 200, "{}", info.text);
        assert_eq!(info.json()["workspace"], json!(back.ws));
        let more = call(
            c.post(format!("{base}/v1/sessions/{}/dispatch", back.id))
                .body(turn(&[("second", "bash", json!({"command": "cat log"}))])),
        )
        .await;
        assert_eq!(
            more.json()["content"][0]["content"],
            "once",
            "{}",
            more.text
        );

        // DELETE of a kept session answers like that of an open one, and ends it.
        let kept_gone = waiting[0];
        let gone = call(c.delete(format!("{base}/v1/sessions/{}", kept_gone.id))).await;
        assert_eq!(gone.status, 200, "{}", gone.text);
        assert_eq!(gone.json()["session_id"], json!(kept_gone.id));
        assert_eq!(gone.json()["workspace"], json!(kept_gone.ws));
        let after = resend(&c, &base, kept_gone).await;
        assert_eq!(
            (after.status, after.code().as_str()),
            (404, "unknown_session")
        );
        vec![open[0], open[1], kept_gone]
    });
    let lines = kept_lines(&log);
    assert_eq!(
        lines.len(),
        1,
        "one line for the reason, not one per session: {log:#?}"
    );
    assert!(
        lines[0].contains("8 sessions")
            && lines[0].contains("table is full")
            && lines[0].contains("--max-sessions"),
        "{}",
        lines[0]
    );
    for s in &sessions {
        assert_eq!(
            file_lines(format!("{}/log", s.ws)),
            ["once"],
            "session {}: its command ran once",
            s.id
        );
    }
    terminate(child);

    // Restarted with the usual limit: every session not deleted is back, answers intact.
    let (child, base, log) = serve_journaled(&root, &journal, &[]);
    assert!(kept_lines(&log).is_empty(), "{log:#?}");
    rt.block_on(async {
        for s in &sessions {
            let again = resend(&c, &base, s).await;
            if deleted.iter().any(|d| d.id == s.id) {
                assert_eq!(
                    (again.status, again.code().as_str()),
                    (404, "unknown_session"),
                    "deleted session {}",
                    s.id
                );
            } else {
                assert_eq!(again.status, 200, "session {}: {}", s.id, again.text);
                assert_eq!(again.text, s.answer, "session {}", s.id);
            }
        }
    });
    terminate(child);
}

#[test]
fn sessions_whose_workspace_root_was_moved_away_come_back_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, journal) = dirs(tmp.path());
    let away = tmp.path().join("ws.away");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();

    let (child, base, _) = serve_journaled(&root, &journal, &[]);
    let sessions: Vec<Held> = rt.block_on(async {
        vec![
            hold(&c, &base, None, 0).await,
            hold(&c, &base, Some("proj"), 1).await,
            hold(&c, &base, None, 2).await,
        ]
    });
    terminate(child);

    // Restarted with the root moved away: nothing is forgotten, and each request says which
    // directory is missing.
    std::fs::rename(&root, &away).unwrap();
    let (child, base, log) = serve_journaled(&root, &journal, &[]);
    rt.block_on(async {
        for s in &sessions {
            for refused in [
                resend(&c, &base, s).await,
                call(c.get(format!("{base}/v1/sessions/{}", s.id))).await,
            ] {
                assert_eq!(refused.status, 500, "{}", refused.text);
                assert_eq!(refused.code(), "internal");
                let message = refused.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .to_string();
                assert!(
                    message.contains(&format!("{} does not exist", s.ws))
                        && message.contains("kept"),
                    "{message}"
                );
            }
        }
    });
    assert!(
        !root.join("proj").exists(),
        "a missing workspace is not replaced by an empty one"
    );
    let lines = kept_lines(&log);
    assert_eq!(lines.len(), 1, "{log:#?}");
    assert!(
        lines[0].contains("3 sessions") && lines[0].contains("workspace directory is missing"),
        "{}",
        lines[0]
    );
    assert!(
        log.iter()
            .any(|l| l.contains("workspace root did not exist")),
        "{log:#?}"
    );

    // The root put back while the server runs: each session is reopened at its next request.
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::rename(&away, &root).unwrap();
    rt.block_on(async {
        for s in &sessions {
            let again = resend(&c, &base, s).await;
            assert_eq!(again.status, 200, "session {}: {}", s.id, again.text);
            assert_eq!(again.text, s.answer, "the stored answer, byte for byte");
        }
    });
    terminate(child);

    // And a further restart finds them all.
    let (child, base, log) = serve_journaled(&root, &journal, &[]);
    assert!(kept_lines(&log).is_empty(), "{log:#?}");
    rt.block_on(async {
        for s in &sessions {
            let again = resend(&c, &base, s).await;
            assert_eq!(again.status, 200, "session {}: {}", s.id, again.text);
            assert_eq!(again.text, s.answer);
        }
    });
    terminate(child);
    for s in &sessions {
        assert_eq!(file_lines(format!("{}/log", s.ws)), ["once"]);
    }
}

#[test]
fn a_kept_session_is_closed_by_the_idle_timeout_unless_requests_name_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, journal) = dirs(tmp.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();

    let (child, base, _) = serve_journaled(&root, &journal, &[]);
    let sessions: Vec<Held> = rt.block_on(async {
        let mut sessions = Vec::new();
        for n in 0..3 {
            sessions.push(hold(&c, &base, None, n).await);
        }
        sessions
    });
    terminate(child);

    let (child, base, _) = serve_journaled(
        &root,
        &journal,
        &["--max-sessions", "1", "--session-idle-timeout", "3s"],
    );
    let (open, named, untouched) = rt.block_on(async {
        let (mut open, mut kept) = (Vec::new(), Vec::new());
        for s in &sessions {
            let info = call(c.get(format!("{base}/v1/sessions/{}", s.id))).await;
            match info.status {
                200 => open.push(s),
                429 => kept.push(s),
                _ => panic!("{} {}", info.status, info.text),
            }
        }
        assert_eq!((open.len(), kept.len()), (1, 2));
        // One kept session is named by a request every 250 ms for 8 s (refused while the
        // table is full, reopened once the open session has idled out); the other is not.
        let (named, untouched) = (kept[0], kept[1]);
        let until = Instant::now() + Duration::from_secs(8);
        while Instant::now() < until {
            let info = call(c.get(format!("{base}/v1/sessions/{}", named.id))).await;
            assert!(
                info.status == 200 || info.status == 429,
                "a session named every 250 ms is not idle: {} {}",
                info.status,
                info.text
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        for s in [untouched, open[0]] {
            let info = call(c.get(format!("{base}/v1/sessions/{}", s.id))).await;
            assert_eq!(
                (info.status, info.code().as_str()),
                (404, "unknown_session"),
                "closed after 3 s without a request: {}",
                info.text
            );
        }
        (open[0], named, untouched)
    });
    terminate(child);

    // Closed as idle means gone from the journal; the session that was named is still there.
    let (child, base, _) = serve_journaled(&root, &journal, &[]);
    rt.block_on(async {
        let again = resend(&c, &base, named).await;
        assert_eq!(again.status, 200, "{}", again.text);
        assert_eq!(again.text, named.answer);
        for s in [untouched, open] {
            let again = resend(&c, &base, s).await;
            assert_eq!(
                (again.status, again.code().as_str()),
                (404, "unknown_session")
            );
        }
    });
    terminate(child);
}

#[test]
fn a_session_the_restarted_server_cannot_reopen_is_kept_until_it_can() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, journal) = dirs(tmp.path());
    let policy = tmp.path().join("reviewer.json");
    std::fs::write(&policy, r#"{"permissions": {"deny": ["write_file"]}}"#).unwrap();
    let offered = format!("reviewer={}", policy.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();

    // A session that chose the policy `reviewer`, which the server offers.
    let (child, base, _) = serve_journaled(&root, &journal, &["--session-policy", &offered]);
    let (id, first, answer) = rt.block_on(async {
        let created = call(
            c.post(format!("{base}/v1/sessions"))
                .body(json!({"policy": "reviewer"}).to_string()),
        )
        .await;
        assert_eq!(created.status, 201, "{}", created.text);
        let id = created.json()["session_id"].as_str().unwrap().to_string();
        let first = turn(&[("w1", "write_file", json!({"path": "a", "content": "x"}))]);
        let answered = call(
            c.post(format!("{base}/v1/sessions/{id}/dispatch"))
                .body(first.clone()),
        )
        .await;
        assert!(
            answered.text.contains("permission_denied"),
            "{}",
            answered.text
        );
        (id, first, answered.text)
    });
    terminate(child);

    // Restarted without it: the session is kept, and a request naming it says why it is not open.
    let (child, base, log) = serve_journaled(&root, &journal, &[]);
    rt.block_on(async {
        let refused = call(
            c.post(format!("{base}/v1/sessions/{id}/dispatch"))
                .body(first.clone()),
        )
        .await;
        assert_eq!(refused.status, 500, "{}", refused.text);
        assert_eq!(refused.code(), "internal");
        let message = refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            message.contains(&id) && message.contains("kept") && message.contains("reviewer"),
            "{message}"
        );
    });
    let lines = kept_lines(&log);
    assert_eq!(lines.len(), 1, "{log:#?}");
    assert!(
        lines[0].contains("1 session ") && lines[0].contains("reviewer"),
        "{}",
        lines[0]
    );
    terminate(child);

    // Offered again: the session is back, with its policy and its answers.
    let (child, base, _) = serve_journaled(&root, &journal, &["--session-policy", &offered]);
    rt.block_on(async {
        let again = call(
            c.post(format!("{base}/v1/sessions/{id}/dispatch"))
                .body(first.clone()),
        )
        .await;
        assert_eq!(again.status, 200, "{}", again.text);
        assert_eq!(again.text, answer);
        let other = call(
            c.post(format!("{base}/v1/sessions/{id}/dispatch"))
                .body(turn(&[(
                    "w2",
                    "write_file",
                    json!({"path": "b", "content": "y"}),
                )])),
        )
        .await;
        assert!(other.text.contains("permission_denied"), "{}", other.text);
    });
    terminate(child);
    assert!(!root.join("@sessions").join(&id).join("a").exists());
}
