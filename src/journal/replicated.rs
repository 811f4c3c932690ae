//! The journal of a cluster: the same records as the embedded store, kept in a NATS JetStream
//! stream replicated across the NATS servers, so that the node that takes a session over after
//! its owner died answers retried calls as the owner would have.
//!
//! **Layout.** One stream per shard (`--cluster-journal-shards`, default 1: `SWITCHBOARD_JOURNAL`,
//! then `SWITCHBOARD_JOURNAL_1`, …, subjects `sbj.>`, `sbj1.>`, …; file storage, `R` replicas,
//! messages older than the retention dropped). Session `S` lives in shard FNV-1a(`S`) mod N:
//! every record of it is a message on subject `sbj.S` (`sbj<k>.S` in shard `k`); a message
//! carries one batch of [`Write`]s and the owner's lease epoch. A session's state is the replay
//! of its subject, read through the stream's leader, and must begin with a snapshot mark.
//!
//! **Fencing.** Every publish carries `Nats-Expected-Last-Subject-Sequence`: the sequence of the
//! last message this node wrote (or read) on the session's subject. A node that claims the
//! session writes a `claim` message first, so the old owner's next write finds the subject moved
//! on and is refused by the stream itself ([`JournalError::Fenced`]) — whatever the old owner
//! believes about its lease. Writes of one session are serialised (each needs the sequence the
//! previous one got) and grouped: writes that arrive while one publish is in flight go out
//! together in the next.
//!
//! **Records of any size.** A message larger than the NATS servers' payload limit (1 MiB by
//! default) is published as consecutive parts (header `Switchboard-Part: k/n`), each fenced on
//! the one before; a reader puts the parts of one message together and ignores an incomplete
//! run of parts (its write was never acknowledged, so nothing it held left the engine).
//!
//! **Sessions never age out while they live.** The stream drops messages older than the
//! retention. So that a session idle for longer keeps its records (and its owner's next write is
//! not refused because the subject emptied), the owner re-publishes each session it holds as one
//! snapshot message at least every quarter of the retention and purges the messages before it:
//! the session's record, every intent, every answer younger than the retention and a tombstone
//! (argument digest, outcome, whether it ran) of every older one. A session that no live node
//! holds for the whole retention (its owner died and no request came since) is dropped with it.
//!
//! **Memory.** The owner keeps the call records of the sessions it holds (read at claim time,
//! then written through), so a lookup never waits for the network; answers older than the
//! retention are kept as tombstones only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use serde::{Deserialize, Serialize};

use super::lease::{Lease, Leases};
use super::{CallRecord, FlushCounts, JournalError, StoredBlock, Write, now_ms};
use crate::metrics::{JournalMetrics, ReplicatedMetrics};

/// Default stream name.
pub const STREAM: &str = "SWITCHBOARD_JOURNAL";
/// Subject prefix of the stream.
const PREFIX: &str = "sbj";
/// How many times a claim re-reads a subject that moved under it before giving up.
const CLAIM_TRIES: usize = 5;
/// How long a read or write is retried while the stream has no leader.
const SETTLE: Duration = Duration::from_secs(8);
/// How long opening the stream is retried at start-up.
const OPEN_SETTLE: Duration = Duration::from_secs(30);
/// The header of one part of a message published in parts: `k/n`.
const PART_HEADER: &str = "Switchboard-Part";
/// Room left in a message for its headers when a payload is cut into parts.
const PART_HEADROOM: usize = 8 * 1024;

/// One record inside a message.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    /// A call's record.
    Call { id: String, record: Box<CallRecord> },
    /// The session's own record (the front end's bytes, JSON).
    Session { record: String },
    /// The session was closed for good: nothing before this counts.
    Forget,
    /// A node took the session over at this message's epoch.
    Claim { node: String },
    /// The start of a snapshot: nothing before this counts (the entries after it hold all of
    /// the session's state).
    Snapshot,
}

/// One message on a session's subject.
#[derive(Debug, Serialize, Deserialize)]
struct Message {
    epoch: u64,
    entries: Vec<Entry>,
}

/// Answered calls' records one session keeps in memory, at most (beyond, the oldest are read
/// back from the stream when asked for).
const SESSION_ANSWERS: usize = 1024;
/// Bytes of answered calls' records one session keeps in memory, at most.
const SESSION_BYTES: usize = 8 << 20;
/// Bytes of answered records a node's journal keeps in memory by default (`--cluster-journal-memory`).
pub const DEFAULT_MEMORY: usize = 256 << 20;
/// What a record costs in memory beyond its strings (map entry, allocations), roughly.
const RECORD_OVERHEAD: usize = 512;

/// The memory a record of call `id` takes, roughly.
fn record_bytes(id: &str, record: &CallRecord) -> usize {
    let answer = record.answer.as_ref().map_or(0, |a| {
        a.id.len()
            + a.tool.len()
            + a.content.len()
            + a.error.as_ref().map_or(0, String::len)
            + a.blocks.as_ref().map_or(0, |blocks| {
                blocks
                    .iter()
                    .map(|b| match b {
                        StoredBlock::Text(t) => t.len(),
                        StoredBlock::Image(m, d) | StoredBlock::ToolReference(m, d) => {
                            m.len() + d.len()
                        }
                    })
                    .sum()
            })
    });
    RECORD_OVERHEAD
        + id.len()
        + record.tool.len()
        + record.digest.len()
        + record.effect.len()
        + answer
}

/// The 64-bit hash an id let go of is remembered by.
fn id_hash(id: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = foldhash::quality::FixedState::with_seed(0x1d5).build_hasher();
    h.write(id.as_bytes());
    h.finish()
}

/// A session's call records in memory: every intent, answers up to a bound (per session, and the
/// node's [`Replicated::memory_budget`] over all sessions), and the hashes of the ids whose
/// records were let go of — those are read from the stream when asked for.
#[derive(Debug, Default)]
struct Calls {
    map: HashMap<String, CallRecord>,
    /// How many records of `map` are answered (or tombstones), and their bytes.
    answered: usize,
    bytes: usize,
    /// Ids (hashed) whose answered records are in the stream only.
    evicted: std::collections::HashSet<u64>,
}

impl Calls {
    fn get(&self, id: &str) -> Option<&CallRecord> {
        self.map.get(id)
    }

    /// Whether call `id`'s record may be in the stream though not here.
    fn let_go_of(&self, id: &str) -> bool {
        !self.evicted.is_empty() && self.evicted.contains(&id_hash(id))
    }

    fn account(&mut self, id: &str, record: &CallRecord, add: bool) {
        if record.answer.is_none() && record.dropped.is_none() {
            return;
        }
        let bytes = record_bytes(id, record);
        if add {
            self.answered += 1;
            self.bytes += bytes;
        } else {
            self.answered -= 1;
            self.bytes -= bytes;
        }
    }

    fn insert(&mut self, id: String, record: CallRecord) {
        self.account(&id, &record, true);
        if !self.evicted.is_empty() {
            self.evicted.remove(&id_hash(&id));
        }
        if let Some(old) = self.map.insert(id.clone(), record) {
            self.account(&id, &old, false);
        }
    }

    fn clear(&mut self) {
        *self = Calls::default();
    }

    /// Turns the answers older than `cutoff` (journal clock) into tombstones.
    fn tombstone_older_than(&mut self, cutoff: u64) {
        let old: Vec<String> = self
            .map
            .iter()
            .filter(|(_, r)| r.at_ms < cutoff && r.answer.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        for id in old {
            if let Some(tomb) = self.map.get(&id).and_then(CallRecord::tombstone) {
                self.insert(id, tomb);
            }
        }
    }

    /// Lets go of the oldest answered records until at most `answers` and `bytes` are left;
    /// the bytes let go of.
    fn shed(&mut self, answers: usize, bytes: usize) -> usize {
        if self.answered <= answers && self.bytes <= bytes {
            return 0;
        }
        let mut done: Vec<(u64, String)> = self
            .map
            .iter()
            .filter(|(_, r)| r.answer.is_some() || r.dropped.is_some())
            .map(|(id, r)| (r.at_ms, id.clone()))
            .collect();
        done.sort_unstable();
        let before = self.bytes;
        for (_, id) in done {
            if self.answered <= answers && self.bytes <= bytes {
                break;
            }
            if let Some(record) = self.map.remove(&id) {
                self.account(&id, &record, false);
                self.evicted.insert(id_hash(&id));
            }
        }
        before - self.bytes
    }

    /// Holds the per-session bound, letting go down to three quarters of it when over.
    fn bound(&mut self) {
        if self.answered > SESSION_ANSWERS || self.bytes > SESSION_BYTES {
            self.shed(SESSION_ANSWERS / 4 * 3, SESSION_BYTES / 4 * 3);
        }
    }
}

/// What this node knows of a session it owns.
#[derive(Debug, Default)]
struct State {
    /// The highest epoch read on the session's subject (a claim must be above it).
    epoch: u64,
    /// Sequence of the last message on the session's subject (0: none).
    last_seq: u64,
    calls: Calls,
    record: Option<String>,
    /// Its lease was lost and a write was refused for it: told to `on_fenced` once.
    fenced: bool,
    /// When this node last published a snapshot of the session (`None`: never, so its oldest
    /// message may be near the age limit).
    snapshot_at: Option<Instant>,
    /// Created here and nothing written yet: its first message begins its history (it starts
    /// with a snapshot mark).
    first: bool,
}

impl State {
    /// What one entry of a message changes, the same when a message is written here and when it
    /// is read back: a call's record, the session's record, or a fresh start (`forget`: closed
    /// for good; `snapshot`: the entries after it hold everything).
    fn apply(&mut self, entry: Entry) {
        match entry {
            Entry::Call { id, record } => self.calls.insert(id, *record),
            Entry::Session { record } => self.record = Some(record),
            Entry::Forget | Entry::Snapshot => {
                self.calls.clear();
                self.record = None;
            }
            Entry::Claim { .. } => {}
        }
    }
}

type Waiter = tokio::sync::oneshot::Sender<Result<(), JournalError>>;

/// One owned session: its lease, its state, and the writes waiting for the next publish.
#[derive(Debug)]
struct Log {
    /// Every write is made at this lease's epoch; none once it is lost.
    lease: Arc<Lease>,
    state: Mutex<State>,
    pending: Mutex<Vec<(Vec<Entry>, Waiter)>>,
    /// Held while a publish is in flight.
    publishing: tokio::sync::Mutex<()>,
}

impl Log {
    fn new(lease: Arc<Lease>, state: State) -> Log {
        Log {
            lease,
            state: Mutex::new(state),
            pending: Mutex::new(Vec::new()),
            publishing: tokio::sync::Mutex::new(()),
        }
    }
}

/// What happened to the session a claim asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// Claimed: the session's record (the front end's bytes).
    Session(Vec<u8>),
    /// The journal holds no live session of that id.
    Unknown,
}

/// The replicated journal of one node.
pub struct Replicated {
    js: jetstream::Context,
    /// The journal's streams (its shards): session `S`'s records are in `streams[shard_of(S)]`.
    streams: Vec<jetstream::stream::Stream>,
    stream_name: String,
    node: String,
    retention: Duration,
    /// Largest payload of one message (the servers' limit less room for headers).
    part_size: usize,
    /// This run of the node (in every message id), and the number of its next write.
    run: String,
    writes: std::sync::atomic::AtomicU64,
    /// The sessions this node wrote or claimed (those whose lease was lost go at the next
    /// snapshot pass).
    logs: Mutex<HashMap<String, Arc<Log>>>,
    /// This node's leases (shared with the cluster): the journal writes only under a held one.
    leases: Arc<Leases>,
    /// Bytes of answered records all sessions may keep in memory ([`Replicated::memory_budget`]),
    /// and about how many they keep (exact after each time the budget was exceeded).
    memory_budget: usize,
    memory: std::sync::atomic::AtomicUsize,
    replicated_metrics: ReplicatedMetrics,
    counts: Arc<Mutex<FlushCounts>>,
    metrics: JournalMetrics,
    closed: AtomicBool,
    /// Told the id of each session whose write was refused (the front end drops it).
    on_fenced: Box<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for Replicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicated")
            .field("stream", &self.stream_name)
            .field("node", &self.node)
            .finish()
    }
}

fn nats_error(
    stream: &str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> JournalError {
    let e = e.into();
    JournalError::Io {
        file: std::path::PathBuf::from(format!("nats:{stream}")),
        detail: e.to_string(),
        source: Some(std::sync::Arc::from(e)),
    }
}

/// The subject of session `id`'s records in journal shard `shard` (shard 0's is `sbj.<id>`, as
/// before there were shards; shard `k`'s `sbj<k>.<id>`).
fn subject(shard: usize, id: &str) -> String {
    match shard {
        0 => format!("{PREFIX}.{id}"),
        k => format!("{PREFIX}{k}.{id}"),
    }
}

/// The name of journal shard `shard`'s stream (`name`, then `name_1`, `name_2`, …).
fn shard_stream(name: &str, shard: usize) -> String {
    match shard {
        0 => name.to_string(),
        k => format!("{name}_{k}"),
    }
}

/// Session `id`'s shard among `shards`: FNV-1a of the id (stable across nodes and versions).
fn shard_of(id: &str, shards: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % shards.max(1) as u64) as usize
}

/// Whether `id` can be a subject token (session ids are `[A-Za-z0-9_-]`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The streams a replicated journal is kept in.
#[derive(Debug, Clone)]
pub struct Streams<'a> {
    /// The first stream's name (the others: `name_1`, …).
    pub name: &'a str,
    /// How many streams sessions are spread over.
    pub shards: usize,
    /// Replicas of each stream.
    pub replicas: usize,
    /// How long messages are kept.
    pub retention: Duration,
}

impl Replicated {
    /// Opens (creating if missing) the streams of the journal `streams` for node `node`, writing
    /// under the node's `leases`; `on_fenced` is told each session whose write was refused.
    pub async fn open(
        js: jetstream::Context,
        streams: Streams<'_>,
        node: &str,
        leases: Arc<Leases>,
        on_fenced: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Result<Replicated, JournalError> {
        let Streams {
            name,
            shards,
            replicas,
            retention,
        } = streams;
        let mut streams = Vec::with_capacity(shards.max(1));
        for shard in 0..shards.max(1) {
            let stream_name = shard_stream(name, shard);
            let config = jetstream::stream::Config {
                name: stream_name.clone(),
                subjects: vec![subject(shard, ">")],
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas,
                max_age: retention,
                allow_direct: true,
                ..Default::default()
            };
            // Retried for a while: a stream or its leader may be in the making (another node
            // created it a moment ago, a fresh NATS cluster is still placing streams, or a
            // server just restarted).
            let started = Instant::now();
            let stream = loop {
                match js.get_or_create_stream(config.clone()).await {
                    Ok(stream) => break stream,
                    Err(e) if started.elapsed() >= OPEN_SETTLE => {
                        return Err(nats_error(
                            &stream_name,
                            format!("cannot open the stream: {e}"),
                        ));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            };
            streams.push(stream);
        }
        // The stream's age limit is the cluster's retention: the first node set it; a node
        // asking for another follows it (its snapshots must come before messages age out).
        let kept = streams[0].cached_info().config.max_age;
        let asked = retention;
        let retention = if kept.is_zero() { retention } else { kept };
        if retention != asked {
            tracing::info!(
                stream = %name,
                retention = %humantime::format_duration(retention),
                "journal: the stream keeps records for the cluster's retention, not this node's"
            );
        }
        let part_size = js
            .client()
            .server_info()
            .max_payload
            .saturating_sub(PART_HEADROOM)
            .max(PART_HEADROOM);
        Ok(Replicated {
            js,
            streams,
            stream_name: name.to_string(),
            node: node.to_string(),
            retention,
            part_size,
            run: format!("{:x}{:x}", now_ms(), std::process::id()),
            writes: std::sync::atomic::AtomicU64::new(0),
            logs: Mutex::new(HashMap::new()),
            leases,
            memory_budget: DEFAULT_MEMORY,
            memory: std::sync::atomic::AtomicUsize::new(0),
            replicated_metrics: ReplicatedMetrics::new(),
            counts: Arc::new(Mutex::new(FlushCounts::default())),
            metrics: JournalMetrics::new(),
            closed: AtomicBool::new(false),
            on_fenced,
        })
    }

    /// Session `id`'s shard.
    fn shard(&self, id: &str) -> usize {
        shard_of(id, self.streams.len())
    }

    /// The stream holding session `id`'s records.
    fn stream_of(&self, id: &str) -> &jetstream::stream::Stream {
        &self.streams[self.shard(id)]
    }

    /// The subject of session `id`'s records.
    fn subject_of(&self, id: &str) -> String {
        subject(self.shard(id), id)
    }

    /// How many streams the journal is spread over.
    pub fn shards(&self) -> usize {
        self.streams.len()
    }

    /// The (first) stream's name.
    pub fn stream_name(&self) -> &str {
        &self.stream_name
    }

    /// How long records are kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    pub(super) fn counts(&self) -> &Mutex<FlushCounts> {
        &self.counts
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// The same journal, keeping at most `bytes` of answered calls' records in memory over all
    /// the sessions it holds (each session at most 1,024 of them and 8 MiB); the others are
    /// read back from the stream when a call's copy asks for them.
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// Starts the journal of a session created here under `lease` (epoch 1; its subject must be
    /// empty: the first write is refused otherwise).
    pub fn start(&self, id: &str, lease: Arc<Lease>) {
        let state = State {
            epoch: lease.epoch(),
            snapshot_at: Some(Instant::now()),
            first: true,
            ..State::default()
        };
        lock(&self.logs).insert(id.to_string(), Arc::new(Log::new(lease, state)));
    }

    /// Reads session `id`'s records and takes it over under `lease` (granted at the session's
    /// new epoch): writes a claim message fenced on the last one read, so that the previous
    /// owner can write nothing more. [`Claimed::Unknown`] when the journal holds no session of
    /// that id (never created, or closed for good).
    pub async fn claim(&self, id: &str, lease: Arc<Lease>) -> Result<Claimed, JournalError> {
        if !valid_id(id) {
            return Ok(Claimed::Unknown);
        }
        let epoch = lease.epoch();
        for _ in 0..CLAIM_TRIES {
            if lease.lost() {
                return Err(JournalError::Fenced {
                    session: id.to_string(),
                });
            }
            let state = self.replay(id).await?;
            let Some(record) = state.record.clone() else {
                return Ok(Claimed::Unknown);
            };
            if state.epoch >= epoch {
                // A later owner claimed it already: the caller's lease is stale.
                return Err(JournalError::Fenced {
                    session: id.to_string(),
                });
            }
            let message = Message {
                epoch,
                entries: vec![Entry::Claim {
                    node: self.node.clone(),
                }],
            };
            let mut seq = state.last_seq;
            match self.publish(id, &message, &mut seq).await {
                Ok(_) => {
                    // Its older messages may be near the age limit: snapshot it soon.
                    let mut state = State {
                        epoch,
                        last_seq: seq,
                        snapshot_at: None,
                        ..state
                    };
                    state.calls.bound();
                    let bytes = state.calls.bytes;
                    lock(&self.logs).insert(id.to_string(), Arc::new(Log::new(lease, state)));
                    self.grew(bytes as isize);
                    return Ok(Claimed::Session(record.into_bytes()));
                }
                // The old owner wrote meanwhile: read again.
                Err(JournalError::Fenced { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(nats_error(
            &self.stream_name,
            format!(
                "session {id}: its journal kept moving while it was claimed ({CLAIM_TRIES} tries)"
            ),
        ))
    }

    /// Session `id`'s state, read from its subject.
    async fn replay(&self, id: &str) -> Result<State, JournalError> {
        let subject = self.subject_of(id);
        let stream = self.stream_of(id);
        let mut state = State::default();
        let mut next = 1u64;
        let mut since_answer = Instant::now();
        // The parts read so far of a message published in parts, and the next part's number.
        let mut parts: Vec<u8> = Vec::new();
        let mut next_part = 1usize;
        // Whether a message was read, and whether the history read starts with a snapshot.
        let mut read_any = false;
        let mut whole = false;
        loop {
            let got = stream
                .raw_message_builder()
                .sequence(next)
                .next_by_subject(subject.clone())
                .send()
                .await;
            let got = match got {
                Err(e)
                    if e.kind()
                        != async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound
                        && since_answer.elapsed() < SETTLE =>
                {
                    // No stream leader for a moment (a NATS server died): ask again.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                other => other,
            };
            since_answer = Instant::now();
            let message = match got {
                Ok(m) => m,
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
                {
                    break;
                }
                Err(e) => {
                    return Err(nats_error(
                        &self.stream_name,
                        format!("cannot read session {id}: {e}"),
                    ));
                }
            };
            next = message.sequence + 1;
            state.last_seq = message.sequence;
            let part = message
                .headers
                .get(PART_HEADER)
                .and_then(|v| parse_part(v.as_str()));
            let payload: axum::body::Bytes = match part {
                None => {
                    if !parts.is_empty() {
                        tracing::warn!(session = %id, seq = message.sequence, "journal: an incomplete record in parts ignored (its write was never acknowledged)");
                        parts.clear();
                        next_part = 1;
                    }
                    message.payload
                }
                Some((k, n)) => {
                    if k == 1 {
                        parts.clear();
                        next_part = 1;
                    }
                    if k != next_part {
                        tracing::warn!(session = %id, seq = message.sequence, "journal: a record part out of order ignored");
                        parts.clear();
                        next_part = 1;
                        continue;
                    }
                    parts.extend_from_slice(&message.payload);
                    if k < n {
                        next_part += 1;
                        continue;
                    }
                    next_part = 1;
                    std::mem::take(&mut parts).into()
                }
            };
            let Ok(decoded) = serde_json::from_slice::<Message>(&payload) else {
                tracing::warn!(session = %id, seq = message.sequence, "journal: a record does not decode; skipped");
                continue;
            };
            state.epoch = state.epoch.max(decoded.epoch);
            // A session's history begins with a snapshot (its first message carries one, and so
            // does every re-publication): one that does not has lost its beginning to the age
            // limit (its owner died and nobody held it since), and what is left must not pass
            // for the whole of it — a late retry of a call whose record aged out would run again.
            if !read_any {
                read_any = true;
                whole = matches!(decoded.entries.first(), Some(Entry::Snapshot));
            }
            for entry in decoded.entries {
                whole |= matches!(entry, Entry::Snapshot);
                state.apply(entry);
            }
        }
        if read_any && !whole && state.record.is_some() {
            tracing::warn!(session = %id, "journal: the session's first records aged out (no node held it for the whole retention); it is dropped");
            state.calls.clear();
            state.record = None;
        }
        Ok(state)
    }

    /// Publishes `message` on session `id`'s subject, expecting `*last_seq` to be the last
    /// message there, and sets `*last_seq` to the last message written (also when a later part
    /// of a message in parts failed: this node's next write follows it). The sequence of the
    /// message's first part, or [`JournalError::Fenced`] if the subject moved on.
    async fn publish(
        &self,
        id: &str,
        message: &Message,
        last_seq: &mut u64,
    ) -> Result<u64, JournalError> {
        let payload = serde_json::to_vec(message).map_err(|e| nats_error(&self.stream_name, e))?;
        let started = Instant::now();
        let outcome = if payload.len() <= self.part_size {
            self.publish_one(id, message.epoch, payload, None, *last_seq)
                .await
                .inspect(|&seq| *last_seq = seq)
        } else {
            let n = payload.len().div_ceil(self.part_size);
            let mut first = None;
            let mut outcome = Ok(0);
            for (k, part) in payload.chunks(self.part_size).enumerate() {
                match self
                    .publish_one(
                        id,
                        message.epoch,
                        part.to_vec(),
                        Some((k + 1, n)),
                        *last_seq,
                    )
                    .await
                {
                    Ok(seq) => {
                        *last_seq = seq;
                        first.get_or_insert(seq);
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            outcome.map(|_| first.unwrap_or(*last_seq))
        };
        let records = message.entries.len();
        self.metrics.flush(records, started.elapsed());
        lock(&self.counts).add(records, started.elapsed());
        outcome
    }

    /// Publishes one message (`part`: its number and the number of parts, for a message in
    /// parts), expecting `last_seq` to be the last message on the subject; its sequence.
    async fn publish_one(
        &self,
        id: &str,
        epoch: u64,
        payload: Vec<u8>,
        part: Option<(usize, usize)>,
        last_seq: u64,
    ) -> Result<u64, JournalError> {
        let payload = axum::body::Bytes::from(payload);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            last_seq.to_string().as_str(),
        );
        // The same id for every try of this write, and for no other write (this run's own
        // number, counted per write): a try whose acknowledgement was lost is acknowledged
        // again as a duplicate, not refused as a moved subject; another write is never taken
        // for a duplicate of it (its payload would be dropped without a word).
        let write = self.writes.fetch_add(1, Ordering::Relaxed);
        let message_id = format!("{}.{}.{id}.{epoch}.{last_seq}.{write}", self.node, self.run);
        headers.insert(async_nats::header::NATS_MESSAGE_ID, message_id.as_str());
        if let Some((k, n)) = part {
            headers.insert(PART_HEADER, format!("{k}/{n}").as_str());
        }
        let started = Instant::now();
        let ack = loop {
            let sent = self
                .js
                .publish_with_headers(self.subject_of(id), headers.clone(), payload.clone())
                .await;
            let ack = match sent {
                Ok(pending) => pending.await,
                Err(e) => Err(e),
            };
            match ack {
                Err(e)
                    if e.kind() != jetstream::context::PublishErrorKind::WrongLastSequence
                        && started.elapsed() < SETTLE =>
                {
                    // No stream leader for a moment (a NATS server died): send again.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => break other,
            }
        };
        match ack {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                Err(JournalError::Fenced {
                    session: id.to_string(),
                })
            }
            // No acknowledgement came, but the write may have been stored all the same (its
            // acknowledgement lost): the subject's last message, read through the stream's
            // leader, says so — an answer that was stored is not told "not recorded".
            Err(e) => match self
                .stream_of(id)
                .get_last_raw_message_by_subject(&self.subject_of(id))
                .await
            {
                Ok(last)
                    if last
                        .headers
                        .get(async_nats::header::NATS_MESSAGE_ID)
                        .is_some_and(|v| v.as_str() == message_id) =>
                {
                    Ok(last.sequence)
                }
                _ => Err(nats_error(&self.stream_name, e)),
            },
        }
    }

    /// The records of calls `ids` of session `id`: from memory, or read from the stream for
    /// those this node let go of from memory.
    pub async fn lookup(
        &self,
        session: &str,
        ids: &[&str],
    ) -> Result<Vec<Option<CallRecord>>, JournalError> {
        let Some(log) = lock(&self.logs)
            .get(session)
            .filter(|log| !log.lease.lost())
            .cloned()
        else {
            return Ok(vec![None; ids.len()]);
        };
        let (mut out, missing) = {
            let state = lock(&log.state);
            let out: Vec<Option<CallRecord>> =
                ids.iter().map(|id| state.calls.get(id).cloned()).collect();
            let missing: Vec<usize> = (0..ids.len())
                .filter(|&i| out[i].is_none() && state.calls.let_go_of(ids[i]))
                .collect();
            (out, missing)
        };
        if missing.is_empty() {
            return Ok(out);
        }
        self.replicated_metrics.stream_read();
        let stored = self.replay(session).await?;
        for i in missing {
            out[i] = stored.calls.get(ids[i]).cloned();
        }
        Ok(out)
    }

    /// Counts `bytes` more of answers in memory; over the node's budget, sessions let go of
    /// their answered records (the oldest first within each) until the node is at three
    /// quarters of it.
    fn grew(&self, bytes: isize) {
        let total = match self
            .memory
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                Some(m.saturating_add_signed(bytes))
            }) {
            Ok(before) | Err(before) => before.saturating_add_signed(bytes),
        };
        if total <= self.memory_budget {
            self.replicated_metrics.memory(total);
            return;
        }
        let logs: Vec<Arc<Log>> = lock(&self.logs).values().cloned().collect();
        let mut exact: usize = logs.iter().map(|l| lock(&l.state).calls.bytes).sum();
        let target = self.memory_budget / 4 * 3;
        for log in &logs {
            if exact <= target {
                break;
            }
            let mut s = lock(&log.state);
            let over = exact - target;
            let keep = s.calls.bytes.saturating_sub(over);
            exact -= s.calls.shed(usize::MAX, keep);
        }
        self.memory.store(exact, Ordering::Release);
        self.replicated_metrics.memory(exact);
    }

    /// Makes `writes` durable: one fenced publish per session, each carrying every write of that
    /// session waiting at the time.
    pub async fn write(&self, writes: Vec<Write>) -> Result<(), JournalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        let mut by_session: Vec<(String, Vec<Entry>)> = Vec::new();
        for write in writes {
            let (session, entry) = match write {
                Write::Call {
                    session,
                    id,
                    record,
                } => (
                    session.to_string(),
                    Entry::Call {
                        id: id.to_string(),
                        record,
                    },
                ),
                Write::Session { id, bytes } => (
                    id,
                    Entry::Session {
                        record: String::from_utf8_lossy(&bytes).into_owned(),
                    },
                ),
                Write::ForgetSession { id } => (id, Entry::Forget),
            };
            match by_session.iter_mut().find(|(s, _)| *s == session) {
                Some((_, entries)) => entries.push(entry),
                None => by_session.push((session, vec![entry])),
            }
        }
        let results = futures::future::join_all(
            by_session
                .into_iter()
                .map(|(session, entries)| self.write_session(session, entries)),
        )
        .await;
        results.into_iter().collect()
    }

    async fn write_session(
        &self,
        session: String,
        entries: Vec<Entry>,
    ) -> Result<(), JournalError> {
        let fenced = || JournalError::Fenced {
            session: session.clone(),
        };
        let Some(log) = lock(&self.logs).get(&session).cloned() else {
            return Err(fenced());
        };
        if log.lease.lost() {
            // Let go here (another node took it, or this node fenced itself): refused as the
            // stream would refuse it.
            return Err(self.refused(&session, &log, fenced()));
        }
        let forget = entries.iter().any(|e| matches!(e, Entry::Forget));
        let (done, wait) = tokio::sync::oneshot::channel();
        lock(&log.pending).push((entries, done));
        {
            let _publishing = log.publishing.lock().await;
            let batch = std::mem::take(&mut *lock(&log.pending));
            if !batch.is_empty() {
                self.flush(&session, &log, batch).await;
            }
        }
        let outcome = wait.await.unwrap_or(Err(JournalError::Closed));
        if forget && outcome.is_ok() {
            lock(&self.logs).remove(&session);
            if let Err(e) = self
                .stream_of(&session)
                .purge()
                .filter(self.subject_of(&session))
                .await
            {
                tracing::warn!(session = %session, error = %e, "journal: a closed session's records were not purged (the age limit will drop them)");
            }
        }
        outcome
    }

    /// One publish carrying `batch`; tells each waiter the outcome.
    async fn flush(&self, session: &str, log: &Log, batch: Vec<(Vec<Entry>, Waiter)>) {
        let epoch = log.lease.epoch();
        let fenced = log.lease.lost();
        let (mut last_seq, first) = {
            let s = lock(&log.state);
            (s.last_seq, s.first)
        };
        let (entries, waiters): (Vec<Vec<Entry>>, Vec<Waiter>) = batch.into_iter().unzip();
        // A new session's first message begins its history.
        let mark = first.then_some(Entry::Snapshot);
        let message = Message {
            epoch,
            entries: mark
                .into_iter()
                .chain(entries.into_iter().flatten())
                .collect(),
        };
        let outcome = if fenced {
            Err(JournalError::Fenced {
                session: session.to_string(),
            })
        } else {
            let outcome = self.publish(session, &message, &mut last_seq).await;
            lock(&log.state).last_seq = last_seq;
            outcome
        };
        let outcome = match outcome {
            Ok(_) => {
                let grew = {
                    let mut s = lock(&log.state);
                    s.first = false;
                    let before = s.calls.bytes;
                    for entry in message.entries {
                        s.apply(entry);
                    }
                    s.calls.bound();
                    s.calls.bytes as isize - before as isize
                };
                self.grew(grew);
                Ok(())
            }
            Err(e) => Err(self.refused(session, log, e)),
        };
        for waiter in waiters {
            let _ = waiter.send(outcome.clone());
        }
    }

    /// `e`, after letting session `id`'s lease go when it is the stream's refusal (another
    /// node claimed it) or the lease was lost already; the first refusal under a lease is told
    /// to `on_fenced`, unless this node holds the session again under a newer lease (which an
    /// old write's refusal must not tear down).
    fn refused(&self, session: &str, log: &Log, e: JournalError) -> JournalError {
        if matches!(e, JournalError::Fenced { .. }) {
            self.leases.lose_lease(session, &log.lease);
            let first = !std::mem::replace(&mut lock(&log.state).fenced, true);
            if first && self.leases.get(session).is_none() {
                tracing::warn!(session = %session, node = %self.node, "journal: refused, another node owns the session now");
                (self.on_fenced)(session);
            }
        }
        e
    }

    /// How often a held session is re-published as a snapshot: a quarter of the retention.
    fn snapshot_every(&self) -> Duration {
        self.retention / 4
    }

    /// Re-publishes session `id` (held here) as one snapshot message — answers older than the
    /// retention as tombstones — and purges its messages before it. False when there was
    /// nothing to do (not held here, fenced, closed, or not yet recorded).
    pub async fn snapshot(&self, id: &str) -> Result<bool, JournalError> {
        let Some(log) = lock(&self.logs).get(id).cloned() else {
            return Ok(false);
        };
        let _publishing = log.publishing.lock().await;
        let cutoff = now_ms().saturating_sub(self.retention.as_millis() as u64);
        // The records this node let go of from memory are in the stream: a snapshot holds them
        // too, read while no write of this node can come between (the publish lock is held).
        // Records let go of after that read (the node's budget, for another session's write)
        // were published before it, so the read holds them.
        let mut stored: Option<Calls> = None;
        let (message, mut last_seq) = loop {
            if stored.is_none() && !lock(&log.state).calls.evicted.is_empty() {
                stored = Some(self.replay(id).await?.calls);
            }
            let mut s = lock(&log.state);
            if stored.is_none() && !s.calls.evicted.is_empty() {
                continue;
            }
            let Some(record) = s.record.clone().filter(|_| !log.lease.lost()) else {
                return Ok(false);
            };
            s.calls.tombstone_older_than(cutoff);
            let mut entries = Vec::with_capacity(s.calls.map.len() + 2);
            entries.push(Entry::Snapshot);
            entries.push(Entry::Session { record });
            entries.extend(s.calls.map.iter().map(|(id, record)| Entry::Call {
                id: id.clone(),
                record: Box::new(record.clone()),
            }));
            if let Some(stored) = stored.as_mut() {
                stored.tombstone_older_than(cutoff);
                entries.extend(
                    std::mem::take(&mut stored.map)
                        .into_iter()
                        .filter(|(id, _)| !s.calls.map.contains_key(id) && s.calls.let_go_of(id))
                        .map(|(id, record)| Entry::Call {
                            id,
                            record: Box::new(record),
                        }),
                );
            }
            break (
                Message {
                    epoch: log.lease.epoch(),
                    entries,
                },
                s.last_seq,
            );
        };
        let outcome = self.publish(id, &message, &mut last_seq).await;
        {
            let mut s = lock(&log.state);
            s.last_seq = last_seq;
            if outcome.is_ok() {
                s.snapshot_at = Some(Instant::now());
            }
        }
        let first = outcome.map_err(|e| self.refused(id, &log, e))?;
        // What came before the snapshot is in it: drop it (the age limit would, later).
        if let Err(e) = self
            .stream_of(id)
            .purge()
            .filter(self.subject_of(id))
            .sequence(first)
            .await
        {
            tracing::warn!(session = %id, error = %e, "journal: the records before a snapshot were not purged (the age limit will drop them)");
        }
        Ok(true)
    }

    /// Snapshots every held session whose last snapshot is older than a quarter of the
    /// retention (or that has none since this node took it); how many were written.
    pub async fn snapshot_due(&self) -> usize {
        let every = self.snapshot_every();
        // Sessions whose lease was lost are another node's now (or closed): their records
        // stay in the stream, not here.
        let mut freed = 0;
        lock(&self.logs).retain(|_, log| {
            let keep = !log.lease.lost();
            if !keep {
                freed += lock(&log.state).calls.bytes;
            }
            keep
        });
        if freed > 0 {
            self.grew(-(freed as isize));
        }
        let due: Vec<String> = lock(&self.logs)
            .iter()
            .filter(|(_, log)| {
                lock(&log.state)
                    .snapshot_at
                    .is_none_or(|at| at.elapsed() >= every)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut written = 0;
        for id in due {
            if self.closed.load(Ordering::Acquire) {
                break;
            }
            match self.snapshot(&id).await {
                Ok(true) => written += 1,
                Ok(false) | Err(JournalError::Fenced { .. }) => {}
                Err(e) => {
                    tracing::warn!(session = %id, error = %e, "journal: a session's snapshot was not written (tried again later)")
                }
            }
        }
        written
    }

    /// Starts the task that keeps held sessions from ageing out ([`Replicated::snapshot_due`]),
    /// until the journal closes or is dropped.
    pub fn spawn_snapshots(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let tick =
            (self.snapshot_every() / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(journal) = weak.upgrade() else { break };
                if journal.closed.load(Ordering::Acquire) {
                    break;
                }
                journal.snapshot_due().await;
            }
        });
    }
}

/// `k/n` of a part header, `1 <= k <= n`.
fn parse_part(text: &str) -> Option<(usize, usize)> {
    let (k, n) = text.split_once('/')?;
    let (k, n) = (k.parse().ok()?, n.parse().ok()?);
    (1 <= k && k <= n).then_some((k, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(at_ms: u64, content: &str) -> CallRecord {
        CallRecord {
            tool: "bash".into(),
            digest: "d".repeat(64),
            effect: "side_effect".into(),
            at_ms,
            answer: Some(crate::journal::StoredAnswer {
                id: String::new(),
                tool: "bash".into(),
                content: content.into(),
                blocks: None,
                error: None,
                queued_ns: 0,
                run_ns: 0,
                ran: true,
            }),
            dropped: None,
        }
    }

    fn intent(at_ms: u64) -> CallRecord {
        CallRecord {
            answer: None,
            ..answered(at_ms, "")
        }
    }

    #[test]
    fn a_sessions_records_in_memory_are_bounded_and_the_oldest_answers_go_first() {
        let mut calls = Calls::default();
        for i in 0..(SESSION_ANSWERS as u64 + 1) {
            calls.insert(format!("c{i}"), intent(i));
        }
        assert_eq!(calls.answered, 0, "intents are not answers");
        for i in 0..(SESSION_ANSWERS as u64 + 1) {
            calls.insert(format!("c{i}"), answered(i, "x"));
        }
        assert_eq!(calls.answered, SESSION_ANSWERS + 1);
        calls.bound();
        assert_eq!(calls.answered, SESSION_ANSWERS / 4 * 3);
        // The oldest went: in the stream only, and known to be there.
        assert!(calls.get("c0").is_none());
        assert!(calls.let_go_of("c0"));
        assert!(calls.get(&format!("c{SESSION_ANSWERS}")).is_some());
        assert!(!calls.let_go_of(&format!("c{SESSION_ANSWERS}")));
        assert!(
            !calls.let_go_of("never-seen"),
            "a new call is not looked for in the stream"
        );
        // Bytes bound too: one large answer past 8 MiB lets the older ones go.
        let mut calls = Calls::default();
        calls.insert("small".into(), answered(1, "x"));
        calls.insert("large".into(), answered(2, &"y".repeat(SESSION_BYTES)));
        calls.bound();
        assert!(calls.get("small").is_none() && calls.let_go_of("small"));
        assert!(calls.bytes <= record_bytes("large", &answered(2, &"y".repeat(SESSION_BYTES))));
    }

    #[test]
    fn records_in_memory_are_counted_as_they_change() {
        let mut calls = Calls::default();
        calls.insert("a".into(), intent(1));
        assert_eq!((calls.answered, calls.bytes), (0, 0));
        calls.insert("a".into(), answered(2, "hello"));
        let one = record_bytes("a", &answered(2, "hello"));
        assert_eq!((calls.answered, calls.bytes), (1, one));
        calls.tombstone_older_than(3);
        let tomb = answered(2, "hello").tombstone().unwrap();
        assert_eq!((calls.answered, calls.bytes), (1, record_bytes("a", &tomb)));
        assert!(calls.get("a").unwrap().answer.is_none());
        assert_eq!(calls.shed(0, 0), record_bytes("a", &tomb));
        assert_eq!((calls.answered, calls.bytes), (0, 0));
        assert!(calls.let_go_of("a"));
        // Written again (its id re-read from the stream and recorded anew): in memory again.
        calls.insert("a".into(), answered(4, "again"));
        assert!(!calls.let_go_of("a"));
        calls.clear();
        assert!(calls.map.is_empty() && calls.evicted.is_empty() && calls.bytes == 0);
    }

    #[test]
    fn only_plain_ids_become_subjects() {
        assert!(valid_id("s0123abcd"));
        assert_eq!(subject(0, "s1"), "sbj.s1");
        assert_eq!(subject(2, "s1"), "sbj2.s1");
        assert_eq!(shard_stream("J", 0), "J");
        assert_eq!(shard_stream("J", 2), "J_2");
        for bad in ["", "a.b", "a*", "a>", "a b", &"s".repeat(129)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn sessions_spread_over_the_shards_the_same_way_on_every_node() {
        assert!((0..100).all(|i| shard_of(&format!("s{i}"), 1) == 0));
        let mut seen = [0usize; 3];
        for i in 0..300 {
            seen[shard_of(&format!("s{i:016x}"), 3)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "{seen:?}");
        // Fixed by the id alone (FNV-1a), so every node and version agrees.
        assert_eq!(
            shard_of("s0123456789abcdef", 3),
            shard_of("s0123456789abcdef", 3)
        );
        assert_eq!(shard_of("", 5), (0xcbf2_9ce4_8422_2325u64 % 5) as usize);
    }

    #[test]
    fn a_message_round_trips() {
        let m = Message {
            epoch: 3,
            entries: vec![
                Entry::Claim { node: "b".into() },
                Entry::Session {
                    record: "{}".into(),
                },
                Entry::Forget,
            ],
        };
        let back: Message = serde_json::from_slice(&serde_json::to_vec(&m).unwrap()).unwrap();
        assert_eq!(back.epoch, 3);
        assert_eq!(back.entries.len(), 3);
        assert!(matches!(back.entries[0], Entry::Claim { ref node } if node == "b"));
    }
}
