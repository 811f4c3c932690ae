//! Cluster mode against real parts: a 3-server `nats-server` cluster with JetStream on loopback
//! ports and 3 `switchboard serve` nodes (the real binary) sharing one workspace root.
//!
//! Skipped (with a line saying so) when no `nats-server` is found, unless
//! `SWITCHBOARD_REQUIRE_NATS=1` (CI sets it and installs the server).

// Shared with other test binaries: not every helper is used here.
#[allow(dead_code)]
#[path = "../common/nats.rs"]
mod nats;
#[path = "../serve_common/mod.rs"]
mod serve_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use serve_common::{Answer, TOKEN, events, file_lines, send, spawn_server, turn};

/// The lease TTL the nodes run with: short, so failover tests stay short.
const TTL: &str = "2s";
/// How long a test waits for a session to move after its owner died (TTL plus the NATS
/// server's expiry of the dead node's heartbeat, plus slack for a loaded machine).
const MOVE_LIMIT: Duration = Duration::from_secs(40);

struct Node {
    name: String,
    child: Child,
    base: String,
}

impl Node {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node(nats: &str, name: &str, root: &Path) -> Node {
    start_node_with(nats, name, root, TTL, "3")
}

/// A node asking for lease TTL `ttl` and `replicas` replicas.
fn start_node_with(nats: &str, name: &str, root: &Path, ttl: &str, replicas: &str) -> Node {
    start_node_args(nats, name, root, ttl, replicas, &[])
}

/// [`start_node_with`] and more flags.
fn start_node_args(
    nats: &str,
    name: &str,
    root: &Path,
    ttl: &str,
    replicas: &str,
    more: &[&str],
) -> Node {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--cluster",
        nats,
        "--node-id",
        name,
    ])
    .args([
        "--lease-ttl",
        ttl,
        "--cluster-replicas",
        replicas,
        "--grace",
        "2s",
    ])
    .args(more)
    .arg("--workspace-root")
    .arg(root)
    .env("SWITCHBOARD_TOKEN", TOKEN)
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let (child, base) = spawn_server(cmd);
    Node {
        name: name.to_string(),
        child,
        base,
    }
}

struct Cluster {
    nats: nats::NatsCluster,
    nodes: Vec<Node>,
    /// Kept until the cluster is dropped: the nodes' workspace root.
    _root: tempfile::TempDir,
}

/// 3 NATS servers and nodes `a`, `b`, `c` on one workspace root; `None` when skipped.
fn cluster() -> Option<Cluster> {
    nats::nats_or_skip()?;
    let nats = nats::NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let nodes = ["a", "b", "c"]
        .iter()
        .map(|n| start_node(&nats.urls(), n, root.path()))
        .collect();
    Some(Cluster {
        nats,
        nodes,
        _root: root,
    })
}

/// 3 NATS servers and a workspace root for nodes started by the test; `None` when skipped.
fn nats_and_root() -> Option<(nats::NatsCluster, tempfile::TempDir)> {
    nats::nats_or_skip()?;
    Some((nats::NatsCluster::start(3), tempfile::tempdir().unwrap()))
}

/// The node that owns session `id`, as `node` reports it.
async fn owner_seen_by(c: &reqwest::Client, node: &Node, id: &str) -> String {
    let info = send(
        c.get(node.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(info.status, 200, "{}", info.text);
    info.json()["node"].as_str().unwrap_or_default().to_string()
}

fn client() -> reqwest::Client {
    switchboard::agent::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn create(c: &reqwest::Client, node: &Node, body: Value) -> Value {
    let a = send(
        c.post(node.url("/v1/sessions"))
            .bearer_auth(TOKEN)
            .body(body.to_string()),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.text);
    a.json()
}

/// A new session made through `node` (a plain one): its id and workspace.
async fn session_on(c: &reqwest::Client, node: &Node) -> (String, PathBuf) {
    let made = create(c, node, json!({})).await;
    (
        made["session_id"].as_str().unwrap().to_string(),
        PathBuf::from(made["workspace"].as_str().unwrap()),
    )
}

async fn dispatch_on(
    c: &reqwest::Client,
    node: &Node,
    id: &str,
    turn_id: &str,
    body: &str,
) -> Answer {
    send(
        c.post(node.url(&format!("/v1/sessions/{id}/dispatch")))
            .bearer_auth(TOKEN)
            .header("Switchboard-Turn-Id", turn_id)
            .body(body.to_string()),
    )
    .await
}

/// A turn of one bash call, `call`, running `command`.
fn bash_turn(call: &str, command: &str) -> String {
    turn(&[(call, "bash", json!({"command": command}))])
}

/// Sends a one-call bash turn through `node`; its answer, which must be a 200.
async fn bash_on(
    c: &reqwest::Client,
    node: &Node,
    id: &str,
    turn_id: &str,
    call: &str,
    command: &str,
) -> Answer {
    let answer = dispatch_on(c, node, id, turn_id, &bash_turn(call, command)).await;
    assert_eq!(answer.status, 200, "through {}: {}", node.name, answer.text);
    answer
}

/// Sends a turn through `nodes` in turn until one answers 200 (a node may be dead, a session
/// may be moving); the answer.
async fn dispatch_until_answered(
    c: &reqwest::Client,
    nodes: &[&Node],
    id: &str,
    turn_id: &str,
    body: &str,
) -> Answer {
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    dispatch_until_answered_at(c, &bases, id, turn_id, body).await
}

/// [`dispatch_until_answered`] through nodes by their base URLs.
async fn dispatch_until_answered_at(
    c: &reqwest::Client,
    bases: &[String],
    id: &str,
    turn_id: &str,
    body: &str,
) -> Answer {
    let deadline = Instant::now() + MOVE_LIMIT;
    let mut i = 0;
    loop {
        let base = &bases[i % bases.len()];
        i += 1;
        let sent = c
            .post(format!("{base}/v1/sessions/{id}/dispatch"))
            .bearer_auth(TOKEN)
            .header("Switchboard-Turn-Id", turn_id)
            .body(body.to_string())
            .send()
            .await;
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            if let Ok(text) = response.text().await {
                let answer = Answer {
                    status,
                    headers,
                    text,
                };
                if status == 200 {
                    return answer;
                }
                let code = answer.code();
                assert!(
                    [
                        "node_unreachable",
                        "session_moved",
                        "cluster_unavailable",
                        "turn_in_progress",
                        "overloaded"
                    ]
                    .contains(&code.as_str()),
                    "only a retryable refusal while a session moves: {} {}",
                    answer.status,
                    answer.text
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "turn {turn_id} of {id} unanswered after {MOVE_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn results(answer: &Answer) -> Vec<Value> {
    answer.json()["content"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn metric(c: &reqwest::Client, node: &Node, name: &str) -> f64 {
    let text = c
        .get(node.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_on_one_node_is_served_by_every_node_and_streams_through_a_forward() {
    let Some(cl) = cluster() else { return };
    let c = client();
    // The servers sync every write before they acknowledge it, as docs/cluster.md asks.
    for i in 0..cl.nats.size() {
        let varz: Value = c
            .get(format!("{}/varz", cl.nats.monitor_url(i)))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            varz["jetstream"]["config"]["sync_always"],
            json!(true),
            "server {i}: {}",
            varz["jetstream"]
        );
    }
    let [a, b, nc] = [&cl.nodes[0], &cl.nodes[1], &cl.nodes[2]];
    let made = create(&c, a, json!({})).await;
    let id = made["session_id"].as_str().unwrap().to_string();
    assert_eq!(
        made["node"], "a",
        "placed on the node that received it: {made}"
    );
    let ws = PathBuf::from(made["workspace"].as_str().unwrap());
    for (i, node) in [a, b, nc].iter().enumerate() {
        let call = format!("c{i}");
        let body = turn(&[(
            &call,
            "bash",
            json!({"command": format!("echo {} >> log; wc -l < log", node.name)}),
        )]);
        let answer = dispatch_on(&c, node, &id, &format!("t{i}"), &body).await;
        assert_eq!(answer.status, 200, "through {}: {}", node.name, answer.text);
        assert_eq!(
            results(&answer)[0]["content"],
            json!((i + 1).to_string()),
            "{}",
            answer.text
        );
    }
    assert_eq!(
        file_lines(ws.join("log")),
        ["a", "b", "c"],
        "each call ran once, on the owner"
    );
    // The owner is the same whichever node is asked.
    for node in [a, b, nc] {
        let info = send(
            c.get(node.url(&format!("/v1/sessions/{id}")))
                .bearer_auth(TOKEN),
        )
        .await;
        assert_eq!(info.status, 200, "{}", info.text);
        assert_eq!(info.json()["node"], "a");
        assert_eq!(info.json()["turns"], 3);
    }
    // A streamed turn through a forward: every event, in order, then `done`.
    let body = turn(&[
        ("s1", "bash", json!({"command": "sleep 0.3; echo first"})),
        ("s2", "bash", json!({"command": "echo second"})),
    ]);
    let streamed = send(
        c.post(b.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
            .bearer_auth(TOKEN)
            .body(body),
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    let got = events(&streamed.text);
    let kinds: Vec<&str> = got
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| *k != "progress")
        .collect();
    assert_eq!(kinds, ["result", "result", "done"], "{}", streamed.text);
    assert!(streamed.text.contains("first") && streamed.text.contains("second"));
    // The commands' output came relayed as live progress, each call's before its result.
    for (call, text, index) in [("s1", "first\n", 0), ("s2", "second\n", 1)] {
        let at = |pred: &dyn Fn(&str, &Value) -> bool| {
            got.iter()
                .position(|(k, d)| pred(k, &serde_json::from_str(d).unwrap()))
                .unwrap_or_else(|| panic!("{call}: {}", streamed.text))
        };
        let progress = at(&|k, d| k == "progress" && d["tool_use_id"] == call && d["text"] == text);
        let result = at(&|k, d| k == "result" && d["index"] == index);
        assert!(progress < result, "{}", streamed.text);
    }
    // A 4-second command printing a line every 200 ms, relayed: its lines come as they are
    // written, before its result.
    let looped = turn(&[(
        "s3",
        "bash",
        json!({"command": "for i in $(seq 1 20); do echo line $i; sleep 0.2; done"}),
    )]);
    let streamed = send(
        c.post(nc.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
            .bearer_auth(TOKEN)
            .body(looped),
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    let got = events(&streamed.text);
    let result = got.iter().position(|(k, _)| k == "result").unwrap();
    let lines: String = got[..result]
        .iter()
        .filter(|(k, _)| k == "progress")
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let progress = got[..result]
        .iter()
        .filter(|(k, _)| k == "progress")
        .count();
    assert!(
        progress >= 15,
        "{progress} progress events: {}",
        streamed.text
    );
    assert_eq!(
        lines,
        (1..=20).map(|i| format!("line {i}\n")).collect::<String>()
    );
    assert!(got[result..].iter().all(|(k, _)| k != "progress"));
    // No token, no relay: the token is checked where the request arrives.
    let refused = send(
        c.post(b.url(&format!("/v1/sessions/{id}/dispatch")))
            .body("{}"),
    )
    .await;
    assert_eq!(refused.status, 401);
    assert!(
        metric(
            &c,
            b,
            "switchboard_cluster_forwards_total{node=\"b\",outcome=\"ok\"}"
        )
        .await
            >= 3.0
    );
    assert_eq!(metric(&c, a, "switchboard_cluster_leases_held").await, 1.0);
    drop(cl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_call_streams_through_one_node_and_is_answered_through_another() {
    let Some(cl) = cluster() else { return };
    let c = client();
    let [a, b, nc] = [&cl.nodes[0], &cl.nodes[1], &cl.nodes[2]];
    let tool = json!({
        "name": "lookup",
        "description": "Looks a key up in the platform's store.",
        "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        // Longer than the test client's 60 s timeout: a call nobody answers never ends the
        // test by its deadline.
        "timeout_ms": 600_000,
    });
    let made = create(&c, a, json!({"tools": [tool]})).await;
    let id = made["session_id"].as_str().unwrap().to_string();
    let body = turn(&[
        ("k1", "lookup", json!({"key": "colour"})),
        ("k2", "bash", json!({"command": "echo built-in"})),
    ]);
    // The stream goes through b; the `call` event's answer goes through c; a owns the session.
    let mut response = c
        .post(b.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut buffer = String::new();
    let mut seen = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = response.chunk().await.unwrap() {
            buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                for (event, data) in events(&block) {
                    if event == "call" {
                        let call: Value = serde_json::from_str(&data).unwrap();
                        assert_eq!(call["input"]["key"], "colour", "{call}");
                        let call_id = call["call_id"].as_str().unwrap();
                        let answered = send(
                            c.post(nc.url(&format!("/v1/sessions/{id}/calls/{call_id}")))
                                .bearer_auth(TOKEN)
                                .body(json!({"content": "blue"}).to_string()),
                        )
                        .await;
                        assert_eq!(answered.status, 200, "{}", answered.text);
                    }
                    seen.push((event, data));
                }
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the relayed stream ended within 30 s: {seen:?}"
    );
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "call").count(),
        1,
        "{kinds:?}"
    );
    let (last, done) = seen.last().unwrap();
    assert_eq!(last, "done", "{kinds:?}");
    assert!(done.contains("blue") && done.contains("built-in"), "{done}");

    // A client that leaves a relayed stream while a call waits for it: the owner answers the
    // call `cancelled` at once (as on a direct connection), so the session's next turn runs.
    let mut response = c
        .post(b.url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .body(turn(&[("k3", "lookup", json!({"key": "size"}))]))
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while !text.contains("event: call") {
        let chunk = response.chunk().await.unwrap().expect("a call event");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    drop(response);
    // Without the cancel reaching the owner, this turn would wait behind the unanswered call
    // for its 10-minute deadline (and the client's 60 s timeout would fail the test).
    let next = bash_on(&c, nc, &id, "after-leaving", "k4", "echo next").await;
    assert_eq!(results(&next)[0]["content"], "next", "{}", next.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_killed_under_load_leaves_every_call_answered_once_and_nothing_run_twice() {
    let Some(mut cl) = cluster() else { return };
    let c = client();
    let mut sessions = Vec::new();
    for _ in 0..16 {
        let made = create(&c, &cl.nodes[0], json!({})).await;
        sessions.push((
            made["session_id"].as_str().unwrap().to_string(),
            PathBuf::from(made["workspace"].as_str().unwrap()),
        ));
    }
    // Each session: turns of two side-effect calls, each appending its own line, sent through
    // b and c (relayed to a) and retried with the same turn id until answered; a is killed
    // once every session has had a turn answered.
    let answered = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (pid, answered) = (cl.nodes[0].pid(), Arc::clone(&answered));
        tokio::spawn(async move {
            while answered.load(Ordering::Acquire) < 16 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        })
    };
    let mut tasks = Vec::new();
    for (s, (id, _)) in sessions.iter().enumerate() {
        let (id, c, answered) = (id.clone(), c.clone(), Arc::clone(&answered));
        let bases = [cl.nodes[1].base.clone(), cl.nodes[2].base.clone()];
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for t in 0..6 {
                let calls: Vec<(String, String)> = (0..2)
                    .map(|k| (format!("x{s}-{t}-{k}"), format!("line-{t}-{k}")))
                    .collect();
                let body = turn(
                    &calls
                        .iter()
                        .map(|(cid, line)| {
                            (
                                cid.as_str(),
                                "bash",
                                json!({"command": format!("echo {line} >> log; sleep 0.2")}),
                            )
                        })
                        .collect::<Vec<_>>(),
                );
                let answer =
                    dispatch_until_answered_at(&c, &bases, &id, &format!("turn-{t}"), &body).await;
                answered.fetch_add(1, Ordering::AcqRel);
                for (r, (_, line)) in results(&answer).into_iter().zip(calls) {
                    answers.push((r, line));
                }
            }
            answers
        }));
    }
    let mut unknown = 0;
    let mut total = 0;
    for (task, (_, ws)) in tasks.into_iter().zip(&sessions) {
        let answers = task.await.unwrap();
        assert_eq!(answers.len(), 12, "every call answered");
        let mut seen: HashMap<String, usize> = HashMap::new();
        for line in file_lines(ws.join("log")) {
            *seen.entry(line).or_insert(0) += 1;
        }
        for (line, n) in &seen {
            assert_eq!(*n, 1, "{line} written {n} times in {}", ws.display());
        }
        for (r, line) in &answers {
            total += 1;
            if r["is_error"] == true {
                let text = r["content"].to_string();
                assert!(
                    text.contains("outcome_unknown"),
                    "only outcome_unknown may fail: {r}"
                );
                unknown += 1;
            } else {
                assert_eq!(
                    seen.get(line),
                    Some(&1),
                    "{r} answered ok and its line is there once"
                );
            }
        }
    }
    killer.await.unwrap();
    assert_eq!(total, 16 * 12);
    assert!(
        unknown <= 32,
        "at most the calls running at the kill are unknown: {unknown}"
    );
    // The sessions moved: b and c hold all 16 now.
    let held = metric(&c, &cl.nodes[1], "switchboard_cluster_leases_held").await
        + metric(&c, &cl.nodes[2], "switchboard_cluster_leases_held").await;
    assert_eq!(held, 16.0);
    let failovers = metric(&c, &cl.nodes[1], "switchboard_cluster_failovers_total").await
        + metric(&c, &cl.nodes[2], "switchboard_cluster_failovers_total").await;
    // At least one takeover per session (a loaded machine may let a new owner's heartbeat
    // lapse too, and the session move once more).
    assert!(failovers >= 16.0, "{failovers}");
    cl.nodes.remove(0);
}

/// The epochs of session `id`'s journal messages, in stream order.
async fn journal_epochs(nats_url: &str, id: &str) -> Vec<(u64, Value)> {
    let client = async_nats::connect(nats_url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("SWITCHBOARD_JOURNAL").await.unwrap();
    let mut out = Vec::new();
    let mut next = 1;
    while let Ok(m) = stream
        .raw_message_builder()
        .sequence(next)
        .next_by_subject(format!("sbj.{id}"))
        .send()
        .await
    {
        next = m.sequence + 1;
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        out.push((v["epoch"].as_u64().unwrap(), v));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_resumed_after_failover_writes_nothing_and_its_client_is_answered_by_the_new_owner()
 {
    let Some(cl) = cluster() else { return };
    let c = client();
    let [a, b, _] = [&cl.nodes[0], &cl.nodes[1], &cl.nodes[2]];
    let (id, ws) = session_on(&c, a).await;
    let first = bash_on(&c, a, &id, "t1", "p1", "echo p1 >> log").await;
    assert_eq!(first.status, 200, "{}", first.text);
    let stop = |sig: &str| {
        let _ = Command::new("kill")
            .args([sig, &a.pid().to_string()])
            .status();
    };
    stop("-STOP");
    // Through b: refused while a's lease stands, then b takes the session over.
    let moved = dispatch_until_answered(
        &c,
        &[b],
        &id,
        "t2",
        &turn(&[("p2", "bash", json!({"command": "echo p2 >> log"}))]),
    )
    .await;
    assert_eq!(
        results(&moved)[0]["is_error"],
        Value::Null,
        "{}",
        moved.text
    );
    // A turn sent to the paused node waits in its socket; once it resumes, it must not run
    // the turn itself: it finds its lease gone and relays the turn to b.
    let late = {
        let (c, url) = (c.clone(), a.url(&format!("/v1/sessions/{id}/dispatch")));
        tokio::spawn(async move {
            send(
                c.post(url)
                    .bearer_auth(TOKEN)
                    .header("Switchboard-Turn-Id", "t3")
                    .body(turn(&[(
                        "p3",
                        "bash",
                        json!({"command": "echo p3 >> log"}),
                    )])),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop("-CONT");
    let late = late.await.unwrap();
    assert_eq!(late.status, 200, "{}", late.text);
    assert_eq!(file_lines(ws.join("log")), ["p1", "p2", "p3"]);
    let info = send(
        c.get(a.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(
        info.json()["node"],
        "b",
        "a relays to the new owner: {}",
        info.text
    );
    // The journal: epochs never go down along the stream (a wrote nothing after b's claim),
    // and b's claim is there.
    let epochs = journal_epochs(&cl.nats.url(0), &id).await;
    assert!(epochs.windows(2).all(|w| w[0].0 <= w[1].0), "{epochs:?}");
    assert!(
        epochs
            .iter()
            .any(|(e, v)| *e == 2 && v.to_string().contains("claim")),
        "{epochs:?}"
    );
    assert_eq!(metric(&c, a, "switchboard_cluster_leases_held").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_mid_call_is_fenced_by_the_journal_and_publishes_nothing() {
    let Some(cl) = cluster() else { return };
    let c = client();
    let [a, b, _] = [&cl.nodes[0], &cl.nodes[1], &cl.nodes[2]];
    let (id, ws) = session_on(&c, a).await;
    let body = turn(&[(
        "f1",
        "bash",
        json!({"command": "touch started; sleep 3; echo f1 >> log"}),
    )]);
    // The call starts on a (its intent is in the journal), then a is paused mid-call.
    let on_a = {
        let (c, url, body) = (
            c.clone(),
            a.url(&format!("/v1/sessions/{id}/dispatch")),
            body.clone(),
        );
        tokio::spawn(async move {
            send(
                c.post(url)
                    .bearer_auth(TOKEN)
                    .header("Switchboard-Turn-Id", "t1")
                    .body(body),
            )
            .await
        })
    };
    // The command has started, so its intent is in the journal (written before it ran).
    assert!(serve_common::appears(&ws.join("started"), Duration::from_secs(20)).await);
    let signal = |sig: &str| {
        let _ = Command::new("kill")
            .args([sig, &a.pid().to_string()])
            .status();
    };
    signal("-STOP");
    // b takes the session over; the call that was running there is `outcome_unknown`.
    let from_b = dispatch_until_answered(&c, &[b], &id, "t1", &body).await;
    let result = &results(&from_b)[0];
    assert_eq!(result["is_error"], true, "{}", from_b.text);
    assert!(
        result["content"].to_string().contains("outcome_unknown"),
        "{}",
        from_b.text
    );
    // a resumes: its command has finished, but the journal refuses a's answer, and a's client
    // gets the new owner's answer.
    signal("-CONT");
    let from_a = on_a.await.unwrap();
    assert_eq!(from_a.status, 200, "{}", from_a.text);
    assert_eq!(
        from_a.text, from_b.text,
        "a relays b's answer instead of its own"
    );
    assert_eq!(file_lines(ws.join("log")), ["f1"], "the command ran once");
    // Counted as a's session is closed there (just after the refusal, not before the answer).
    let counted = serve_common::eventually(Duration::from_secs(10), || {
        let c = c.clone();
        async move { metric(&c, a, "switchboard_cluster_fencing_refusals_total").await == 1.0 }
    })
    .await;
    assert!(
        counted,
        "a's refused write is counted once, not {}",
        metric(&c, a, "switchboard_cluster_fencing_refusals_total").await
    );
    let epochs = journal_epochs(&cl.nats.url(0), &id).await;
    assert!(
        epochs.windows(2).all(|w| w[0].0 <= w[1].0),
        "a wrote nothing after b's claim: {epochs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_keeps_working_when_a_nats_server_is_killed() {
    let Some(mut cl) = cluster() else { return };
    let c = client();
    let (id, ws) = session_on(&c, &cl.nodes[0]).await;
    cl.nats.kill(0);
    // Sessions are still made and served through every node, with answers remembered.
    let body = turn(&[("n1", "bash", json!({"command": "echo n1 >> log; echo ok"}))]);
    let nodes: Vec<&Node> = cl.nodes.iter().collect();
    let first = dispatch_until_answered(&c, &nodes[1..], &id, "t1", &body).await;
    assert_eq!(results(&first)[0]["content"], "ok", "{}", first.text);
    let again = dispatch_until_answered(&c, &nodes[2..], &id, "t1", &body).await;
    assert_eq!(
        first.text, again.text,
        "the retry is answered from the journal"
    );
    for node in &cl.nodes {
        let made = send(
            c.post(node.url("/v1/sessions"))
                .bearer_auth(TOKEN)
                .body("{}"),
        )
        .await;
        assert_eq!(made.status, 201, "{}", made.text);
    }
    assert_eq!(file_lines(ws.join("log")), ["n1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_nats_quorum_requests_get_a_retryable_503_in_bounded_time_and_work_once_it_is_back()
 {
    let Some(mut cl) = cluster() else { return };
    let c = client();
    let (id, _) = session_on(&c, &cl.nodes[0]).await;
    // Its owner dies, and two of the three NATS servers with it: no quorum.
    let _ = cl.nodes[0].child.kill();
    let _ = cl.nodes[0].child.wait();
    cl.nats.kill(1);
    cl.nats.kill(2);
    let body = turn(&[("q1", "bash", json!({"command": "echo back"}))]);
    for (what, request) in [
        (
            "a new session",
            c.post(cl.nodes[1].url("/v1/sessions"))
                .bearer_auth(TOKEN)
                .body("{}"),
        ),
        (
            "the dead owner's session",
            c.post(cl.nodes[1].url(&format!("/v1/sessions/{id}/dispatch")))
                .bearer_auth(TOKEN)
                .header("Switchboard-Turn-Id", "t1")
                .body(body.clone()),
        ),
    ] {
        let started = Instant::now();
        let answer = send(request).await;
        let waited = started.elapsed();
        assert_eq!(answer.status, 503, "{what}: {}", answer.text);
        // A new session needs the lease bucket's quorum; the dead owner's session may also
        // read as still owned (its heartbeat has not expired without a quorum to expire it).
        let expected: &[&str] = if what == "a new session" {
            &["cluster_unavailable"]
        } else {
            &["cluster_unavailable", "node_unreachable"]
        };
        assert!(
            expected.contains(&answer.code().as_str()),
            "{what}: {}",
            answer.text
        );
        assert!(
            answer.headers.contains_key("retry-after"),
            "{what}: no Retry-After"
        );
        assert!(
            waited < Duration::from_secs(30),
            "{what}: answered after {waited:?}"
        );
    }
    // The servers back: the session is taken over and served, new sessions are made.
    cl.nats.restart(1);
    cl.nats.restart(2);
    let nodes: Vec<&Node> = cl.nodes[1..].iter().collect();
    let answer = dispatch_until_answered(&c, &nodes, &id, "t1", &body).await;
    assert_eq!(results(&answer)[0]["content"], "back", "{}", answer.text);
    let deadline = Instant::now() + MOVE_LIMIT;
    loop {
        let made = send(
            c.post(cl.nodes[2].url("/v1/sessions"))
                .bearer_auth(TOKEN)
                .body("{}"),
        )
        .await;
        if made.status == 201 {
            break;
        }
        assert_eq!(made.status, 503, "{}", made.text);
        assert!(Instant::now() < deadline, "{}", made.text);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_stream_whose_owner_dies_ends_with_an_error_event() {
    let Some(mut cl) = cluster() else { return };
    let c = client();
    let (id, _) = session_on(&c, &cl.nodes[0]).await;
    let body = turn(&[
        ("e1", "bash", json!({"command": "echo first"})),
        ("e2", "bash", json!({"command": "sleep 30; echo never"})),
    ]);
    let request = c
        .post(cl.nodes[1].url(&format!("/v1/sessions/{id}/dispatch?stream=true")))
        .bearer_auth(TOKEN)
        .header("Switchboard-Turn-Id", "t1")
        .body(body);
    let streamed = tokio::spawn(send(request));
    // The first result is out; the owner dies while the second call runs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = cl.nodes[0].child.kill();
    let _ = cl.nodes[0].child.wait();
    let streamed = streamed.await.unwrap();
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    let got: Vec<(String, String)> = events(&streamed.text)
        .into_iter()
        .filter(|(k, _)| k != "progress")
        .collect();
    let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["result", "error"], "{}", streamed.text);
    let error: Value = serde_json::from_str(&got[1].1).unwrap();
    assert_eq!(error["error"]["code"], "node_unreachable", "{error}");
    assert!(!streamed.text.contains("never"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_nats_stops_its_running_commands_before_its_lease_can_expire() {
    let Some(mut cl) = cluster() else { return };
    let c = client();
    let (id, ws) = session_on(&c, &cl.nodes[0]).await;
    let body = turn(&[(
        "k1",
        "bash",
        // Its line would come 2.5 s after the freeze: after the lease could have expired.
        json!({"command": "touch started; sleep 2.5; echo late >> log"}),
    )]);
    let request = c
        .post(cl.nodes[0].url(&format!("/v1/sessions/{id}/dispatch")))
        .bearer_auth(TOKEN)
        .header("Switchboard-Turn-Id", "t1")
        .body(body.clone());
    let first = tokio::spawn(send(request));
    assert!(serve_common::appears(&ws.join("started"), Duration::from_secs(20)).await);
    // Every NATS server frozen for longer than the TTL: no node can renew its heartbeat.
    for i in 0..3 {
        cl.nats.signal(i, "STOP");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..3 {
        cl.nats.signal(i, "CONT");
    }
    let first = first.await.unwrap();
    // The command was stopped within half the TTL of the last renewal: it never wrote.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !ws.join("log").exists(),
        "the command ran on after its node's heartbeat lapsed"
    );
    // One final answer for the call, the same for every copy: it had started, so
    // outcome_unknown (or the stop's own answer, if that was recorded).
    let nodes: Vec<&Node> = cl.nodes.iter().collect();
    let again = dispatch_until_answered(&c, &nodes, &id, "t1", &body).await;
    let answer = &results(&again)[0];
    assert_eq!(answer["is_error"], true, "{}", again.text);
    if first.status == 200 {
        assert_eq!(results(&first), results(&again), "{}", first.text);
    }
    let copy = dispatch_until_answered(&c, &nodes[1..], &id, "t1", &body).await;
    assert_eq!(results(&copy), results(&again));
    assert!(!ws.join("log").exists());
    assert!(
        metric(&c, &cl.nodes[0], "switchboard_cluster_self_fenced_total").await >= 1.0,
        "the self-fencing is counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_turn_sent_to_every_node_at_once_around_failovers_get_one_answer() {
    let Some(mut cl) = cluster() else { return };
    let c = client();
    let root = cl._root.path().to_path_buf();
    for round in 0..5 {
        // The session's owner rotates: a, b, c, a, b.
        let owner = round % 3;
        let (id, ws) = session_on(&c, &cl.nodes[owner]).await;
        let answered = turn(&[(
            "w1",
            "bash",
            json!({"command": "echo w1 >> log; echo $RANDOM$RANDOM"}),
        )]);
        let first = dispatch_on(&c, &cl.nodes[owner], &id, "t1", &answered).await;
        assert_eq!(first.status, 200, "{}", first.text);
        // A call running when its owner dies: its copies, at every node at once, right after the
        // lease expires.
        let running = turn(&[(
            "w2",
            "bash",
            json!({"command": "touch started; sleep 0.5; echo w2 >> log; echo $RANDOM$RANDOM"}),
        )]);
        let in_flight = {
            let request = c
                .post(cl.nodes[owner].url(&format!("/v1/sessions/{id}/dispatch")))
                .bearer_auth(TOKEN)
                .header("Switchboard-Turn-Id", "t2")
                .body(running.clone());
            tokio::spawn(async move {
                let response = request.send().await.ok()?;
                let ok = response.status() == 200;
                let text = response.text().await.ok()?;
                ok.then_some(text)
            })
        };
        assert!(serve_common::appears(&ws.join("started"), Duration::from_secs(20)).await);
        let name = cl.nodes[owner].name.clone();
        let _ = cl.nodes[owner].child.kill();
        let _ = cl.nodes[owner].child.wait();
        // Answered before its owner died, or not at all.
        let original = in_flight.await.unwrap();
        // A replacement joins at once (under a new name: the dead one's is taken until its
        // heartbeat expires).
        cl.nodes[owner] = start_node(&cl.nats.urls(), &format!("{name}{round}"), &root);
        let bases: Vec<String> = cl.nodes.iter().map(|n| n.base.clone()).collect();
        for (turn_id, body) in [("t2", &running), ("t1", &answered)] {
            let copies = futures::future::join_all(bases.iter().map(|base| {
                let (c, id, body) = (c.clone(), id.clone(), body.clone());
                let one = vec![base.clone()];
                async move { dispatch_until_answered_at(&c, &one, &id, turn_id, &body).await }
            }))
            .await;
            let texts: Vec<Vec<Value>> = copies.iter().map(results).collect();
            assert!(
                texts.windows(2).all(|w| w[0] == w[1]),
                "round {round}, {turn_id}: copies answered differently: {texts:?}"
            );
            if turn_id == "t1" {
                assert_eq!(texts[0], results(&first), "round {round}");
            }
            if let (Some(text), "t2") = (&original, turn_id) {
                let v: Value = serde_json::from_str(text).unwrap();
                assert_eq!(
                    v["content"].as_array().unwrap(),
                    &texts[0],
                    "round {round}: the copies differ from the first answer"
                );
            }
        }
        let lines = file_lines(ws.join("log"));
        for id in ["w1", "w2"] {
            let n = lines.iter().filter(|l| *l == id).count();
            assert!(n <= 1, "round {round}: {id} ran {n} times");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_places_new_sessions_elsewhere_and_finishes_its_turns() {
    let Some(cl) = cluster() else { return };
    let c = client();
    let a = &cl.nodes[0];
    let (id, _) = session_on(&c, a).await;
    // A turn running on a while it is drained still finishes there.
    let running = {
        let (c, url) = (c.clone(), a.url(&format!("/v1/sessions/{id}/dispatch")));
        tokio::spawn(async move {
            send(c.post(url).bearer_auth(TOKEN).body(turn(&[(
                "d1",
                "bash",
                json!({"command": "sleep 1; echo done"}),
            )])))
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let drained = send(c.post(a.url("/v1/admin/drain")).bearer_auth(TOKEN)).await;
    assert_eq!(drained.status, 200, "{}", drained.text);
    assert_eq!(drained.json()["draining"], true);
    for _ in 0..4 {
        let placed = create(&c, a, json!({})).await;
        assert_ne!(placed["node"], "a", "{placed}");
    }
    let finished = running.await.unwrap();
    assert_eq!(finished.status, 200, "{}", finished.text);
    assert_eq!(results(&finished)[0]["content"], "done");
    // Its own sessions are still served.
    let more = bash_on(&c, a, &id, "t2", "d2", "echo more").await;
    assert_eq!(results(&more)[0]["content"], "more", "{}", more.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moved_to_a_node_without_its_workspace_answers_workspace_lost() {
    let Some(_) = nats::nats_or_skip() else {
        return;
    };
    let nats = nats::NatsCluster::start(3);
    let (root_a, root_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = start_node(&nats.urls(), "a", root_a.path());
    let b = start_node(&nats.urls(), "b", root_b.path());
    let c = client();
    let made = create(&c, &a, json!({"workspace": "proj"})).await;
    let id = made["session_id"].as_str().unwrap().to_string();
    let _ = a.child.kill();
    let _ = a.child.wait();
    let body = turn(&[
        ("w1", "bash", json!({"command": "echo hi > f"})),
        ("w2", "read_file", json!({"path": "f"})),
    ]);
    let answer = dispatch_until_answered(&c, &[&b], &id, "t1", &body).await;
    for r in results(&answer) {
        assert_eq!(r["is_error"], true, "{}", answer.text);
        let text = r["content"].to_string();
        assert!(
            text.contains("workspace_lost") || text.contains("workspace"),
            "{text}"
        );
    }
    assert!(answer.text.contains("does not exist"), "{}", answer.text);
    assert!(
        !root_b.path().join("proj").exists(),
        "no empty directory made in its place"
    );
    // It can still be closed, and is then gone.
    let closed = send(
        c.delete(b.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(closed.status, 200, "{}", closed.text);
    assert_eq!(closed.json()["workspace_lost"], true);
    assert!(
        serve_common::eventually(Duration::from_secs(10), || {
            let (c, url) = (c.clone(), b.url(&format!("/v1/sessions/{id}")));
            async move { send(c.get(url).bearer_auth(TOKEN)).await.status == 404 }
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_with_another_lease_ttl_follows_the_clusters_and_keeps_its_sessions() {
    let Some(cl) = cluster() else { return };
    let c = client();
    // The cluster's TTL is 2 s; this node asks for 30 s (a heartbeat every 10 s would let its
    // heartbeat expire between puts, and its sessions be taken while it lives).
    let d = start_node_with(&cl.nats.urls(), "d", cl._root.path(), "30s", "3");
    let (id, _) = session_on(&c, &d).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let b = &cl.nodes[1];
    let answer = bash_on(&c, b, &id, "t1", "d1", "echo still d").await;
    assert_eq!(results(&answer)[0]["content"], "still d", "{}", answer.text);
    assert_eq!(owner_seen_by(&c, b, &id).await, "d");
    assert_eq!(
        metric(&c, b, "switchboard_cluster_failovers_total").await,
        0.0
    );
}

#[test]
fn a_node_that_cannot_reach_nats_refuses_to_start_naming_the_servers() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let root = tempfile::tempdir().unwrap();
    let serve = |extra: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_switchboard"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--no-auth",
                "--cluster",
                &url,
            ])
            .arg("--workspace-root")
            .arg(root.path())
            .args(extra)
            .output()
            .unwrap()
    };
    let out = serve(&[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach the NATS servers") && stderr.contains(&url),
        "{stderr}"
    );
    // `--cluster` with `--journal` is refused too, before anything is reached.
    let journal = root.path().join("j");
    let out = serve(&["--journal".as_ref(), journal.as_os_str()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("drop --journal"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_a_nodes_sessions_over_at_once_not_after_the_lease_ttl() {
    let Some(_) = nats::nats_or_skip() else {
        return;
    };
    // One NATS server, one replica, and a lease TTL longer than the test waits: the session
    // can only move in time because the stopping node gives its leases up.
    let nats = nats::NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let start = |name: &str| start_node_with(&nats.urls(), name, root.path(), "120s", "1");
    let mut a = start("a");
    let b = start("b");
    let c = client();
    let (id, _) = session_on(&c, &a).await;
    let first = bash_on(&c, &b, &id, "t1", "g1", "echo on a").await;
    assert_eq!(results(&first)[0]["content"], "on a", "{}", first.text);
    let _ = Command::new("kill")
        .args(["-TERM", &a.pid().to_string()])
        .status();
    assert!(a.child.wait().unwrap().success(), "a clean exit");
    // Well within the 120 s TTL: b takes the session over, and the answered call is remembered.
    let again = dispatch_until_answered(
        &c,
        &[&b],
        &id,
        "t1",
        &turn(&[("g1", "bash", json!({"command": "echo on a"}))]),
    )
    .await;
    assert_eq!(first.text, again.text);
    assert_eq!(owner_seen_by(&c, &b, &id).await, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_relayed_to_an_owner_now_gone_follows_the_session_on_the_first_try() {
    let Some(_) = nats::nats_or_skip() else {
        return;
    };
    // A TTL longer than the test: a relaying node's memory of where it relayed lately stays
    // valid throughout, so only its handling of a gone owner can send the turn on in time.
    let nats = nats::NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let start = |name: &str| start_node_with(&nats.urls(), name, root.path(), "120s", "1");
    let mut a = start("a");
    let b = start("b");
    let nc = start("c");
    let c = client();
    let (id, _) = session_on(&c, &a).await;
    // Relayed through b to a: b remembers a as the session's node.
    let first = bash_on(&c, &b, &id, "t1", "g1", "echo on a").await;
    assert_eq!(results(&first)[0]["content"], "on a", "{}", first.text);
    let _ = Command::new("kill")
        .args(["-TERM", &a.pid().to_string()])
        .status();
    assert!(a.child.wait().unwrap().success(), "a clean exit");
    // c takes the session over (a gave its lease up on the way out).
    let second = bash_on(&c, &nc, &id, "t2", "g2", "echo on c").await;
    assert_eq!(results(&second)[0]["content"], "on c", "{}", second.text);
    assert_eq!(owner_seen_by(&c, &nc, &id).await, "c");
    // Through b again: its route to a finds no node listening, and the turn goes on to c at
    // once — answered on the first try, not refused as unreachable.
    let third = bash_on(&c, &b, &id, "t3", "g3", "echo through b").await;
    assert_eq!(results(&third)[0]["content"], "through b", "{}", third.text);
    assert_eq!(owner_seen_by(&c, &b, &id).await, "c");
    // And the call answered at a is still remembered through b.
    let again = bash_on(&c, &b, &id, "t1", "g1", "echo on a").await;
    assert_eq!(again.text, first.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeping_no_answers_in_memory_reads_them_back_from_the_stream() {
    let Some((nats, root)) = nats_and_root() else {
        return;
    };
    // Neither node keeps any answered call's record in its journal's memory.
    let none = ["--cluster-journal-memory", "0"];
    let mut a = start_node_args(&nats.urls(), "a", root.path(), TTL, "3", &none);
    let b = start_node_args(&nats.urls(), "b", root.path(), TTL, "3", &none);
    let c = client();
    let (id, _) = session_on(&c, &a).await;
    let small = bash_turn("g1", "echo $RANDOM$RANDOM$RANDOM");
    let large = bash_turn(
        "g2",
        "echo $RANDOM$RANDOM; head -c 300000 /dev/zero | tr '\\0' x",
    );
    let first = dispatch_on(&c, &a, &id, "t1", &small).await;
    let second = dispatch_on(&c, &a, &id, "t2", &large).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(second.status, 200, "{}", second.text);
    assert!(
        results(&second)[0]["content"]
            .as_str()
            .is_some_and(|t| t.len() > 10_000),
        "a large answer: {}",
        &second.text[..200.min(second.text.len())]
    );
    let _ = a.child.kill();
    let _ = a.child.wait();
    // b takes the session over and keeps none of its answers in memory either: the copies of
    // the answered calls are answered from the stream, the same as before.
    let again = dispatch_until_answered(&c, &[&b], &id, "t1", &small).await;
    assert_eq!(again.text, first.text);
    let again = dispatch_until_answered(&c, &[&b], &id, "t2", &large).await;
    assert_eq!(again.text, second.text);
    assert!(
        metric(&c, &b, "switchboard_cluster_journal_stream_reads_total").await >= 2.0,
        "read back from the stream"
    );
    assert_eq!(
        metric(&c, &b, "switchboard_cluster_journal_memory_bytes").await,
        0.0
    );
    // A new call is not taken for one let go of: it runs.
    let third = bash_on(&c, &b, &id, "t3", "g3", "echo three").await;
    assert_eq!(results(&third)[0]["content"], "three", "{}", third.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_leaves_an_orphaned_session_to_a_node_with_room() {
    let Some((nats, root)) = nats_and_root() else {
        return;
    };
    let mut a = start_node(&nats.urls(), "a", root.path());
    let b = start_node_args(
        &nats.urls(),
        "b",
        root.path(),
        TTL,
        "3",
        &["--max-sessions", "1"],
    );
    let nc = start_node(&nats.urls(), "c", root.path());
    let c = client();
    let made = create(&c, &a, json!({})).await;
    let id = made["session_id"].as_str().unwrap().to_string();
    assert_eq!(made["node"], "a", "{made}");
    // b's one place taken.
    let filler = create(&c, &b, json!({})).await;
    assert_eq!(filler["node"], "b", "{filler}");
    let _ = a.child.kill();
    let _ = a.child.wait();
    // Asked through the full node only: it is served all the same (by a node with room), never
    // stuck behind b.
    let body = turn(&[("x1", "bash", json!({"command": "echo one"}))]);
    let answer = dispatch_until_answered(&c, &[&b], &id, "t1", &body).await;
    assert_eq!(results(&answer)[0]["content"], "one", "{}", answer.text);
    let body = turn(&[("x2", "bash", json!({"command": "echo two"}))]);
    for node in [&b, &nc] {
        let again = dispatch_until_answered(&c, &[node], &id, "t2", &body).await;
        assert_eq!(results(&again)[0]["content"], "two", "{}", again.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_a_node_cannot_reopen_is_released_to_a_node_that_can() {
    let Some((nats, root)) = nats_and_root() else {
        return;
    };
    let policy = root.path().join("strict.json");
    std::fs::write(&policy, r#"{"permissions": {"deny": ["write_file"]}}"#).unwrap();
    let offer = format!("strict={}", policy.display());
    let with_policy = ["--session-policy", offer.as_str()];
    // a and c offer the session policy `strict`; b does not, so it cannot reopen such a session.
    let mut a = start_node_args(&nats.urls(), "a", root.path(), TTL, "3", &with_policy);
    let b = start_node(&nats.urls(), "b", root.path());
    let nc = start_node_args(&nats.urls(), "c", root.path(), TTL, "3", &with_policy);
    let c = client();
    let made = create(&c, &a, json!({"policy": "strict"})).await;
    let id = made["session_id"].as_str().unwrap().to_string();
    let _ = a.child.kill();
    let _ = a.child.wait();
    // Asked through b only: b takes it over, cannot reopen it, gives it back and relays the
    // request to c, which serves it (with its policy).
    let body = turn(&[
        ("p1", "bash", json!({"command": "echo served"})),
        ("p2", "write_file", json!({"path": "f", "content": "x"})),
    ]);
    let answer = dispatch_until_answered(&c, &[&b], &id, "t1", &body).await;
    let got = results(&answer);
    assert_eq!(got[0]["content"], "served", "{}", answer.text);
    assert_eq!(
        got[1]["is_error"], true,
        "the policy still holds: {}",
        answer.text
    );
    // From now on c owns it: through either node, the same answers.
    for node in [&b, &nc] {
        let again = dispatch_until_answered(&c, &[node], &id, "t1", &body).await;
        assert_eq!(results(&again), got, "through {}", node.name);
    }
    assert_eq!(owner_seen_by(&c, &b, &id).await, "c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_sharded_over_three_streams_keeps_every_session_across_a_failover() {
    let Some((nats, root)) = nats_and_root() else {
        return;
    };
    let sharded = ["--cluster-journal-shards", "3"];
    let mut a = start_node_args(&nats.urls(), "a", root.path(), TTL, "3", &sharded);
    let b = start_node_args(&nats.urls(), "b", root.path(), TTL, "3", &sharded);
    let c = client();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url(0)).await.unwrap());
    let names = [
        "SWITCHBOARD_JOURNAL",
        "SWITCHBOARD_JOURNAL_1",
        "SWITCHBOARD_JOURNAL_2",
    ];
    // How many messages each stream holds.
    let held = || async {
        let mut counts = Vec::new();
        for name in names {
            let mut stream = js.get_stream(name).await.unwrap();
            counts.push(stream.info().await.unwrap().state.messages);
        }
        counts
    };
    // Sessions (their ids are random) until every stream holds some: nine at least, at most 40
    // (all 40 in two of three streams: a chance of 3 × (2/3)^40, about 3e-7).
    let mut sessions = Vec::new();
    for i in 0..40 {
        let (id, ws) = session_on(&c, &a).await;
        let command = format!("echo {i} >> log; echo {i}");
        let answer = bash_on(&c, &a, &id, "t1", "x1", &command).await;
        sessions.push((id, ws, command, answer));
        if i >= 8 && held().await.iter().all(|&n| n > 0) {
            break;
        }
    }
    // Every stream holds some of them: each has its own leader.
    let counts = held().await;
    for (name, n) in names.iter().zip(&counts) {
        assert!(*n > 0, "{name} holds nothing ({} sessions)", sessions.len());
    }
    let _ = a.child.kill();
    let _ = a.child.wait();
    for (id, ws, command, answer) in &sessions {
        let body = bash_turn("x1", command);
        let again = dispatch_until_answered(&c, &[&b], id, "t1", &body).await;
        assert_eq!(results(&again), results(answer), "{id}");
        assert_eq!(file_lines(ws.join("log")).len(), 1, "{id}");
    }
    // A node that would read another shard for some sessions refuses to join.
    let said = refused_start(&nats.urls(), root.path(), TOKEN).await;
    assert!(said.contains("--cluster-journal-shards"), "{said}");
}

/// Starts node `d` with bearer token `token` (and the default flags), which must refuse to start
/// (exit non-zero within 30 s); what it printed.
async fn refused_start(nats: &str, root: &Path, token: &str) -> String {
    let mut other = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["serve", "--listen", "127.0.0.1:0", "--cluster"])
        .arg(nats)
        .args(["--node-id", "d", "--lease-ttl", TTL, "--workspace-root"])
        .arg(root)
        .env("SWITCHBOARD_TOKEN", token)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while other.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = other.kill();
            let _ = other.wait();
            panic!("a node that should refuse to start was still running after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = other.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "it started: {said}");
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_token_refuses_to_join() {
    let Some((nats, root)) = nats_and_root() else {
        return;
    };
    let _a = start_node(&nats.urls(), "a", root.path());
    // Tried up to three times: a start that fails for another reason (JetStream still settling on
    // a loaded machine) is tried again; one that runs, or never names the token, fails the test.
    let mut said = String::new();
    for _ in 0..3 {
        said = refused_start(&nats.urls(), root.path(), "another-token-entirely").await;
        if said.contains("another bearer token") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        said.contains("another bearer token") && said.contains("\"a\""),
        "{said}"
    );
    assert!(!said.contains("another-token-entirely"), "{said}");
    // The same token joins.
    let _b = start_node(&nats.urls(), "b", root.path());
}

/// Session `id`'s journal records in stream order, parts put together: whether each came in
/// parts, and the record (`{"epoch", "entries"}`).
async fn journal_messages(nats_url: &str, id: &str) -> Vec<(bool, Value)> {
    let client = async_nats::connect(nats_url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("SWITCHBOARD_JOURNAL").await.unwrap();
    let mut out = Vec::new();
    let mut next = 1;
    let mut parts: Vec<u8> = Vec::new();
    while let Ok(m) = stream
        .raw_message_builder()
        .sequence(next)
        .next_by_subject(format!("sbj.{id}"))
        .send()
        .await
    {
        next = m.sequence + 1;
        match m
            .headers
            .get("Switchboard-Part")
            .map(|v| v.as_str().to_string())
        {
            None => out.push((false, serde_json::from_slice::<Value>(&m.payload).unwrap())),
            Some(part) => {
                let (k, n) = part.split_once('/').unwrap();
                if k == "1" {
                    parts.clear();
                }
                parts.extend_from_slice(&m.payload);
                if k == n {
                    out.push((true, serde_json::from_slice::<Value>(&parts).unwrap()));
                    parts.clear();
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_larger_than_a_nats_message_and_sessions_idle_past_the_age_limit_survive_a_failover()
 {
    let Some((nats, root)) = nats_and_root() else {
        return;
    };
    // The shortest retention there is: the stream drops messages older than a minute.
    let short = ["--cluster-retention", "1m"];
    let mut a = start_node_args(&nats.urls(), "a", root.path(), TTL, "3", &short);
    let b = start_node_args(&nats.urls(), "b", root.path(), TTL, "3", &short);
    let c = client();
    // A tool list of ~1.3 MB: its session record is larger than one NATS message.
    let tools: Vec<Value> = (0..200)
        .map(|i| {
            json!({
                "name": format!("lookup_{i}"),
                "description": format!("Looks key {i} up. {}", "Long description. ".repeat(360)),
                "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}},
            })
        })
        .collect();
    let made = create(&c, &a, json!({ "tools": tools })).await;
    let id = made["session_id"].as_str().unwrap().to_string();
    assert_eq!(made["node"], "a", "{made}");
    // 30 answers of ~48 KB, different on every run: ~1.4 MB of answers in one turn.
    let big = |prefix: &str| -> String {
        let calls: Vec<(String, &str, Value)> = (0..30)
            .map(|i| {
                (
                    format!("{prefix}{i}"),
                    "bash",
                    json!({"command": "head -c 36000 /dev/urandom | base64 -w0"}),
                )
            })
            .collect();
        let calls: Vec<(&str, &str, Value)> = calls
            .iter()
            .map(|(i, t, v)| (i.as_str(), *t, v.clone()))
            .collect();
        turn(&calls)
    };
    let first = dispatch_on(&c, &a, &id, "t1", &big("p")).await;
    assert_eq!(first.status, 200, "{}", first.text);
    // Idle past the stream's age limit: its owner keeps it alive (snapshots), and still writes.
    tokio::time::sleep(Duration::from_secs(75)).await;
    let answer = bash_on(&c, &a, &id, "t2", "q1", "echo still-here").await;
    assert_eq!(results(&answer)[0]["content"], "still-here");
    let second = dispatch_on(&c, &a, &id, "t3", &big("r")).await;
    assert_eq!(second.status, 200, "{}", second.text);
    // A snapshot carrying the new answers (larger than one message: in parts) replaces what came
    // before it: the session's records begin with it.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let messages = journal_messages(&nats.url(0), &id).await;
        let first = messages.first();
        let is_new_snapshot = first.is_some_and(|(in_parts, record)| {
            let entries = record["entries"].as_array().unwrap();
            *in_parts
                && entries[0] == "snapshot"
                && (0..30).all(|i| {
                    entries.iter().any(|e| {
                        // The call's identity: its turn and its id.
                        e["call"]["id"] == format!("t3\u{0}r{i}")
                            && e["call"]["record"]["answer"].is_object()
                    })
                })
        });
        if is_new_snapshot {
            break;
        }
        let kinds: Vec<(bool, Value)> = messages
            .iter()
            .map(|(p, r)| (*p, r["entries"][0].clone()))
            .collect();
        assert!(
            Instant::now() < deadline,
            "no snapshot in parts with the new answers begins the session's records: {kinds:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let _ = a.child.kill();
    let _ = a.child.wait();
    // The new owner answers the retried turn byte for byte from the snapshot, and its tools are
    // all there.
    let again = dispatch_until_answered(&c, &[&b], &id, "t3", &big("r")).await;
    assert_eq!(results(&again), results(&second));
    // The first turn's answers are older than the retention: refused, never run again.
    let late = dispatch_until_answered(&c, &[&b], &id, "t1", &big("p")).await;
    for result in results(&late) {
        assert_eq!(result["is_error"], true, "{result}");
        assert!(
            result["content"].to_string().contains("no longer kept"),
            "{result}"
        );
    }
    let listed = send(
        c.get(b.url(&format!("/v1/sessions/{id}/tools")))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert!(
        listed.text.contains("lookup_199"),
        "{}",
        &listed.text[..200]
    );
}
