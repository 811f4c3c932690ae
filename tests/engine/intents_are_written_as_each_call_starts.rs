//! With a journal, a call's intent is made durable right before that call starts — not for the
//! whole turn up front — and its answer as soon as it finishes: after a crash, a call of the turn
//! that never started has no intent and runs on the retry, one that finished has its answer, and
//! only one that was running is answered `outcome_unknown`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use switchboard::journal::{Journal, RecordState};
use switchboard::{Effect, Engine, Handler, Session, SessionOptions, ToolSpec};

/// A side-effect tool: `hold` waits until the test lets it go; any other text answers at once.
fn step(release: &Arc<tokio::sync::Notify>, started: &Arc<tokio::sync::Notify>) -> ToolSpec {
    let (release, started) = (Arc::clone(release), Arc::clone(started));
    ToolSpec::new(
        "step",
        "A step.",
        text_schema(),
        Handler::future(move |args, _ctx| {
            let (release, started) = (Arc::clone(&release), Arc::clone(&started));
            async move {
                let text = text_arg(&args);
                if text == "hold" {
                    started.notify_one();
                    release.notified().await;
                }
                Ok(format!("did {text}"))
            }
        }),
    )
    .effect(Effect::SideEffect)
}

/// An engine with `tool` and a journal in `dir`, its journal, and its session `conv`.
async fn journaled(dir: &std::path::Path, tool: ToolSpec) -> (Engine, Journal, Session) {
    let engine = Engine::builder()
        .tool(tool)
        .sandbox(switchboard::sandbox::SandboxConfig::off())
        .journal(dir)
        .build()
        .unwrap();
    let journal = engine.journal().unwrap().clone();
    let session = engine
        .session_with(SessionOptions::new().id("conv"))
        .await
        .unwrap();
    (engine, journal, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_calls_intent_is_written_when_it_starts_not_with_its_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (release, started) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let (engine, journal, s) = journaled(dir.path(), step(&release, &started)).await;
    // Three side-effect calls of one tool: they run one after the other.
    let turn = vec![
        call("a", "step", json!({"text": "one"})),
        call("b", "step", json!({"text": "hold"})),
        call("c", "step", json!({"text": "three"})),
    ];
    let running = tokio::spawn({
        let s = s.clone();
        async move { s.dispatch(turn).await.unwrap() }
    });
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the second call started");
    // While the second call runs: the first is answered in the journal (an answer is recorded
    // as soon as its call finishes, not when the turn ends), the second has its intent, and the
    // third — not started — has nothing.
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = journal.lookup("conv", &["a", "b", "c"]).await.unwrap();
        if matches!(
            seen[0].as_ref().map(|r| r.state()),
            Some(RecordState::Answered(_))
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        matches!(
            seen[0].as_ref().map(|r| r.state()),
            Some(RecordState::Answered(_))
        ),
        "the first call's answer was not recorded while the turn went on"
    );
    assert_eq!(
        seen[1].as_ref().map(|r| r.state()),
        Some(RecordState::Started)
    );
    assert!(
        seen[2].is_none(),
        "the third call's intent was written before it started"
    );
    release.notify_one();
    let answers = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap();
    let texts: Vec<&str> = answers.iter().map(|r| r.content.as_str()).collect();
    assert_eq!(texts, ["did one", "did hold", "did three"]);
    let seen = journal.lookup("conv", &["c"]).await.unwrap();
    assert!(matches!(
        seen[0].as_ref().map(|r| r.state()),
        Some(RecordState::Answered(_))
    ));
    engine.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_never_reach_a_handler_write_no_intent() {
    let dir = tempfile::tempdir().unwrap();
    let (release, started) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let (engine, journal, s) = journaled(dir.path(), step(&release, &started)).await;
    // Refused by validation: no intent; its answer is journaled like any answer.
    let r = s
        .dispatch(vec![call("bad", "step", json!({"text": 5}))])
        .await
        .unwrap();
    assert!(!r[0].is_ok());
    let seen = journal.lookup("conv", &["bad"]).await.unwrap();
    assert!(matches!(
        seen[0].as_ref().map(|r| r.state()),
        Some(RecordState::Answered(_))
    ));
    // Cancelled before it started: no intent either.
    let cancel = s.turn_token();
    cancel.cancel();
    let r = s
        .dispatch_with_cancel(vec![call("x", "step", json!({"text": "x"}))], cancel)
        .await
        .unwrap();
    assert_eq!(r[0].error, Some(switchboard::ErrorCode::Cancelled));
    let seen = journal.lookup("conv", &["x"]).await.unwrap();
    assert!(
        !matches!(
            seen[0].as_ref().map(|r| r.state()),
            Some(RecordState::Started)
        ),
        "a call that never started left an intent"
    );
    engine.shutdown(Duration::from_secs(2)).await;
}
