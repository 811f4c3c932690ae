//! One admission path: a turn whose calls are admitted and started while the answer streams
//! (eager dispatch) gets exactly the results the same turn gets when it is dispatched whole —
//! the same codes, the same details, the same contents, in the same order — on the built-in
//! tools and a workspace laid out the same way.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::model::{self, BOUND, answer, text, tool_use};
use common::workspace::temp_workspace;
use serde_json::{Value, json};
use switchboard::ToolDispatchResult;
use switchboard::agent::{ScriptedProvider, tool_calls_of};

/// A turn that mixes what eager dispatch starts early (reads, a glob) with what it must not
/// (writes, an edit, bash) and with calls the engine refuses (a bad id, an unknown tool, invalid
/// arguments), and reads that depend on the writes before them.
fn blocks() -> Vec<Value> {
    vec![
        tool_use("r1", "read_file", json!({"path": "seed.txt"})),
        tool_use("g1", "glob", json!({"pattern": "*.txt"})),
        tool_use("bad id!", "read_file", json!({"path": "seed.txt"})),
        tool_use(
            "w1",
            "write_file",
            json!({"path": "new.txt", "content": "one\n"}),
        ),
        tool_use("r2", "read_file", json!({"path": "new.txt"})),
        tool_use("u1", "no_such_tool", json!({})),
        tool_use("i1", "read_file", json!({"limit": 1})),
        tool_use(
            "e1",
            "edit_file",
            json!({"path": "new.txt", "old_text": "one", "new_text": "two"}),
        ),
        tool_use("r3", "read_file", json!({"path": "new.txt"})),
        tool_use("b1", "bash", json!({"command": "cat seed.txt new.txt"})),
        tool_use("r4", "read_file", json!({"path": "seed.txt", "limit": 1})),
        tool_use("r5", "read_file", json!({"path": "missing.txt"})),
    ]
}

/// What a user compares: id, tool, error code and content of each result, in order.
fn seen(results: &[ToolDispatchResult]) -> Vec<(String, String, Option<String>, String)> {
    results
        .iter()
        .map(|r| {
            (
                r.tool_use_id.to_string(),
                r.tool_name.to_string(),
                r.error.map(|c| c.to_string()),
                r.content.clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_and_the_same_turn_dispatched_whole_get_identical_results() {
    // Streamed, with eager dispatch on.
    let (_streamed_dir, streamed_ws) = temp_workspace();
    std::fs::write(streamed_ws.root().join("seed.txt"), "alpha\nbeta\n").unwrap();
    let engine = common::builtin_engine(&streamed_ws, vec![]);
    let provider = Arc::new(
        ScriptedProvider::new([
            answer(blocks(), "tool_use"),
            answer(vec![text("done")], "end_turn"),
        ])
        .with_stream_delays(Duration::from_millis(2), Duration::from_millis(20)),
    );
    let mut agent = model::agent(&engine, provider, true, true);
    let streamed = tokio::time::timeout(BOUND, agent.run("go"))
        .await
        .expect("the prompt finishes")
        .expect("no engine fault");
    assert!(
        streamed.eager[0] > 0,
        "no call started while the answer streamed, so this compares nothing: {:?}",
        streamed.eager
    );

    // The same calls as one whole turn, on a workspace laid out the same way.
    let (_whole_dir, whole_ws) = temp_workspace();
    std::fs::write(whole_ws.root().join("seed.txt"), "alpha\nbeta\n").unwrap();
    let engine = common::builtin_engine(&whole_ws, vec![]);
    let whole = tokio::time::timeout(BOUND, engine.session().dispatch(tool_calls_of(&blocks())))
        .await
        .expect("the turn finishes")
        .expect("no engine fault");

    assert_eq!(seen(&streamed.dispatches[0]), seen(&whole));
    // And what they agree on is what the turn means.
    let codes: Vec<_> = whole
        .iter()
        .map(|r| r.error.map(|c| c.to_string()))
        .collect();
    assert_eq!(codes[2].as_deref(), Some("invalid_arguments"));
    assert_eq!(codes[5].as_deref(), Some("unknown_tool"));
    assert_eq!(codes[6].as_deref(), Some("invalid_arguments"));
    assert!(whole[4].content.contains("one"), "{}", whole[4].content);
    assert!(whole[8].content.contains("two"), "{}", whole[8].content);
    assert_eq!(
        std::fs::read_to_string(streamed_ws.root().join("new.txt")).unwrap(),
        std::fs::read_to_string(whole_ws.root().join("new.txt")).unwrap()
    );
}
