//! The sessions table: every open HTTP session, its engine [`Session`], its workspace and its
//! counters. The table owns the sessions; a request holds one only while it runs.
//!
//! A session is created with a workspace under `--workspace-root` (a named one, shared by every
//! session that names it, or a fresh directory named after the session), confined exactly as
//! `dispatch --workspace` is. Turns of one session run one after another, in the order they
//! arrive (a fair lock taken before the turn is dispatched); turns of different sessions run
//! concurrently. `cancel` answers the running and pending turns `cancelled` and leaves the
//! session usable; `DELETE` cancels and frees it. A session with no request in flight for
//! longer than the idle timeout is closed by the reaper (its workspace stays on disk).
//!
//! With a journal, the sessions of the last run are reopened at start under their ids. One the
//! server cannot reopen now — the table is full (a lower `--max-sessions`), its workspace
//! directory is missing, or another failure — stays in the journal and is kept here *dormant*:
//! its id, where its workspace is, and its idle clock (started at the restart). A request naming
//! it reopens it when it can (exactly as at start); meanwhile the request is refused
//! (`too_many_sessions` while the table is full, `internal` naming a missing workspace) and the
//! session is kept. Only `DELETE` and the idle timeout end it.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::client_tools::{self, Delegate};
use super::errors::ApiError;
use super::turns::TurnTable;
use crate::engine::{Engine, Session, SessionError, SessionOptions};
use crate::sandbox::{SandboxConfig, SandboxMode};
use crate::workspace::Workspace;

/// Longest workspace name.
pub const MAX_NAME_LEN: usize = 128;
/// Default `--max-session-turns`: turns one session may have running or waiting.
pub const DEFAULT_TURN_SHARE: usize = 16;
/// The directory under the root where sessions created without a workspace name get theirs:
/// its name is not a valid workspace name, so no session can name its way into another's.
pub const FRESH_DIR: &str = "@sessions";

/// One HTTP session.
#[derive(Debug)]
pub struct HttpSession {
    id: Arc<str>,
    workspace: PathBuf,
    session: Session,
    /// The token of turns arriving now; `cancel` cancels it and puts a fresh one in its place.
    epoch: Mutex<CancellationToken>,
    /// Held by the turn running; waiting turns queue on it in arrival order.
    turn_lock: Arc<tokio::sync::Mutex<()>>,
    /// One permit per turn of this session running or waiting (`--max-session-turns`).
    share: Arc<tokio::sync::Semaphore>,
    /// The share's size.
    share_size: usize,
    /// Its turns by id (turn-addressed cancel).
    turn_ids: Arc<TurnTable>,
    /// Its client tools' calls, if it declared any.
    delegate: Option<Arc<Delegate>>,
    /// Its client tools' names, in declaration order.
    client_tools: Vec<String>,
    turns: AtomicU64,
    calls: AtomicU64,
    in_flight: AtomicUsize,
    /// Milliseconds since the table's start when the last request left.
    last_used_ms: AtomicU64,
    /// What the journal keeps of it (with a journal).
    persisted: Option<Mutex<Persisted>>,
}

/// A journaled session that is not open (see the module docs); its id is the key.
#[derive(Debug)]
struct Dormant {
    /// Where its workspace is.
    place: Place,
    /// Milliseconds since the table's start when it was restored or last named by a request.
    last_used_ms: u64,
    /// A request is reopening it now (the reaper leaves it alone).
    reopening: bool,
}

/// Where a dormant session's workspace is.
#[derive(Debug, Clone)]
enum Place {
    /// A fresh one, `<root>/@sessions/<id>`.
    Fresh,
    /// A named one, `<root>/<name>`.
    Named(Box<str>),
    /// Not known: its journal record does not decode here.
    Unknown,
}

impl Place {
    fn of(p: &Persisted) -> Place {
        match &p.workspace {
            None => Place::Fresh,
            Some(name) if check_name(name).is_ok() => Place::Named(name.as_str().into()),
            Some(_) => Place::Unknown,
        }
    }
}

/// Why a journaled session is not open.
#[derive(Debug)]
enum Unopened {
    /// The table is full.
    Full,
    /// Its workspace directory is missing.
    NoWorkspace(PathBuf),
    /// Anything else (a record this server cannot read, a policy it does not offer …).
    Failed(String),
}

/// How many sessions were left dormant for one reason at start, and one example.
#[derive(Debug, Default)]
struct Tally {
    count: usize,
    example: String,
}

impl Tally {
    fn add(&mut self, example: impl FnOnce() -> String) {
        if self.count == 0 {
            self.example = example();
        }
        self.count += 1;
    }
}

/// What the journal keeps of a session, to reopen it under the same id after a restart: what
/// it was created with, and the deferred tools it has been shown.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Persisted {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tools: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sandbox: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allow_network: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<String>,
    #[serde(default)]
    revealed: Vec<String>,
}

impl Persisted {
    fn of(new: &NewSession) -> Persisted {
        Persisted {
            workspace: new.workspace.clone(),
            tools: new.tools.clone(),
            sandbox: new.sandbox.map(|m| m.as_str().to_string()),
            allow_network: new.allow_network,
            policy: new.policy.clone(),
            revealed: Vec::new(),
        }
    }

    fn to_new(&self) -> Result<NewSession, String> {
        Ok(NewSession {
            workspace: self.workspace.clone(),
            tools: self.tools.clone(),
            sandbox: match &self.sandbox {
                None => None,
                Some(m) => Some(m.parse::<SandboxMode>().map_err(|e| e.to_string())?),
            },
            allow_network: self.allow_network,
            policy: self.policy.clone(),
        })
    }

    fn write(&self, id: &str) -> crate::journal::Write {
        crate::journal::Write::Session {
            id: id.to_string(),
            bytes: serde_json::to_vec(self).unwrap_or_default(),
        }
    }
}

impl HttpSession {
    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The absolute path of the workspace.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The engine session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Its turns by id.
    pub fn turn_ids(&self) -> &Arc<TurnTable> {
        &self.turn_ids
    }

    /// Its client tools' names.
    pub fn client_tool_names(&self) -> &[String] {
        &self.client_tools
    }

    /// Its client tools' side, if it declared any.
    pub fn delegate(&self) -> Option<&Arc<Delegate>> {
        self.delegate.as_ref()
    }

    /// The cancellation token of a turn arriving now: cancelled by `cancel`, `DELETE`, and
    /// engine shutdown.
    pub fn turn_token(&self) -> CancellationToken {
        lock(&self.epoch).child_token()
    }

    /// Cancels every turn running or waiting now; later turns run normally.
    pub fn cancel_turns(&self) {
        let fresh = self.session.turn_token();
        let old = std::mem::replace(&mut *lock(&self.epoch), fresh);
        old.cancel();
    }

    /// The lock a turn holds while it runs (fair: turns get it in arrival order).
    pub fn turn_lock(&self) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(&self.turn_lock)
    }

    /// A place in this session's share of turns running or waiting, held until the turn ends;
    /// `overloaded` when the session has as many as it may.
    pub fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.share)
            .try_acquire_owned()
            .map_err(|_| ApiError::SessionBusy(self.share_size))
    }

    /// Counts a dispatched turn of `calls` calls.
    pub fn count_turn(&self, calls: usize) {
        self.turns.fetch_add(1, Ordering::Relaxed);
        self.calls.fetch_add(calls as u64, Ordering::Relaxed);
    }

    /// `{"session_id", "workspace", "turns", "calls", "in_flight"}`.
    pub fn info(&self) -> Value {
        json!({
            "session_id": &*self.id,
            "workspace": self.workspace.to_string_lossy(),
            "turns": self.turns.load(Ordering::Relaxed),
            "calls": self.calls.load(Ordering::Relaxed),
            "in_flight": self.in_flight.load(Ordering::Relaxed),
        })
    }
}

/// What a new session asks for (the create-session body).
#[derive(Debug, Default)]
pub struct NewSession {
    /// A named workspace under the root (else a fresh one named after the session).
    pub workspace: Option<String>,
    /// Client tool definitions (the `tools` array), if any.
    pub tools: Option<Value>,
    /// A narrower sandbox mode than the server's.
    pub sandbox: Option<SandboxMode>,
    /// `false` to take the network away when the server allows it.
    pub allow_network: Option<bool>,
    /// The name of a session policy the server offers (`--session-policy NAME=FILE`).
    pub policy: Option<String>,
}

/// Why `--session-policy` values cannot be used ([`SessionPolicies::load`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionPolicyError {
    /// A value is not `NAME=FILE` with a valid name, or a name is given twice.
    #[error("--session-policy {spec}: {reason}")]
    Spec {
        /// The value given (the name, when given twice).
        spec: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The file of policy `name` cannot be read or is not a session policy.
    #[error("session policy {name} ({}): {problem}", file.display())]
    File {
        /// The policy's name.
        name: String,
        /// Its file.
        file: PathBuf,
        /// What is wrong, with its source.
        #[source]
        problem: PolicyFileProblem,
    },
}

/// What is wrong with a session policy's file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyFileProblem {
    /// It cannot be read.
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
    /// It is not JSON.
    #[error("not JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// It holds something other than an object.
    #[error("a policy file must hold a JSON object")]
    NotAnObject,
    /// It has hooks.
    #[error("a session policy holds permissions only (hooks belong in --policy)")]
    Hooks,
    /// Its rules are refused.
    #[error("{0}")]
    Rules(#[source] crate::policy::PolicyError),
    /// A rule asks.
    #[error("a session policy may allow and deny, not ask (a session narrows by denying)")]
    Asks,
}

/// The stricter policies a session may choose by name (`--session-policy NAME=FILE`): each the
/// `permissions` object of a policy file (allow and deny rules and a default; no ask, no hooks),
/// narrowing the server's policy for the sessions that choose it.
#[derive(Debug, Default, Clone)]
pub struct SessionPolicies(Vec<(String, Value)>);

impl SessionPolicies {
    /// Reads every `NAME=FILE`; the error names the file and what is wrong.
    pub fn load(specs: &[String]) -> Result<SessionPolicies, SessionPolicyError> {
        let mut policies: Vec<(String, Value)> = Vec::with_capacity(specs.len());
        for spec in specs {
            let bad_spec = |reason| SessionPolicyError::Spec {
                spec: spec.clone(),
                reason,
            };
            let Some((name, file)) = spec.split_once('=') else {
                return Err(bad_spec("expected NAME=FILE"));
            };
            let valid = (1..=64).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !valid {
                return Err(bad_spec("a name is 1 to 64 of [A-Za-z0-9._-]"));
            }
            if policies.iter().any(|(n, _)| n == name) {
                return Err(SessionPolicyError::Spec {
                    spec: name.to_string(),
                    reason: "given twice",
                });
            }
            let named = |problem| SessionPolicyError::File {
                name: name.to_string(),
                file: PathBuf::from(file),
                problem,
            };
            let text =
                std::fs::read_to_string(file).map_err(|e| named(PolicyFileProblem::Read(e)))?;
            let doc: Value =
                serde_json::from_str(&text).map_err(|e| named(PolicyFileProblem::Json(e)))?;
            let Value::Object(fields) = doc else {
                return Err(named(PolicyFileProblem::NotAnObject));
            };
            if fields.contains_key("hooks") {
                return Err(named(PolicyFileProblem::Hooks));
            }
            let mut permissions = fields
                .get("permissions")
                .cloned()
                .unwrap_or_else(|| json!({}));
            // A session policy lists what it denies: what it does not name, it leaves to the
            // server's policy.
            if let Value::Object(p) = &mut permissions {
                p.entry("default").or_insert_with(|| json!("allow"));
            }
            let rules = crate::policy::Rules::from_json(&permissions)
                .map_err(|e| named(PolicyFileProblem::Rules(e)))?;
            if rules.has_ask() {
                return Err(named(PolicyFileProblem::Asks));
            }
            policies.push((name.to_string(), permissions));
        }
        Ok(SessionPolicies(policies))
    }

    /// True when the server offers none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rules of the policy named `name`; `bad_request` naming the ones offered if none is.
    fn rules(&self, name: &str) -> Result<crate::policy::Rules, ApiError> {
        let Some((_, permissions)) = self.0.iter().find(|(n, _)| n == name) else {
            let offered: Vec<&str> = self.0.iter().map(|(n, _)| n.as_str()).collect();
            return Err(ApiError::BadRequest(if offered.is_empty() {
                format!("unknown policy `{name}`: this server offers no session policies")
            } else {
                format!(
                    "unknown policy `{name}`: this server offers {}",
                    offered.join(", ")
                )
            }));
        };
        crate::policy::Rules::from_json(permissions)
            .map_err(|e| ApiError::BadRequest(format!("policy `{name}`: {e}")))
    }
}

/// How strict a mode is: a session may move only up this order.
fn strictness(mode: SandboxMode) -> u8 {
    match mode {
        SandboxMode::Off => 0,
        SandboxMode::BestEffort => 1,
        SandboxMode::WorkspaceWrite => 2,
        SandboxMode::ReadOnly => 3,
    }
}

/// The session's sandbox: the server's, narrowed as asked; `bad_request` for a widening.
pub fn narrowed(
    server: &SandboxConfig,
    mode: Option<SandboxMode>,
    allow_network: Option<bool>,
) -> Result<Option<SandboxConfig>, ApiError> {
    if mode.is_none() && allow_network.is_none() {
        return Ok(None);
    }
    let mut config = server.clone();
    if let Some(mode) = mode {
        if strictness(mode) < strictness(server.mode) {
            return Err(ApiError::BadRequest(format!(
                "sandbox `{}` would widen the server's `{}`: a session may only narrow it (order: off, best-effort, workspace-write, read-only)",
                mode.as_str(),
                server.mode.as_str()
            )));
        }
        config.mode = mode;
    }
    if let Some(allow) = allow_network {
        if allow && !server.allow_network {
            return Err(ApiError::BadRequest(
                "allow_network: the server gives commands no network, and a session may only narrow that".into(),
            ));
        }
        config.allow_network = allow;
    }
    Ok(Some(config))
}

/// Every open session.
#[derive(Debug)]
pub struct SessionTable {
    sessions: Mutex<HashMap<Arc<str>, Arc<HttpSession>>>,
    engine: Engine,
    root: PathBuf,
    /// The server's sandbox (what sessions may narrow).
    sandbox: SandboxConfig,
    /// The server's limits on client tools.
    tool_limits: client_tools::Limits,
    /// Whether `read_file` follows multiply-linked files in workspaces.
    allow_hard_links: bool,
    /// The stricter policies sessions may choose.
    policies: SessionPolicies,
    max: usize,
    /// What set `max`: `--max-sessions` or the open-file limit.
    max_by: &'static str,
    /// Most turns one session may have running or waiting.
    turn_share: usize,
    idle_timeout: Duration,
    start: Instant,
    ids: RandomState,
    next: AtomicU64,
    /// Cluster mode: this node's link to the cluster.
    cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Cluster mode: sessions taken over here whose workspace directory is missing on this
    /// node, and that directory.
    lost: Mutex<HashMap<String, PathBuf>>,
    /// Cluster mode: sessions let go here ([`SessionTable::drop_local`]) whose turns may still
    /// be finishing: each one's turn share (a permit per turn running or waiting) and its size.
    departed: Mutex<HashMap<String, (Arc<tokio::sync::Semaphore>, usize)>>,
    /// Journaled sessions not open now (see the module docs).
    dormant: Mutex<HashMap<Arc<str>, Dormant>>,
    /// How many there are (read without the lock on every request).
    dormant_count: AtomicUsize,
    /// Held while a dormant session is reopened or deleted: one at a time, so that a session is
    /// never reopened twice, nor reopened after its `DELETE`.
    reopening: tokio::sync::Mutex<()>,
}

/// Checks a workspace name: one path component of `[A-Za-z0-9._-]`, 1 to 128 characters, not
/// `.` or `..`.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > MAX_NAME_LEN || !ok_chars || name == "." || name == ".." {
        return Err(ApiError::BadRequest(format!(
            "bad workspace name {name:?}: one path component of letters, digits, `.`, `_` and `-`, 1 to {MAX_NAME_LEN} characters, not `.` or `..`"
        )));
    }
    Ok(())
}

impl SessionTable {
    /// A table of sessions whose workspaces live under `root` (an existing, absolute directory),
    /// at most [`super::DEFAULT_MAX_SESSIONS`] of them until [`SessionTable::with_max`].
    pub fn new(
        engine: Engine,
        root: PathBuf,
        idle_timeout: Duration,
        sandbox: SandboxConfig,
        tool_limits: client_tools::Limits,
        allow_hard_links: bool,
    ) -> Self {
        SessionTable {
            sessions: Mutex::new(HashMap::new()),
            engine,
            root,
            sandbox,
            tool_limits,
            allow_hard_links,
            policies: SessionPolicies::default(),
            max: super::DEFAULT_MAX_SESSIONS,
            max_by: "--max-sessions",
            turn_share: DEFAULT_TURN_SHARE,
            idle_timeout,
            start: Instant::now(),
            ids: RandomState::new(),
            next: AtomicU64::new(0),
            cluster: None,
            lost: Mutex::new(HashMap::new()),
            departed: Mutex::new(HashMap::new()),
            dormant: Mutex::new(HashMap::new()),
            dormant_count: AtomicUsize::new(0),
            reopening: tokio::sync::Mutex::new(()),
        }
    }

    /// The same table, as one node of `cluster`.
    pub fn with_cluster(mut self, cluster: Arc<crate::cluster::Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// How many sessions are open here, and whether that is the limit.
    pub fn load(&self) -> (usize, bool) {
        let n = lock(&self.sessions).len();
        (n, n >= self.max)
    }

    /// Whether session `id` is open here.
    pub fn has(&self, id: &str) -> bool {
        lock(&self.sessions).contains_key(id) || lock(&self.lost).contains_key(id)
    }

    /// The workspace directory session `id` lacks here, if it was taken over without one.
    pub fn lost(&self, id: &str) -> Option<PathBuf> {
        lock(&self.lost).get(id).cloned()
    }

    /// Closes for good session `id` that was taken over without its workspace; the directory
    /// it lacked, or `None` if it is no such session.
    pub fn forget_lost(&self, id: &str) -> Option<PathBuf> {
        let dir = lock(&self.lost).remove(id)?;
        self.forget(vec![Arc::from(id)]);
        Some(dir)
    }

    /// Closes session `id` here without forgetting it (another node owns it now): its turns
    /// are cancelled, its journal and lease are left to the new owner.
    pub fn drop_local(&self, id: &str) {
        let session = lock(&self.sessions).remove(id);
        lock(&self.lost).remove(id);
        if let Some(session) = session {
            session.session.cancel();
            let mut departed = lock(&self.departed);
            if departed.len() >= 1024 {
                // Those whose turns are over need no waiting for.
                departed.retain(|_, (share, size)| share.available_permits() < *size);
            }
            departed.insert(
                id.to_string(),
                (Arc::clone(&session.share), session.share_size),
            );
        }
        // Its lease is lost: the journal writes nothing more for it here.
        if let Some(cluster) = &self.cluster {
            cluster.let_go(id);
        }
    }

    /// Whether a turn of session `id`, let go here earlier, may still be running (a handler
    /// finishing its commit, an answer on its way to the journal): the session must not be
    /// taken back here before — that turn's writes would land in the new run's journal.
    pub fn departed_busy(&self, id: &str) -> bool {
        let mut departed = lock(&self.departed);
        let busy = departed
            .get(id)
            .is_some_and(|(share, size)| share.available_permits() < *size);
        if !busy {
            departed.remove(id);
        }
        busy
    }

    /// Reopens session `id`, taken over from another node under `lease`, from its journal
    /// record `bytes`. A session whose workspace directory is missing here is kept as lost: its
    /// calls are answered `workspace_lost`, and nothing runs in an empty directory in its place.
    pub async fn adopt(
        &self,
        id: &str,
        bytes: &[u8],
        lease: Arc<crate::journal::lease::Lease>,
    ) -> Result<(), ApiError> {
        let p = serde_json::from_slice::<Persisted>(bytes).map_err(|e| {
            ApiError::Internal(format!(
                "session {id}: its journal record does not decode: {e}"
            ))
        })?;
        let dir = match &p.workspace {
            Some(name) => self.root.join(name),
            None => self.root.join(FRESH_DIR).join(id),
        };
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            tracing::warn!(session = %id, workspace = %dir.display(), "cluster: a session taken over has no workspace on this node");
            lock(&self.lost).insert(id.to_string(), dir);
            return Ok(());
        }
        let new = p.to_new().map_err(ApiError::Internal)?;
        let (http, _) = self
            .create_as(new, Some(id.to_string()), Some(p.clone()))
            .await?;
        let names: Vec<Arc<str>> = p.revealed.iter().map(|n| Arc::from(n.as_str())).collect();
        http.session.restore_revealed(&names);
        http.session.hold_lease(lease);
        Ok(())
    }

    /// The same table, holding at most `max` sessions because of `by` (the open-file limit).
    pub fn with_max(mut self, max: usize, by: &'static str) -> Self {
        self.max = max.max(1);
        self.max_by = by;
        self
    }

    /// The same table, each session with at most `share` turns running or waiting.
    pub fn with_turn_share(mut self, share: usize) -> Self {
        self.turn_share = share.max(1);
        self
    }

    /// The same table, offering `policies` to its sessions.
    pub fn with_policies(mut self, policies: SessionPolicies) -> Self {
        self.policies = policies;
        self
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn new_id(&self) -> String {
        loop {
            let id = format!("s{:016x}", self.random());
            if self.dormant_count.load(Ordering::Acquire) == 0
                || !lock(&self.dormant).contains_key(id.as_str())
            {
                return id;
            }
        }
    }

    /// A turn id for a dispatch that brought none.
    pub fn new_turn_id(&self) -> String {
        format!("t{:016x}", self.random())
    }

    fn random(&self) -> u64 {
        let mut h = self.ids.build_hasher();
        h.write_u64(self.next.fetch_add(1, Ordering::Relaxed));
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    }

    fn full(&self) -> Result<(), ApiError> {
        if lock(&self.sessions).len() >= self.max {
            return Err(ApiError::TooManySessions(self.max, self.max_by));
        }
        Ok(())
    }

    /// Opens a session in `<root>/<name>` (created if missing), or in a fresh directory named
    /// after the session, with the client tools and the narrower sandbox it asks for.
    pub async fn create(&self, new: NewSession) -> Result<Arc<HttpSession>, ApiError> {
        let persisted = self.engine.journal().map(|_| Persisted::of(&new));
        let (http, created) = self.create_as(new, None, persisted.clone()).await?;
        // Refused after all: the directory goes too if this request made it (and it is empty).
        let unmade = || {
            if created {
                let _ = std::fs::remove_dir(&http.workspace);
            }
        };
        // Cluster mode: the lease first (epoch 1), and the session's journal under it.
        if let Some(cluster) = &self.cluster {
            match cluster.register(&http.id).await {
                Ok(lease) => http.session.hold_lease(lease),
                Err(e) => {
                    let _ = lock(&self.sessions).remove(&http.id);
                    unmade();
                    return Err(ApiError::ClusterUnavailable(format!(
                        "the session's lease was not recorded: {e}"
                    )));
                }
            }
        }
        // With a journal, the session is on disk before its id is handed out.
        if let (Some(journal), Some(p)) = (self.engine.journal(), persisted)
            && let Err(e) = journal.write(vec![p.write(&http.id)]).await
        {
            let _ = self.remove(&http.id);
            unmade();
            let why = format!("the journal cannot record the session: {e}");
            return Err(if self.cluster.is_some() {
                ApiError::ClusterUnavailable(why)
            } else {
                ApiError::Internal(why)
            });
        }
        Ok(http)
    }

    /// Reopens every session the journal holds, under its id (after a restart); returns how
    /// many. A session that cannot be reopened now (the table is full, its workspace is missing,
    /// any other failure) stays in the journal and is kept dormant, to be reopened when a request
    /// names it; one line per reason is logged.
    pub async fn restore(&self) -> usize {
        let Some(journal) = self.engine.journal() else {
            return 0;
        };
        let records = match journal.sessions() {
            Ok(records) => records,
            Err(e) => {
                tracing::error!(error = %e, "journal: cannot read the sessions");
                return 0;
            }
        };
        let mut restored = 0;
        let (mut full, mut missing, mut failed) =
            (Tally::default(), Tally::default(), Tally::default());
        for (id, bytes) in records {
            let place = match self.reopen(&id, &bytes).await {
                Ok(_) => {
                    restored += 1;
                    continue;
                }
                Err((place, Unopened::Full)) => {
                    full.add(|| id.clone());
                    place
                }
                Err((place, Unopened::NoWorkspace(dir))) => {
                    missing.add(|| dir.display().to_string());
                    place
                }
                Err((place, Unopened::Failed(why))) => {
                    failed.add(|| format!("session {id}: {why}"));
                    place
                }
            };
            lock(&self.dormant).insert(
                Arc::from(id.as_str()),
                Dormant {
                    place,
                    last_used_ms: self.now_ms(),
                    reopening: false,
                },
            );
        }
        let kept = lock(&self.dormant).len();
        self.dormant_count.store(kept, Ordering::Release);
        if full.count > 0 {
            tracing::warn!(
                sessions = full.count,
                open = restored,
                "journal: {} kept but not reopened: the table is full ({} sessions, {}); each is reopened when a request names it and a place is free",
                sessions_word(full.count),
                self.max,
                self.max_by
            );
        }
        if missing.count > 0 {
            tracing::warn!(
                sessions = missing.count,
                example = %missing.example,
                "journal: {} kept but not reopened: the workspace directory is missing (moved, deleted or not mounted); each is reopened when a request names it once its directory is back",
                sessions_word(missing.count)
            );
        }
        if failed.count > 0 {
            tracing::warn!(
                sessions = failed.count,
                example = %failed.example,
                "journal: {} kept but not reopened: this server cannot reopen them; a request naming one is refused until it can",
                sessions_word(failed.count)
            );
        }
        restored
    }

    /// How many journaled sessions are kept without being open.
    pub fn dormant(&self) -> usize {
        self.dormant_count.load(Ordering::Acquire)
    }

    /// The workspace directory of a session of id `id` at `place`.
    fn dir_of(&self, id: &str, place: &Place) -> Option<PathBuf> {
        match place {
            Place::Fresh => Some(self.root.join(FRESH_DIR).join(id)),
            Place::Named(name) => Some(self.root.join(&**name)),
            Place::Unknown => None,
        }
    }

    /// Reopens session `id` from its journal record `bytes`, exactly as it was: its workspace
    /// (which must exist: a missing one is never replaced by an empty directory), client tools,
    /// sandbox, policy and revealed tools.
    async fn reopen(&self, id: &str, bytes: &[u8]) -> Result<Arc<HttpSession>, (Place, Unopened)> {
        let p = serde_json::from_slice::<Persisted>(bytes).map_err(|e| {
            (
                Place::Unknown,
                Unopened::Failed(format!("its journal record does not decode: {e}")),
            )
        })?;
        let place = Place::of(&p);
        if let Some(dir) = self.dir_of(id, &place)
            && !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
        {
            return Err((place, Unopened::NoWorkspace(dir)));
        }
        if self.full().is_err() {
            return Err((place, Unopened::Full));
        }
        let new = match p.to_new() {
            Ok(new) => new,
            Err(e) => return Err((place, Unopened::Failed(e))),
        };
        let http = match self
            .create_as(new, Some(id.to_string()), Some(p.clone()))
            .await
        {
            Ok((http, _)) => http,
            Err(ApiError::TooManySessions(..)) => return Err((place, Unopened::Full)),
            Err(e) => return Err((place, Unopened::Failed(e.message()))),
        };
        let names: Vec<Arc<str>> = p.revealed.iter().map(|n| Arc::from(n.as_str())).collect();
        http.session.restore_revealed(&names);
        Ok(http)
    }

    /// If session `id` is dormant, reopens it: `Ok` when it is open now (or is not a dormant
    /// session: the caller then looks it up as usual). Refused, it stays dormant:
    /// `too_many_sessions` while the table is full, `internal` naming its missing workspace or
    /// what else keeps it closed. A request naming it restarts its idle clock either way.
    ///
    /// The reopening runs on a task of its own: a client that goes away meanwhile leaves no
    /// session half reopened.
    pub async fn wake(self: &Arc<Self>, id: &str) -> Result<(), ApiError> {
        if self.dormant_count.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        match lock(&self.dormant).get_mut(id) {
            None => return Ok(()),
            Some(d) => d.last_used_ms = self.now_ms(),
        }
        let (table, id) = (Arc::clone(self), id.to_string());
        tokio::spawn(async move { table.wake_dormant(&id).await })
            .await
            .unwrap_or_else(|e| Err(ApiError::Internal(format!("reopening failed: {e}"))))
    }

    /// [`SessionTable::wake`] of a session that was dormant a moment ago.
    async fn wake_dormant(&self, id: &str) -> Result<(), ApiError> {
        let _one = self.reopening.lock().await;
        let place = match lock(&self.dormant).get_mut(id) {
            // Reopened by another request meanwhile, or closed.
            None => return Ok(()),
            Some(d) => {
                d.reopening = true;
                d.place.clone()
            }
        };
        let outcome = self.wake_now(id, &place).await;
        let mut dormant = lock(&self.dormant);
        match &outcome {
            Ok(()) => {
                dormant.remove(id);
            }
            Err(_) => {
                if let Some(d) = dormant.get_mut(id) {
                    d.reopening = false;
                    d.last_used_ms = self.now_ms();
                }
            }
        }
        self.dormant_count.store(dormant.len(), Ordering::Release);
        outcome
    }

    /// Reopens dormant session `id` (the reopening lock held).
    async fn wake_now(&self, id: &str, place: &Place) -> Result<(), ApiError> {
        if lock(&self.sessions).contains_key(id) {
            return Ok(());
        }
        if let Some(dir) = self.dir_of(id, place)
            && !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
        {
            return Err(workspace_missing(id, &dir));
        }
        if self.full().is_err() {
            return Err(ApiError::SessionKept(id.to_string(), self.max, self.max_by));
        }
        let Some(journal) = self.engine.journal() else {
            return Err(ApiError::UnknownSession(id.to_string()));
        };
        let journal = journal.clone();
        let records = tokio::task::spawn_blocking(move || journal.sessions())
            .await
            .map_err(|e| e.to_string())
            .and_then(|read| read.map_err(|e| e.to_string()))
            .map_err(|e| {
                ApiError::Internal(format!(
                    "session `{id}` is kept, but the journal cannot be read now: {e}"
                ))
            })?;
        let Some((_, bytes)) = records.into_iter().find(|(k, _)| k == id) else {
            // Not in the journal any more: nothing to reopen.
            lock(&self.dormant).remove(id);
            return Err(ApiError::UnknownSession(id.to_string()));
        };
        match self.reopen(id, &bytes).await {
            Ok(_) => Ok(()),
            Err((_, Unopened::Full)) => {
                Err(ApiError::SessionKept(id.to_string(), self.max, self.max_by))
            }
            Err((_, Unopened::NoWorkspace(dir))) => Err(workspace_missing(id, &dir)),
            Err((_, Unopened::Failed(why))) => Err(ApiError::Internal(format!(
                "session `{id}` is kept in the journal, but this server cannot reopen it: {why}; nothing ran (DELETE closes it for good)"
            ))),
        }
    }

    /// Closes dormant session `id` for good (`DELETE`): its journal record is deleted before
    /// this returns. Its answer, as for an open session; `None` if it is no dormant session.
    /// (On a task of its own, like [`SessionTable::wake`].)
    pub async fn remove_dormant(self: &Arc<Self>, id: &str) -> Result<Option<Value>, ApiError> {
        if self.dormant_count.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        let (table, id) = (Arc::clone(self), id.to_string());
        tokio::spawn(async move { table.forget_dormant(&id).await })
            .await
            .unwrap_or_else(|e| Err(ApiError::Internal(format!("deleting failed: {e}"))))
    }

    /// [`SessionTable::remove_dormant`] on its task.
    async fn forget_dormant(&self, id: &str) -> Result<Option<Value>, ApiError> {
        let _one = self.reopening.lock().await;
        let Some((key, d)) = lock(&self.dormant).remove_entry(id) else {
            return Ok(None);
        };
        if let Some(journal) = self.engine.journal()
            && let Err(e) = journal
                .write(vec![crate::journal::Write::ForgetSession {
                    id: id.to_string(),
                }])
                .await
        {
            lock(&self.dormant).insert(key, d);
            return Err(ApiError::Internal(format!(
                "the journal cannot forget session `{id}`: {e}"
            )));
        }
        self.dormant_count
            .store(lock(&self.dormant).len(), Ordering::Release);
        let workspace = self
            .dir_of(id, &d.place)
            .map(|dir| Value::String(dir.to_string_lossy().into_owned()));
        Ok(Some(json!({
            "session_id": id,
            "workspace": workspace,
            "turns": 0,
            "calls": 0,
            "in_flight": 0,
        })))
    }

    /// The session `id`, reopened first if it is dormant (see [`SessionTable::wake`]).
    pub async fn open(self: &Arc<Self>, id: &str) -> Result<Arc<HttpSession>, ApiError> {
        self.wake(id).await?;
        self.get(id)
    }

    /// Records the deferred tools `session` has been shown since it was last recorded (with a
    /// journal), so a restart keeps its catalog.
    pub async fn persist_revealed(&self, session: &HttpSession) {
        let (Some(journal), Some(persisted)) = (self.engine.journal(), &session.persisted) else {
            return;
        };
        let revealed = session.session.revealed();
        let write = {
            let mut p = lock(persisted);
            if revealed.len() <= p.revealed.len() {
                return;
            }
            p.revealed = revealed.iter().map(|n| n.to_string()).collect();
            p.write(&session.id)
        };
        if let Err(e) = journal.write(vec![write]).await {
            tracing::error!(error = %e, "journal: a session's revealed tools were not recorded");
        }
    }

    fn forget(&self, ids: Vec<Arc<str>>) {
        if let (Some(journal), false) = (self.engine.journal(), ids.is_empty()) {
            let journal = journal.clone();
            let cluster = self.cluster.clone();
            let writes = ids
                .iter()
                .map(|id| crate::journal::Write::ForgetSession { id: id.to_string() })
                .collect();
            tokio::spawn(async move {
                let _ = journal.write(writes).await;
                if let Some(cluster) = cluster {
                    for id in ids {
                        cluster.forget(&id).await;
                    }
                }
            });
        }
    }

    /// Opens a session (under id `restore`, when one is reopened) and adds it to the table; with
    /// it, whether this call made its workspace directory. Nothing is made for a session that is
    /// refused.
    async fn create_as(
        &self,
        new: NewSession,
        restore: Option<String>,
        persisted: Option<Persisted>,
    ) -> Result<(Arc<HttpSession>, bool), ApiError> {
        let name = new.workspace.as_deref();
        if let Some(name) = name {
            check_name(name)?;
        }
        let sandbox = narrowed(&self.sandbox, new.sandbox, new.allow_network)?;
        let rules = match &new.policy {
            Some(name) => Some((name.clone(), self.policies.rules(name)?)),
            None => None,
        };
        let delegate = new.tools.is_some().then(|| Arc::new(Delegate::default()));
        let tools = match (&new.tools, &delegate) {
            (Some(defs), Some(delegate)) => client_tools::parse(defs, self.tool_limits, delegate)?,
            _ => Vec::new(),
        };
        let client_tools = tools.iter().map(|t| t.name.clone()).collect();
        self.full()?;
        // Everything that can refuse the session is decided before its workspace directory is
        // made: a refused session leaves nothing behind.
        let mut options = SessionOptions::new().tools(tools);
        if let Some(config) = sandbox {
            options = options.sandbox(config);
        }
        if let Some((name, rules)) = rules {
            options = options.rules(name, rules);
        }
        let prepared = match self.engine.prepare_session(options).await {
            Ok(prepared) => prepared,
            Err(e) => {
                return Err(ApiError::BadRequest(match e {
                    SessionError::Tool(crate::RegistryError::Duplicate(name)) => format!(
                        "client tool `{name}`: the name is taken (by a built-in or MCP tool, or twice in `tools`)"
                    ),
                    SessionError::Tool(crate::RegistryError::BadSchema { name, detail }) => {
                        format!("client tool `{name}`: {detail}")
                    }
                    SessionError::Tool(e) => format!("client tool refused: {e}"),
                    other => format!("cannot open the session: {other}"),
                }));
            }
        };
        // `created`: this request made a fresh (unnamed) directory, and removes it if the
        // session is refused after all (never a named one, nor one that existed before).
        let (id, dir, created) = match (name, restore) {
            // A restored session without a named workspace had a fresh one, named after it.
            (None, Some(id)) => {
                let dir = self.root.join(FRESH_DIR).join(&id);
                if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                    return Err(ApiError::BadRequest(format!(
                        "its workspace {} is gone",
                        dir.display()
                    )));
                }
                (id, dir, false)
            }
            (Some(name), restore) => {
                let dir = self.root.join(name);
                // A named directory this request made stays if the session fails after this
                // point (the table full at the last moment, the lease or journal not recorded):
                // a concurrent create of the same name may already be using it.
                match std::fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        // Only a real directory: never a symlink planted to lead elsewhere.
                        let real_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
                        if !real_dir {
                            return Err(ApiError::BadRequest(format!(
                                "workspace {name:?} exists and is not a directory (a symlink or a file)"
                            )));
                        }
                    }
                    Err(e) => return Err(cannot_create(&dir, &e)),
                }
                (restore.unwrap_or_else(|| self.new_id()), dir, false)
            }
            (None, None) => loop {
                let id = self.new_id();
                let dir = self.root.join(FRESH_DIR).join(&id);
                match std::fs::create_dir(&dir) {
                    Ok(()) => break (id, dir, true),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(cannot_create(&dir, &e)),
                }
            },
        };
        let cleanup = |dir: &Path| {
            if created {
                // Only while empty: a concurrent session of the same name may have begun using it.
                let _ = std::fs::remove_dir(dir);
            }
        };
        let workspace = match Workspace::open(&dir) {
            Ok(ws) => ws.allow_hard_links(self.allow_hard_links),
            Err(e) => {
                cleanup(&dir);
                return Err(ApiError::BadRequest(format!(
                    "cannot open workspace {}: {e}",
                    dir.display()
                )));
            }
        };
        // The engine session has the HTTP session's id: audit lines, hook input, approvals and
        // spans all name the id the client knows.
        let session = self
            .engine
            .open_prepared(prepared.id(id.clone()).workspace(workspace));
        let http = Arc::new(HttpSession {
            id: Arc::from(id.as_str()),
            workspace: dir.clone(),
            epoch: Mutex::new(session.turn_token()),
            session,
            turn_lock: Arc::new(tokio::sync::Mutex::new(())),
            share: Arc::new(tokio::sync::Semaphore::new(self.turn_share)),
            share_size: self.turn_share,
            turn_ids: Arc::new(TurnTable::default()),
            delegate,
            client_tools,
            turns: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_used_ms: AtomicU64::new(self.now_ms()),
            persisted: persisted.map(Mutex::new),
        });
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= self.max {
            drop(sessions);
            cleanup(&dir);
            return Err(ApiError::TooManySessions(self.max, self.max_by));
        }
        sessions.insert(Arc::clone(&http.id), Arc::clone(&http));
        Ok((http, created))
    }

    /// The session `id`, if open (a request naming it counts as use: its idle time restarts).
    pub fn get(&self, id: &str) -> Result<Arc<HttpSession>, ApiError> {
        let session = lock(&self.sessions)
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::UnknownSession(id.to_string()))?;
        session.last_used_ms.store(self.now_ms(), Ordering::Release);
        Ok(session)
    }

    /// The session `id`, counted in flight (so it is not closed as idle) until the guard drops.
    pub fn enter(self: &Arc<Self>, id: &str) -> Result<Entered, ApiError> {
        let sessions = lock(&self.sessions);
        let session = sessions
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::UnknownSession(id.to_string()))?;
        session.in_flight.fetch_add(1, Ordering::AcqRel);
        drop(sessions);
        Ok(Entered {
            session,
            table: Arc::clone(self),
        })
    }

    /// Removes session `id` and cancels its turns (they are still answered).
    pub fn remove(&self, id: &str) -> Result<Arc<HttpSession>, ApiError> {
        let session = lock(&self.sessions)
            .remove(id)
            .ok_or_else(|| ApiError::UnknownSession(id.to_string()))?;
        session.session.cancel();
        self.forget(vec![Arc::clone(&session.id)]);
        Ok(session)
    }

    /// Closes every session with nothing in flight whose last request left more than the idle
    /// timeout ago; returns how many.
    pub fn expire_idle(&self) -> usize {
        let now = self.now_ms();
        let limit = self.idle_timeout.as_millis() as u64;
        let mut sessions = lock(&self.sessions);
        let mut closed = Vec::new();
        sessions.retain(|id, s| {
            let keep = s.in_flight.load(Ordering::Acquire) > 0
                || now.saturating_sub(s.last_used_ms.load(Ordering::Acquire)) <= limit;
            if !keep {
                closed.push(Arc::clone(id));
            }
            keep
        });
        drop(sessions);
        if self.dormant_count.load(Ordering::Acquire) > 0 {
            let mut dormant = lock(&self.dormant);
            dormant.retain(|id, d| {
                let keep = d.reopening || now.saturating_sub(d.last_used_ms) <= limit;
                if !keep {
                    closed.push(Arc::clone(id));
                }
                keep
            });
            self.dormant_count.store(dormant.len(), Ordering::Release);
        }
        let n = closed.len();
        self.forget(closed);
        n
    }

    /// The idle timeout.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }
}

/// "1 session", "8 sessions".
fn sessions_word(n: usize) -> String {
    if n == 1 {
        "1 session".into()
    } else {
        format!("{n} sessions")
    }
}

/// The refusal of a request naming a dormant session whose workspace `dir` is missing (or is
/// not a directory: a symlink is never followed to one).
fn workspace_missing(id: &str, dir: &Path) -> ApiError {
    let what = if std::fs::symlink_metadata(dir).is_ok() {
        "is not a directory (a symlink or a file)"
    } else {
        "does not exist on this server (moved, deleted or not mounted)"
    };
    ApiError::Internal(format!(
        "session `{id}` is kept in the journal, but its workspace {} {what}; nothing ran. Put the directory back and retry (the session is then reopened), or DELETE the session",
        dir.display()
    ))
}

fn cannot_create(dir: &Path, e: &std::io::Error) -> ApiError {
    ApiError::Internal(format!("cannot create workspace {}: {e}", dir.display()))
}

/// A session with one request in flight; the request leaves when this drops.
#[derive(Debug)]
pub struct Entered {
    session: Arc<HttpSession>,
    table: Arc<SessionTable>,
}

impl std::ops::Deref for Entered {
    type Target = HttpSession;
    fn deref(&self) -> &HttpSession {
        &self.session
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.session
            .last_used_ms
            .store(self.table.now_ms(), Ordering::Release);
        self.session.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_plain_component() {
        for good in ["a", "proj-1", "x.y_z", "..a", &"n".repeat(128)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            FRESH_DIR,
            ".",
            "..",
            "a/b",
            "/abs",
            "a b",
            "é",
            "a\0b",
            &"n".repeat(129),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
