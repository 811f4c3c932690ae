//! A journal that cannot write fails closed: a call whose intent it cannot record does not run,
//! an answer it cannot record leaves as `outcome_unknown` (what every later copy gets, after a
//! restart too), it heals once it can write again — without a restart — and an answer its
//! retention dropped leaves a tombstone, so a late retry is refused and never runs.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use serde_json::json;
use switchboard::journal::{Journal, Write};
use switchboard::{Effect, Engine, ErrorCode, Handler, SessionOptions, ToolSpec};

fn engine(tools: Vec<ToolSpec>, journal: &Path) -> Engine {
    Engine::builder()
        .tools(tools)
        .sandbox(switchboard::sandbox::SandboxConfig::off())
        .journal(journal)
        .build()
        .expect("engine builds")
}

/// A side-effect tool that counts its runs; `during` runs inside each call, before it answers.
fn pay(runs: &Arc<AtomicUsize>, during: impl Fn() + Send + Sync + 'static) -> ToolSpec {
    let runs = Arc::clone(runs);
    ToolSpec::new(
        "pay",
        "Pays.",
        text_schema(),
        Handler::blocking(move |args, _ctx| {
            during();
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(format!("paid {} #{n}", text_arg(args)))
        }),
    )
    .effect(Effect::SideEffect)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_journal_cannot_record_is_outcome_unknown_for_every_copy() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("journal");
    let away = parent.path().join("journal.away");
    let runs = Arc::new(AtomicUsize::new(0));
    let first = {
        let (from, to) = (dir.clone(), away.clone());
        let moved = Arc::new(AtomicUsize::new(0));
        // The first run takes the journal's directory away while it runs (as an operator's
        // `mv` or a full disk would stop its writes).
        let tool = pay(&runs, move || {
            if moved.fetch_add(1, Ordering::SeqCst) == 0 {
                std::fs::rename(&from, &to).unwrap();
            }
        });
        let engine = engine(vec![tool], &dir);
        let s = engine
            .session_with(SessionOptions::new().id("conv"))
            .await
            .unwrap();
        let turn = || vec![call("p1", "pay", json!({"text": "5 EUR"}))];
        let first = s.dispatch(turn()).await.unwrap();
        assert_eq!(
            first[0].error,
            Some(ErrorCode::OutcomeUnknown),
            "{}",
            first[0].content
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(engine.journal().unwrap().health().is_err());
        // Sent again: the same answer, nothing runs.
        assert_eq!(wire(&s.dispatch(turn()).await.unwrap()), wire(&first));
        // A new call cannot have its intent recorded: refused, not run.
        let refused = s
            .dispatch(vec![call("p2", "pay", json!({"text": "6 EUR"}))])
            .await
            .unwrap();
        assert_eq!(
            refused[0].error,
            Some(ErrorCode::ExecutionError),
            "{}",
            refused[0].content
        );
        assert!(
            refused[0].content.contains("not run"),
            "{}",
            refused[0].content
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Back: the journal heals by itself, and a new call runs.
        std::fs::rename(&away, &dir).unwrap();
        let ran = s
            .dispatch(vec![call("p3", "pay", json!({"text": "7 EUR"}))])
            .await
            .unwrap();
        assert!(ran[0].is_ok(), "{}", ran[0].content);
        assert!(engine.journal().unwrap().health().is_ok());
        engine.shutdown(Duration::from_secs(2)).await;
        first
    };
    // After a restart, the copy read from the journal is the same answer, byte for byte.
    let engine = engine(vec![pay(&runs, || {})], &dir);
    let s = engine
        .session_with(SessionOptions::new().id("conv"))
        .await
        .unwrap();
    let again = s
        .dispatch(vec![call("p1", "pay", json!({"text": "5 EUR"}))])
        .await
        .unwrap();
    assert_eq!(wire(&again), wire(&first));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    engine.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_of_an_answer_the_journal_dropped_is_refused_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    {
        let engine = engine(vec![pay(&runs, || {})], dir.path());
        let s = engine
            .session_with(SessionOptions::new().id("conv"))
            .await
            .unwrap();
        for id in ["old", "recent"] {
            let r = s
                .dispatch(vec![call(id, "pay", json!({"text": id}))])
                .await
                .unwrap();
            assert!(r[0].is_ok());
        }
        engine.shutdown(Duration::from_secs(2)).await;
    }
    // Age the first answer past the retention, and compact.
    {
        let j = Journal::open(dir.path(), Duration::from_secs(3600)).unwrap();
        let mut old = j.lookup("conv", &["old"]).await.unwrap()[0]
            .clone()
            .unwrap();
        old.at_ms = j.now_ms() - 2 * 3600 * 1000;
        j.write(vec![Write::Call {
            session: "conv".into(),
            id: "old".into(),
            record: Box::new(old),
        }])
        .await
        .unwrap();
        assert_eq!(j.compact().unwrap().tombstoned, 1);
        j.close();
    }
    let engine = engine(vec![pay(&runs, || {})], dir.path());
    let s = engine
        .session_with(SessionOptions::new().id("conv"))
        .await
        .unwrap();
    let late = s
        .dispatch(vec![call("old", "pay", json!({"text": "old"}))])
        .await
        .unwrap();
    assert_eq!(
        late[0].error,
        Some(ErrorCode::InvalidArguments),
        "{}",
        late[0].content
    );
    assert!(
        late[0].content.contains("no longer kept"),
        "{}",
        late[0].content
    );
    // The other answer is still whole.
    let recent = s
        .dispatch(vec![call("recent", "pay", json!({"text": "recent"}))])
        .await
        .unwrap();
    assert_eq!(recent[0].content, "paid recent #2");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    engine.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_side_effects_and_heals_without_a_restart() {
    let parent = tempfile::tempdir().unwrap();
    let Some(mounted) = common::tmpfs::small_tmpfs(parent.path(), "4m") else {
        return;
    };
    let dir = mounted.path().to_path_buf();
    let journal = dir.join("journal");
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = engine(vec![pay(&runs, || {})], &journal);
    let s = engine
        .session_with(SessionOptions::new().id("conv"))
        .await
        .unwrap();
    let before = s
        .dispatch(vec![call("a", "pay", json!({"text": "a"}))])
        .await
        .unwrap();
    assert!(before[0].is_ok());
    // Fill the file system.
    let filler = dir.join("filler");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    // Calls with large arguments until the journal cannot grow its file: the call whose
    // intent does not fit is refused and does not run.
    let big = "x".repeat(256 << 10);
    let mut refused = None;
    for i in 0..40 {
        let ran_before = runs.load(Ordering::SeqCst);
        let r = s
            .dispatch(vec![call(&format!("f{i}"), "pay", json!({"text": big}))])
            .await
            .unwrap();
        if r[0].error == Some(ErrorCode::ExecutionError) {
            assert!(r[0].content.contains("not run"), "{}", r[0].content);
            assert_eq!(
                runs.load(Ordering::SeqCst),
                ran_before,
                "a refused call ran"
            );
            refused = Some(i);
            break;
        }
        assert!(
            r[0].is_ok() || r[0].error == Some(ErrorCode::OutcomeUnknown),
            "{}",
            r[0].content
        );
    }
    assert!(refused.is_some(), "no call was refused on a full disk");
    // Space back: within a few seconds the journal writes again, with no restart.
    std::fs::remove_file(&filler).unwrap();
    let mut healed = None;
    for i in 0..100 {
        let r = s
            .dispatch(vec![call(&format!("h{i}"), "pay", json!({"text": big}))])
            .await
            .unwrap();
        if r[0].is_ok() {
            healed = Some(i);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(healed.is_some(), "the journal did not heal within 10 s");
    assert!(engine.journal().unwrap().health().is_ok());
    // The answer acknowledged before the disk filled is still there, byte for byte.
    let again = s
        .dispatch(vec![call("a", "pay", json!({"text": "a"}))])
        .await
        .unwrap();
    assert_eq!(wire(&again), wire(&before));
    engine.shutdown(Duration::from_secs(2)).await;
}
