//! Live progress through `switchboard serve` (`event: progress` on a streamed turn): a running
//! command's lines arrive as they are written, before the call's result and never after it, with
//! the final answer unchanged, and are counted in the progress metrics; a retried turn answered
//! from memory sends none; `progress=false` turns them off; a 100 MB flood of output to a client
//! that does not read keeps the server's memory bounded (the real binary, its peak RSS read from
//! /proc) and what it left out is counted; a client tool's reports reach the stream; cancel
//! stops a call's progress.

use crate::serve_common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use serve_common::*;

/// A streamed dispatch read as it arrives: each `(event, data)` with the moment it came.
async fn stream_timed(
    c: &reqwest::Client,
    url: &str,
    body: &str,
) -> Vec<(String, Value, SystemTime)> {
    let mut response = c
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut buffer = String::new();
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        let now = SystemTime::now();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            for (event, data) in events(&block) {
                let data = serde_json::from_str(&data).unwrap_or(Value::Null);
                out.push((event, data, now));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_command_s_lines_arrive_as_progress_before_its_result() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, _ws) = session(&c, &s, None).await;
    // 20 lines, one every 200 ms (4 s), each with the moment it was written (ns since the epoch).
    let command =
        "for i in $(seq 1 20); do echo \"line $i $(date +%s%N)\"; sleep 0.2; done; echo err >&2";
    let body = turn(&[
        ("quick", "glob", json!({"pattern": "*"})),
        ("loop", "bash", json!({"command": command})),
    ]);
    let url = s.url(&format!("/v1/sessions/{id}/dispatch?stream=true"));
    let events = stream_timed(&c, &url, &body).await;
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last.0, "done", "{events:?}");
    let result_at = rest
        .iter()
        .position(|(e, d, _)| e == "result" && d["index"] == 1)
        .expect("the bash call's result");
    let progress: Vec<&(String, Value, SystemTime)> =
        rest.iter().filter(|(e, _, _)| e == "progress").collect();
    assert!(
        progress.iter().all(|(_, d, _)| d["tool_use_id"] == "loop"),
        "only the command reports progress"
    );
    // Every progress event of the call came before its result.
    let before: Vec<&Value> = rest[..result_at]
        .iter()
        .filter(|(e, _, _)| e == "progress")
        .map(|(_, d, _)| d)
        .collect();
    assert_eq!(
        before.len(),
        progress.len(),
        "a progress event after the result"
    );
    assert!(
        before.len() >= 15,
        "{} progress events before the result",
        before.len()
    );
    let seqs: Vec<u64> = before.iter().map(|d| d["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let text = |stream: &str| -> String {
        before
            .iter()
            .filter(|d| d["kind"] == "output" && d["stream"] == stream)
            .map(|d| d["text"].as_str().unwrap())
            .collect()
    };
    let stdout = text("stdout");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 20, "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("line {} ", i + 1)), "{line}");
    }
    assert_eq!(text("stderr"), "err\n");
    // The result is the call's one final answer, as without progress.
    let done: &Value = &last.1;
    let result = &done["content"][1];
    assert!(result.get("is_error").is_none(), "{result}");
    let content = result["content"].as_str().unwrap();
    assert!(content.starts_with("line 1 "), "{content}");
    assert!(
        content.contains("\nline 20 ") && content.ends_with("err"),
        "{content}"
    );

    // How late each line came: written (its timestamp) → its event read here.
    let mut lags_ms: Vec<f64> = Vec::new();
    for (_, d, at) in &progress {
        let arrived = at.duration_since(UNIX_EPOCH).unwrap().as_nanos() as f64;
        for line in d["text"].as_str().unwrap().lines() {
            if let Some(ns) = line.split(' ').nth(2).and_then(|t| t.parse::<f64>().ok()) {
                lags_ms.push((arrived - ns) / 1e6);
            }
        }
    }
    lags_ms.sort_by(f64::total_cmp);
    let at =
        |q: f64| lags_ms[((q * lags_ms.len() as f64).ceil() as usize).clamp(1, lags_ms.len()) - 1];
    println!(
        "progress: {} lines, line written → its event at the client: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        lags_ms.len(),
        at(0.5),
        at(0.99),
        lags_ms.last().unwrap()
    );

    // The same turn again: answered from the session's memory, nothing runs, no progress.
    let again = stream_timed(&c, &url, &body).await;
    assert!(again.iter().all(|(e, _, _)| e != "progress"), "{again:?}");
    assert_eq!(again.last().unwrap().1, *done);

    // progress=false: the stream has results only.
    let quiet = turn(&[("q", "bash", json!({"command": "echo a; sleep 0.1; echo b"}))]);
    let url = s.url(&format!(
        "/v1/sessions/{id}/dispatch?stream=true&progress=false"
    ));
    let events = stream_timed(&c, &url, &quiet).await;
    let kinds: Vec<&str> = events.iter().map(|(e, _, _)| e.as_str()).collect();
    assert_eq!(kinds, ["result", "done"]);
    let bad = post(
        &c,
        &s.url(&format!(
            "/v1/sessions/{id}/dispatch?stream=true&progress=maybe"
        )),
        &quiet,
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.text.contains("progress must be true or false"),
        "{}",
        bad.text
    );
    s.shutdown().await.unwrap();
}

/// Peak resident memory of process `pid` (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_output_to_a_client_that_does_not_read_keeps_memory_bounded() {
    use std::process::{Command, Stdio};
    let root = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-auth",
        "--workspace-root",
    ])
    .arg(root.path())
    .env_remove("SWITCHBOARD_TOKEN")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let (child, base) = spawn_server(cmd);
    let c = client();
    let created = post(&c, &format!("{base}/v1/sessions"), "{}").await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json()["session_id"].as_str().unwrap().to_string();
    // Warm the session (its first command starts the sandbox's helpers) before the baseline.
    let warm = turn(&[("w", "bash", json!({"command": "echo warm"}))]);
    let warmed = post(&c, &format!("{base}/v1/sessions/{id}/dispatch"), &warm).await;
    assert_eq!(warmed.status, 200, "{}", warmed.text);
    let before = peak_kib(child.id());

    // 100 MB of output in lines, streamed to a client that reads nothing until the command ends.
    let flood = turn(&[(
        "flood",
        "bash",
        json!({"command": "yes 'a line of output, over and over, to flood the stream' | head -c 100000000; echo done"}),
    )]);
    let mut response = c
        .post(format!("{base}/v1/sessions/{id}/dispatch?stream=true"))
        .header("content-type", "application/json")
        .body(flood)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // The command runs to its end while nobody reads: its journal-free answer is kept by the
    // session, so wait until a plain retry of the same id answers from memory.
    let retry = turn(&[(
        "flood",
        "bash",
        json!({"command": "yes 'a line of output, over and over, to flood the stream' | head -c 100000000; echo done"}),
    )]);
    let started = Instant::now();
    let answer = loop {
        let a = post(&c, &format!("{base}/v1/sessions/{id}/dispatch"), &retry).await;
        if a.status == 200 {
            break a;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{}: {}",
            a.status,
            a.text
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let content = answer.json()["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(content.contains("bytes truncated"), "{content:.200}");
    assert!(content.trim_end().ends_with("done"), "{content:.200}");
    let after = peak_kib(child.id());
    let grew_mib = after.saturating_sub(before) as f64 / 1024.0;
    println!(
        "progress flood: 100 MB of output to a client that does not read; server peak RSS {:.1} MiB → {:.1} MiB (+{grew_mib:.1} MiB)",
        before as f64 / 1024.0,
        after as f64 / 1024.0
    );
    assert!(grew_mib < 32.0, "the server grew by {grew_mib:.1} MiB");

    // Now read: the stream ends with the result; the output it left out is counted.
    let mut body = String::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events = events(&body);
    let progress: Vec<Value> = events
        .iter()
        .filter(|(e, _)| e == "progress")
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert!(!progress.is_empty());
    let shown: u64 = progress
        .iter()
        .map(|d| d["text"].as_str().map_or(0, |t| t.len() as u64))
        .sum();
    let dropped: u64 = progress
        .iter()
        .map(|d| d["dropped_bytes"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        dropped > 0 && shown < 100_000_000,
        "shown {shown}, dropped {dropped}"
    );
    assert_eq!(events.last().unwrap().0, "done");
    // The metrics count what was sent and what was left out (this server ran nothing else
    // with a listener).
    let exposition = get(&c, &format!("{base}/metrics")).await.text;
    let value = |name: &str| -> f64 {
        exposition
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    assert_eq!(
        value("switchboard_progress_events_total "),
        progress.len() as f64
    );
    assert_eq!(value("switchboard_progress_bytes_total "), shown as f64);
    assert!(value("switchboard_progress_dropped_bytes_total ") >= dropped as f64);
    terminate(child);
}

/// A client tool's progress: while its call waits for the client's answer, the client reports
/// output and values (`POST …/calls/{call_id}/progress`); they reach the turn's stream as
/// `event: progress` under the call's `tool_use_id`, before its result. Reports on a call that
/// is answered, unknown, or malformed are refused as answers are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_s_progress_reports_reach_the_stream_before_its_result() {
    let s = start(|_| {}).await;
    let c = client();
    let created = post(
        &c,
        &s.url("/v1/sessions"),
        &json!({"tools": [{
            "name": "build",
            "description": "Builds the project on the platform.",
            "input_schema": {"type": "object", "properties": {}},
        }]})
        .to_string(),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json()["session_id"].as_str().unwrap().to_string();
    let mut response = c
        .post(s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(turn(&[("b1", "build", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut buffer = String::new();
    let mut seen: Vec<(String, Value)> = Vec::new();
    let mut call_id = None;
    while let Some(chunk) = response.chunk().await.unwrap() {
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            for (event, data) in events(&block) {
                let data: Value = serde_json::from_str(&data).unwrap();
                if event == "call" {
                    let cid = data["call_id"].as_str().unwrap().to_string();
                    let url = s.url(&format!("/v1/sessions/{id}/calls/{cid}/progress"));
                    for report in [
                        json!({"text": "compiling 1/2\n"}),
                        json!({"progress": 1, "total": 2, "message": "compiled"}),
                        json!({"text": "a warning\n", "stream": "stderr"}),
                    ] {
                        let r = post(&c, &url, &report.to_string()).await;
                        assert_eq!(r.status, 200, "{}", r.text);
                        assert_eq!(r.json()["accepted"], true);
                        tokio::time::sleep(MIN_GAP).await;
                    }
                    for bad in [
                        json!({"text": 1}),
                        json!({"nope": 1}),
                        json!({"progress": "x"}),
                    ] {
                        let r = post(&c, &url, &bad.to_string()).await;
                        assert_eq!(r.status, 400, "{bad}: {}", r.text);
                    }
                    let answer = s.url(&format!("/v1/sessions/{id}/calls/{cid}"));
                    let r = post(&c, &answer, &json!({"content": "built"}).to_string()).await;
                    assert_eq!(r.status, 200, "{}", r.text);
                    call_id = Some(cid);
                }
                seen.push((event, data));
            }
        }
    }
    let cid = call_id.expect("a call event");
    let kinds: Vec<&str> = seen.iter().map(|(e, _)| e.as_str()).collect();
    let result_at = kinds.iter().position(|k| *k == "result").unwrap();
    let progress: Vec<&Value> = seen[..result_at]
        .iter()
        .filter(|(e, _)| e == "progress")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(progress.len(), 3, "{seen:?}");
    assert!(progress.iter().all(|d| d["tool_use_id"] == "b1"));
    assert_eq!(progress[0]["text"], "compiling 1/2\n");
    assert_eq!(
        (
            progress[1]["kind"].as_str(),
            progress[1]["progress"].as_f64(),
            progress[1]["total"].as_f64()
        ),
        (Some("progress"), Some(1.0), Some(2.0))
    );
    assert_eq!(
        (progress[2]["stream"].as_str(), progress[2]["text"].as_str()),
        (Some("stderr"), Some("a warning\n"))
    );
    assert!(
        kinds[result_at + 1..].iter().all(|k| *k != "progress"),
        "{kinds:?}"
    );
    assert_eq!(seen.last().unwrap().1["content"][0]["content"], "built");
    // Answered: a report now is refused as a second answer would be.
    let late = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/calls/{cid}/progress")),
        &json!({"text": "late"}).to_string(),
    )
    .await;
    assert_eq!(
        (late.status, late.code()),
        (409, "already_answered".into()),
        "{}",
        late.text
    );
    let unknown = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/calls/c999/progress")),
        &json!({"text": "?"}).to_string(),
    )
    .await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (404, "unknown_call".into())
    );
    s.shutdown().await.unwrap();
}

/// More than the 50 ms a call's progress batches are apart: each report its own event.
const MIN_GAP: Duration = Duration::from_millis(80);

/// Cancel stops a call's progress: a streamed command cancelled while it prints sends its lines
/// until then, its result says `cancelled`, and no progress follows the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_stops_at_cancel() {
    let s = start(|_| {}).await;
    let c = client();
    let (id, _ws) = session(&c, &s, None).await;
    let url = s.url(&format!(
        "/v1/sessions/{id}/dispatch?stream=true&turn_id=cancelled-loop"
    ));
    let body = turn(&[(
        "loop",
        "bash",
        json!({"command": "while true; do echo tick; sleep 0.1; done"}),
    )]);
    let streaming = tokio::spawn({
        let c = c.clone();
        async move { stream_timed(&c, &url, &body).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let cancelled = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/turns/cancelled-loop/cancel")),
        "",
    )
    .await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    let events = streaming.await.unwrap();
    let result = events
        .iter()
        .position(|(e, _, _)| e == "result")
        .expect("a result");
    let before = events[..result]
        .iter()
        .filter(|(e, _, _)| e == "progress")
        .count();
    assert!(before >= 3, "{events:?}");
    assert!(
        events[result..].iter().all(|(e, _, _)| e != "progress"),
        "{events:?}"
    );
    let content = events[result].1["result"]["content"].as_str().unwrap();
    assert!(content.starts_with("Error [cancelled]"), "{content}");
    s.shutdown().await.unwrap();
}
