//! Calling a tool's handler directly, as the engine would, asserting its error code, and tracing
//! the processes a bash call leaves behind — shared by the tool-level tests (confinement, atomic
//! writes, bash control).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard::Workspace;
use switchboard::protocol::ErrorCode;
use switchboard::tool::{Handler, SessionScope, ToolContext, ToolOutcome, ToolSpec};
use tokio_util::sync::CancellationToken;

/// A handler context for call `call_id` with `budget` until its deadline, in a session without a
/// workspace (wrap the spec with [`in_workspace`] to give its calls one).
pub fn ctx(call_id: &str, budget: Duration, cancel: CancellationToken) -> ToolContext {
    ToolContext::new(
        call_id,
        "test",
        Arc::new(SessionScope::new("test", None)),
        Instant::now() + budget,
        cancel,
    )
}

/// The spec as a session confined to `ws` sees it: every call's context carries `ws` as its
/// session's workspace, as the engine's would.
pub fn in_workspace(spec: ToolSpec, ws: &Workspace) -> ToolSpec {
    let scope = Arc::new(SessionScope::new("test", Some(ws.clone())));
    let scoped = move |ctx: &ToolContext| ToolContext {
        session: Arc::clone(&scope),
        ..ctx.clone()
    };
    let handler = match spec.handler.clone() {
        Handler::Inline(f) => Handler::inline(move |args, ctx| f(args, &scoped(ctx))),
        Handler::Blocking(f) => Handler::blocking(move |args, ctx| f(args, &scoped(ctx))),
        Handler::Async(f) => Handler::future(move |args, ctx| f(args, scoped(&ctx))),
    };
    ToolSpec { handler, ..spec }
}

/// [`in_workspace`] for each spec.
pub fn all_in_workspace(specs: Vec<ToolSpec>, ws: &Workspace) -> Vec<ToolSpec> {
    specs.into_iter().map(|s| in_workspace(s, ws)).collect()
}

/// Runs a spec's handler with `ctx` (async handlers are awaited).
pub async fn call_with(spec: &ToolSpec, args: Value, ctx: ToolContext) -> ToolOutcome {
    match &spec.handler {
        Handler::Inline(f) | Handler::Blocking(f) => f(&args, &ctx),
        Handler::Async(f) => f(args, ctx).await,
    }
}

/// Runs a spec's handler outside any runtime, with a 30 s deadline (for the file tools; an async
/// handler is driven by a local executor).
pub fn call_sync(spec: &ToolSpec, call_id: &str, args: Value) -> ToolOutcome {
    let ctx = ctx(call_id, Duration::from_secs(30), CancellationToken::new());
    futures::executor::block_on(call_with(spec, args, ctx))
}

/// [`call_sync`] under the call id `direct` (file tools do not look at it).
pub fn call_tool(spec: &ToolSpec, args: Value) -> ToolOutcome {
    call_sync(spec, "direct", args)
}

/// Runs a spec's handler as call `call_id` with a 60 s deadline and `cancel`, failing the test
/// if it is not answered within 10 s.
pub async fn call_bounded(
    spec: &ToolSpec,
    call_id: &str,
    args: Value,
    cancel: CancellationToken,
) -> ToolOutcome {
    let ctx = ctx(call_id, Duration::from_secs(60), cancel);
    tokio::time::timeout(Duration::from_secs(10), call_with(spec, args, ctx))
        .await
        .expect("the call was answered within 10 s")
}

/// Asserts the outcome failed with `code` (`what` names the case in the message).
pub fn assert_code(outcome: ToolOutcome, code: ErrorCode, what: &str) {
    match outcome {
        Err(e) => assert_eq!(e.code, code, "{what}: {e}"),
        Ok(text) => panic!("{what}: expected {code}, got success: {text}"),
    }
}

/// Asserts the outcome is `permission_denied`.
pub fn assert_denied(outcome: ToolOutcome, what: &str) {
    assert_code(outcome, ErrorCode::PermissionDenied, what);
}

/// A call id no other test uses, so its environment marker finds only this call's processes.
pub fn unique_id(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{tag}-{}-{n}", std::process::id())
}

/// Live processes whose environment carries `SWITCHBOARD_CALL_ID=<call_id>` (zombies have an
/// empty environment and are not counted).
pub fn marked_processes(call_id: &str) -> Vec<String> {
    let needle = format!("SWITCHBOARD_CALL_ID={call_id}\0").into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// Waits (bounded, 2 s) until no process of the call is left; returns the survivors, if any.
pub async fn survivors(call_id: &str) -> Vec<String> {
    for _ in 0..40 {
        if marked_processes(call_id).is_empty() {
            return Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    marked_processes(call_id)
}
