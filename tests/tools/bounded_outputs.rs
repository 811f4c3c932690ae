//! Bounded outputs: whatever a tool produces, the model gets at most the output cap (head and
//! tail around a `… N bytes truncated …` marker, cut on UTF-8 boundaries, long lines clamped),
//! and memory holds no more than that while it is produced. `read_file` refuses special files at
//! once (never blocking), binary files and invalid UTF-8 with a clear message.

use crate::common;

use common::TURN_BOUND;

use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::workspace::temp_workspace;
use serde_json::{Value, json};
use switchboard::Workspace;
use switchboard::protocol::ErrorCode;
use switchboard::tool::{Handler, SessionScope, ToolContext, ToolError, ToolOutcome, ToolSpec};
use switchboard::tools::builtin_tools;
use switchboard::{Engine, ToolCall};
use tokio_util::sync::CancellationToken;

struct Tools {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    ws: Workspace,
}

impl Tools {
    fn new() -> Self {
        let (tmp, ws) = temp_workspace();
        Tools {
            root: ws.root().to_path_buf(),
            ws,
            _tmp: tmp,
        }
    }

    fn spec(&self, name: &str) -> ToolSpec {
        builtin_tools()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap()
    }

    /// A context for a call in this workspace's session.
    fn ctx(&self, id: &str, budget: Duration) -> ToolContext {
        ToolContext::new(
            id,
            "test",
            Arc::new(SessionScope::new("bounded", Some(self.ws.clone()))),
            Instant::now() + budget,
            CancellationToken::new(),
        )
    }

    /// Calls a blocking file tool on its own thread, so a call that blocks fails the test after
    /// [`TURN_BOUND`] instead of hanging it.
    fn call_bounded(&self, name: &str, args: Value) -> ToolOutcome {
        let spec = self.spec(name);
        let ctx = self.ctx("bounded", Duration::from_secs(30));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let ctx = ctx;
            let Handler::Blocking(f) = &spec.handler else {
                panic!("file tools are blocking")
            };
            let _ = tx.send(f(&args, &ctx));
        });
        rx.recv_timeout(TURN_BOUND)
            .expect("the call returned at once instead of blocking")
    }

    fn read(&self, path: &str) -> ToolOutcome {
        self.call_bounded("read_file", json!({"path": path}))
    }

    async fn bash(&self, command: &str, timeout_ms: u64) -> ToolOutcome {
        let spec = self.spec("bash");
        let Handler::Async(f) = &spec.handler else {
            panic!("bash is async")
        };
        let ctx = self.ctx("bounded-bash", Duration::from_secs(60));
        let args = json!({"command": command, "timeout_ms": timeout_ms});
        tokio::time::timeout(TURN_BOUND, f(args, ctx))
            .await
            .expect("bash answered within the bound")
    }
}

/// Splits `head\n… N bytes truncated …\ntail`.
fn parts(text: &str) -> (&str, usize, &str) {
    let (head, rest) = text.split_once("\n… ").expect("a truncation marker");
    let (count, tail) = rest
        .split_once(" bytes truncated …\n")
        .expect("a truncation marker");
    (head, count.parse().unwrap(), tail)
}

fn assert_error(outcome: ToolOutcome, code: ErrorCode, detail: &str) {
    match outcome {
        Err(e) => assert_eq!((e.code, e.detail.as_str()), (code, detail)),
        Ok(text) => panic!("expected {code} {detail:?}, got {} bytes", text.len()),
    }
}

#[test]
fn special_files_are_refused_at_once_without_blocking() {
    let t = Tools::new();
    let fifo = std::process::Command::new("mkfifo")
        .arg(t.root.join("fifo"))
        .status()
        .unwrap();
    assert!(fifo.success());
    symlink("fifo", t.root.join("fifo_alias")).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(t.root.join("sock")).unwrap();
    std::fs::create_dir(t.root.join("dir")).unwrap();
    for path in ["fifo", "fifo_alias", "sock"] {
        assert_error(
            t.read(path),
            ErrorCode::ExecutionError,
            &format!("not a regular file: {path}"),
        );
        let edit = t.call_bounded(
            "edit_file",
            json!({"path": path, "old_text": "a", "new_text": "b"}),
        );
        assert_eq!(edit.unwrap_err().code, ErrorCode::ExecutionError);
    }
    assert_error(
        t.read("dir"),
        ErrorCode::ExecutionError,
        "is a directory: dir",
    );
    // Devices: root may create one inside the workspace.
    let made = std::process::Command::new("mknod")
        .arg(t.root.join("zero"))
        .args(["c", "1", "5"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if made {
        assert_error(
            t.read("zero"),
            ErrorCode::ExecutionError,
            "not a regular file: zero",
        );
    }
    // Devices outside are outside.
    symlink("/dev/zero", t.root.join("devzero")).unwrap();
    assert_eq!(
        t.read("devzero").unwrap_err().code,
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        t.read("/dev/zero").unwrap_err().code,
        ErrorCode::PermissionDenied
    );
}

#[test]
fn binary_files_and_invalid_utf8_are_reported_not_mangled() {
    let t = Tools::new();
    let mut late_nul = "x".repeat(100_000).into_bytes();
    late_nul[90_000] = 0;
    let files: [(&str, Vec<u8>, &str); 6] = [
        ("nul_start", b"\0ELF".to_vec(), "binary file: nul_start"),
        ("nul_late", late_nul, "binary file: nul_late"),
        ("utf16", b"\xFF\xFEh\0i\0".to_vec(), "binary file: utf16"),
        (
            "latin1",
            b"caf\xe9 au lait".to_vec(),
            "file is not valid UTF-8 (byte offset 3): latin1",
        ),
        (
            "cut_char",
            b"ok \xE2\x9C".to_vec(),
            "file is not valid UTF-8 (byte offset 3): cut_char",
        ),
        (
            "overlong",
            b"a\xC0\xAFb".to_vec(),
            "file is not valid UTF-8 (byte offset 1): overlong",
        ),
    ];
    for (name, bytes, detail) in files {
        std::fs::write(t.root.join(name), bytes).unwrap();
        assert_error(t.read(name), ErrorCode::ExecutionError, detail);
    }
    std::fs::write(t.root.join("fine"), "héllo ✓ 🦀\n").unwrap();
    assert_eq!(t.read("fine").unwrap(), "héllo ✓ 🦀");
}

#[test]
fn a_huge_file_is_refused_without_being_loaded() {
    let t = Tools::new();
    let file = std::fs::File::create(t.root.join("huge.log")).unwrap();
    file.set_len(65 * 1024 * 1024).unwrap(); // sparse: costs no disk
    let err = t.read("huge.log").unwrap_err();
    assert_eq!(err.code, ErrorCode::ExecutionError);
    assert!(err.detail.starts_with("file too large"), "{}", err.detail);
}

#[test]
fn read_file_output_is_capped_and_long_lines_are_clamped() {
    let t = Tools::new();
    let text: String = (0..20_000).map(|i| format!("line {i:05}\n")).collect();
    std::fs::write(t.root.join("many.txt"), &text).unwrap();
    let out = t.read("many.txt").unwrap();
    assert!(out.len() <= 50_000, "{}", out.len());
    let (head, dropped, tail) = parts(&out);
    assert!(head.starts_with("line 00000\nline 00001"));
    assert!(tail.ends_with("line 19999"));
    assert_eq!(head.len() + dropped + tail.len(), text.len() - 1);
    // `limit` still counts the rest.
    let limited = t.call_bounded("read_file", json!({"path": "many.txt", "limit": 2}));
    assert_eq!(
        limited.unwrap(),
        "line 00000\nline 00001\n... (19998 more lines)"
    );

    let long = format!("{}{}", "<".repeat(500_000), ">".repeat(500_000));
    std::fs::write(t.root.join("minified.js"), format!("start\n{long}\nend\n")).unwrap();
    let out = t.read("minified.js").unwrap();
    assert!(out.len() <= 50_000, "{}", out.len());
    // The long line among others is clamped first, so every other line is kept.
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.len());
    assert_eq!((lines[0], lines[2]), ("start", "end"));
    assert!(lines[1].len() <= 2_000, "{}", lines[1].len());
    assert!(lines[1].starts_with("<<<<") && lines[1].ends_with(">>>>"));
    assert_eq!(
        lines[1].matches(" … 998200 bytes truncated … ").count(),
        1,
        "{}",
        &lines[1][890..930]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_floods_are_capped_with_head_tail_and_clamped_lines() {
    let t = Tools::new();
    let out = t.bash("seq 1 2000000", 60_000).await.unwrap();
    assert!(out.len() <= 50_000, "{}", out.len());
    let (head, _, tail) = parts(&out);
    assert!(head.starts_with("1\n2\n3\n"));
    assert!(tail.ends_with("1999999\n2000000"));

    let line = t
        .bash(
            "head -c 1000000 /dev/zero | tr '\\0' x; echo; echo after",
            60_000,
        )
        .await
        .unwrap();
    // The flood was never held whole: head and tail of what was, around one marker; the line
    // after it is kept.
    assert!(line.len() <= 50_000, "{}", line.len());
    assert_eq!(line.matches("bytes truncated").count(), 1, "one marker");
    let lines: Vec<&str> = line.lines().collect();
    assert!(lines[0].starts_with("xxxx") && lines[1].starts_with("… "));
    assert_eq!(lines.last(), Some(&"after"));

    // A 10 MB single line comes back as about the cap: head and tail, one marker.
    let single = t
        .bash("head -c 10000000 /dev/zero | tr '\\0' y", 60_000)
        .await
        .unwrap();
    assert!(
        single.len() <= 50_000 && single.len() > 49_000,
        "{}",
        single.len()
    );
    assert_eq!(single.matches("bytes truncated").count(), 1, "one marker");
    let (head, cut, tail) = parts(&single);
    assert_eq!(head.len() + cut + tail.len(), 10_000_000);
    assert!(head.bytes().chain(tail.bytes()).all(|b| b == b'y'));

    // An endless flood is cut by its timeout and still capped.
    let err = t.bash("yes flood", 1_000).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
    assert!(err.detail.len() <= 50_000, "{}", err.detail.len());
    assert!(
        err.detail
            .starts_with("timeout (1s); partial output:\nflood\nflood")
    );
    assert!(err.detail.contains("bytes truncated"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_engine_every_tool_output_is_capped_by_its_policy() {
    let huge = ToolSpec::new(
        "huge",
        "Returns 10 MB of text, or fails with it.",
        json!({"type": "object", "properties": {"fail": {"type": "boolean"}}}),
        Handler::future(|args: Value, _ctx| async move {
            let text = format!("{}\n{}", "h".repeat(5_000_000), "t\n".repeat(2_500_000));
            if args["fail"] == true {
                Err(ToolError::execution(text))
            } else {
                Ok(text)
            }
        }),
    )
    .output_cap(10_000);
    let engine = Engine::builder().tool(huge).build().unwrap();
    let results = tokio::time::timeout(
        TURN_BOUND,
        engine.dispatch(vec![
            ToolCall::new("ok", "huge", json!({})),
            ToolCall::new("err", "huge", json!({"fail": true})),
        ]),
    )
    .await
    .unwrap()
    .expect("engine available");
    assert!(results[0].is_ok());
    assert!(
        results[0].content.len() <= 10_000,
        "{}",
        results[0].content.len()
    );
    let (head, dropped, tail) = parts(&results[0].content);
    let first = head.lines().next().unwrap();
    assert!(
        first.len() <= 2_000 && first.contains(" bytes truncated "),
        "the long line among others is clamped"
    );
    assert!(
        head.starts_with("hhhh") && head.ends_with("t") && tail.ends_with("t\nt\n"),
        "{head:?} {tail:?}"
    );
    assert!(dropped > 4_900_000, "{dropped}");
    assert_eq!(results[1].error, Some(ErrorCode::ExecutionError));
    assert!(results[1].content.len() <= 10_000 + "Error [execution_error]: ".len());
}
