//! What a session's client tools may cost the sidecar is bounded: a schema whose patterns pass
//! the engine's limits (length, compiled size, patterns per catalog) is refused `400 bad_request`
//! naming the tool, the keyword and the limit, before anything is made; a hundred patterns like
//! `[^x]{3000}y` (a few KB that compiled to about a gigabyte) leave the real binary's resident
//! memory near where it started; and what a session's patterns did compile is freed when the
//! session ends (the next session reuses it: four in turn cost what one did).

use crate::serve_common;

use serde_json::{Value, json};
use serve_common::*;
use switchboard::testing::{MAX_CATALOG_PATTERNS, MAX_PATTERN_BYTES, PATTERN_COMPILED_BYTES};

/// A client tool whose `input_schema` has one string property per pattern.
fn tool(name: &str, patterns: impl IntoIterator<Item = String>) -> Value {
    let properties: serde_json::Map<String, Value> = patterns
        .into_iter()
        .enumerate()
        .map(|(i, p)| (format!("p{i}"), json!({"type": "string", "pattern": p})))
        .collect();
    json!({"name": name, "input_schema": {"type": "object", "properties": properties}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_past_a_bound_is_refused_naming_the_tool_the_keyword_and_the_limit() {
    let s = start(|_| {}).await;
    let c = client();
    let half = MAX_CATALOG_PATTERNS / 2 + 1;
    let refusals = [
        (
            json!([
                tool("fine", ["^[a-z]+$".into()]),
                tool("greedy", ["[^x]{3000}y".into()])
            ]),
            format!(
                "client tool `greedy`: `pattern` at /properties/p0/pattern (\"[^x]{{3000}}y\") \
                 compiles to more than {PATTERN_COMPILED_BYTES} bytes, the engine's limit for \
                 one pattern"
            ),
        ),
        (
            json!([tool("long", ["a".repeat(MAX_PATTERN_BYTES + 1)])]),
            format!(
                "client tool `long`: `pattern` at /properties/p0/pattern is {} bytes; the engine \
                 compiles patterns of at most {MAX_PATTERN_BYTES} bytes",
                MAX_PATTERN_BYTES + 1
            ),
        ),
        (
            json!([
                tool("first", (0..half).map(|i| format!("^a{i}$"))),
                tool("second", (0..half).map(|i| format!("^b{i}$"))),
            ]),
            format!(
                "client tool `second`: its schema has {half} patterns (`pattern`, \
                 `patternProperties`); one catalog compiles at most {MAX_CATALOG_PATTERNS} and \
                 the tools before it have {half}"
            ),
        ),
    ];
    for (tools, says) in refusals {
        let a = post(
            &c,
            &s.url("/v1/sessions"),
            &json!({"tools": tools}).to_string(),
        )
        .await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "bad_request"),
            "{}",
            a.text
        );
        assert_eq!(a.json()["error"]["message"], says.as_str(), "{}", a.text);
    }
    // Within the bounds, patterns compile and check the calls' arguments.
    let ok = post(
        &c,
        &s.url("/v1/sessions"),
        &json!({"tools": [tool("fine", ["^[a-z]+$".into()])]}).to_string(),
    )
    .await;
    assert_eq!(ok.status, 201, "{}", ok.text);
    let id = ok.json()["session_id"].as_str().unwrap().to_string();
    let a = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/dispatch?stream=true")),
        &turn(&[("t1", "fine", json!({"p0": "UPPER"}))]),
    )
    .await;
    let done = events(&a.text)
        .into_iter()
        .find(|(event, _)| event == "done")
        .unwrap_or_else(|| panic!("no done event: {}", a.text));
    let answer: Value = serde_json::from_str(&done.1).unwrap();
    let result = &answer["content"][0];
    assert_eq!(result["is_error"], true, "{answer}");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [invalid_arguments]: /p0: "),
        "{result}"
    );
    s.shutdown().await.unwrap();
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// A server process, killed if the test ends without stopping it (a failed assertion).
struct Running(Option<std::process::Child>);

impl Running {
    fn id(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Stops it with SIGTERM and checks that it exits 0.
    fn terminate(mut self) {
        terminate(self.0.take().unwrap());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The real binary, `serve --no-auth` on a free loopback port.
fn serve(root: &std::path::Path) -> (Running, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.arg("serve")
        .arg("--workspace-root")
        .arg(root)
        .args(["--listen", "127.0.0.1:0", "--no-auth", "--sandbox", "off"])
        .env_remove("SWITCHBOARD_TOKEN")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let (child, base) = spawn_server(cmd);
    (Running(Some(child)), base)
}

#[test]
fn a_hundred_oversized_patterns_are_refused_and_the_sidecar_stays_near_its_start_size() {
    let root = tempfile::tempdir().unwrap();
    let (child, base) = serve(root.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();
    // The first session request of a process allocates for good (about 3 MiB: the schema
    // compiler's tables, the request path): made before the measure starts.
    let warm_up = json!({"tools": [{"name": "warm", "input_schema":
        {"type": "object", "properties": {"x": {"type": "no-such-type"}}}}]});
    let a = rt.block_on(send(
        c.post(format!("{base}/v1/sessions"))
            .body(warm_up.to_string()),
    ));
    assert_eq!(a.status, 400, "{}", a.text);
    let started = rss_kib(child.id());
    for round in 0..3 {
        // 10 tools of 10 patterns, each pattern distinct (nothing is compiled once for two).
        let tools: Vec<Value> = (0..10)
            .map(|t| {
                tool(
                    &format!("t{t}"),
                    (0..10).map(|p| format!("[^x]{{3000}}y{round}_{t}_{p}")),
                )
            })
            .collect();
        let body = json!({"tools": tools}).to_string();
        let a = rt.block_on(send(
            c.post(format!("{base}/v1/sessions")).body(body.clone()),
        ));
        assert_eq!(a.status, 400, "{}", a.text);
        let message = a.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            message.starts_with("client tool `t0`: `pattern` at /properties/p0/pattern")
                && message.contains(&PATTERN_COMPILED_BYTES.to_string()),
            "{message}"
        );
        eprintln!("round {round}: {} bytes refused", body.len());
    }
    let after = rss_kib(child.id());
    eprintln!("resident: {started} KiB at start, {after} KiB after three refused requests");
    // Bounded, no pattern compiles past the limit, and what a refused request compiled is freed.
    // Unbounded, each of these requests compiled about 300 MB to 1 GB of automata.
    assert!(
        after < started + started / 2,
        "resident memory went from {started} KiB to {after} KiB"
    );
    assert_eq!(workspace_count(root.path()), 0, "no workspace was made");
    child.terminate();
}

/// The sidecar's `switchboard_sessions_active` gauge.
fn sessions_active(rt: &tokio::runtime::Runtime, c: &reqwest::Client, base: &str) -> f64 {
    let metrics = rt.block_on(send(c.get(format!("{base}/metrics"))));
    metrics
        .text
        .lines()
        .find_map(|l| l.strip_prefix("switchboard_sessions_active "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sessions gauge in:\n{}", metrics.text))
}

#[test]
fn what_a_sessions_patterns_compiled_is_freed_when_it_ends_and_serves_the_next_one() {
    let root = tempfile::tempdir().unwrap();
    let (child, base) = serve(root.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();
    let started = rss_kib(child.id());
    let mut with_session = Vec::new();
    for round in 0..4 {
        // A whole catalog's worth of patterns, each just under the compiled-size limit, and none
        // the same as another round's.
        let patterns = (0..MAX_CATALOG_PATTERNS).map(|i| format!("[^x]{{60}}y{round}_{i}"));
        let body = json!({"tools": [tool("edge", patterns)]}).to_string();
        let a = rt.block_on(send(c.post(format!("{base}/v1/sessions")).body(body)));
        assert_eq!(a.status, 201, "{}", a.text);
        let id = a.json()["session_id"].as_str().unwrap().to_string();
        with_session.push(rss_kib(child.id()));
        let gone = rt.block_on(send(c.delete(format!("{base}/v1/sessions/{id}"))));
        assert_eq!(gone.status, 200, "{}", gone.text);
    }
    let after = rss_kib(child.id());
    eprintln!(
        "resident: {started} KiB at start, {with_session:?} KiB with each of four sessions in \
         turn, {after} KiB after the last ended"
    );
    // Every session, and so every validator it compiled, is gone.
    assert_eq!(sessions_active(&rt, &c, &base), 0.0);
    let grown = with_session[0].saturating_sub(started);
    assert!(
        grown > 4 * 1024,
        "{MAX_CATALOG_PATTERNS} patterns near the limit cost only {grown} KiB"
    );
    assert!(
        grown < 64 * 1024,
        "one session's patterns took {grown} KiB (bounded by {MAX_CATALOG_PATTERNS} × \
         {PATTERN_COMPILED_BYTES} bytes of automata)"
    );
    // What one session's patterns took was freed when it ended, and the next sessions' patterns
    // took its place: four sessions one after another cost at most what two did, not four times
    // as much (the margin of one session's growth absorbs the allocator's reuse pattern, which
    // varies with what the machine runs beside the test; a leak would add three). The allocator
    // keeps freed pages for reuse rather than handing them to the kernel at once.
    let most = *with_session.iter().max().unwrap();
    assert!(
        most.max(after) <= with_session[0] + grown,
        "resident memory grew with each session: {with_session:?} KiB, then {after} KiB"
    );
    child.terminate();
}
