//! Ordering: results come back in call order whatever order they finish in; calls that are not
//! concurrency-safe run alone, in model order, so a later call sees an earlier call's effects.

use crate::common;

use common::*;
use serde_json::json;
use switchboard::Workspace;
use switchboard::tools::builtin_tools;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_finish_in_reverse_come_back_in_call_order() {
    let engine = engine(vec![sleeping_tool("sleep", true)]);
    let results = run_turn(
        &engine,
        vec![
            call("s80", "sleep", json!({"ms": 80})),
            call("s60", "sleep", json!({"ms": 60})),
            call("s40", "sleep", json!({"ms": 40})),
            call("s20", "sleep", json!({"ms": 20})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["s80", "s60", "s40", "s20"]);
    let contents: Vec<_> = results.iter().map(|r| r.content.as_str()).collect();
    assert_eq!(contents, ["slept 80", "slept 60", "slept 40", "slept 20"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutating_batch_runs_one_call_at_a_time_in_model_order() {
    let log = EventLog::default();
    let engine = engine(vec![logging_tool("mutate", false, log.clone())]);
    // Earlier calls sleep longer: any overlap or reordering would show in the log.
    let calls = (0..4)
        .map(|i| {
            call(
                &format!("m{i}"),
                "mutate",
                json!({"i": i, "ms": 40 - 10 * i}),
            )
        })
        .collect();
    let results = run_turn(&engine, calls).await;
    assert_eq!(ids(&results), ["m0", "m1", "m2", "m3"]);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(
        log.events(),
        [
            "start 0", "end 0", "start 1", "end 1", "start 2", "end 2", "start 3", "end 3"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_call_waits_for_the_safe_calls_before_it_and_blocks_those_after_it() {
    let log = EventLog::default();
    let engine = engine(vec![
        logging_tool("read", true, log.clone()),
        logging_tool("write", false, log.clone()),
    ]);
    let results = run_turn(
        &engine,
        vec![
            call("r0", "read", json!({"i": 0, "ms": 40})),
            call("r1", "read", json!({"i": 1, "ms": 20})),
            call("w2", "write", json!({"i": 2, "ms": 20})),
            call("r3", "read", json!({"i": 3, "ms": 0})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["r0", "r1", "w2", "r3"]);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let start_write = log.position("start 2");
    assert!(log.position("end 0") < start_write, "{:?}", log.events());
    assert!(log.position("end 1") < start_write, "{:?}", log.events());
    assert!(
        log.position("end 2") < log.position("start 3"),
        "{:?}",
        log.events()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_a_write_in_the_same_turn_sees_the_new_content() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.md"), "old content\n").unwrap();
    let ws = Workspace::open(dir.path()).unwrap();
    let engine = engine(common::direct::all_in_workspace(builtin_tools(), &ws));
    let results = run_turn(
        &engine,
        vec![
            call(
                "w",
                "write_file",
                json!({"path": "notes.md", "content": "fresh content\n"}),
            ),
            call("r", "read_file", json!({"path": "notes.md"})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["w", "r"]);
    assert!(results[0].is_ok(), "{}", results[0].content);
    assert!(results[1].is_ok(), "{}", results[1].content);
    assert!(
        results[1].content.contains("fresh content"),
        "{}",
        results[1].content
    );
    assert!(!results[1].content.contains("old content"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.md")).unwrap(),
        "fresh content\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_an_edit_in_the_same_turn_sees_the_edit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("todo.txt"), "TODO: ship it\n").unwrap();
    let ws = Workspace::open(dir.path()).unwrap();
    let engine = engine(common::direct::all_in_workspace(builtin_tools(), &ws));
    let results = run_turn(
        &engine,
        vec![
            call("r0", "read_file", json!({"path": "todo.txt"})),
            call(
                "e",
                "edit_file",
                json!({"path": "todo.txt", "old_text": "TODO: ship it", "new_text": "DONE: shipped"}),
            ),
            call("r1", "read_file", json!({"path": "todo.txt"})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["r0", "e", "r1"]);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert!(results[0].content.contains("TODO: ship it"));
    assert!(
        results[2].content.contains("DONE: shipped"),
        "{}",
        results[2].content
    );
    assert!(!results[2].content.contains("TODO"));
}
