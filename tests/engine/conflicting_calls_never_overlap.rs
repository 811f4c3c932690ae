//! Overlap by markers, not by timing (issue #14): calls that do not conflict run at the same time
//! (each handler waits, up to a patience, until two handlers are inside at once — which a serial
//! run can never reach), and calls that conflict never do (each handler records entering and
//! leaving; a conflicting pair must show one's exit before the other's entry, and neither may
//! ever see the other inside).
//!
//! The tools declare exactly the built-ins' accesses (`write_file::access`,
//! `read_file::access`, `glob::access`) around handlers that only record markers.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use switchboard::tools::{glob, read_file, write_file};
use switchboard::{Engine, Handler, ToolCall, ToolSpec};

/// The markers of one turn: `enter ID` / `exit ID`, in the order they happened.
type Log = Arc<Mutex<Vec<String>>>;

/// How many handlers are inside now, and the most that ever were at once.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// A tool with `access` whose handler enters, waits up to `patience` until two handlers have
/// been inside at once, and exits; its answer is `met` or `alone`.
fn marker_tool(
    name: &str,
    schema: Value,
    access: fn(
        &Value,
        Option<&switchboard::Workspace>,
    ) -> Result<switchboard::Access, switchboard::ToolError>,
    log: &Log,
    barrier: &Arc<Inside>,
    patience: Duration,
) -> ToolSpec {
    let (log, barrier) = (Arc::clone(log), Arc::clone(barrier));
    ToolSpec::new(
        name,
        "Records its markers.",
        schema,
        Handler::future(move |_args: Value, ctx| {
            let (log, barrier) = (Arc::clone(&log), Arc::clone(&barrier));
            async move {
                log.lock().unwrap().push(format!("enter {}", ctx.call_id));
                let n = barrier.now.fetch_add(1, Ordering::SeqCst) + 1;
                barrier.peak.fetch_max(n, Ordering::SeqCst);
                let until = tokio::time::Instant::now() + patience;
                while barrier.peak.load(Ordering::SeqCst) < 2 && tokio::time::Instant::now() < until
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let met = barrier.peak.load(Ordering::SeqCst) >= 2;
                log.lock().unwrap().push(format!("exit {}", ctx.call_id));
                barrier.now.fetch_sub(1, Ordering::SeqCst);
                Ok(if met { "met" } else { "alone" }.to_string())
            }
        }),
    )
    .access(access)
}

fn engine(log: &Log, barrier: &Arc<Inside>, patience: Duration) -> (tempfile::TempDir, Engine) {
    let (tmp, ws) = common::workspace::temp_workspace();
    let path =
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
    let pattern = json!({"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]});
    let engine = Engine::builder()
        .tools([
            marker_tool(
                "w",
                path.clone(),
                write_file::access,
                log,
                barrier,
                patience,
            ),
            marker_tool("r", path, read_file::access, log, barrier, patience),
            marker_tool("g", pattern, glob::access, log, barrier, patience),
        ])
        .workspace(ws)
        .workers(2)
        .build()
        .unwrap();
    (tmp, engine)
}

fn call(id: &str, name: &str, key: &str, value: &str) -> ToolCall {
    ToolCall::new(id, name, json!({ key: value }))
}

async fn run(calls: Vec<ToolCall>, patience: Duration) -> (Vec<String>, Vec<String>) {
    let log: Log = Log::default();
    let barrier = Arc::new(Inside::default());
    let (_tmp, engine) = engine(&log, &barrier, patience);
    let results = tokio::time::timeout(Duration::from_secs(30), engine.dispatch(calls))
        .await
        .expect("bounded")
        .unwrap();
    let contents = results.iter().map(|r| r.content.clone()).collect();
    let markers = log.lock().unwrap().clone();
    (contents, markers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writes_to_different_files_run_at_the_same_time() {
    for (a, b) in [
        ("a.txt", "b.txt"),
        ("dir/a.txt", "dir/b.txt"),
        ("x/1", "y/2"),
    ] {
        let (contents, markers) = run(
            vec![call("w1", "w", "path", a), call("w2", "w", "path", b)],
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(contents, ["met", "met"], "{a} {b}: {markers:?}");
        assert_eq!(&markers[..2], ["enter w1", "enter w2"].map(String::from));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_calls_never_run_at_the_same_time() {
    // Each pair conflicts: same file twice (also through `./` and an absolute form is covered in
    // the unit tests), a write and a read of its directory, a write and a glob over it.
    let pairs = [
        (
            call("x", "w", "path", "a.txt"),
            call("y", "w", "path", "a.txt"),
        ),
        (
            call("x", "w", "path", "a.txt"),
            call("y", "w", "path", "./a.txt"),
        ),
        (
            call("x", "w", "path", "dir/f.txt"),
            call("y", "r", "path", "dir"),
        ),
        (
            call("x", "r", "path", "dir"),
            call("y", "w", "path", "dir/f.txt"),
        ),
        (
            call("x", "w", "path", "dir/f.txt"),
            call("y", "g", "pattern", "dir/**"),
        ),
        (
            call("x", "g", "pattern", "**/*.txt"),
            call("y", "w", "path", "z/q.txt"),
        ),
        (
            call("x", "r", "path", "a.txt"),
            call("y", "w", "path", "a.txt"),
        ),
    ];
    for (first, second) in pairs {
        let what = format!("{first:?} then {second:?}");
        let (contents, markers) = run(vec![first, second], Duration::from_millis(300)).await;
        assert_eq!(contents, ["alone", "alone"], "{what}");
        assert_eq!(
            markers,
            ["enter x", "exit x", "enter y", "exit y"].map(String::from),
            "{what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_one_file_overlap_and_a_later_call_overtakes_an_unrelated_wait() {
    // x writes a; y reads a (waits for x); z reads b (waits for nothing): z is inside together
    // with x while y is still waiting.
    let (contents, markers) = run(
        vec![
            call("x", "w", "path", "a.txt"),
            call("y", "r", "path", "a.txt"),
            call("z", "r", "path", "b.txt"),
        ],
        Duration::from_millis(2_000),
    )
    .await;
    assert_eq!(contents[0], "met", "{markers:?}");
    assert_eq!(contents[2], "met", "{markers:?}");
    let at = |m: &str| markers.iter().position(|x| x == m).unwrap();
    assert!(at("exit x") < at("enter y"), "{markers:?}");
    // Two reads of one file are inside together.
    let (contents, _) = run(
        vec![
            call("p", "r", "path", "a.txt"),
            call("q", "r", "path", "a.txt"),
        ],
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(contents, ["met", "met"]);
}
