//! A session remembers its answers: a turn sent again gets the same answers without running
//! anything; a copy of a call still running waits for that run; an id reused with other
//! arguments is refused; and with a journal, all of this survives a restart — a side-effect call
//! that was running when the engine stopped is answered `outcome_unknown`, never run twice.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use serde_json::json;
use switchboard::journal::{CallRecord, Journal, Write};
use switchboard::{
    Effect, Engine, ErrorCode, Handler, Retention, SessionOptions, ToolDispatchResult, ToolSpec,
};

/// A tool that counts its runs and answers `ran <text> #<n>`; async, sleeping `ms` first.
fn counting(name: &str, effect: Effect, ms: u64, runs: &Arc<AtomicUsize>) -> ToolSpec {
    let runs = Arc::clone(runs);
    ToolSpec::new(
        name,
        "Counts its runs.",
        text_schema(),
        Handler::future(move |args, _ctx| {
            let runs = Arc::clone(&runs);
            async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(format!("ran {} #{n}", text_arg(&args)))
            }
        }),
    )
    .effect(effect)
}

fn sandbox_off() -> switchboard::sandbox::SandboxConfig {
    switchboard::sandbox::SandboxConfig::off()
}

fn engine_with(tools: Vec<ToolSpec>, journal: Option<&std::path::Path>) -> Engine {
    let mut b = Engine::builder().tools(tools).sandbox(sandbox_off());
    if let Some(dir) = journal {
        b = b.journal(dir);
    }
    b.build().expect("engine builds")
}

/// One call of `tool` with `{"text": text}` under id `id`, as a turn of `session`.
async fn one(
    session: &switchboard::Session,
    id: &str,
    tool: &str,
    text: &str,
) -> Vec<ToolDispatchResult> {
    session
        .dispatch(vec![call(id, tool, json!({"text": text}))])
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_sent_again_gets_the_same_answers_and_runs_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = engine_with(vec![counting("push", Effect::SideEffect, 1, &runs)], None);
    let session = engine.session();
    let turn = vec![
        call("a", "push", json!({"text": "x"})),
        call("b", "nope", json!({})),
        call("c", "push", json!({"text": "y"})),
    ];
    let first = session.dispatch(turn.clone()).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let again = session.dispatch(turn).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "nothing ran a second time");
    assert_eq!(wire(&first), wire(&again), "the same bytes on the wire");
    assert_eq!(again[1].error, Some(ErrorCode::UnknownTool));

    // A turn mixing a re-sent call with a new one runs only the new one.
    let mixed = session
        .dispatch(vec![
            call("c", "push", json!({"text": "y"})),
            call("d", "push", json!({"text": "z"})),
        ])
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(mixed[0].content, first[2].content);
    assert_eq!(mixed[1].content, "ran z #3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_reused_with_other_arguments_is_refused_and_runs_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = engine_with(vec![counting("push", Effect::SideEffect, 1, &runs)], None);
    let session = engine.session();
    one(&session, "a", "push", "x").await;
    let other = one(&session, "a", "push", "CHANGED").await;
    assert_eq!(other[0].error, Some(ErrorCode::InvalidArguments));
    assert!(
        other[0].content.contains("was used with other arguments"),
        "{}",
        other[0].content
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The original answer is still the one a faithful retry gets.
    let retry = one(&session, "a", "push", "x").await;
    assert_eq!(retry[0].content, "ran x #1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_running_call_waits_for_that_same_run() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = engine_with(vec![counting("slow", Effect::SideEffect, 300, &runs)], None);
    let session = engine.session();
    let turn = vec![call("a", "slow", json!({"text": "x"}))];
    let (one, two) = tokio::join!(session.dispatch(turn.clone()), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        session.dispatch(turn.clone()).await
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for both copies");
    assert_eq!(wire(&one.unwrap()), wire(&two.unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_do_not_share_answers_and_refused_turns_are_not_remembered() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = engine_with(vec![counting("push", Effect::SideEffect, 1, &runs)], None);
    let (s1, s2) = (engine.session(), engine.session());
    let turn = vec![call("a", "push", json!({"text": "x"}))];
    s1.dispatch(turn.clone()).await.unwrap();
    s2.dispatch(turn.clone()).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "another session's id is its own"
    );

    // A turn with a duplicate id is refused whole; the same ids sent properly then run.
    let dup = vec![
        call("d", "push", json!({"text": "1"})),
        call("d", "push", json!({"text": "1"})),
    ];
    let refused = s1.dispatch(dup).await.unwrap();
    assert!(
        refused
            .iter()
            .all(|r| r.error == Some(ErrorCode::InvalidArguments))
    );
    let ran = s1
        .dispatch(vec![call("d", "push", json!({"text": "1"}))])
        .await
        .unwrap();
    assert!(ran[0].is_ok(), "{}", ran[0].content);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_share_the_engines_answer_budget_and_a_dropped_answer_is_never_run_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    // Room for about 100 answers of 1 KB over the whole engine (each counts 1.5 KB).
    let engine = Engine::builder()
        .tool(counting("push", Effect::SideEffect, 0, &runs))
        .sandbox(sandbox_off())
        .answer_retention(Retention {
            engine_bytes: 160 << 10,
            ..Retention::default()
        })
        .build()
        .unwrap();
    let quiet = engine.session();
    let busy = engine.session();
    let text = "x".repeat(1000);
    for i in 0..5 {
        one(&quiet, &format!("q{i}"), "push", &text).await;
    }
    for i in 0..400 {
        one(&busy, &format!("b{i}"), "push", &text).await;
    }
    // The session that grew let its oldest answers go; the quiet one kept all of its own.
    assert!(
        busy.answers_kept() < 150,
        "kept {} answers past the engine's budget",
        busy.answers_kept()
    );
    assert_eq!(quiet.answers_kept(), 5);
    let before = runs.load(Ordering::SeqCst);
    let late = one(&busy, "b0", "push", &text).await;
    assert_eq!(late[0].error, Some(ErrorCode::InvalidArguments));
    assert!(
        late[0].content.contains("no longer kept"),
        "{}",
        late[0].content
    );
    assert_eq!(runs.load(Ordering::SeqCst), before, "nothing ran again");
    // The newest answer is still the same answer.
    let again = one(&busy, "b399", "push", &text).await;
    assert!(again[0].is_ok(), "{}", again[0].content);
    assert_eq!(runs.load(Ordering::SeqCst), before);
    // A session's answers leave the count with it: another session has room again.
    drop(busy);
    let fresh = engine.session();
    for i in 0..90 {
        one(&fresh, &format!("f{i}"), "push", &text).await;
    }
    assert_eq!(fresh.answers_kept(), 90);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_past_the_retention_is_refused_not_run_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tool(counting("push", Effect::SideEffect, 0, &runs))
        .sandbox(sandbox_off())
        .answer_retention(Retention {
            answers: 2,
            bytes: 1 << 20,
            ..Retention::default()
        })
        .build()
        .unwrap();
    let session = engine.session();
    for id in ["a", "b", "c"] {
        one(&session, id, "push", id).await;
    }
    assert_eq!(session.answers_kept(), 2);
    let late = one(&session, "a", "push", "a").await;
    assert_eq!(late[0].error, Some(ErrorCode::InvalidArguments));
    assert!(
        late[0].content.contains("no longer kept"),
        "{}",
        late[0].content
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Recent ones are still answered from memory.
    let recent = one(&session, "c", "push", "c").await;
    assert_eq!(recent[0].content, "ran c #3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_retry_streams_the_stored_answers() {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = engine_with(vec![counting("push", Effect::SideEffect, 1, &runs)], None);
    let session = engine.session();
    let turn = vec![
        call("a", "push", json!({"text": "x"})),
        call("b", "push", json!({"text": "y"})),
    ];
    let first = session.dispatch(turn.clone()).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let again = session
        .dispatch_streaming(
            vec![
                turn[1].clone(),
                call("n", "push", json!({"text": "new"})),
                turn[0].clone(),
            ],
            session.turn_token(),
            tx,
        )
        .await
        .unwrap();
    let mut streamed = Vec::new();
    while let Ok(item) = rx.try_recv() {
        streamed.push(item);
    }
    streamed.sort_by_key(|(i, _)| *i);
    let indices: Vec<usize> = streamed.iter().map(|(i, _)| *i).collect();
    assert_eq!(indices, [0, 1, 2], "each call streamed once");
    assert_eq!(streamed[0].1.content, first[1].content);
    assert_eq!(streamed[2].1.content, first[0].content);
    assert_eq!(again[1].content, "ran new #3");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_journal_answers_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let turn = vec![call("a", "push", json!({"text": "x"}))];
    let first = {
        let engine = engine_with(
            vec![counting("push", Effect::SideEffect, 1, &runs)],
            Some(dir.path()),
        );
        let session = engine
            .session_with(SessionOptions::new().id("conv-1"))
            .await
            .unwrap();
        let first = session.dispatch(turn.clone()).await.unwrap();
        engine.shutdown(Duration::from_secs(1)).await;
        first
    };
    let engine = engine_with(
        vec![counting("push", Effect::SideEffect, 1, &runs)],
        Some(dir.path()),
    );
    let session = engine
        .session_with(SessionOptions::new().id("conv-1"))
        .await
        .unwrap();
    let again = session.dispatch(turn).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "not run again after the restart"
    );
    assert_eq!(wire(&first), wire(&again));
    let other = one(&session, "a", "push", "other").await;
    assert_eq!(other[0].error, Some(ErrorCode::InvalidArguments));
}

/// Writes an intent for call `id` of session `conv-1`, as the engine does before running it, and
/// no answer: what the journal holds after a crash during the call.
async fn intent_only(
    dir: &std::path::Path,
    id: &str,
    tool: &str,
    effect: Effect,
    args: serde_json::Value,
) {
    // The digest is the engine's own: learn it from a journal written by a real run.
    let probe = tempfile::tempdir().unwrap();
    {
        let runs = Arc::new(AtomicUsize::new(0));
        let engine = engine_with(
            vec![counting(tool, Effect::SideEffect, 0, &runs)],
            Some(probe.path()),
        );
        let s = engine
            .session_with(SessionOptions::new().id("conv-1"))
            .await
            .unwrap();
        s.dispatch(vec![call(id, tool, args)]).await.unwrap();
        engine.shutdown(Duration::from_secs(1)).await;
    }
    let digest = {
        let j = Journal::open(probe.path(), Duration::from_secs(3600)).unwrap();
        j.lookup("conv-1", &[id]).await.unwrap()[0]
            .as_ref()
            .unwrap()
            .digest
            .clone()
    };
    let j = Journal::open(dir, Duration::from_secs(3600)).unwrap();
    j.write(vec![Write::Call {
        session: "conv-1".into(),
        id: id.into(),
        record: Box::new(CallRecord {
            tool: tool.into(),
            digest,
            effect: effect.as_str().into(),
            at_ms: j.now_ms(),
            answer: None,
            dropped: None,
        }),
    }])
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_a_side_effect_call_is_outcome_unknown_and_an_idempotent_one_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    intent_only(
        dir.path(),
        "pay-1",
        "pay",
        Effect::SideEffect,
        json!({"text": "10 EUR"}),
    )
    .await;
    intent_only(
        dir.path(),
        "put-1",
        "put",
        Effect::Idempotent,
        json!({"text": "v"}),
    )
    .await;
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = engine_with(
        vec![
            counting("pay", Effect::SideEffect, 0, &runs),
            counting("put", Effect::Idempotent, 0, &runs),
        ],
        Some(dir.path()),
    );
    let session = engine
        .session_with(SessionOptions::new().id("conv-1"))
        .await
        .unwrap();
    let turn = vec![
        call("pay-1", "pay", json!({"text": "10 EUR"})),
        call("put-1", "put", json!({"text": "v"})),
    ];
    let answers = session.dispatch(turn.clone()).await.unwrap();
    assert_eq!(answers[0].error, Some(ErrorCode::OutcomeUnknown));
    assert!(
        answers[0]
            .content
            .contains("may or may not have taken effect"),
        "{}",
        answers[0].content
    );
    assert!(answers[1].is_ok(), "{}", answers[1].content);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only the idempotent call ran"
    );
    // The outcome is final: asked again, the same answers.
    let again = session.dispatch(turn).await.unwrap();
    assert_eq!(wire(&answers), wire(&again));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn the_built_in_tools_declare_their_effect() {
    let effects: Vec<(String, Effect)> = switchboard::tools::builtin_tools()
        .into_iter()
        .map(|t| (t.name, t.effect))
        .collect();
    let of = |n: &str| effects.iter().find(|(name, _)| name == n).unwrap().1;
    assert_eq!(of("read_file"), Effect::ReadOnly);
    assert_eq!(of("glob"), Effect::ReadOnly);
    assert_eq!(of("write_file"), Effect::Idempotent);
    assert_eq!(of("edit_file"), Effect::SideEffect);
    assert_eq!(of("bash"), Effect::SideEffect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_turn_is_part_of_a_calls_identity() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let in_turn =
        |turn: &str, text: &str| vec![call("call_0", "push", json!({"text": text})).in_turn(turn)];
    let (first, second) = {
        let engine = engine_with(
            vec![counting("push", Effect::SideEffect, 0, &runs)],
            Some(dir.path()),
        );
        let s = engine
            .session_with(SessionOptions::new().id("conv"))
            .await
            .unwrap();
        // A provider that numbers its calls `call_0`, `call_1`, … in every response: the same
        // id and the same arguments in two turns are two calls.
        let first = s.dispatch(in_turn("resp-1", "x")).await.unwrap();
        let second = s.dispatch(in_turn("resp-2", "x")).await.unwrap();
        assert_eq!(first[0].content, "ran x #1");
        assert_eq!(second[0].content, "ran x #2");
        // A retry re-sends the same turn id: the stored answer, nothing runs.
        assert_eq!(
            wire(&s.dispatch(in_turn("resp-1", "x")).await.unwrap()),
            wire(&first)
        );
        // Other arguments under the same turn and id are refused, as without turns.
        let other = s.dispatch(in_turn("resp-2", "y")).await.unwrap();
        assert_eq!(other[0].error, Some(ErrorCode::InvalidArguments));
        // Without a turn id, today's rule: the id alone (a new call here).
        let bare = one(&s, "call_0", "push", "x").await;
        assert_eq!(bare[0].content, "ran x #3");
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        engine.shutdown(Duration::from_secs(2)).await;
        (first, second)
    };
    // After a restart, from the journal: each turn's own answer.
    let engine = engine_with(
        vec![counting("push", Effect::SideEffect, 0, &runs)],
        Some(dir.path()),
    );
    let s = engine
        .session_with(SessionOptions::new().id("conv"))
        .await
        .unwrap();
    assert_eq!(
        wire(&s.dispatch(in_turn("resp-2", "x")).await.unwrap()),
        wire(&second)
    );
    assert_eq!(
        wire(&s.dispatch(in_turn("resp-1", "x")).await.unwrap()),
        wire(&first)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    engine.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_turn_joins_the_idempotency_key() {
    let engine = Engine::builder()
        .tool(ToolSpec::new(
            "key",
            "Answers its idempotency key.",
            text_schema(),
            Handler::inline(|_, ctx| Ok(ctx.idempotency_key())),
        ))
        .build()
        .unwrap();
    let s = engine
        .session_with(SessionOptions::new().id("conv"))
        .await
        .unwrap();
    let key = |turn: Option<&str>| {
        let mut c = call("k1", "key", json!({"text": "t"}));
        c.turn = turn.map(Arc::from);
        c
    };
    let named = s.dispatch(vec![key(Some("resp-1"))]).await.unwrap();
    assert_eq!(
        named[0].content,
        switchboard::tool::idempotency_key("conv", Some("resp-1"), "k1")
    );
    let bare = s.dispatch(vec![key(None)]).await.unwrap();
    assert_eq!(
        bare[0].content,
        switchboard::tool::idempotency_key("conv", None, "k1")
    );
    assert_ne!(named[0].content, bare[0].content);
    engine.shutdown(Duration::from_secs(2)).await;
}
