//! What an operator sees from the binary: `--metrics-addr` serves `/metrics` and `/healthz`,
//! `--metrics-file` writes the final exposition, and `--log-format json` logs one JSON object
//! per line on stderr with the OpenTelemetry GenAI names on every call's span — while stdout keeps
//! only protocol JSON.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use common::cli::switchboard;
use serde_json::Value;

/// A plain HTTP/1.1 GET on loopback; returns the status line and the body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text.lines().next().unwrap_or_default().to_string();
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or_default();
    (status, body.to_string())
}

#[test]
fn metrics_addr_serves_metrics_and_healthz_while_the_demo_runs() {
    let mut child = switchboard()
        .args([
            "demo",
            "--sessions",
            "2",
            "--duration",
            "20s",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "switchboard::metrics::exporter=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The exporter logs the address it bound (port 0 picks a free one); the rest of stderr is
    // drained on a thread so the child never blocks on a full pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(rest) = line.split("serving metrics on http://").nth(1) {
                let _ = tx.send(rest.split('/').next().unwrap_or_default().to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the exporter logged its address");
    let (status, body) = get(&addr, "/healthz");
    assert!(status.contains("200"), "{status}");
    assert_eq!(body.trim(), "ok");
    // Counters appear once calls have been answered.
    let mut metrics = String::new();
    for _ in 0..100 {
        let (status, body) = get(&addr, "/metrics");
        assert!(status.contains("200"), "{status}");
        metrics = body;
        if metrics.contains("switchboard_tool_calls_total{tool=\"read_file\",outcome=\"ok\"}") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        metrics.contains("# TYPE switchboard_tool_calls_total counter"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchboard_tool_call_duration_seconds_bucket"),
        "histograms are real Prometheus histograms"
    );
    assert!(metrics.contains("switchboard_build_info{version="));
}

#[test]
fn json_logs_carry_the_genai_span_fields_and_stdout_stays_protocol_json() {
    let ws = tempfile::tempdir().unwrap();
    let mut cmd = switchboard();
    cmd.args(["--log-format", "json", "dispatch", "--workspace"])
        .arg(ws.path())
        .env("RUST_LOG", "switchboard=info");
    let out = common::cli::fed(
        cmd,
        br#"{"role":"assistant","content":[
                {"type":"tool_use","id":"t1","name":"glob","input":{"pattern":"*"}},
                {"type":"tool_use","id":"t2","name":"read_file","input":{"path":"../x"}}]}"#,
    );
    assert!(out.status.success());
    let answer: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(answer["role"], "user");

    let lines: Vec<Value> = String::from_utf8(out.stderr)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let call_span = |id: &str| {
        lines
            .iter()
            .find(|l| l["span"]["gen_ai.tool.call.id"] == id)
            .unwrap_or_else(|| panic!("no span for {id} in {lines:?}"))["span"]
            .clone()
    };
    let ok = call_span("t1");
    assert_eq!(ok["gen_ai.operation.name"], "execute_tool");
    assert_eq!(ok["gen_ai.tool.name"], "glob");
    assert!(ok.get("error.type").is_none());
    let denied = call_span("t2");
    assert_eq!(denied["gen_ai.tool.name"], "read_file");
    assert_eq!(denied["error.type"], "permission_denied");
}

#[test]
fn metrics_file_holds_the_final_exposition() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.txt");
    let out = switchboard()
        .args(["demo", "--sessions", "2", "--metrics-file"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(&file).unwrap();
    // Each demo session makes exactly one call to an unknown tool.
    assert!(
        text.contains("switchboard_tool_calls_total{tool=\"_unknown\",outcome=\"unknown_tool\"} 2"),
        "{text}"
    );
    assert!(text.contains("switchboard_sessions_active 0"));
}

#[test]
fn a_closed_stderr_does_not_bring_the_engine_down() {
    let mut child = switchboard()
        .args(["demo", "--sessions", "2", "--duration", "1s"])
        .env("RUST_LOG", "switchboard=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read one log line, then close our end, as `… 2>&1 | head -1` would.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    assert!(
        !first.contains('\u{1b}'),
        "no colour codes when stderr is not a terminal: {first:?}"
    );
    drop(stderr);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .contains("sessions finished with every call")
    );
}
