//! The hop (performance issue): a turn whose handlers are all inline is planned and run on the
//! task that dispatches it — its answer is ready at the first poll, with no actor message to wait
//! for — while a turn with a handler that waits goes to a scheduler actor. Tools registered at run
//! time are seen by the next turn (the engine's cached registry snapshot is refreshed when the
//! registry's version moves).

use crate::common;

use common::{async_echo_tool, call, echo_tool, engine, ids, outcomes};
use futures::FutureExt;
use serde_json::json;

#[tokio::test]
async fn an_inline_turn_is_answered_at_its_first_poll_and_a_waiting_one_is_not() {
    let engine = engine(vec![echo_tool("echo"), async_echo_tool("slow_echo")]);
    let session = engine.session();
    // The first turn may refresh the registry snapshot (one message); later ones never need to.
    session
        .dispatch(vec![call("w", "echo", json!({"text": "warm"}))])
        .await
        .unwrap();

    let turn = vec![
        call("a", "echo", json!({"text": "one"})),
        call("b", "nope", json!({})),
        call("c", "echo", json!({"text": 3})),
        call("d", "echo", json!({"text": "two"})),
    ];
    let results = session
        .dispatch(turn)
        .now_or_never()
        .expect("a turn of inline handlers is answered without yielding")
        .expect("engine available");
    assert_eq!(ids(&results), ["a", "b", "c", "d"]);
    assert_eq!(
        outcomes(&results),
        ["ok", "unknown_tool", "invalid_arguments", "ok"]
    );
    assert_eq!(results[3].content, "echo:two");
    // Session-less dispatch takes the same path.
    assert!(
        engine
            .dispatch(vec![call("e", "echo", json!({"text": "x"}))])
            .now_or_never()
            .is_some()
    );

    // An async handler waits for its scheduler and a worker: not ready at the first poll, and
    // answered in full when awaited.
    // (A turn dropped unanswered leaves its ids' outcome unknown: the awaited turn has its own.)
    let waiting = || {
        vec![
            call(&common::fresh("f"), "echo", json!({"text": "x"})),
            call(&common::fresh("g"), "slow_echo", json!({"text": "y"})),
        ]
    };
    assert!(session.dispatch(waiting()).now_or_never().is_none());
    let results = session.dispatch(waiting()).await.unwrap();
    assert_eq!(outcomes(&results), ["ok", "ok"]);
}

#[tokio::test]
async fn a_tool_registered_at_run_time_is_seen_by_the_next_turn() {
    let engine = engine(vec![echo_tool("echo")]);
    let session = engine.session();
    let before = session
        .dispatch(vec![call("a", "late", json!({"text": "x"}))])
        .await
        .unwrap();
    assert_eq!(outcomes(&before), ["unknown_tool"]);
    engine.register(echo_tool("late")).await.unwrap();
    let after = session
        .dispatch(vec![call("b", "late", json!({"text": "x"}))])
        .await
        .unwrap();
    assert_eq!(outcomes(&after), ["ok"]);
    assert_eq!(after[0].content, "echo:x");
    assert!(engine.unregister("late").await);
    let gone = session
        .dispatch(vec![call("c", "late", json!({"text": "x"}))])
        .await
        .unwrap();
    assert_eq!(outcomes(&gone), ["unknown_tool"]);
}
