//! What one careless or hostile client can do to the others: flood one session with turns, stall
//! its uploads, name its workspace after another session, hold descriptors; and what a turn
//! waiting at shutdown is answered.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::serve_common::*;

/// One session flooded with turns (far more than its share) while two others send turns one
/// after another: every turn of the others is served, and the flood is refused `overloaded`
/// beyond the flooded session's share, never beyond the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_session_does_not_starve_the_others() {
    let s = start(|c| {
        c.load_tools = true;
        c.max_requests = 4;
        c.max_session_turns = 4;
    })
    .await;
    let c = client();
    let (flooded, _) = session(&c, &s, None).await;
    let (a, _) = session(&c, &s, None).await;
    let (b, _) = session(&c, &s, None).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut flood = Vec::new();
    for i in 0..64 {
        let (c, url, stop) = (
            c.clone(),
            s.url(&format!("/v1/sessions/{flooded}/dispatch")),
            stop.clone(),
        );
        flood.push(tokio::spawn(async move {
            let (mut served, mut refused) = (0u32, 0u32);
            let mut n = 0;
            while !stop.is_cancelled() && n < 400 {
                n += 1;
                let body = turn(&[(&format!("f{i}-{n}"), "sleep", json!({}))]);
                let answer = post(&c, &url, &body).await;
                match answer.status {
                    200 => served += 1,
                    503 => {
                        assert_eq!(answer.code(), "overloaded", "{}", answer.text);
                        assert!(
                            answer.text.contains("--max-session-turns"),
                            "{}",
                            answer.text
                        );
                        refused += 1;
                    }
                    other => panic!("unexpected {other}: {}", answer.text),
                }
            }
            (served, refused)
        }));
    }
    // Let the flood fill the session's share, then serve the others.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for other in [&a, &b] {
        for n in 0..20 {
            let body = turn(&[(&format!("o{n}"), "noop", json!({}))]);
            let answer = dispatch(&c, &s, other, &body).await;
            assert_eq!(answer.status, 200, "turn {n} of {other}: {}", answer.text);
        }
    }
    stop.cancel();
    let (mut served, mut refused) = (0, 0);
    for task in flood {
        let (s, r) = task.await.unwrap();
        served += s;
        refused += r;
    }
    assert!(served > 0, "the flooded session was served too");
    assert!(refused > 0, "the flood went beyond the session's share");
    s.shutdown().await.unwrap();
}

/// At shutdown, a turn waiting behind its session's running turn is answered call by call:
/// `cancelled`, as it never ran — not `shutting_down` with no results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_waiting_at_shutdown_gets_a_result_per_call() {
    let mut s = start(|c| c.grace = Duration::from_millis(200)).await;
    let c = client();
    let (id, ws) = session(&c, &s, None).await;
    let url = s.url(&format!("/v1/sessions/{id}/dispatch"));
    let running = {
        let (c, url) = (c.clone(), url.clone());
        let body = turn(&[("r", "bash", json!({"command": "touch started; sleep 30"}))]);
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    let started = std::path::PathBuf::from(format!("{ws}/started"));
    assert!(appears(&started, Duration::from_secs(20)).await);
    let waiting = {
        let (c, url) = (c.clone(), url.clone());
        let body = turn(&[
            (
                "w",
                "write_file",
                json!({"path": "late.txt", "content": "x"}),
            ),
            ("g", "glob", json!({"pattern": "*"})),
        ]);
        tokio::spawn(async move { post(&c, &url, &body).await })
    };
    // The second turn is queued (in flight: two requests).
    let info = s.url(&format!("/v1/sessions/{id}"));
    assert!(
        eventually(Duration::from_secs(10), || {
            let (c, info) = (c.clone(), info.clone());
            async move { get(&c, &info).await.json()["in_flight"] == 2 }
        })
        .await
    );
    s.begin_shutdown();
    let first = running.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text);
    assert!(first.text.contains("Error [cancelled]"), "{}", first.text);
    let second = waiting.await.unwrap();
    assert_eq!(second.status, 200, "{}", second.text);
    let blocks = second.json()["content"].as_array().unwrap().clone();
    assert_eq!(blocks.len(), 2, "{}", second.text);
    for (block, id) in blocks.iter().zip(["w", "g"]) {
        assert_eq!(block["tool_use_id"], id);
        assert_eq!(block["is_error"], true);
        assert!(
            block["content"]
                .as_str()
                .unwrap()
                .starts_with("Error [cancelled]"),
            "{block}"
        );
    }
    assert!(!std::path::Path::new(&format!("{ws}/late.txt")).exists());
}

/// A session created without a workspace name gets a directory no name reaches: naming a new
/// session's workspace after it (or after the directory holding such workspaces) is refused or
/// lands elsewhere, never in that session's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_sessions_workspace_is_not_reachable_by_name() {
    let s = start(|_| {}).await;
    let c = client();
    let (victim, victim_ws) = session(&c, &s, None).await;
    std::fs::write(format!("{victim_ws}/secret.txt"), "mine").unwrap();
    let (intruder, intruder_ws) = session(&c, &s, Some(&victim)).await;
    assert_ne!(intruder_ws, victim_ws);
    let read = dispatch(
        &c,
        &s,
        &intruder,
        &turn(&[("r", "read_file", json!({"path": "secret.txt"}))]),
    )
    .await;
    assert_eq!(read.json()["content"][0]["is_error"], true, "{}", read.text);
    let refused = post(&c, &s.url("/v1/sessions"), r#"{"workspace": "@sessions"}"#).await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (400, "bad_request")
    );
    s.shutdown().await.unwrap();
}

/// Reads what the server sends until it closes the connection (or 10 s pass).
fn read_until_closed(stream: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// A request whose headers stop half-way is closed after the read timeout; a body that stalls
/// is answered `request_timeout` (408); other sessions are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_after_the_read_timeout_and_hold_nothing() {
    let s = start(|c| {
        c.read_timeout = Duration::from_secs(1);
        c.max_requests = 1;
    })
    .await;
    let c = client();
    let (stalled, _) = session(&c, &s, None).await;
    let (other, _) = session(&c, &s, None).await;
    let addr = s.base.trim_start_matches("http://").to_string();

    let mut half_headers = TcpStream::connect(&addr).unwrap();
    half_headers
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut stalled_bodies = Vec::new();
    for _ in 0..4 {
        let mut body = TcpStream::connect(&addr).unwrap();
        let head = format!(
            "POST /v1/sessions/{stalled}/dispatch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n{{\"role\""
        );
        body.write_all(head.as_bytes()).unwrap();
        stalled_bodies.push(body);
    }
    // The other session is served while the uploads stall: they hold no place of the server's
    // (its only one, `max_requests = 1`; before, they held it and this was `overloaded`).
    let served = dispatch(
        &c,
        &s,
        &other,
        &turn(&[("g", "glob", json!({"pattern": "*"}))]),
    )
    .await;
    assert_eq!(served.status, 200, "{}", served.text);

    let (answer, waited) = read_until_closed(&mut half_headers);
    assert!(
        waited < Duration::from_secs(8),
        "half-sent headers kept the connection {waited:?}"
    );
    assert!(!answer.contains("200 OK"), "{answer}");
    for mut body in stalled_bodies {
        let (answer, _) = read_until_closed(&mut body);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("request_timeout"), "{answer}");
        assert!(answer.contains("--read-timeout"), "{answer}");
    }
    s.shutdown().await.unwrap();
}

fn prlimit() -> Option<String> {
    let found = Command::new("prlimit")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    found.then(|| "prlimit".to_string())
}

/// The soft and hard open-file limits of process `pid`.
fn open_files(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

/// `serve` raises its soft open-file limit to the hard one, and refuses new sessions with
/// `too_many_sessions` before the descriptors run out, so existing sessions keep working.
#[test]
fn sessions_are_refused_before_descriptors_run_out() {
    let Some(prlimit) = prlimit() else {
        if std::env::var_os("SWITCHBOARD_REQUIRE_SANDBOX").is_some() {
            panic!("prlimit (util-linux) is required here");
        }
        eprintln!("SKIPPED: no prlimit");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(prlimit);
    cmd.arg("--nofile=300:512")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_switchboard"))
        .arg("serve")
        .arg("--workspace-root")
        .arg(tmp.path())
        .args(["--listen", "127.0.0.1:0", "--no-auth", "--sandbox", "off"])
        .env_remove("SWITCHBOARD_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (mut child, base) = spawn_server(cmd);
    assert_eq!(
        open_files(child.id()),
        (512, 512),
        "the soft limit is raised"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();
    rt.block_on(async {
        // 512 descriptors: (512 - 256) / 4 = 64 sessions.
        let mut ids = Vec::new();
        let refusal = loop {
            let a = send(c.post(format!("{base}/v1/sessions")).body("{}")).await;
            if a.status != 201 {
                break a;
            }
            ids.push(a.json()["session_id"].as_str().unwrap().to_string());
            assert!(ids.len() <= 64, "more sessions than the descriptors allow");
        };
        assert_eq!(ids.len(), 64);
        assert_eq!(
            (refusal.status, refusal.code().as_str()),
            (429, "too_many_sessions")
        );
        assert!(refusal.text.contains("open-file limit"), "{}", refusal.text);
        // Every session still runs commands.
        for (n, id) in ids.iter().enumerate().step_by(9) {
            let body = turn(&[("b", "bash", json!({"command": format!("echo {n}")}))]);
            let a = send(
                c.post(format!("{base}/v1/sessions/{id}/dispatch"))
                    .body(body),
            )
            .await;
            assert_eq!(
                a.json()["content"][0]["content"].as_str().map(str::trim),
                Some(n.to_string().as_str()),
                "{}",
                a.text
            );
        }
    });
    let _ = child.kill();
    let _ = child.wait();
}
