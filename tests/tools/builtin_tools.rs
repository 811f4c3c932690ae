//! Behaviour of the five built-in tools, called through their specs' handlers: the seed's outputs
//! and messages, byte-exact edits, atomic writes, and a bash that leaks no environment, reads no
//! stdin and leaves no process behind.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard::Workspace;
use switchboard::protocol::ErrorCode;
use switchboard::tool::{Handler, ToolOutcome, ToolSpec};
use switchboard::tools::builtin_tools;

use common::direct::{call_bounded, call_with, ctx, survivors, unique_id};
use common::workspace::temp_workspace;
use tokio_util::sync::CancellationToken;

/// Calls with a generous deadline, bounded so that a hang fails the test instead of stalling it.
async fn call(spec: &ToolSpec, args: Value) -> ToolOutcome {
    call_bounded(spec, "call-1", args, CancellationToken::new()).await
}

struct Tools {
    _tmp: tempfile::TempDir,
    ws: Workspace,
    specs: Vec<ToolSpec>,
}

impl Tools {
    fn new() -> Self {
        let (tmp, ws) = temp_workspace();
        let specs = common::direct::all_in_workspace(builtin_tools(), &ws);
        Tools {
            _tmp: tmp,
            ws,
            specs,
        }
    }

    fn spec(&self, name: &str) -> &ToolSpec {
        self.specs.iter().find(|s| s.name == name).unwrap()
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.ws.root().join(rel)
    }

    async fn bash(&self, command: &str) -> ToolOutcome {
        call(self.spec("bash"), json!({"command": command})).await
    }
}

#[test]
fn the_five_tools_come_in_seed_order_with_closed_schemas() {
    let t = Tools::new();
    let names: Vec<&str> = t.specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["bash", "read_file", "write_file", "edit_file", "glob"]
    );
    let safe: Vec<bool> = t.specs.iter().map(|s| s.policy.concurrency_safe).collect();
    assert_eq!(safe, [false, true, false, false, true]);
    for spec in &t.specs {
        assert_eq!(spec.input_schema["type"], "object", "{}", spec.name);
        assert_eq!(spec.input_schema["additionalProperties"], false);
    }
    assert!(matches!(t.spec("bash").handler, Handler::Async(_)));
    // The engine's bound is the largest per-call `timeout_ms`; the default applies inside.
    assert_eq!(t.spec("bash").policy.timeout, Duration::from_secs(600));
    let timeout_ms = &t.spec("bash").input_schema["properties"]["timeout_ms"];
    assert_eq!(
        (
            &timeout_ms["type"],
            &timeout_ms["minimum"],
            &timeout_ms["maximum"]
        ),
        (&json!("integer"), &json!(1), &json!(600_000))
    );
    assert!(t.spec("edit_file").description.contains("FIRST"));
}

#[tokio::test]
async fn read_file_limit_keeps_the_first_lines_and_counts_the_rest() {
    let t = Tools::new();
    std::fs::write(t.path("f.txt"), "1\n2\n3\n4\n5\n").unwrap();
    let read = |limit: Value| {
        call(
            t.spec("read_file"),
            json!({"path": "f.txt", "limit": limit}),
        )
    };
    assert_eq!(read(json!(2)).await.unwrap(), "1\n2\n... (3 more lines)");
    assert_eq!(read(json!(5)).await.unwrap(), "1\n2\n3\n4\n5");
    let whole = call(t.spec("read_file"), json!({"path": "f.txt"})).await;
    assert_eq!(whole.unwrap(), "1\n2\n3\n4\n5");
}

#[tokio::test]
async fn read_file_refuses_binary_invalid_utf8_missing_and_special_files() {
    let t = Tools::new();
    std::fs::write(t.path("bin"), b"abc\0def").unwrap();
    std::fs::write(t.path("latin1"), b"caf\xe9").unwrap();
    std::fs::create_dir(t.path("dir")).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(t.path("fifo"))
        .status()
        .unwrap();
    assert!(status.success());
    for (path, detail) in [
        ("bin", "binary file: bin"),
        ("latin1", "file is not valid UTF-8 (byte offset 3): latin1"),
        ("dir", "is a directory: dir"),
        ("fifo", "not a regular file: fifo"),
        ("nope.txt", "file not found: nope.txt"),
    ] {
        let err = call(t.spec("read_file"), json!({"path": path}))
            .await
            .unwrap_err();
        assert_eq!(
            (err.code, err.detail.as_str()),
            (ErrorCode::ExecutionError, detail)
        );
    }
}

#[tokio::test]
async fn write_file_creates_parents_and_counts_utf8_bytes() {
    let t = Tools::new();
    let content = "héllo ✓";
    let out = call(
        t.spec("write_file"),
        json!({"path": "a/b/c.txt", "content": content}),
    )
    .await;
    assert_eq!(out.unwrap(), "Wrote 10 bytes to a/b/c.txt");
    assert_eq!(
        std::fs::read_to_string(t.path("a/b/c.txt")).unwrap(),
        content
    );
}

#[tokio::test]
async fn write_file_replaces_atomically_keeps_the_mode_and_leaves_no_temp_files() {
    let t = Tools::new();
    std::fs::write(t.path("conf.txt"), "old").unwrap();
    std::fs::set_permissions(t.path("conf.txt"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = call(
        t.spec("write_file"),
        json!({"path": "conf.txt", "content": "new"}),
    )
    .await;
    assert_eq!(out.unwrap(), "Wrote 3 bytes to conf.txt");
    assert_eq!(std::fs::read_to_string(t.path("conf.txt")).unwrap(), "new");
    let mode = std::fs::metadata(t.path("conf.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    let names: Vec<_> = std::fs::read_dir(t.ws.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["conf.txt"]);
}

#[tokio::test]
async fn write_file_onto_a_directory_fails_and_leaves_it_alone() {
    let t = Tools::new();
    std::fs::create_dir(t.path("d")).unwrap();
    let err = call(t.spec("write_file"), json!({"path": "d", "content": "x"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::ExecutionError);
    assert!(t.path("d").is_dir());
    assert_eq!(std::fs::read_dir(t.path("d")).unwrap().count(), 0);
}

#[tokio::test]
async fn edit_file_replaces_only_the_first_occurrence_and_keeps_every_other_byte() {
    let t = Tools::new();
    let before = b"\xEF\xBB\xBFfoo\r\nbar foo\r\nend";
    std::fs::write(t.path("crlf.txt"), before).unwrap();
    let out = call(
        t.spec("edit_file"),
        json!({"path": "crlf.txt", "old_text": "foo", "new_text": "baz"}),
    )
    .await;
    assert_eq!(out.unwrap(), "Edited crlf.txt");
    assert_eq!(
        std::fs::read(t.path("crlf.txt")).unwrap(),
        b"\xEF\xBB\xBFbaz\r\nbar foo\r\nend"
    );
}

#[tokio::test]
async fn edit_file_reports_missing_text_and_refuses_an_empty_needle() {
    let t = Tools::new();
    std::fs::write(t.path("f.txt"), "hello").unwrap();
    let edit = |old: &str| {
        call(
            t.spec("edit_file"),
            json!({"path": "f.txt", "old_text": old, "new_text": "x"}),
        )
    };
    let err = edit("absent").await.unwrap_err();
    assert_eq!(
        (err.code, err.detail.as_str()),
        (ErrorCode::ExecutionError, "text not found in f.txt")
    );
    assert_eq!(
        edit("").await.unwrap_err().code,
        ErrorCode::InvalidArguments
    );
    assert_eq!(std::fs::read_to_string(t.path("f.txt")).unwrap(), "hello");
}

#[tokio::test]
async fn glob_lists_sorted_relative_matches_recursively() {
    let t = Tools::new();
    for file in [
        "b.rs",
        "src/z.rs",
        "src/a.rs",
        "src/deep/m.rs",
        "src/notes.md",
        ".hidden/x.rs",
    ] {
        let path = t.path(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }
    let glob = |pattern: &str| call(t.spec("glob"), json!({"pattern": pattern}));
    assert_eq!(
        glob("**/*.rs").await.unwrap(),
        "b.rs\nsrc/a.rs\nsrc/deep/m.rs\nsrc/z.rs"
    );
    assert_eq!(glob("src/*.rs").await.unwrap(), "src/a.rs\nsrc/z.rs");
    assert_eq!(glob("src/").await.unwrap(), "src");
    assert_eq!(glob(".hidden/*").await.unwrap(), ".hidden/x.rs");
    assert_eq!(glob("*.py").await.unwrap(), "(no matches)");
}

#[tokio::test]
async fn bash_echo_returns_trimmed_output() {
    let t = Tools::new();
    assert_eq!(t.bash("echo hi").await.unwrap(), "hi");
    assert_eq!(t.bash("echo out; echo err >&2").await.unwrap(), "out\nerr");
    assert_eq!(t.bash("true").await.unwrap(), "(no output)");
}

#[tokio::test]
async fn bash_sees_only_allowlisted_environment_with_home_and_pwd_at_the_workspace() {
    let t = Tools::new();
    // Cargo sets CARGO_* for the test process: proof there is something that could leak.
    assert!(std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("CARGO")));
    let out = t.bash("env").await.unwrap();
    let names: BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, _)| k)
        .collect();
    let bash_own = ["PWD", "SHLVL", "_", "OLDPWD"];
    let ours = [
        "PATH",
        "LANG",
        "TMPDIR",
        "HOME",
        "SWITCHBOARD_CALL_ID",
        "SWITCHBOARD_IDEMPOTENCY_KEY",
    ];
    for name in &names {
        assert!(
            ours.contains(name) || bash_own.contains(name) || name.starts_with("LC_"),
            "leaked variable {name}"
        );
    }
    let root = t.ws.root().display().to_string();
    let expected = format!("{root}|{root}|{root}|call-1");
    let out = t
        .bash("echo \"$HOME|$PWD|$(pwd)|$SWITCHBOARD_CALL_ID\"")
        .await;
    assert_eq!(out.unwrap(), expected);
}

#[tokio::test]
async fn bash_stdin_is_empty_so_cat_returns_at_once() {
    let t = Tools::new();
    assert_eq!(t.bash("cat").await.unwrap(), "(no output)");
}

#[tokio::test]
async fn bash_non_zero_exit_is_a_result_with_an_exit_code_line() {
    let t = Tools::new();
    assert_eq!(
        t.bash("echo oops; exit 3").await.unwrap(),
        "oops\n[exit code: 3]"
    );
}

#[tokio::test]
async fn bash_dangerous_commands_are_denied_without_running() {
    let t = Tools::new();
    let err = t.bash("sudo touch ran").await.unwrap_err();
    assert_eq!(
        (err.code, err.detail.as_str()),
        (
            ErrorCode::PermissionDenied,
            "dangerous command blocked: sudo"
        )
    );
    assert!(!t.path("ran").exists());
}

#[tokio::test]
async fn bash_does_not_wait_for_a_backgrounded_child_and_kills_it() {
    let t = Tools::new();
    let id = unique_id("bg");
    let spec = t.spec("bash");
    let args = json!({"command": "sleep 32 & echo started"});
    let run = call_with(
        spec,
        args,
        ctx(&id, Duration::from_secs(60), CancellationToken::new()),
    );
    let out = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("a background child holding the pipe does not hold the result back");
    assert_eq!(out.unwrap(), "started");
    assert_eq!(
        survivors(&id).await,
        Vec::<String>::new(),
        "background sleep survived"
    );
}

#[tokio::test]
async fn bash_deadline_times_out_and_kills_the_process_group() {
    let t = Tools::new();
    let spec = t.spec("bash");
    let quick = ctx(
        "call-2",
        Duration::from_millis(300),
        CancellationToken::new(),
    );
    let err = call_with(spec, json!({"command": "sleep 30; echo x"}), quick)
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
    // The budget left when bash starts: 0.3 s, or 0.2 s on a loaded machine.
    assert!(
        ["timeout (0.3s)", "timeout (0.2s)"].contains(&err.detail.as_str()),
        "{}",
        err.detail
    );

    let id = unique_id("deadline");
    let short = ctx(&id, Duration::from_secs(1), CancellationToken::new());
    let command = json!({"command": "sleep 31 & echo $! > pid; wait"});
    let bounded = tokio::time::timeout(Duration::from_secs(10), call_with(spec, command, short));
    assert_eq!(bounded.await.unwrap().unwrap_err().code, ErrorCode::Timeout);
    assert!(t.path("pid").exists(), "the command ran");
    assert_eq!(
        survivors(&id).await,
        Vec::<String>::new(),
        "sleep survived the timeout"
    );
}

#[tokio::test]
async fn bash_cancellation_answers_cancelled() {
    let t = Tools::new();
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        trigger.cancel();
    });
    let running = call_with(
        t.spec("bash"),
        json!({"command": "sleep 30"}),
        ctx("call-4", Duration::from_secs(60), cancel),
    );
    let err = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (err.code, err.detail.as_str()),
        (ErrorCode::Cancelled, "cancelled")
    );
}

#[tokio::test]
async fn bash_huge_output_is_capped_with_a_truncation_marker() {
    let t = Tools::new();
    let out = t.bash("yes | head -c 5000000").await.unwrap();
    assert!(out.len() <= 50_000, "{} bytes", out.len());
    let (head, rest) = out.split_once("\n… ").expect("marker");
    let (count, tail) = rest.split_once(" bytes truncated …\n").expect("marker");
    let dropped: usize = count.parse().unwrap();
    // 5,000,000 bytes less the final newline, which the seed's trim removes.
    assert_eq!(head.len() + dropped + tail.len(), 4_999_999);
    assert!(head.len() > 20_000 && tail.len() > 20_000);
    assert!(out.starts_with("y\ny\n") && out.ends_with("y\ny"));
}

#[test]
fn workspace_root_is_canonical() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path().join(".")).unwrap();
    assert_eq!(ws.root(), std::fs::canonicalize(tmp.path()).unwrap());
    assert!(Workspace::open(Path::new("/definitely/not/here")).is_err());
}
