//! Shared by the `serve` tests: a server started in this process on 127.0.0.1:0 with a fresh
//! workspace root, and a small HTTP client (reqwest, no proxy, loopback only).

#![allow(dead_code)]

use std::time::Duration;

use serde_json::Value;
use switchboard::serve::{Auth, ServeConfig, Server};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const TOKEN: &str = "test-token-0123456789";

pub struct TestServer {
    pub base: String,
    pub root: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), switchboard::serve::ServeError>>>,
}

/// Starts a server with a token, after `configure` changes the defaults.
pub async fn start(configure: impl FnOnce(&mut ServeConfig)) -> TestServer {
    let root = tempfile::tempdir().unwrap();
    let mut config = ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        root.path().join("ws"),
        Auth::token(TOKEN).unwrap(),
    );
    configure(&mut config);
    let server = Server::bind(config).await.expect("bind");
    let base = format!("http://{}", server.local_addr());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    TestServer {
        base,
        root,
        stop: Some(tx),
        task: Some(task),
    }
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Starts the shutdown (like SIGTERM) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// Shuts down and waits for `run` to return (bounded).
    pub async fn shutdown(mut self) -> Result<(), switchboard::serve::ServeError> {
        self.begin_shutdown();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("server stops")
            .expect("server task")
    }
}

pub fn client() -> reqwest::Client {
    switchboard::agent::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap()
}

pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// The error code of an error answer.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("not an error answer: {}", self.text))
            .to_string()
    }
}

pub async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    Answer {
        status,
        headers,
        text,
    }
}

pub async fn post(c: &reqwest::Client, url: &str, body: &str) -> Answer {
    send(c.post(url).bearer_auth(TOKEN).body(body.to_string())).await
}

pub async fn get(c: &reqwest::Client, url: &str) -> Answer {
    send(c.get(url).bearer_auth(TOKEN)).await
}

/// Creates a session (`name` = workspace name) and returns `(session_id, workspace path)`.
pub async fn session(c: &reqwest::Client, s: &TestServer, name: Option<&str>) -> (String, String) {
    let body = match name {
        Some(n) => serde_json::json!({"workspace": n}).to_string(),
        None => "{}".into(),
    };
    let a = post(c, &s.url("/v1/sessions"), &body).await;
    assert_eq!(a.status, 201, "{}", a.text);
    let v = a.json();
    (
        v["session_id"].as_str().unwrap().to_string(),
        v["workspace"].as_str().unwrap().to_string(),
    )
}

/// An assistant message with these `(id, tool, input)` tool_use blocks.
pub fn turn(calls: &[(&str, &str, Value)]) -> String {
    let content: Vec<Value> = calls
        .iter()
        .map(|(id, name, input)| {
            serde_json::json!({"type": "tool_use", "id": id, "name": name, "input": input})
        })
        .collect();
    serde_json::json!({"role": "assistant", "content": content}).to_string()
}

pub async fn dispatch(c: &reqwest::Client, s: &TestServer, id: &str, body: &str) -> Answer {
    post(c, &s.url(&format!("/v1/sessions/{id}/dispatch")), body).await
}

/// Polls `check` every 20 ms for at most `limit`; true once it held.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Parses an SSE body into `(event, data)` pairs.
pub fn events(body: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for block in body.split("\n\n") {
        let mut event = String::new();
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(e) = line.strip_prefix("event:") {
                event = e.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
            }
        }
        if !event.is_empty() {
            out.push((event, data.join("\n")));
        }
    }
    out
}

/// Starts a `switchboard serve` process and returns it with its base URL (read from its ready
/// line, `listening on …`); the rest of stderr is drained on a thread.
pub fn spawn_server(cmd: std::process::Command) -> (std::process::Child, String) {
    let (child, base, _) = spawn_server_logged(cmd);
    (child, base)
}

/// [`spawn_server`], also returning the lines the server printed before its ready line (what
/// it logged while starting).
pub fn spawn_server_logged(
    mut cmd: std::process::Command,
) -> (std::process::Child, String, Vec<String>) {
    use std::io::BufRead;
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    let mut base = None;
    let mut printed = Vec::new();
    for line in lines.by_ref().take(50) {
        let line = line.unwrap();
        if let Some(at) = line.find("listening on ") {
            base = Some(line[at + "listening on ".len()..].trim().to_string());
            break;
        }
        printed.push(line);
    }
    std::thread::spawn(move || for _ in lines {});
    let base = base
        .unwrap_or_else(|| panic!("no ready line; the server printed:\n{}", printed.join("\n")));
    (child, base, printed)
}

/// Starts the real binary as `serve --journal JOURNAL --workspace-root ROOT --no-auth` on a free
/// loopback port, with `extra` flags: the child, its base URL and its start-up lines.
pub fn serve_journaled(
    root: &std::path::Path,
    journal: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, String, Vec<String>) {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.arg("serve")
        .arg("--workspace-root")
        .arg(root)
        .arg("--journal")
        .arg(journal)
        .args(["--listen", "127.0.0.1:0", "--no-auth"])
        .args(extra)
        .env_remove("SWITCHBOARD_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    spawn_server_logged(cmd)
}

/// Stops a server process with SIGTERM and waits for it to exit 0 (60 s at most).
pub fn terminate(mut child: std::process::Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0), "the server exits 0 on SIGTERM");
            return;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not exit within 60 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many workspaces exist under `root`: named ones, and the fresh ones under `@sessions`.
pub fn workspace_count(root: &std::path::Path) -> usize {
    let named = std::fs::read_dir(root)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != "@sessions")
        .count();
    named + std::fs::read_dir(root.join("@sessions")).unwrap().count()
}

/// Polls every 20 ms for at most `limit` until `path` exists; true once it does.
pub async fn appears(path: &std::path::Path, limit: Duration) -> bool {
    let path = path.to_path_buf();
    eventually(limit, || {
        let p = path.clone();
        async move { p.exists() }
    })
    .await
}

/// The lines of the file at `path` (none if it does not exist).
pub fn file_lines(path: impl AsRef<std::path::Path>) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}
