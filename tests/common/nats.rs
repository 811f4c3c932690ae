//! A real `nats-server` cluster with JetStream on 127.0.0.1 for the cluster-mode tests: finding
//! the binary (and the skip rule), writing one config per server into a temporary directory,
//! starting them on free loopback ports and waiting until JetStream has a meta leader, and
//! killing and restarting single servers. Nothing here talks to anything but 127.0.0.1, and every
//! wait is bounded by [`READY_BOUND`].

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// `NATS_SERVER_BIN`: the `nats-server` to run (otherwise the one on PATH).
pub const BIN_VAR: &str = "NATS_SERVER_BIN";

/// `SWITCHBOARD_REQUIRE_NATS=1`: a missing `nats-server` is a failure, not a skip.
pub const REQUIRE_VAR: &str = "SWITCHBOARD_REQUIRE_NATS";

/// Upper bound for a cluster (or one restarted server) to become ready.
pub const READY_BOUND: Duration = Duration::from_secs(30);

/// How many times [`NatsCluster::start`] picks new ports when a server could not bind its own
/// (another process took a free port between the pick and the server's bind).
const START_ATTEMPTS: usize = 3;

/// The `nats-server` binary: `$NATS_SERVER_BIN` when set (and a file), else `nats-server` on
/// PATH; `None` when neither exists.
pub fn nats_server_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_VAR).filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        return bin.is_file().then_some(bin);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join("nats-server"))
        .find(|p| p.is_file())
}

/// The `nats-server` binary, or `None` after printing why the test is skipped; panics instead
/// when `SWITCHBOARD_REQUIRE_NATS=1` (CI must not skip).
pub fn nats_or_skip() -> Option<PathBuf> {
    if let Some(bin) = nats_server_bin() {
        return Some(bin);
    }
    let why = match std::env::var_os(BIN_VAR).filter(|v| !v.is_empty()) {
        Some(bin) => format!("{BIN_VAR}={} is not a file", Path::new(&bin).display()),
        None => format!("nats-server is not on PATH and {BIN_VAR} is not set"),
    };
    if std::env::var(REQUIRE_VAR).as_deref() == Ok("1") {
        panic!("{REQUIRE_VAR}=1 but {why}");
    }
    println!("SKIPPED: {why} (set {REQUIRE_VAR}=1 to make this a failure)");
    None
}

/// One server of a [`NatsCluster`]: its ports, files and (while it runs) its process.
#[derive(Debug)]
struct Server {
    /// Client port (`nats://127.0.0.1:<client>`).
    client: u16,
    /// Cluster route port (0 for a single server: no cluster block).
    route: u16,
    /// Monitoring port (`http://127.0.0.1:<http>`).
    http: u16,
    /// Its config file.
    config: PathBuf,
    /// Its stdout and stderr, appended across restarts.
    log: PathBuf,
    /// The running process, `None` after [`NatsCluster::kill`].
    child: Option<Child>,
}

/// `n` `nats-server`s with JetStream, clustered as `sb` when `n > 1`, each with its own store
/// under a temporary directory. Dropping it kills every server still running (only the
/// processes it started) and removes the directory.
#[derive(Debug)]
pub struct NatsCluster {
    bin: PathBuf,
    servers: Vec<Server>,
    /// Last, so the servers are gone before their files are removed.
    dir: TempDir,
}

impl NatsCluster {
    /// Starts `n` servers (1, or 3 for a cluster with a JetStream quorum) and waits until every
    /// one accepts clients, answers 200 on `/healthz` and, clustered, reports a meta leader on
    /// `/jsz`. Panics, with the tails of the server logs, when that takes longer than
    /// [`READY_BOUND`]. Call [`nats_or_skip`] first: a missing binary panics here.
    pub fn start(n: usize) -> NatsCluster {
        assert!(n >= 1, "a NATS cluster needs at least one server");
        let bin = nats_server_bin()
            .expect("nats-server is found (call nats_or_skip() first and skip when it is None)");
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let mut cluster = NatsCluster::spawn_all(&bin, n);
            let all: Vec<usize> = (0..n).collect();
            match cluster.wait_ready(&all) {
                Ok(()) => return cluster,
                // Another process took a port we picked: new ports, new servers.
                Err(e) if cluster.any_log_contains("address already in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}\n(gave up after {START_ATTEMPTS} attempts with fresh ports)")
    }

    /// Number of servers (running or killed).
    pub fn size(&self) -> usize {
        self.servers.len()
    }

    /// Client URLs of all servers, comma-separated (`nats://127.0.0.1:P1,nats://…`).
    pub fn urls(&self) -> String {
        (0..self.servers.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Client URL of server `i` (`nats://127.0.0.1:PORT`).
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.servers[i].client)
    }

    /// Monitoring URL of server `i` (`http://127.0.0.1:PORT`).
    pub fn monitor_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.servers[i].http)
    }

    /// Whether server `i` runs (started and not killed; it may have exited on its own).
    pub fn is_running(&mut self, i: usize) -> bool {
        match self.servers[i].child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILLs server `i` (its own process, by its child handle) and waits for it; nothing if
    /// it is not running.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].child.take() {
            let _ = child.kill();
            child.wait().expect("the killed nats-server is reaped");
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to server `i` (its own process, by pid), if it runs.
    pub fn signal(&mut self, i: usize, signal: &str) {
        if let Some(child) = &self.servers[i].child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status();
        }
    }

    /// Starts server `i` again (killing it first if it still runs) with the same config, ports
    /// and store directory, and waits until it is ready as in [`NatsCluster::start`] (panics with
    /// the log tails after [`READY_BOUND`]).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        let server = &mut self.servers[i];
        let mut log = OpenOptions::new()
            .append(true)
            .open(&server.log)
            .expect("the nats-server log opens for appending");
        writeln!(log, "---- switchboard test harness: restarting n{i} ----")
            .expect("the nats-server log is writable");
        server.child = Some(spawn(&self.bin, &server.config, &server.log));
        if let Err(e) = self.wait_ready(&[i]) {
            panic!("{e}");
        }
    }

    /// Everything server `i` wrote to stdout and stderr so far (across restarts).
    pub fn log(&self, i: usize) -> String {
        String::from_utf8_lossy(&fs::read(&self.servers[i].log).unwrap_or_default()).into_owned()
    }

    /// The temporary directory holding configs, stores (`js-<i>`) and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Picks the ports, writes the configs and spawns every server (without waiting).
    fn spawn_all(bin: &Path, n: usize) -> NatsCluster {
        let dir = tempfile::Builder::new()
            .prefix("switchboard-nats-")
            .tempdir()
            .expect("a temporary directory for the NATS cluster");
        let ports = free_ports(n * 3);
        let route = |i: usize| if n > 1 { ports[3 * i + 1] } else { 0 };
        let mut servers = Vec::with_capacity(n);
        for i in 0..n {
            let (client, http) = (ports[3 * i], ports[3 * i + 2]);
            let store = dir.path().join(format!("js-{i}"));
            let routes: Vec<String> = (0..n)
                .filter(|&j| j != i)
                .map(|j| format!("    nats-route://127.0.0.1:{}", route(j)))
                .collect();
            let cluster = if n > 1 {
                format!(
                    "cluster {{\n  name: sb\n  listen: 127.0.0.1:{}\n  routes: [\n{}\n  ]\n}}\n",
                    route(i),
                    routes.join("\n")
                )
            } else {
                String::new()
            };
            let text = format!(
                "server_name: n{i}\n\
                 listen: 127.0.0.1:{client}\n\
                 http: 127.0.0.1:{http}\n\
                 jetstream {{\n  store_dir: {store:?}\n  max_memory_store: 64MB\n  max_file_store: 1GB\n  sync_interval: always\n}}\n\
                 {cluster}",
                store = store.display().to_string(),
            );
            let config = dir.path().join(format!("n{i}.conf"));
            fs::write(&config, text).expect("the nats-server config is written");
            let log = dir.path().join(format!("n{i}.log"));
            File::create(&log).expect("the nats-server log is created");
            servers.push(Server {
                client,
                route: route(i),
                http,
                config,
                log,
                child: None,
            });
        }
        let mut cluster = NatsCluster {
            bin: bin.to_path_buf(),
            servers,
            dir,
        };
        for server in &mut cluster.servers {
            server.child = Some(spawn(bin, &server.config, &server.log));
        }
        cluster
    }

    /// Waits until each server in `which` accepts clients, answers 200 on `/healthz` and, when
    /// clustered, names a meta leader on `/jsz`; `Err` (with the log tails) when one exits or
    /// [`READY_BOUND`] passes.
    fn wait_ready(&mut self, which: &[usize]) -> Result<(), String> {
        let clustered = self.servers.len() > 1;
        let deadline = Instant::now() + READY_BOUND;
        let mut pending: Vec<usize> = which.to_vec();
        let mut last = String::from("not polled yet");
        loop {
            for &i in &pending {
                if let Some(child) = self.servers[i].child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Err(self.failure(&format!("nats-server n{i} exited ({status})")));
                }
            }
            let mut still = Vec::new();
            for &i in &pending {
                match self.check_ready(i, clustered) {
                    Ok(()) => {}
                    Err(why) => {
                        last = format!("n{i}: {why}");
                        still.push(i);
                    }
                }
            }
            pending = still;
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!(
                    "the NATS servers were not ready within {READY_BOUND:?} (last: {last})"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One readiness probe of server `i`.
    fn check_ready(&self, i: usize, clustered: bool) -> Result<(), String> {
        let server = &self.servers[i];
        let client = SocketAddr::from(([127, 0, 0, 1], server.client));
        TcpStream::connect_timeout(&client, Duration::from_millis(500))
            .map_err(|e| format!("client port {}: {e}", server.client))?;
        let (status, body) = http_get(server.http, "/healthz")?;
        if status != 200 {
            return Err(format!("/healthz answered {status}: {}", body.trim()));
        }
        if clustered {
            let (status, body) = http_get(server.http, "/jsz")?;
            if status != 200 {
                return Err(format!("/jsz answered {status}"));
            }
            let jsz: Value =
                serde_json::from_str(&body).map_err(|e| format!("/jsz is not JSON: {e}"))?;
            let leader = jsz
                .pointer("/meta_cluster/leader")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if leader.is_empty() {
                return Err("/jsz names no meta leader yet".into());
            }
        }
        Ok(())
    }

    /// Whether any server's log contains `needle`.
    fn any_log_contains(&self, needle: &str) -> bool {
        (0..self.servers.len()).any(|i| self.log(i).contains(needle))
    }

    /// `what`, followed by the last lines of every server's log.
    fn failure(&self, what: &str) -> String {
        let mut text = format!("{what}\nNATS cluster in {}", self.dir.path().display());
        for (i, server) in self.servers.iter().enumerate() {
            let log = self.log(i);
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            text.push_str(&format!(
                "\n---- n{i} (client {}, route {}, http {}) log tail ----\n{}",
                server.client,
                server.route,
                server.http,
                tail.join("\n")
            ));
        }
        text
    }
}

impl Drop for NatsCluster {
    /// Kills and reaps every server still running (by its own child handle).
    fn drop(&mut self) {
        for server in &mut self.servers {
            if let Some(mut child) = server.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `count` distinct free loopback ports: all bound at once on 127.0.0.1:0 (so none repeats),
/// read, then released for the servers to bind.
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .expect("a bound listener has an address")
                .port()
        })
        .collect()
}

/// Spawns `nats-server -c <config>` with stdout and stderr appended to `log`.
fn spawn(bin: &Path, config: &Path, log: &Path) -> Child {
    let out = OpenOptions::new()
        .append(true)
        .open(log)
        .expect("the nats-server log opens for appending");
    let err = out.try_clone().expect("the nats-server log handle clones");
    Command::new(bin)
        .arg("-c")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("{} starts: {e}", bin.display()))
}

/// `GET <path>` on 127.0.0.1:`port` as a hand-written HTTP/1.0 request: the status code and the
/// body (bounded by short timeouts).
fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| format!("monitor port {port}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(2))))
        .map_err(|e| format!("monitor port {port}: {e}"))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("GET {path}: {e}"))?;
    let mut raw = Vec::new();
    stream
        .take(4 << 20)
        .read_to_end(&mut raw)
        .map_err(|e| format!("GET {path}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("GET {path}: no HTTP status in {head:?}"))?;
    Ok((status, body.to_string()))
}
