//! A launcher's channel to the real `switchboard serve`: the ready line on an inherited
//! descriptor (`--ready-fd`) or in a file (`--ready-file`), never mistaken for what the server's
//! log prints; and `--stop-on-stdin-close`, the server stopping when the launcher's pipe closes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `switchboard serve --no-auth` on a free loopback port, through `bash -c 'exec …'` so that
/// `redirects` (for example `3>&1 1>/dev/null`) set up the descriptors it is started with.
fn serve_via_bash(root: &std::path::Path, flags: &str, redirects: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!(
            "exec \"$0\" serve --no-auth --listen 127.0.0.1:0 --workspace-root \"$1\" {flags} {redirects}"
        ))
        .arg(env!("CARGO_BIN_EXE_switchboard"))
        .arg(root)
        .env_remove("SWITCHBOARD_TOKEN");
    cmd
}

fn ready_value(line: &str) -> serde_json::Value {
    serde_json::from_str(line.trim_end()).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// The status code of `GET /healthz` at `url` (plain HTTP/1.0 over loopback).
fn healthz(url: &str) -> u16 {
    use std::io::Write;
    let addr = url.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").unwrap();
    let mut status = String::new();
    BufReader::new(tcp).read_line(&mut status).unwrap();
    status.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code().unwrap_or(-1));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn the_ready_line_comes_on_the_descriptor_and_stdin_closing_stops_the_server() {
    let root = tempfile::tempdir().unwrap();
    // Descriptor 3 is this test's pipe (the child's stdout is moved there); stdout goes nowhere.
    let mut child = serve_via_bash(
        root.path(),
        "--ready-fd 3 --stop-on-stdin-close",
        "3>&1 1>/dev/null",
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let ready = ready_value(&line);
    assert_eq!(ready["pid"], child.id(), "{line}");
    let url = ready["url"].as_str().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_eq!(healthz(&url), 200);
    // Whatever the launcher writes to stdin is ignored; closing it stops the server.
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"ignored\n").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            child.try_wait().unwrap().is_none(),
            "a line on stdin stopped the server"
        );
    }
    assert_eq!(wait_exit(&mut child, Duration::from_secs(10)), Some(0));
}

#[test]
fn the_ready_file_names_the_url_and_the_pid() {
    let root = tempfile::tempdir().unwrap();
    let ready = root.path().join("ready.json");
    let mut child = serve_via_bash(
        &root.path().join("ws"),
        &format!("--ready-file {} --stop-on-stdin-close", ready.display()),
        "",
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "no ready file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let value = ready_value(&std::fs::read_to_string(&ready).unwrap());
    assert_eq!(value["pid"], child.id());
    let url = value["url"].as_str().unwrap();
    assert_eq!(healthz(url), 200);
    drop(child.stdin.take());
    assert_eq!(wait_exit(&mut child, Duration::from_secs(10)), Some(0));
}

#[test]
fn a_descriptor_not_given_by_the_launcher_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let out = serve_via_bash(root.path(), "--ready-fd 9", "")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--ready-fd 9")
            && err.contains("not a descriptor this process was started with"),
        "{err}"
    );
    // Open for reading only: refused too.
    let out = serve_via_bash(root.path(), "--ready-fd 3", "3</dev/null")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not open for writing"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_server_that_fails_to_start_closes_the_descriptor_without_a_line() {
    let root = tempfile::tempdir().unwrap();
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = blocker.local_addr().unwrap().port();
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!(
            "exec \"$0\" serve --no-auth --listen 127.0.0.1:{port} --workspace-root \"$1\" --ready-fd 3 3>&1 1>/dev/null"
        ))
        .arg(env!("CARGO_BIN_EXE_switchboard"))
        .arg(root.path())
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
}
