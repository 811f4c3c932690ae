//! MCP servers that misbehave (tests/mcp_servers/misbehaving.py): a call that hangs, a server that
//! crashes mid-call (or keeps crashing), garbage on stdout, a 10 MB result, a tool list that
//! changes, a tool whose schema does not compile — each call is
//! still answered exactly once, in order, and the engine and the server's other tools keep
//! working. Needs python3 (skipped with a message without it, unless SWITCHBOARD_MCP_TEST_DIR is
//! set, as in CI).

use crate::common;

use std::time::Duration;

use common::mcp::*;
use serde_json::json;
use switchboard::ErrorCode;
use switchboard::mcp::ServerState;

fn events(state: &std::path::Path) -> String {
    std::fs::read_to_string(state.join("events.log")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_call_times_out_and_the_server_is_told_to_cancel_it() {
    let Some(py) = python("hanging call") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let mut spec = misbehaving(&py, state.path());
    spec.timeout = Duration::from_millis(1_500);
    let engine = engine_with(vec![("bad", spec)]).await;
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__bad__echo", json!({"x": 1})),
            call("b", "mcp__bad__hang", json!({})),
            call("c", "mcp__bad__echo", json!({"x": 2})),
        ],
    )
    .await;
    assert_eq!(results[0].content, r#"{"x": 1}"#);
    assert_eq!(
        results[1].error,
        Some(ErrorCode::Timeout),
        "{}",
        results[1].content
    );
    assert!(
        results[1]
            .content
            .contains("notifications/cancelled sent to MCP server bad"),
        "{}",
        results[1].content
    );
    assert_eq!(results[2].content, r#"{"x": 2}"#);
    // The server saw a notifications/cancelled naming exactly the hanging request's id.
    let got = eventually(Duration::from_secs(10), || {
        let log = events(state.path());
        let id = log.lines().find_map(|l| {
            l.strip_suffix(" hang")?
                .strip_prefix("call ")
                .map(str::to_string)
        });
        id.is_some_and(|id| log.lines().any(|l| l == format!("cancelled {id}")))
    })
    .await;
    assert!(
        got,
        "no matching notifications/cancelled: {}",
        events(state.path())
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_turn_cancels_the_request_on_the_server() {
    let Some(py) = python("cancelled call") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![("bad", misbehaving(&py, state.path()))]).await;
    let token = engine.turn_token();
    let dispatch = {
        let (engine, token) = (engine.clone(), token.clone());
        tokio::spawn(async move {
            engine
                .dispatch_with_cancel(vec![call("h", "mcp__bad__hang", json!({}))], token)
                .await
                .expect("engine available")
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || events(state.path())
            .contains(" hang"))
        .await,
        "the call never reached the server"
    );
    token.cancel();
    let results = dispatch.await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(
        results[0].error,
        Some(ErrorCode::Cancelled),
        "{}",
        results[0].content
    );
    assert!(
        eventually(Duration::from_secs(10), || events(state.path())
            .contains("cancelled "))
        .await,
        "{}",
        events(state.path())
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_crashes_mid_call_is_restarted_and_the_next_call_works() {
    let Some(py) = python("crashing server") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![("bad", misbehaving(&py, state.path()))]).await;
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__bad__echo", json!({"before": true})),
            call("b", "mcp__bad__crash_once", json!({})),
            call("c", "mcp__bad__echo", json!({"after": true})),
        ],
    )
    .await;
    assert_eq!(results[0].error, None, "{}", results[0].content);
    assert_eq!(results[1].error, Some(ErrorCode::ExecutionError));
    assert!(
        results[1].content.contains("MCP server bad exited"),
        "{}",
        results[1].content
    );
    // The next call waits for the restart (1 s backoff) and then works.
    assert_eq!(results[2].error, None, "{}", results[2].content);
    assert_eq!(results[2].content, r#"{"after": true}"#);
    let again = turn(&engine, vec![call("d", "mcp__bad__crash_once", json!({}))]).await;
    assert_eq!(again[0].content, "survived");
    let status = &engine.mcp_status()[0];
    assert_eq!(status.state, ServerState::Up);
    assert_eq!(status.restarts, 1);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_stdout_does_not_lose_or_duplicate_answers() {
    let Some(py) = python("garbage on stdout") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![("bad", misbehaving(&py, state.path()))]).await;
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__bad__garbage", json!({})),
            call("b", "mcp__bad__echo", json!({"n": 1})),
        ],
    )
    .await;
    // The garbage lines are skipped; the answer after them still arrives.
    assert_eq!(results[0].error, None, "{}", results[0].content);
    assert_eq!(results[0].content, "after garbage");
    assert_eq!(results[1].content, r#"{"n": 1}"#);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_result_is_capped_like_any_output() {
    let Some(py) = python("10 MB result") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![("bad", misbehaving(&py, state.path()))]).await;
    let results = turn(
        &engine,
        vec![
            call("a", "mcp__bad__big", json!({})),
            call("b", "mcp__bad__fail", json!({})),
        ],
    )
    .await;
    assert_eq!(results[0].error, None);
    assert!(
        results[0].content.len() <= 50_000,
        "{}",
        results[0].content.len()
    );
    // About the cap, head and tail around one marker that counts every byte cut.
    assert!(
        results[0].content.len() > 49_000,
        "{}",
        results[0].content.len()
    );
    assert_eq!(results[0].content.matches("bytes truncated").count(), 1);
    let kept = results[0].content.bytes().filter(|b| *b == b'x').count();
    let cut: usize = results[0]
        .content
        .split("… ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(kept + cut, 10 * 1024 * 1024);
    assert_eq!(results[1].error, Some(ErrorCode::ExecutionError));
    assert_eq!(results[1].content, "Error [execution_error]: it went wrong");
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_replaces_the_servers_tools_atomically() {
    let Some(py) = python("changing tool list") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![("bad", misbehaving(&py, state.path()))]).await;
    // Both pages of tools/list were registered.
    let names = |engine: &switchboard::Engine| {
        engine.mcp_status()[0]
            .tools
            .iter()
            .map(|t| t.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&engine).len(), 9, "{:?}", names(&engine));
    assert_eq!(engine.tool_count().await, 9);
    // The tool whose schema does not compile is skipped, named, and the rest of the server loads.
    let skipped = engine.mcp_status()[0].skipped.clone();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].0, "bad_schema");
    assert!(skipped[0].1.contains("mcp__bad__bad_schema"), "{skipped:?}");
    let version = engine.registry_version();
    let results = turn(
        &engine,
        vec![call("a", "mcp__bad__change_tools", json!({}))],
    )
    .await;
    assert_eq!(results[0].content, "changing");
    assert!(
        eventually(Duration::from_secs(10), || names(&engine)
            .contains(&"mcp__bad__echo2".to_string()))
        .await
    );
    assert_eq!(engine.registry_version(), version + 1, "one version bump");
    assert_eq!(engine.tool_count().await, 9);
    let results = turn(
        &engine,
        vec![
            call("b", "mcp__bad__echo", json!({})),
            call("c", "mcp__bad__echo2", json!({"v": 2})),
        ],
    )
    .await;
    assert_eq!(results[0].error, Some(ErrorCode::UnknownTool));
    assert_eq!(results[1].content, r#"{"v": 2}"#);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_sees_only_the_allowlisted_environment_and_its_own_env() {
    let Some(py) = python("environment") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let mut spec = misbehaving(&py, state.path());
    if let switchboard::mcp::Transport::Stdio { env, .. } = &mut spec.transport {
        env.insert("CONFIGURED".into(), "yes".into());
    }
    let engine = engine_with(vec![("bad", spec)]).await;
    let results = turn(&engine, vec![call("a", "mcp__bad__env", json!({}))]).await;
    let keys: Vec<String> = serde_json::from_str(&results[0].content).unwrap();
    assert!(keys.contains(&"CONFIGURED".to_string()), "{keys:?}");
    assert!(keys.contains(&"PATH".to_string()), "{keys:?}");
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "CONFIGURED",
        // The marker of a server's process tree where it has no cgroup of its own.
        "SWITCHBOARD_CALL_TOKEN",
    ];
    for k in &keys {
        // python3 itself may add LC_CTYPE when coercing the locale.
        assert!(
            allowed.contains(&k.as_str()) || k.starts_with("LC_"),
            "{k} leaked into the server's environment: {keys:?}"
        );
    }
    // Cargo sets this for every test process; it must not reach the server.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    assert!(!keys.contains(&"CARGO_MANIFEST_DIR".to_string()));
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_server_process_and_failed_servers_do_not_stop_the_engine() {
    let Some(py) = python("shutdown") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![
        ("bad", misbehaving(&py, state.path())),
        (
            "missing",
            switchboard::mcp::ServerSpec::stdio("/nonexistent/mcp-server", []),
        ),
        // Names are checked in the library too: `__` would make registry prefixes ambiguous.
        ("bad__name", misbehaving(&py, state.path())),
    ])
    .await;
    let status = |name: &str| {
        engine
            .mcp_servers()
            .get(name)
            .map(|s| s.status().state)
            .unwrap()
    };
    assert_eq!(status("bad"), ServerState::Up);
    assert!(
        matches!(status("missing"), ServerState::Failed { reason } if reason.contains("/nonexistent/mcp-server")),
        "{:?}",
        status("missing")
    );
    assert!(
        matches!(status("bad__name"), ServerState::Failed { reason } if reason.contains("invalid server name \"bad__name\"")),
        "{:?}",
        status("bad__name")
    );
    let pid = engine.mcp_servers().get("bad").unwrap().pid();
    assert!(pid > 0 && !process_gone(pid));
    let results = turn(&engine, vec![call("a", "mcp__bad__echo", json!({}))]).await;
    assert_eq!(results[0].error, None);
    engine.shutdown(Duration::from_secs(1)).await;
    assert!(
        process_gone(pid),
        "server process {pid} outlived the engine"
    );
    assert_eq!(status("bad"), ServerState::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_keeps_crashing_stays_down_after_five_failures_and_its_tools_go() {
    let Some(py) = python("crash loop") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let engine = engine_with(vec![("bad", misbehaving(&py, state.path()))]).await;
    // Each call crashes the server; each restart waits 1, 2, 4, 8 s (about 15 s in all).
    for i in 0..5 {
        let results = turn(
            &engine,
            vec![call(&format!("c{i}"), "mcp__bad__crash_always", json!({}))],
        )
        .await;
        assert_eq!(
            results[0].error,
            Some(ErrorCode::ExecutionError),
            "{i}: {}",
            results[0].content
        );
        assert!(
            results[0].content.contains("MCP server bad exited"),
            "{}",
            results[0].content
        );
    }
    let stays_down = || {
        matches!(&engine.mcp_status()[0].state,
            ServerState::Failed { reason } if reason.contains("stays down after 5 failures within 5 minutes"))
    };
    assert!(
        eventually(Duration::from_secs(10), stays_down).await,
        "{:?}",
        engine.mcp_status()
    );
    let status = engine.mcp_status().remove(0);
    assert_eq!(status.restarts, 4);
    assert_eq!(
        engine.tool_count().await,
        0,
        "the server's tools were removed"
    );
    let results = turn(&engine, vec![call("d", "mcp__bad__echo", json!({}))]).await;
    assert_eq!(results[0].error, Some(ErrorCode::UnknownTool));
    engine.shutdown(Duration::from_secs(1)).await;
}
