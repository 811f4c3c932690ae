//! Helpers of the MCP tests: locating python3 and the third-party servers, building engines with
//! MCP servers, and checking that every turn is answered once, in order.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard::mcp::{McpConfig, ServerSpec};
use switchboard::{Engine, ToolCall, ToolDispatchResult};

/// `SWITCHBOARD_MCP_TEST_DIR`: where `.ci/run` installed the third-party servers (npm prefix with
/// `node_modules/`, and a Python venv in `venv/`). When it is set, a missing prerequisite is a
/// failure, not a skip.
pub const TEST_DIR_VAR: &str = "SWITCHBOARD_MCP_TEST_DIR";

/// The install directory, or `None` after printing why the test is skipped.
pub fn test_dir(test: &str) -> Option<PathBuf> {
    match std::env::var_os(TEST_DIR_VAR) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            eprintln!(
                "SKIPPED {test}: set {TEST_DIR_VAR} to a directory with the npm and pip MCP servers \
                 installed (.ci/run does this)"
            );
            None
        }
    }
}

/// A program found on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// python3 for the misbehaving test server, or `None` after printing why the test is skipped
/// (and a panic when `SWITCHBOARD_MCP_TEST_DIR` is set: CI must not skip).
pub fn python(test: &str) -> Option<PathBuf> {
    // The real interpreter, not a wrapper (pyenv's shim is a bash script that adds variables).
    let real = which("python3").and_then(|shim| {
        let out = std::process::Command::new(shim)
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()?;
        let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        path.is_file().then_some(path)
    });
    match real {
        Some(p) => Some(p),
        None if std::env::var_os(TEST_DIR_VAR).is_some() => {
            panic!("{test}: python3 is required when {TEST_DIR_VAR} is set")
        }
        None => {
            eprintln!("SKIPPED {test}: python3 is not on PATH");
            None
        }
    }
}

/// The misbehaving server (tests/mcp_servers/misbehaving.py) as a stdio server spec.
pub fn misbehaving(python: &Path, state: &Path) -> ServerSpec {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_servers/misbehaving.py");
    ServerSpec::stdio(
        python.display().to_string(),
        [script.display().to_string(), state.display().to_string()],
    )
}

/// A node package's entry file under the install directory.
pub fn node_entry(dir: &Path, package: &str) -> PathBuf {
    dir.join("node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js")
}

/// An engine with these servers, started (every server up or failed).
pub async fn engine_with(servers: Vec<(&str, ServerSpec)>) -> Engine {
    let mut builder = Engine::builder();
    for (name, spec) in servers {
        builder = builder.mcp_server(name, spec);
    }
    builder.start().await.expect("engine starts")
}

/// An engine from a configuration text.
pub async fn engine_from(text: &str) -> Engine {
    let config = McpConfig::parse(text, &|k| std::env::var(k).ok()).expect("config parses");
    Engine::builder()
        .mcp_config(config)
        .start()
        .await
        .expect("engine starts")
}

/// A call.
pub fn call(id: &str, name: &str, args: Value) -> ToolCall {
    ToolCall::new(id, name, args)
}

/// Dispatches `calls` and checks that the answer has one result per call, in call order.
pub async fn turn(engine: &Engine, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
    let ids: Vec<String> = calls.iter().map(|c| c.id.to_string()).collect();
    let results = engine.dispatch(calls).await.expect("engine available");
    let got: Vec<String> = results.iter().map(|r| r.tool_use_id.to_string()).collect();
    assert_eq!(got, ids, "one result per call, in call order");
    results
}

/// Polls `check` every 50 ms for at most `limit`; true once it held.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

/// True when process `pid` is gone (absent, or a zombie waiting to be reaped).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}
