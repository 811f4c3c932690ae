//! Results that tell the truth: a write answered `cancelled` never happened and a write that
//! happened is never answered `cancelled`; two editors of one file lose no successful edit; a
//! write of a file changed since the session read it is refused, not silently applied.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use switchboard::Workspace;
use switchboard::tools::builtin_tools;
use switchboard::{Engine, ErrorCode, Session, ToolCall, ToolDispatchResult};

fn engine_in(ws: &Workspace) -> Engine {
    Engine::builder()
        .tools(builtin_tools())
        .workspace(ws.clone())
        .build()
        .unwrap()
}

async fn turn(session: &Session, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
    tokio::time::timeout(common::TURN_BOUND, session.dispatch(calls))
        .await
        .expect("answered within the bound")
        .expect("engine available")
}

/// A small deterministic generator for the delays.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_error_agrees_with_the_file_over_a_thousand_cancels_at_random_moments() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path()).unwrap();
    let engine = engine_in(&ws);
    let session = engine.session();
    let mut rng = Lcg(7);
    let (mut happened, mut refused) = (0, 0);
    for i in 0..1_000 {
        let name = format!("n{i}.txt");
        std::fs::write(ws.root().join(&name), "v1").unwrap();
        let token = session.turn_token();
        let trigger = token.clone();
        let delay = Duration::from_micros(rng.next(3_000));
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            trigger.cancel();
        });
        let calls = vec![
            ToolCall::new(
                common::fresh("w"),
                "write_file",
                json!({"path": name, "content": "v2"}),
            ),
            ToolCall::new(common::fresh("r"), "read_file", json!({"path": name})),
        ];
        let results = tokio::time::timeout(
            common::TURN_BOUND,
            session.dispatch_with_cancel(calls, token),
        )
        .await
        .unwrap()
        .unwrap();
        let on_disk = std::fs::read_to_string(ws.root().join(&name)).unwrap();
        let write = &results[0];
        match write.error {
            None => {
                assert_eq!(on_disk, "v2", "iteration {i}: answered ok, file unchanged");
                happened += 1;
            }
            Some(code) => {
                assert_eq!(
                    on_disk, "v1",
                    "iteration {i}: answered {code} ({}), yet the file changed",
                    write.content
                );
                assert_eq!(code, ErrorCode::Cancelled, "{}", write.content);
                refused += 1;
            }
        }
    }
    // Both outcomes occurred, so the race was really exercised.
    println!("{happened} writes happened, {refused} were cancelled before the rename");
    assert!(happened > 0 && refused > 0, "{happened} / {refused}");
}

/// `sessions` editors, each on its own session (of one engine, or of separate engines), doing
/// `turns` turns of [read a.txt, edit "END" → "<token> END"]. Returns the tokens whose edit was
/// answered ok, and how many were refused as conflicts.
async fn editors(ws: &Workspace, sessions: Vec<Session>, turns: usize) -> (Vec<String>, usize) {
    std::fs::write(ws.root().join("a.txt"), "END").unwrap();
    let mut tasks = Vec::new();
    for (s, session) in sessions.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut conflicts) = (Vec::new(), 0);
            for t in 0..turns {
                let token = format!("s{s}t{t}");
                let results = turn(
                    &session,
                    vec![
                        ToolCall::new(common::fresh("r"), "read_file", json!({"path": "a.txt"})),
                        ToolCall::new(
                            common::fresh("e"),
                            "edit_file",
                            json!({"path": "a.txt", "old_text": "END", "new_text": format!("{token} END")}),
                        ),
                    ],
                )
                .await;
                match results[1].error {
                    None => ok.push(token),
                    Some(ErrorCode::ExecutionError)
                        if results[1].content.contains("modified since this session read it") =>
                    {
                        conflicts += 1
                    }
                    other => panic!("unexpected {other:?}: {}", results[1].content),
                }
            }
            (ok, conflicts)
        }));
    }
    let mut all = (Vec::new(), 0);
    for t in tasks {
        let (ok, conflicts) = t.await.unwrap();
        all.0.extend(ok);
        all.1 += conflicts;
    }
    all
}

fn assert_every_ok_edit_is_in_the_file(ws: &Workspace, ok: &[String], conflicts: usize) {
    let text = std::fs::read_to_string(ws.root().join("a.txt")).unwrap();
    for token in ok {
        assert!(text.contains(&format!("{token} ")), "lost the edit {token}");
    }
    assert_eq!(text.matches(' ').count(), ok.len(), "{text}");
    assert_eq!(ok.len() + conflicts, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_editing_one_file_lose_no_successful_edit() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path()).unwrap();
    let engine = engine_in(&ws);
    let (ok, conflicts) = editors(&ws, vec![engine.session(), engine.session()], 200).await;
    assert_every_ok_edit_is_in_the_file(&ws, &ok, conflicts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_on_one_workspace_lose_no_successful_edit() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path()).unwrap();
    // Two engines, each with its own handle on the directory, as two processes would have.
    let a = engine_in(&Workspace::open(tmp.path()).unwrap());
    let b = engine_in(&Workspace::open(tmp.path()).unwrap());
    let (ok, conflicts) = editors(&ws, vec![a.session(), b.session()], 200).await;
    assert_every_ok_edit_is_in_the_file(&ws, &ok, conflicts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_a_file_changed_since_it_was_read_is_refused_until_read_again() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path()).unwrap();
    let engine = engine_in(&ws);
    let session = engine.session();
    let path = ws.root().join("notes.md");
    std::fs::write(&path, "mine").unwrap();
    let read = || ToolCall::new(common::fresh("r"), "read_file", json!({"path": "notes.md"}));
    let write = |id: &str| {
        ToolCall::new(
            id,
            "write_file",
            json!({"path": "notes.md", "content": "model's version"}),
        )
    };
    assert!(turn(&session, vec![read()]).await[0].is_ok());
    // Someone else changes the file (same length, so only the stamp tells).
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&path, "them").unwrap();
    for call in [
        write("w1"),
        ToolCall::new(
            "e1",
            "edit_file",
            json!({"path": "notes.md", "old_text": "them", "new_text": "x"}),
        ),
    ] {
        let refused = turn(&session, vec![call]).await;
        assert_eq!(refused[0].error, Some(ErrorCode::ExecutionError));
        assert!(
            refused[0]
                .content
                .contains("notes.md was modified since this session read it at"),
            "{}",
            refused[0].content
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "them");
    }
    // Reading again is how the model recovers.
    let again = turn(&session, vec![read(), write("w2")]).await;
    assert_eq!(again[0].content, "them");
    assert!(again[1].is_ok(), "{}", again[1].content);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "model's version");
    // Another session that never read it is not blocked; this session's own write is no conflict.
    let other = engine.session();
    assert!(turn(&other, vec![write("w3")]).await[0].is_ok());
    let _ = Arc::new(());
}
