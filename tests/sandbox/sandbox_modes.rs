//! The mode in force is visible — `switchboard tools --json`, the start-up log, the
//! `switchboard_sandbox_info` metric — and never silently downgraded: a mode the machine cannot
//! enforce stops the engine's start with a message naming what is missing, `best-effort` starts
//! and says what is missing, `off` starts with a warning.

use crate::common;

use std::process::{Command, Output, Stdio};

use common::sandbox::*;
use serde_json::Value;
use switchboard::Engine;
use switchboard::sandbox::{SandboxConfig, SandboxMode};
use switchboard::tools::builtin_tools;

fn switchboard(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(CLI);
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn sandbox_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["tools"].as_array().unwrap().len(), 5);
    doc["sandbox"].clone()
}

#[test]
fn tools_json_shows_the_mode_in_force() {
    let sandbox = sandbox_of(&switchboard(&["tools", "--json"], &[]));
    if !available(
        "Landlock (the default mode cannot start)",
        sandbox["landlock_abi"].as_i64().unwrap_or(0) >= 1,
    ) {
        return;
    }
    assert_eq!(sandbox["mode"], "workspace-write");
    assert_eq!(sandbox["max_processes"], 256);
    assert_eq!(sandbox["max_memory_bytes"], 2u64 << 30);
    assert_eq!(sandbox["max_file_size_bytes"], 1u64 << 30);
    assert_eq!(sandbox["max_tmp_size_bytes"], 512u64 << 20);
    assert!(sandbox["network"].as_str().unwrap().starts_with("none"));
    // The small trampoline beside the CLI is the one it starts for each command.
    assert_eq!(sandbox["trampoline"], TRAMPOLINE);
    let sandbox = sandbox_of(&switchboard(
        &[
            "tools",
            "--json",
            "--sandbox",
            "read-only",
            "--allow-network",
        ],
        &[],
    ));
    assert_eq!(sandbox["mode"], "read-only");
    assert_eq!(sandbox["network"], "allowed");
    // Without --json the output stays the bare catalog.
    let out = switchboard(&["tools"], &[]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc.is_array());
}

#[test]
fn an_unenforceable_mode_stops_the_start_and_best_effort_says_what_is_missing() {
    // A "trampoline" that does not answer like one: the mode cannot be enforced.
    let broken = [("SWITCHBOARD_TRAMPOLINE", "/bin/false")];
    let out = switchboard(&["tools", "--json"], &broken);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sandbox mode workspace-write cannot be enforced on this machine")
            && stderr.contains("the trampoline binary")
            && stderr.contains("(--sandbox best-effort, --sandbox off)"),
        "{stderr}"
    );
    let out = switchboard(&["tools", "--json", "--sandbox", "best-effort"], &broken);
    let sandbox = sandbox_of(&out);
    assert_eq!(sandbox["mode"], "best-effort");
    assert!(
        sandbox["missing"][0]
            .as_str()
            .unwrap()
            .contains("trampoline"),
        "{sandbox}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("running without"), "{stderr}");
    let out = switchboard(&["tools", "--json", "--sandbox", "off"], &[]);
    assert_eq!(sandbox_of(&out)["mode"], "off");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sandbox: off"), "{stderr}");
}

#[tokio::test]
async fn the_library_refuses_an_unenforceable_mode_at_build() {
    let err = Engine::builder()
        .tools(builtin_tools())
        .sandbox(SandboxConfig::new(SandboxMode::ReadOnly).trampoline("/nonexistent/switchboard"))
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("sandbox mode read-only cannot be enforced"),
        "{err}"
    );
    // A library user has no flags: the refusal names the modes, never a command-line flag.
    assert!(!err.to_string().contains("--"), "{err}");
}

#[test]
fn the_mode_is_exported_as_a_metric() {
    let (dir, ws) = temp_workspace();
    let metrics = dir.path().join("metrics.prom");
    let mut child = Command::new(CLI)
        .args(["dispatch", "--workspace"])
        .arg(ws.root())
        .arg("--metrics-file")
        .arg(&metrics)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take()); // an empty turn
    let out = child.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&metrics).unwrap_or_default();
    if !available(
        "the default sandbox",
        !String::from_utf8_lossy(&out.stderr).contains("cannot be enforced"),
    ) {
        return;
    }
    let line = text
        .lines()
        .find(|l| l.starts_with("switchboard_sandbox_info{"))
        .unwrap_or_else(|| panic!("no sandbox info in:\n{text}"));
    assert!(line.contains("mode=\"workspace-write\""), "{line}");
    assert!(
        line.contains("landlock_abi=\"") && line.ends_with(" 1"),
        "{line}"
    );
}

#[test]
fn the_binary_under_another_name_is_still_its_own_trampoline() {
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("sb");
    if std::fs::hard_link(CLI, &renamed).is_err() {
        std::fs::copy(CLI, &renamed).unwrap();
    }
    let out = Command::new(&renamed)
        .args(["tools", "--json"])
        .env_remove("SWITCHBOARD_TRAMPOLINE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Where the kernel cannot enforce the default mode, it must not blame a missing trampoline.
    if !out.status.success() {
        assert!(!stderr.contains("the trampoline binary"), "{stderr}");
        available(&format!("the default sandbox ({stderr})"), false);
        return;
    }
    let sandbox = sandbox_of(&out);
    assert_eq!(sandbox["mode"], "workspace-write");
    assert_eq!(sandbox["trampoline"], renamed.display().to_string());
}
