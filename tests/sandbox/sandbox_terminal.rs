//! A command never reaches the terminal the engine runs in. `switchboard dispatch` started under
//! a pseudo-terminal (`script` from util-linux, which makes it the controlling terminal of what
//! it runs) answers a bash call that writes a marker to `/dev/tty` and reports its own terminal:
//! in every mode (`workspace-write`, `read-only`, `best-effort`, `off`), forked by the spawner or
//! started for the call, the marker never reaches the terminal, `/dev/tty` does not open
//! (`ENXIO`), and the command has no controlling terminal (`tty_nr` 0 in `/proc/$$/stat`, `?`
//! for `ps`).

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::sandbox::*;
use serde_json::{Value, json};
use switchboard::sandbox::SandboxMode;

/// Built by the shell, so the marker itself appears nowhere but where it was written.
const MARKER: &str = "TTYWRITE-42";

/// Writes the marker to the terminal, then says what terminal the command has.
const PROBE: &str = "printf 'TTY%s' WRITE-$((6*7)) | tee /dev/tty >/dev/null; \
                     read -r _ _ _ _ _ _ tty _ < /proc/$$/stat; echo \"tty_nr=$tty\"; \
                     if command -v ps >/dev/null; then echo \"ps=$(ps -o tty= $$ | tr -d ' ')\"; fi";

/// Runs `sh -c script` under a fresh pseudo-terminal with `env`; what reached the terminal
/// (carriage returns dropped), or `None` when `script` cannot run here.
fn under_a_terminal(script: &str, env: &[(&str, &Path)]) -> Option<String> {
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", script, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        cmd.env(name, value);
    }
    let out = cmd.output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).replace('\r', ""))
}

/// True when `script` gives what it runs a controlling terminal whose output it captures: a
/// shell's write to `/dev/tty` shows up.
fn terminal_available() -> bool {
    let control = under_a_terminal("printf 'TTY%s' CONTROL-$((6*7)) > /dev/tty", &[]);
    if control
        .as_deref()
        .is_some_and(|o| o.contains("TTYCONTROL-42"))
    {
        return true;
    }
    println!("SKIPPED: no pseudo-terminal through `script` (util-linux) here: {control:?}");
    false
}

/// `dispatch --sandbox MODE` under a terminal, `trampoline` as `$SWITCHBOARD_TRAMPOLINE` when
/// given, answering the probe: checks that nothing reached the terminal and returns the call's
/// answer.
fn probe_under_a_terminal(mode: SandboxMode, trampoline: Option<&Path>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let turn = dir.path().join("turn.json");
    std::fs::write(
        &turn,
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "tty", "name": "bash", "input": {"command": PROBE}}
        ]})
        .to_string(),
    )
    .unwrap();
    let log = dir.path().join("stderr.txt");
    // The engine's log goes to a file: only its answer (stdout) and what the command wrote to
    // the terminal can reach the terminal.
    let run = format!(
        "exec \"$SB_CLI\" dispatch --sandbox {} --workspace \"$SB_WS\" < \"$SB_TURN\" 2> \"$SB_LOG\"",
        mode.as_str()
    );
    let mut env: Vec<(&str, &Path)> = vec![
        ("SB_CLI", Path::new(CLI)),
        ("SB_WS", &ws),
        ("SB_TURN", &turn),
        ("SB_LOG", &log),
    ];
    if let Some(trampoline) = trampoline {
        env.push(("SWITCHBOARD_TRAMPOLINE", trampoline));
    }
    let seen = under_a_terminal(&run, &env).expect("script ran before");
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !seen.contains(MARKER),
        "{mode}: the command wrote to the engine's terminal: {seen:?}"
    );
    let answer: Value = serde_json::from_str(seen.trim()).unwrap_or_else(|e| {
        panic!("{mode}: the terminal shows more than the answer ({e}): {seen:?}; stderr: {stderr}")
    });
    let result = &answer["content"][0];
    assert_eq!(result["is_error"], Value::Null, "{mode}: {result}");
    let text = result["content"].as_str().unwrap().to_string();
    assert!(
        text.contains("tee: /dev/tty: No such device or address"),
        "{mode}: /dev/tty opened: {text}"
    );
    assert!(
        text.lines().any(|l| l == "tty_nr=0"),
        "{mode}: the command has a controlling terminal: {text}"
    );
    if let Some(ps) = text.lines().find_map(|l| l.strip_prefix("ps=")) {
        assert_eq!(ps, "?", "{mode}: {text}");
    }
    text
}

/// The modes to try: all four where the kernel can enforce the confining ones, else the two
/// that start anywhere.
fn modes() -> Vec<SandboxMode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let confining = rt.block_on(async { engine(None, config(SandboxMode::WorkspaceWrite)) });
    let mut modes = vec![SandboxMode::BestEffort, SandboxMode::Off];
    if confining.is_some() {
        modes.extend([SandboxMode::WorkspaceWrite, SandboxMode::ReadOnly]);
    }
    modes
}

#[test]
fn in_no_mode_does_a_command_write_to_the_engines_terminal_or_have_one() {
    if !terminal_available() {
        return;
    }
    for mode in modes() {
        probe_under_a_terminal(mode, None);
    }
}

#[test]
fn a_trampoline_started_for_each_call_leaves_the_terminal_behind_too() {
    if !terminal_available() {
        return;
    }
    // A trampoline that will not be a spawner (as an older build would refuse the flag): the
    // engine starts it for each call itself.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("no-spawner");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --spawner \"*) echo 'unknown option --spawner' >&2; exit 125;; esac\nexec {TRAMPOLINE} \"$@\"\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    for mode in modes() {
        probe_under_a_terminal(mode, Some(&script));
    }
}
