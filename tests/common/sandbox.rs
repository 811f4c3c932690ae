//! Shared by the `sandbox_*` suites: engines with a sandbox whose trampoline is this build's
//! `switchboard` binary, one-call helpers, and the skip rule — a test skips (printing why) only
//! where the kernel lacks the feature it needs, and with `SWITCHBOARD_REQUIRE_SANDBOX=1` (set by
//! `.ci/run`) a skip is a failure instead.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use switchboard::sandbox::{SandboxConfig, SandboxMode};
use switchboard::tools::builtin_tools;
use switchboard::{Engine, ErrorCode, Session, ToolCall, ToolDispatchResult, Workspace};

/// This build's small trampoline, `switchboard-sandbox` (what the engine finds beside
/// `switchboard` and starts for every sandboxed command), the trampoline of every engine here.
/// `switchboard sandbox-exec` itself is the trampoline of the CLI tests that copy the binary
/// elsewhere (`sandbox_modes`).
pub const TRAMPOLINE: &str = env!("CARGO_BIN_EXE_switchboard-sandbox");

/// This build's `switchboard` CLI (which finds `switchboard-sandbox` beside it).
pub const CLI: &str = env!("CARGO_BIN_EXE_switchboard");

/// A config in `mode` with this build's trampoline.
pub fn config(mode: SandboxMode) -> SandboxConfig {
    SandboxConfig::new(mode).trampoline(TRAMPOLINE)
}

/// Returns `true` when `available`; otherwise prints why the test is skipped and returns
/// `false`, or panics when `SWITCHBOARD_REQUIRE_SANDBOX=1`.
pub fn available(what: &str, available: bool) -> bool {
    if available {
        return true;
    }
    if std::env::var("SWITCHBOARD_REQUIRE_SANDBOX").as_deref() == Ok("1") {
        panic!("SWITCHBOARD_REQUIRE_SANDBOX=1 but this machine lacks {what}");
    }
    println!("SKIPPED: this kernel lacks {what}");
    false
}

/// An engine with the built-in tools and `config`, or `None` (skipped) when the kernel cannot
/// enforce it.
pub fn engine(ws: Option<&Workspace>, config: SandboxConfig) -> Option<Engine> {
    let mut builder = Engine::builder().tools(builtin_tools()).sandbox(config);
    if let Some(ws) = ws {
        builder = builder.workspace(ws.clone());
    }
    match builder.build() {
        Ok(engine) => Some(engine),
        Err(e) => {
            available(&format!("the sandbox ({e})"), false);
            None
        }
    }
}

/// A bash call.
pub fn bash_call(id: &str, command: &str, timeout: Duration) -> ToolCall {
    ToolCall::new(
        id,
        "bash",
        json!({"command": command, "timeout_ms": timeout.as_millis() as u64}),
    )
}

/// Runs one bash command in `session` and returns its result.
pub async fn bash(session: &Session, command: &str) -> ToolDispatchResult {
    let mut results = session
        .dispatch(vec![bash_call(
            &super::fresh("c"),
            command,
            Duration::from_secs(60),
        )])
        .await
        .expect("engine available");
    results.remove(0)
}

/// The text of an `ok` result (panics with the result otherwise).
pub fn ok_text(r: &ToolDispatchResult) -> &str {
    assert_eq!(r.error, None, "expected ok, got {}", r.content);
    &r.content
}

/// Asserts that `r` is `code` and returns its text.
pub fn error_text(r: &ToolDispatchResult, code: ErrorCode) -> &str {
    assert_eq!(r.error, Some(code), "expected {code:?}, got {}", r.content);
    &r.content
}

/// A temporary directory and a workspace in it (`<dir>/ws`); the directory also holds whatever
/// a test places "outside" the workspace.
pub fn temp_workspace() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let ws = Workspace::open(&root).unwrap();
    (dir, ws)
}

/// Every file below `dir` with its content, sorted (to compare before and after).
pub fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
                out.push((path.display().to_string(), Vec::new()));
            } else {
                out.push((
                    path.display().to_string(),
                    std::fs::read(&path).unwrap_or_default(),
                ));
            }
        }
    }
    out.sort();
    out
}
