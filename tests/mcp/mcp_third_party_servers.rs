//! MCP servers nobody here wrote, as users run them: `@modelcontextprotocol/server-everything`
//! over stdio and over Streamable HTTP, `@modelcontextprotocol/server-filesystem`, and PyPI's
//! `mcp-server-time`. They are found under `$SWITCHBOARD_MCP_TEST_DIR` (`.ci/run` installs them
//! there); without the variable these tests print why and skip, so `cargo test` needs only the
//! Rust toolchain.

use crate::common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::mcp::*;
use serde_json::json;
use switchboard::ErrorCode;
use switchboard::ToolDispatchResult;
use switchboard::mcp::{ServerSpec, ServerState};

fn node_server(dir: &Path, package: &str, args: &[&str]) -> ServerSpec {
    let mut all = vec![node_entry(dir, package).display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    ServerSpec::stdio("node", all)
}

/// Start (relative to the turn's arrival) and end of a call's handler.
fn span(r: &ToolDispatchResult) -> (Duration, Duration) {
    assert!(r.timing.ran, "{} did not run", r.tool_use_id);
    (r.timing.queued, r.timing.queued + r.timing.run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_stdio_answers_text_images_structured_content_and_errors() {
    let Some(dir) = test_dir("server-everything stdio") else {
        return;
    };
    let engine = engine_with(vec![(
        "everything",
        node_server(&dir, "server-everything", &["stdio"]),
    )])
    .await;
    assert_eq!(
        engine.mcp_status()[0].state,
        ServerState::Up,
        "{:?}",
        engine.mcp_status()
    );
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__everything__echo", json!({"message": "hi"})),
            call("b", "mcp__everything__get-sum", json!({"a": 2, "b": 3})),
            call("c", "mcp__everything__get-tiny-image", json!({})),
            call(
                "d",
                "mcp__everything__get-structured-content",
                json!({"location": "Chicago"}),
            ),
            // Refused by the engine's own schema validation: nothing is sent.
            call("e", "mcp__everything__echo", json!({"nope": 1})),
            call("f", "mcp__everything__no-such-tool", json!({})),
        ],
    )
    .await;
    assert_eq!(results[0].content, "Echo: hi");
    assert_eq!(results[1].content, "The sum of 2 and 3 is 5.");
    // get-tiny-image answers text, a PNG, text: an image block for Anthropic, its note for
    // OpenAI.
    assert_eq!(results[2].error, None, "{}", results[2].content);
    assert!(
        results[2].content.contains("[image: image/png,"),
        "{}",
        results[2].content
    );
    let anthropic = results[2].to_anthropic_block();
    let blocks = anthropic["content"].as_array().expect("an array of blocks");
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["text", "image", "text"], "{anthropic}");
    assert_eq!(blocks[1]["source"]["type"], "base64");
    assert_eq!(blocks[1]["source"]["media_type"], "image/png");
    let data = blocks[1]["source"]["data"].as_str().unwrap();
    assert!(data.starts_with("iVBORw0KGgo"), "a PNG: {}", &data[..20]);
    let openai = results[2].to_openai_message();
    assert_eq!(
        openai["content"],
        format!(
            "Here's the image you requested:\n[image: image/png, {} bytes base64, not shown]\n\
             The image above is the MCP logo.",
            data.len()
        )
    );
    assert_eq!(results[3].error, None, "{}", results[3].content);
    assert!(
        results[3].content.contains("temperature"),
        "{}",
        results[3].content
    );
    assert_eq!(results[4].error, Some(ErrorCode::InvalidArguments));
    assert_eq!(results[5].error, Some(ErrorCode::UnknownTool));
    engine.shutdown(Duration::from_secs(2)).await;
}

/// server-everything in Streamable HTTP mode on a free loopback port (killed on drop).
struct HttpServer {
    child: Child,
    port: u16,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_http(dir: &Path) -> HttpServer {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let preload = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/bind_loopback.cjs");
    let child = Command::new("node")
        .arg("--require")
        .arg(preload)
        .arg(node_entry(dir, "server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("node starts");
    HttpServer { child, port }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_streamable_http_answers_calls_in_order() {
    let Some(dir) = test_dir("server-everything Streamable HTTP") else {
        return;
    };
    let server = start_http(&dir);
    let addr = format!("127.0.0.1:{}", server.port);
    assert!(
        eventually(Duration::from_secs(20), || std::net::TcpStream::connect(
            &addr
        )
        .is_ok())
        .await,
        "server-everything did not listen on {addr}"
    );
    let engine = engine_from(&format!(
        r#"{{"mcpServers": {{"web": {{"type": "http", "url": "http://{addr}/mcp",
            "headers": {{"X-Test": "${{SWITCHBOARD_UNSET_FOR_TEST:-ok}}"}}}}}}}}"#
    ))
    .await;
    let status = &engine.mcp_status()[0];
    assert_eq!(status.state, ServerState::Up, "{status:?}");
    assert_eq!(status.transport, "http");
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__web__echo", json!({"message": "over http"})),
            call("b", "mcp__web__get-sum", json!({"a": 40, "b": 2})),
            call("c", "mcp__web__echo", json!({"message": "again"})),
        ],
    )
    .await;
    assert_eq!(results[0].content, "Echo: over http");
    assert_eq!(results[1].content, "The sum of 40 and 2 is 42.");
    assert_eq!(results[2].content, "Echo: again");
    engine.shutdown(Duration::from_secs(2)).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_filesystem_reads_of_one_turn_overlap_and_a_write_does_not() {
    let Some(dir) = test_dir("server-filesystem") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    for name in ["a", "b", "c"] {
        std::fs::write(
            root_path.join(format!("{name}.txt")),
            format!("file {name}"),
        )
        .unwrap();
    }
    let engine = engine_with(vec![(
        "fs",
        node_server(&dir, "server-filesystem", &[root_path.to_str().unwrap()]),
    )])
    .await;
    let status = &engine.mcp_status()[0];
    assert_eq!(status.state, ServerState::Up, "{status:?}");
    let policy = |name: &str| {
        status
            .tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.concurrency_safe)
    };
    assert_eq!(policy("mcp__fs__read_text_file"), Some(true));
    assert_eq!(policy("mcp__fs__write_file"), Some(false));
    let path = |n: &str| root_path.join(n).display().to_string();

    // Three reads: one concurrent stage, so every handler started before any of them ended.
    let reads = turn(
        &engine,
        ["a", "b", "c"]
            .iter()
            .map(|n| {
                call(
                    n,
                    "mcp__fs__read_text_file",
                    json!({"path": path(&format!("{n}.txt"))}),
                )
            })
            .collect(),
    )
    .await;
    for (r, n) in reads.iter().zip(["a", "b", "c"]) {
        assert_eq!(r.content, format!("file {n}"));
    }
    let spans: Vec<_> = reads.iter().map(span).collect();
    let last_start = spans.iter().map(|s| s.0).max().unwrap();
    let first_end = spans.iter().map(|s| s.1).min().unwrap();
    assert!(
        last_start < first_end,
        "the reads did not overlap: {spans:?}"
    );

    // read, write, read-back: the write runs alone, after the read and before the read-back.
    let mixed = turn(
        &engine,
        vec![
            call(
                "r1",
                "mcp__fs__read_text_file",
                json!({"path": path("a.txt")}),
            ),
            call(
                "w",
                "mcp__fs__write_file",
                json!({"path": path("d.txt"), "content": "written"}),
            ),
            call(
                "r2",
                "mcp__fs__read_text_file",
                json!({"path": path("d.txt")}),
            ),
        ],
    )
    .await;
    assert_eq!(mixed[1].error, None, "{}", mixed[1].content);
    assert_eq!(mixed[2].content, "written", "the read-back saw the write");
    let (r1, w, r2) = (span(&mixed[0]), span(&mixed[1]), span(&mixed[2]));
    assert!(
        r1.1 <= w.0 && w.1 <= r2.0,
        "the write overlapped: {r1:?} {w:?} {r2:?}"
    );
    engine.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_time_from_pypi_answers_and_reports_bad_timezones_as_errors() {
    let Some(dir) = test_dir("mcp-server-time") else {
        return;
    };
    let program = dir.join("venv/bin/mcp-server-time");
    assert!(program.is_file(), "{} is missing", program.display());
    let engine = engine_with(vec![(
        "time",
        ServerSpec::stdio(program.display().to_string(), []),
    )])
    .await;
    let status = &engine.mcp_status()[0];
    assert_eq!(status.state, ServerState::Up, "{status:?}");
    let results = turn(
        &engine,
        vec![
            call(
                "a",
                "mcp__time__get_current_time",
                json!({"timezone": "UTC"}),
            ),
            call(
                "b",
                "mcp__time__convert_time",
                json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
            ),
            call(
                "c",
                "mcp__time__get_current_time",
                json!({"timezone": "Mars/Olympus"}),
            ),
        ],
    )
    .await;
    assert_eq!(results[0].error, None, "{}", results[0].content);
    assert!(
        results[0].content.contains("\"timezone\": \"UTC\"")
            || results[0].content.contains("\"timezone\":\"UTC\""),
        "{}",
        results[0].content
    );
    assert_eq!(results[1].error, None, "{}", results[1].content);
    assert!(
        results[1].content.contains("21:00"),
        "{}",
        results[1].content
    );
    assert_eq!(
        results[2].error,
        Some(ErrorCode::ExecutionError),
        "{}",
        results[2].content
    );
    assert!(
        results[2].content.contains("Mars/Olympus"),
        "{}",
        results[2].content
    );
    engine.shutdown(Duration::from_secs(2)).await;
}

/// server-everything's `trigger-long-running-operation` sends `notifications/progress` for the
/// progress token of its request: with a listener, each arrives as a progress value of the call
/// (in order, before its result); the result is the same with or without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_s_progress_notifications_reach_the_call_s_listener() {
    let Some(dir) = test_dir("server-everything progress") else {
        return;
    };
    let engine = engine_with(vec![(
        "everything",
        node_server(&dir, "server-everything", &["stdio"]),
    )])
    .await;
    let session = engine.session();
    let long = |id: &str| {
        call(
            id,
            "mcp__everything__trigger-long-running-operation",
            json!({"duration": 1, "steps": 5}),
        )
    };
    let (listener, mut events) =
        switchboard::tool::ProgressSink::channel(switchboard::tool::ProgressSink::DEFAULT_CAPACITY);
    let (results_tx, mut results_rx) = tokio::sync::mpsc::unbounded_channel();
    let results = session
        .dispatch_with_progress(
            vec![
                long("p1"),
                call("e", "mcp__everything__echo", json!({"message": "x"})),
            ],
            session.turn_token(),
            Some(results_tx),
            listener,
        )
        .await
        .unwrap();
    assert_eq!(
        results[0].content, "Long running operation completed. Duration: 1 seconds, Steps: 5.",
        "{:?}",
        results[0]
    );
    let mut values = Vec::new();
    while let Ok(event) = events.try_recv() {
        assert_eq!(&*event.tool_use_id, "p1", "{event:?}");
        match event.update {
            switchboard::tool::ProgressUpdate::Value {
                progress, total, ..
            } => values.push((event.seq, progress, total)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        values,
        (1..=5u64)
            .map(|i| (i, i as f64, Some(5.0)))
            .collect::<Vec<_>>()
    );
    // Each result went to the result sink too; the call's own came after its progress (the
    // events were all there when the turn ended, read above).
    let mut answered = Vec::new();
    while let Ok((index, _)) = results_rx.try_recv() {
        answered.push(index);
    }
    answered.sort_unstable();
    assert_eq!(answered, [0, 1]);

    // Without a listener: the same answer, nothing routed.
    let plain = session.dispatch(vec![long("p2")]).await.unwrap();
    assert_eq!(plain[0].content, results[0].content);

    // A call given up while the server still works on it: cancelled, and the server (told so)
    // answers the next call as before.
    let (listener, _events) = switchboard::tool::ProgressSink::channel(8);
    let cancel = session.turn_token();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.cancel();
    });
    let cancelled = session
        .dispatch_with_progress(vec![long("p3")], cancel, None, listener)
        .await
        .unwrap();
    assert_eq!(
        cancelled[0].error,
        Some(ErrorCode::Cancelled),
        "{:?}",
        cancelled[0]
    );
    let after = session
        .dispatch(vec![call(
            "e2",
            "mcp__everything__echo",
            json!({"message": "still here"}),
        )])
        .await
        .unwrap();
    assert_eq!(after[0].content, "Echo: still here");
    drop(session);
    engine.shutdown(Duration::from_secs(2)).await;
}
