//! Cluster mode: several `switchboard serve` nodes as one service, on NATS JetStream.
//!
//! | file | owns |
//! | --- | --- |
//! | `mod.rs` | the flags, the connection, node heartbeats, session ownership (leases and epochs) |
//! | `forward.rs` | relaying an HTTP request to the node that owns its session, over NATS request-reply |
//!
//! **Who owns a session.** Two JetStream key-value buckets, replicated like the journal:
//! - `switchboard_nodes`: one key per live node (`{node, boot, http, sessions, in_flight,
//!   draining, full}`), put every `--lease-ttl`/6; the bucket's age limit is the lease TTL, so
//!   a node that stops putting (dead, paused, cut off) disappears after at most the TTL.
//! - `switchboard_sessions`: one key per session, `{node, boot, epoch}`, changed only by a
//!   revision-checked update. A session's lease is valid while its node's heartbeat with the
//!   same `boot` exists: one put per node per TTL/6 keeps every lease of the node alive, however
//!   many sessions it holds. A node takes a session over from a dead owner by updating its key
//!   to itself with `epoch + 1` (only one node's update can win), then claims the session's
//!   journal at that epoch ([`crate::journal::replicated`]), which fences the old owner.
//!
//! A node whose heartbeat lapsed (it was paused or cut off past the TTL) re-reads each session's
//! key before it serves it again, and lets go of those another node took. Keys are read through
//! the buckets' stream leaders (`leader_entry`), not from whichever replica answers first (it may lag); a node
//! takes a session over one request at a time ([`Cluster::taking_over`]) and gives back one it
//! cannot reopen ([`Cluster::release`]).

pub mod forward;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use clap::builder::TypedValueParser;
use serde::{Deserialize, Serialize};

use crate::journal::JournalError;
use crate::journal::lease::{Lease, Leases};
use crate::journal::replicated::{Claimed, Replicated};
use crate::metrics::ClusterMetrics;

/// Default `--lease-ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// Default `--cluster-replicas`.
pub const DEFAULT_REPLICAS: usize = 3;
/// The nodes' heartbeat bucket.
pub const NODES_BUCKET: &str = "switchboard_nodes";
/// The sessions' ownership bucket.
pub const SESSIONS_BUCKET: &str = "switchboard_sessions";
/// How long connecting to NATS may take at start-up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Flags of `switchboard serve` for cluster mode.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// Run as one node of a cluster: the NATS servers (with JetStream) the nodes share,
    /// comma-separated (`nats://HOST:PORT[,…]`, or `nats://USER:PASSWORD@HOST:PORT`,
    /// `tls://…`). The journal is then kept in JetStream.
    #[arg(long, value_name = "URLS")]
    pub cluster: Option<String>,
    /// This node's name in the cluster (letters, digits, `-` and `_`; unique among live
    /// nodes). Default: the host name and the listening port.
    #[arg(long, value_name = "ID", requires = "cluster")]
    pub node_id: Option<String>,
    /// How long a node's leases outlive its last heartbeat: after a node dies, its sessions
    /// move to other nodes after at most this long. The first node of a cluster sets it for
    /// all; a node asking for another follows the cluster's.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = humantime::parse_duration, requires = "cluster")]
    pub lease_ttl: Duration,
    /// Replicas of the cluster's buckets and journal stream (at most the number of NATS
    /// servers; 1 for a single server).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_REPLICAS, value_parser = clap::value_parser!(u64).range(1..=5).map(|n| n as usize), requires = "cluster")]
    pub cluster_replicas: usize,
    /// How long the cluster's journal keeps answers in full (at least 1m): older ones leave a
    /// tombstone, so a late retry is refused, never run. Sessions live on however long they
    /// are idle. The first node of a cluster sets it for all; a node asking for another
    /// follows the cluster's.
    #[arg(long, value_name = "D", default_value = "24h", value_parser = crate::command::journal_retention, requires = "cluster")]
    pub cluster_retention: Duration,
    /// How many JetStream streams the journal is spread over, by a hash of the session id: each
    /// stream has its own Raft leader, so writes spread over the NATS servers. Every node of a
    /// cluster must use the same number (a node with another refuses to start).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64).map(|n| n as usize), requires = "cluster")]
    pub cluster_journal_shards: usize,
    /// MiB of answered calls' records this node's journal keeps in memory over all its sessions
    /// (each session at most 1,024 answers and 8 MiB); older ones are read back from the
    /// stream when a retry asks for them. 0 keeps none (every such retry reads the stream).
    #[arg(long, value_name = "MIB", default_value_t = 256, requires = "cluster")]
    pub cluster_journal_memory: usize,
    /// NATS credentials file (`.creds`: a user JWT and its NKey seed).
    #[arg(long, value_name = "FILE", requires = "cluster")]
    pub cluster_creds: Option<PathBuf>,
    /// CA certificate (PEM) to verify the NATS servers' TLS certificates with; TLS is then
    /// required.
    #[arg(long, value_name = "FILE", requires = "cluster")]
    pub cluster_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for NATS servers that verify clients (with
    /// `--cluster-tls-key`).
    #[arg(long, value_name = "FILE", requires_all = ["cluster", "cluster_tls_key"])]
    pub cluster_tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["cluster", "cluster_tls_cert"])]
    pub cluster_tls_key: Option<PathBuf>,
}

/// One node as its heartbeat describes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id.
    pub node: String,
    /// This run of the node (a restarted node is a new owner).
    pub boot: String,
    /// The node's HTTP address.
    pub http: String,
    /// Sessions it holds.
    pub sessions: usize,
    /// Calls it is running.
    pub in_flight: usize,
    /// It places no new sessions (drain or shutdown).
    pub draining: bool,
    /// It is at its session limit.
    pub full: bool,
    /// A digest of the bearer token it serves with (`none` without one): nodes that do not
    /// agree refuse to join one cluster.
    #[serde(default)]
    pub token: String,
    /// Its `--cluster-journal-shards` (0: a node of a version without shards, which has one).
    #[serde(default)]
    pub shards: usize,
}

/// A session's owner, as its key says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Owner {
    /// The owning node.
    pub node: String,
    /// That node's run.
    pub boot: String,
    /// The lease epoch: 1 when created, +1 at each takeover.
    pub epoch: u64,
}

/// What this node's load is, for its heartbeat.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    /// Sessions open here.
    pub sessions: usize,
    /// Calls running here.
    pub in_flight: usize,
    /// At the session limit.
    pub full: bool,
}

/// How many recent routes a node keeps ([`Cluster::recent_route`]); all are dropped when full.
const ROUTES_KEPT: usize = 16_384;

/// Where a request for a session should go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node owns it (and has it open, or must open it from the journal).
    Here(Owner),
    /// Another live node owns it.
    There(Owner),
    /// Its owner is gone: this node may take it over (the key's value and revision).
    Orphan(Owner, u64),
    /// No such session.
    Unknown,
}

/// Why cluster mode cannot start or an operation failed: what failed and, when NATS, JetStream or
/// the encoding said why, that error as its [`source`](std::error::Error::source). Its text is
/// one line for a person: what failed, then the source's own text.
#[derive(Debug, Clone)]
pub struct ClusterError {
    what: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {source}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for ClusterError {
    /// The error itself (a NATS or JSON error), not the `Arc` holding it: `downcast_ref` finds
    /// it.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl ClusterError {
    /// An error with no underlying cause (a bad flag, a refused join).
    pub(crate) fn new(what: impl Into<String>) -> Self {
        ClusterError {
            what: what.into(),
            source: None,
        }
    }

    /// What failed, and the error that says why.
    pub(crate) fn with_source(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ClusterError {
            what: what.into(),
            source: Some(Arc::from(source.into())),
        }
    }

    /// What failed, without its source.
    pub fn what(&self) -> &str {
        &self.what
    }
}

fn err(what: &str, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ClusterError {
    ClusterError::with_source(what, e)
}

/// How long a read or write of the cluster's buckets is retried while JetStream has no answer
/// (a stream leader being elected after a server died or a bucket was just made).
const SETTLE: Duration = Duration::from_secs(8);

/// How long start-up waits for the cluster's buckets to be made or found: a fresh NATS cluster
/// may take a while to place its first replicated streams, and several nodes may be making them
/// at once.
const START_SETTLE: Duration = Duration::from_secs(30);

/// Runs `op` until it succeeds or [`SETTLE`] has passed; the last error then.
async fn settled<T, E, F, Fut>(op: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    settled_for(SETTLE, op).await
}

/// Runs `op` until it succeeds or `limit` has passed; the last error then.
async fn settled_for<T, E, F, Fut>(limit: Duration, mut op: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() >= limit => return Err(e),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// The latest value of `key` in the key-value bucket kept in `stream` (prefix `$KV.<bucket>.`)
/// and its revision, read from the stream's leader — never from a replica, which may lag: a key
/// written while a NATS server was down reads as missing (or as its old value) there for seconds
/// after the server rejoins, which would route a live session as unknown, or take a live
/// node's session over. `None` when the key is missing or deleted.
async fn leader_entry(
    stream: &jetstream::stream::Stream,
    bucket: &str,
    key: &str,
) -> Result<Option<(axum::body::Bytes, u64)>, jetstream::stream::LastRawMessageError> {
    use jetstream::stream::LastRawMessageErrorKind;
    match stream
        .get_last_raw_message_by_subject(&format!("$KV.{bucket}.{key}"))
        .await
    {
        Ok(message) => {
            let deleted = message
                .headers
                .get("KV-Operation")
                .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"));
            Ok((!deleted).then_some((message.payload, message.sequence)))
        }
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A node's link to the cluster.
pub struct Cluster {
    client: async_nats::Client,
    js: jetstream::Context,
    nodes: kv::Store,
    owners: kv::Store,
    /// The buckets' streams, read through their leaders ([`leader_entry`]).
    nodes_stream: jetstream::stream::Stream,
    owners_stream: jetstream::stream::Stream,
    node: String,
    boot: String,
    http: String,
    /// The digest of the bearer token this node serves with ([`NodeInfo::token`]).
    token: String,
    /// Its `--cluster-journal-shards`.
    shards: usize,
    /// Its `--cluster-journal-memory`, in bytes.
    journal_memory: usize,
    ttl: Duration,
    replicas: usize,
    draining: AtomicBool,
    /// The leases of the sessions owned here (shared with the replicated journal).
    leases: Arc<Leases>,
    /// The replicated journal, once opened ([`Cluster::open_journal`]).
    journal: std::sync::OnceLock<Arc<Replicated>>,
    /// Where requests for sessions other nodes own were relayed lately: session → (owner's
    /// node, when read). A relay through it skips reading the owner's key and heartbeat; an
    /// owner that no longer has the session says so (and the entry goes), one that is gone has
    /// no responder (and the entry goes); entries older than the lease TTL are read again.
    routes: Mutex<HashMap<String, (String, Instant)>>,
    /// Until when this node's heartbeat is known to stand (its last successful put + TTL).
    alive_until: Mutex<Option<Instant>>,
    /// When the current unbroken run of heartbeats began: a session last known to be owned
    /// here before that (the node was paused or cut off past its TTL in between) is checked
    /// again before it is served.
    alive_since: Mutex<Option<Instant>>,
    /// One lock per session being taken over here: two requests for one session (copies of a
    /// turn, a relayed and a local one) never take it over twice at once.
    taking: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    metrics: ClusterMetrics,
    /// The inbox of the requests this node relays to others.
    relays: forward::Relays,
}

/// Held while this node takes a session over ([`Cluster::taking_over`]).
pub struct TakingOver {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    taking: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    id: String,
}

impl Drop for TakingOver {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut taking = lock(&self.taking);
        // Nobody else waits for this session's lock: forget it.
        if taking
            .get(&self.id)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            taking.remove(&self.id);
        }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node)
            .field("boot", &self.boot)
            .finish()
    }
}

/// Checks a node id: 1 to 64 of `[A-Za-z0-9_-]`.
pub fn check_node_id(id: &str) -> Result<(), ClusterError> {
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ClusterError::new(format!(
            "bad --node-id {id:?}: 1 to 64 letters, digits, `-` and `_`"
        )));
    }
    Ok(())
}

/// The default node id: the host name and the port, as a valid id.
pub fn default_node_id(port: u16) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_else(|_| "node".into())
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect::<String>();
    format!("{host}-{port}")
}

impl Cluster {
    /// Connects to the NATS servers of `args` and opens the cluster's buckets, as node `node`
    /// serving HTTP on `http`. Fails with a message naming the servers when NATS cannot be
    /// reached or has no JetStream.
    pub async fn connect(
        args: &ClusterArgs,
        node: &str,
        http: &str,
        token: &str,
    ) -> Result<Cluster, ClusterError> {
        let urls = args
            .cluster
            .as_deref()
            .ok_or_else(|| ClusterError::new("no --cluster servers"))?;
        check_node_id(node)?;
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("switchboard {node}"))
            .connection_timeout(CONNECT_TIMEOUT);
        if let Some(creds) = &args.cluster_creds {
            options = options.credentials_file(creds).await.map_err(|e| {
                err(
                    &format!("cannot read --cluster-creds {}", creds.display()),
                    e,
                )
            })?;
        }
        if let Some(ca) = &args.cluster_tls_ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&args.cluster_tls_cert, &args.cluster_tls_key) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        let addrs: Vec<async_nats::ServerAddr> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                u.parse()
                    .map_err(|e| err(&format!("bad NATS server address {u:?} in --cluster"), e))
            })
            .collect::<Result<_, _>>()?;
        if addrs.is_empty() {
            return Err(ClusterError::new("--cluster names no NATS server"));
        }
        let client = tokio::time::timeout(CONNECT_TIMEOUT * 2, options.connect(addrs))
            .await
            .map_err(|_| {
                ClusterError::new(format!("cannot reach the NATS servers {urls} (timed out)"))
            })?
            .map_err(|e| err(&format!("cannot reach the NATS servers {urls}"), e))?;
        let js = jetstream::new(client.clone());
        let ttl = args.lease_ttl.max(Duration::from_millis(300));
        let bucket = |name: &str, max_age: Duration| kv::Config {
            bucket: name.to_string(),
            history: 1,
            max_age,
            num_replicas: args.cluster_replicas,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        let open = |config: kv::Config| {
            let js = js.clone();
            async move {
                let name = config.bucket.clone();
                let made = settled_for(START_SETTLE, || {
                    let (js, config) = (js.clone(), config.clone());
                    async move {
                        match js.get_key_value(&config.bucket).await {
                            Ok(store) => Ok(store),
                            Err(_) => js.create_key_value(config).await,
                        }
                    }
                })
                .await;
                match made {
                    Ok(store) => Ok(store),
                    Err(e) => Err(e).map_err(|e| {
                        err(
                            &format!(
                                "cannot create the key-value bucket {name} (JetStream enabled on {urls}? replicas {} need as many servers: --cluster-replicas)",
                                 args.cluster_replicas
                            ),
                            e,
                        )
                    }),
                }
            }
        };
        let nodes = open(bucket(NODES_BUCKET, ttl)).await?;
        // The lease TTL is the heartbeat bucket's age limit, set by the first node of the
        // cluster: a node heartbeating at a third of another TTL would vanish between its puts
        // (or be kept alive too long), so every node follows the bucket.
        let bucket_ttl = settled_for(START_SETTLE, || nodes.status())
            .await
            .map_err(|e| err(&format!("cannot read the {NODES_BUCKET} bucket"), e))?
            .max_age();
        let ttl = if bucket_ttl.is_zero() || bucket_ttl == ttl {
            ttl
        } else {
            tracing::warn!(
                asked = %humantime::format_duration(ttl),
                cluster = %humantime::format_duration(bucket_ttl),
                "cluster: --lease-ttl differs from the cluster's; this node uses the cluster's (set when its first node started)"
            );
            bucket_ttl
        };
        let owners = open(bucket(SESSIONS_BUCKET, Duration::ZERO)).await?;
        let stream_of = |bucket: &'static str| {
            let js = js.clone();
            async move {
                settled_for(START_SETTLE, || js.get_stream(format!("KV_{bucket}")))
                    .await
                    .map_err(|e| err(&format!("cannot open the {bucket} bucket's stream"), e))
            }
        };
        let nodes_stream = stream_of(NODES_BUCKET).await?;
        let owners_stream = stream_of(SESSIONS_BUCKET).await?;
        let boot = format!("{:x}{:x}", crate::journal::now_ms(), std::process::id());
        let relays = forward::Relays::start(client.clone()).await?;
        let cluster = Cluster {
            client,
            js,
            nodes,
            owners,
            nodes_stream,
            owners_stream,
            node: node.to_string(),
            boot,
            http: http.to_string(),
            token: token.to_string(),
            shards: args.cluster_journal_shards.max(1),
            journal_memory: args.cluster_journal_memory.saturating_mul(1 << 20),
            ttl,
            replicas: args.cluster_replicas,
            draining: AtomicBool::new(false),
            leases: Arc::new(Leases::new()),
            journal: std::sync::OnceLock::new(),
            routes: Mutex::new(HashMap::new()),
            alive_until: Mutex::new(None),
            alive_since: Mutex::new(None),
            taking: Arc::new(Mutex::new(HashMap::new())),
            metrics: ClusterMetrics::new(node),
            relays,
        };
        // A live node of the same id would share forwards and leases: refuse.
        if let Some(other) = cluster.node_info(node).await?
            && other.boot != cluster.boot
        {
            return Err(ClusterError::new(format!(
                "node id {node:?} is in use by a live node (serving {}); give each node its own --node-id, or wait {} for the old one's heartbeat to expire",
                other.http,
                humantime::format_duration(ttl)
            )));
        }
        // The live nodes, read once, tried again while JetStream settles (a node restarted
        // while a NATS server is down or catching up may wait a while for the listing).
        let live = settled_for(START_SETTLE, || cluster.live_nodes()).await?;
        // A node serving with another token would accept requests its clients could not make
        // elsewhere, and take over sessions for clients the others refuse: refuse to join.
        if let Some(other) = live
            .iter()
            // An empty digest is a node of an older version (no check: rolling upgrades).
            .find(|n| n.node != node && !n.token.is_empty() && n.token != cluster.token)
        {
            return Err(ClusterError::new(format!(
                "the live node {:?} serves with another bearer token (or none): every node of a \
                 cluster must share one (SWITCHBOARD_TOKEN or --token-file)",
                other.node
            )));
        }
        // The journal's shard of a session is its hash modulo the shard count: nodes that
        // disagree would read and write one session in different streams.
        if let Some(other) = live
            .iter()
            .find(|n| n.node != node && n.shards.max(1) != cluster.shards)
        {
            return Err(ClusterError::new(format!(
                "the live node {:?} spreads the journal over {} stream(s), this one over {}: every \
                 node of a cluster must use the same --cluster-journal-shards",
                other.node,
                other.shards.max(1),
                cluster.shards
            )));
        }
        Ok(cluster)
    }

    /// The NATS client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The inbox of the requests this node relays ([`forward::forward`]).
    pub fn relays(&self) -> &forward::Relays {
        &self.relays
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The metrics of this node.
    pub fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// Stops placing new sessions here.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether this node places no new sessions.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Puts this node's heartbeat now (tried for up to 8 s while JetStream settles).
    pub async fn heartbeat(&self, load: Load) -> Result<(), ClusterError> {
        self.beat(load, SETTLE).await
    }

    /// Puts this node's heartbeat, tried for up to `patience`.
    async fn beat(&self, load: Load, patience: Duration) -> Result<(), ClusterError> {
        let info = NodeInfo {
            node: self.node.clone(),
            boot: self.boot.clone(),
            http: self.http.clone(),
            sessions: load.sessions,
            in_flight: load.in_flight,
            draining: self.draining(),
            full: load.full,
            token: self.token.clone(),
            shards: self.shards,
        };
        let bytes = serde_json::to_vec(&info).map_err(|e| err("heartbeat", e))?;
        let bytes = axum::body::Bytes::from(bytes);
        // Each try bounded by a sixth of the TTL (a put sent to a server that just died would
        // wait for the acknowledgement's own timeout, past the half TTL at which the node
        // fences itself); tried again, through the servers still up, for up to `patience`.
        let attempt = (self.ttl / 6).max(Duration::from_millis(50));
        let started = settled_for(patience, || async {
            let started = Instant::now();
            match tokio::time::timeout(attempt, self.nodes.put(&self.node, bytes.clone())).await {
                Ok(Ok(_)) => Ok(started),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "no acknowledgement within {}",
                    humantime::format_duration(attempt)
                )),
            }
        })
        .await
        .map_err(|e| err("cannot put this node's heartbeat", e))?;
        // Counted from before the put: the server's clock started no earlier.
        let mut until = lock(&self.alive_until);
        if until.is_none_or(|u| started >= u) {
            // The heartbeat had lapsed (or this is the first): another node may have taken any
            // session over meanwhile.
            *lock(&self.alive_since) = Some(started);
        }
        *until = Some(started + self.ttl);
        drop(until);
        self.metrics.leases(self.leases.len());
        Ok(())
    }

    /// Puts the heartbeat every TTL/6 until `stop`, with `load` read each time; then deletes it,
    /// so that other nodes take this node's sessions over at once. (Every sixth of the TTL: a
    /// put may take up to a third of it before the node fences itself at half the TTL.)
    pub async fn keep_alive(
        self: Arc<Self>,
        load: impl Fn() -> Load + Send + 'static,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(self.ttl / 6);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = self.beat(load(), self.ttl / 2).await {
                        tracing::warn!(node = %self.node, error = %e, "cluster: heartbeat failed");
                    }
                }
                () = stop.cancelled() => break,
            }
        }
        self.leave().await;
    }

    /// Deletes this node's heartbeat: its sessions are free for other nodes at once.
    pub async fn leave(&self) {
        *lock(&self.alive_until) = None;
        if let Err(e) = self.nodes.delete(&self.node).await {
            tracing::warn!(node = %self.node, error = %e, "cluster: the heartbeat was not deleted (its sessions move after the lease TTL)");
        }
    }

    /// The heartbeat of node `node`, if it is alive.
    pub async fn node_info(&self, node: &str) -> Result<Option<NodeInfo>, ClusterError> {
        if check_node_id(node).is_err() {
            return Ok(None);
        }
        let entry = settled(|| leader_entry(&self.nodes_stream, NODES_BUCKET, node))
            .await
            .map_err(|e| err("cannot read the node heartbeats", e))?;
        Ok(entry.and_then(|(value, _)| serde_json::from_slice(&value).ok()))
    }

    /// Every live node's heartbeat.
    pub async fn live_nodes(&self) -> Result<Vec<NodeInfo>, ClusterError> {
        use futures::TryStreamExt;
        let keys: Vec<String> = match settled(|| self.nodes.keys()).await {
            Ok(keys) => keys
                .try_collect()
                .await
                .map_err(|e| err("cannot list the nodes", e))?,
            Err(e) => return Err(err("cannot list the nodes", e)),
        };
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(info) = self.node_info(&key).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Whether this node's heartbeat was renewed within the last half TTL. A node that is not
    /// fresh fences itself: it stops the running commands of its sessions and serves none until
    /// its heartbeat is renewed, well before another node can take them over (at the full TTL).
    pub fn fresh(&self) -> bool {
        lock(&self.alive_until).is_some_and(|until| Instant::now() + self.ttl / 2 < until)
    }

    /// Waits until no other request of this node is taking session `id` over, and holds that
    /// place until the guard is dropped.
    pub async fn taking_over(&self, id: &str) -> TakingOver {
        let l = Arc::clone(
            lock(&self.taking)
                .entry(id.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(()))),
        );
        let guard = l.lock_owned().await;
        TakingOver {
            guard: Some(guard),
            taking: Arc::clone(&self.taking),
            id: id.to_string(),
        }
    }

    /// The sessions this node holds a lease on now.
    pub fn held(&self) -> Vec<String> {
        self.leases.ids()
    }

    /// Opens the cluster's replicated journal (over `--cluster-journal-shards` streams, records
    /// kept for `retention`), writing under this node's leases; `on_fenced` is told each session
    /// whose write was refused. Once per node.
    pub async fn open_journal(
        &self,
        retention: Duration,
        on_fenced: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Result<Arc<Replicated>, ClusterError> {
        let journal = Replicated::open(
            self.js.clone(),
            crate::journal::replicated::Streams {
                name: crate::journal::replicated::STREAM,
                shards: self.shards,
                replicas: self.replicas,
                retention,
            },
            &self.node,
            Arc::clone(&self.leases),
            on_fenced,
        )
        .await
        .map_err(|e| ClusterError::with_source("cannot open the replicated journal", e))?
        .memory_budget(self.journal_memory);
        let journal = Arc::new(journal);
        self.journal
            .set(Arc::clone(&journal))
            .map_err(|_| ClusterError::new("the replicated journal is open already"))?;
        Ok(journal)
    }

    /// The replicated journal ([`Cluster::open_journal`]).
    fn journal(&self) -> Result<&Arc<Replicated>, ClusterError> {
        self.journal
            .get()
            .ok_or_else(|| ClusterError::new("cluster mode without its replicated journal"))
    }

    /// Whether this node's own heartbeat is known to stand now.
    fn alive(&self) -> bool {
        lock(&self.alive_until).is_some_and(|until| Instant::now() < until)
    }

    /// Whether this node owns session `id` now: it holds it and its heartbeat stands; after a
    /// lapse (a pause), the session's key is read again, and a session taken by another node is
    /// let go (false). An error when the key cannot be read (nothing is let go then).
    pub async fn owns(&self, id: &str) -> Result<bool, ClusterError> {
        let Some(lease) = self.leases.get(id) else {
            return Ok(false);
        };
        let since = *lock(&self.alive_since);
        if self.alive() && since.is_some_and(|s| lease.verified() >= s) {
            return Ok(true);
        }
        let checked = Instant::now();
        match self.owner(id).await {
            Ok(Some((owner, _)))
                if owner.node == self.node
                    && owner.boot == self.boot
                    && owner.epoch == lease.epoch() =>
            {
                lease.verify(checked);
                Ok(!lease.lost())
            }
            Ok(_) => {
                self.leases.lose_lease(id, &lease);
                self.metrics.leases(self.leases.len());
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Session `id`'s owner and its key's revision.
    pub async fn owner(&self, id: &str) -> Result<Option<(Owner, u64)>, ClusterError> {
        if !crate::journal::replicated::valid_id(id) {
            return Ok(None);
        }
        let entry = settled(|| leader_entry(&self.owners_stream, SESSIONS_BUCKET, id))
            .await
            .map_err(|e| err("cannot read a session's owner", e))?;
        Ok(entry.and_then(|(value, revision)| {
            serde_json::from_slice(&value).ok().map(|o| (o, revision))
        }))
    }

    /// Where a request for session `id` goes.
    pub async fn route(&self, id: &str) -> Result<Route, ClusterError> {
        if !crate::journal::replicated::valid_id(id) {
            return Ok(Route::Unknown);
        }
        let Some((owner, revision)) = self.owner(id).await? else {
            return Ok(Route::Unknown);
        };
        if owner.node == self.node && owner.boot == self.boot {
            return Ok(Route::Here(owner));
        }
        if owner.node.is_empty() {
            // Released by a node that could not reopen it: any node may take it.
            return Ok(Route::Orphan(owner, revision));
        }
        match self.node_info(&owner.node).await? {
            Some(info) if info.boot == owner.boot => {
                let mut routes = lock(&self.routes);
                if routes.len() >= ROUTES_KEPT {
                    routes.clear();
                }
                routes.insert(id.to_string(), (owner.node.clone(), Instant::now()));
                Ok(Route::There(owner))
            }
            _ => Ok(Route::Orphan(owner, revision)),
        }
    }

    /// The node a request for session `id` was relayed to lately (within the lease TTL), if
    /// any: see [`Cluster::route`]. A relay through it that the node refuses as not its
    /// session, or that finds no node listening, forgets it ([`Cluster::forget_route`]) and
    /// routes again.
    pub fn recent_route(&self, id: &str) -> Option<String> {
        let mut routes = lock(&self.routes);
        match routes.get(id) {
            Some((node, at)) if at.elapsed() < self.ttl => Some(node.clone()),
            Some(_) => {
                routes.remove(id);
                None
            }
            None => None,
        }
    }

    /// Forgets where session `id`'s requests were relayed ([`Cluster::recent_route`]).
    pub fn forget_route(&self, id: &str) {
        lock(&self.routes).remove(id);
    }

    /// Records a session created here: its key names this node at epoch 1, and its journal
    /// starts under the lease granted for it. An error if the id is taken.
    pub async fn register(&self, id: &str) -> Result<Arc<Lease>, ClusterError> {
        let owner = Owner {
            node: self.node.clone(),
            boot: self.boot.clone(),
            epoch: 1,
        };
        let bytes =
            axum::body::Bytes::from(serde_json::to_vec(&owner).map_err(|e| err("lease", e))?);
        // Retried while JetStream settles; a try whose acknowledgement was lost finds its own
        // record there.
        let made = settled(|| async {
            match self.owners.create(id, bytes.clone()).await {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    match self.owner(id).await {
                        Ok(Some((o, _))) if o == owner => Ok(()),
                        _ => Err(err(
                            &format!("cannot record session {id}'s lease: the session id is taken"),
                            e,
                        )),
                    }
                }
                Err(e) => Err(err(&format!("cannot record session {id}'s lease"), e)),
            }
        })
        .await;
        made?;
        let journal = self.journal()?;
        let lease = self.hold(id, 1);
        journal.start(id, Arc::clone(&lease));
        Ok(lease)
    }

    /// Takes session `id`'s key over from its dead owner `from` (the key at `revision`): the
    /// lease granted at the new epoch, or `None` when another node was faster. The session is
    /// this node's once its journal is claimed too ([`Cluster::claim`]).
    pub async fn take_over(
        &self,
        id: &str,
        from: &Owner,
        revision: u64,
    ) -> Result<Option<Arc<Lease>>, ClusterError> {
        let owner = Owner {
            node: self.node.clone(),
            boot: self.boot.clone(),
            epoch: from.epoch + 1,
        };
        let bytes =
            axum::body::Bytes::from(serde_json::to_vec(&owner).map_err(|e| err("lease", e))?);
        // Retried while JetStream settles (a NATS server just died: no stream leader for a
        // moment). A try whose acknowledgement was lost moved the key itself: a later try then
        // finds the revision gone and the key naming this node at the new epoch.
        let taken = settled(|| async {
            match self.owners.update(id, bytes.clone(), revision).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    Ok(matches!(self.owner(id).await?, Some((o, _)) if o == owner))
                }
                Err(e) => Err(err(&format!("cannot take session {id} over"), e)),
            }
        })
        .await?;
        if !taken {
            return Ok(None);
        }
        Ok(Some(self.hold(id, owner.epoch)))
    }

    /// Reads session `id`'s journal and claims it under `lease` (from [`Cluster::take_over`]):
    /// the previous owner can write nothing more.
    pub async fn claim(&self, id: &str, lease: Arc<Lease>) -> Result<Claimed, JournalError> {
        let journal = self.journal().map_err(|e| JournalError::Io {
            file: crate::journal::replicated::STREAM.into(),
            detail: e.to_string(),
            source: None,
        })?;
        journal.claim(id, lease).await
    }

    /// The name of the replicated journal's (first) stream.
    pub fn stream_name(&self) -> &str {
        self.journal
            .get()
            .map_or(crate::journal::replicated::STREAM, |j| j.stream_name())
    }

    fn hold(&self, id: &str, epoch: u64) -> Arc<Lease> {
        let lease = self.leases.grant(id, epoch);
        self.metrics.leases(self.leases.len());
        lease
    }

    /// Stops holding session `id` here (another node took it, or this node closed it): its
    /// lease is lost, and the journal writes nothing more under it.
    pub fn let_go(&self, id: &str) {
        self.leases.lose(id);
        self.metrics.leases(self.leases.len());
    }

    /// Gives session `id` back after this node took it over at `epoch` and could not reopen it:
    /// its key then names no node (at the same epoch), so the next request, at any node, takes it
    /// over — a node that can reopen it serves it, and it is never stuck behind this one.
    pub async fn release(&self, id: &str, epoch: u64) {
        self.let_go(id);
        let released = Owner {
            node: String::new(),
            boot: String::new(),
            epoch,
        };
        let Ok(bytes) = serde_json::to_vec(&released) else {
            return;
        };
        let outcome = settled(|| async {
            match self.owner(id).await? {
                Some((o, revision))
                    if o.node == self.node && o.boot == self.boot && o.epoch == epoch =>
                {
                    self.owners
                        .update(id, bytes.clone().into(), revision)
                        .await
                        .map(|_| ())
                        .map_err(|e| err("cannot release the session", e))
                }
                // Moved on meanwhile (another node took it): nothing to give back.
                _ => Ok(()),
            }
        })
        .await;
        if let Err(e) = outcome {
            tracing::warn!(session = %id, error = %e, "cluster: a session this node could not reopen was not released (it moves when this node's lease lapses)");
        }
    }

    /// Session `id` is closed for good: its lease is deleted.
    pub async fn forget(&self, id: &str) {
        self.let_go(id);
        if let Err(e) = self.owners.delete(id).await {
            tracing::warn!(session = %id, error = %e, "cluster: a closed session's lease was not deleted");
        }
    }

    /// The live node a new session should go to instead of this one (least calls in flight,
    /// then fewest sessions), if this one is draining or full; `None` to place it here.
    pub async fn placement(&self, here_full: bool) -> Result<Option<NodeInfo>, ClusterError> {
        if !here_full && !self.draining() {
            return Ok(None);
        }
        let best = self
            .live_nodes()
            .await?
            .into_iter()
            .filter(|n| n.node != self.node && !n.draining && !n.full)
            .min_by_key(|n| (n.in_flight, n.sessions));
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_error_keeps_its_cause_for_downcast() {
        let e = ClusterError::with_source(
            "cannot read the session's owner",
            std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"),
        );
        assert_eq!(e.to_string(), "cannot read the session's owner: no answer");
        let io = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the cause itself is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
        assert!(std::error::Error::source(&ClusterError::new("bad flag")).is_none());
    }

    #[test]
    fn node_ids_are_plain_names() {
        for good in ["a", "node-1", "eu_west_3", &"n".repeat(64)] {
            assert!(check_node_id(good).is_ok(), "{good}");
        }
        for bad in ["", "a.b", "a b", "a/b", "é", &"n".repeat(65)] {
            let e = check_node_id(bad).unwrap_err();
            assert!(e.what().contains("--node-id"), "{e}");
        }
        assert!(check_node_id(&default_node_id(7420)).is_ok());
    }
}
