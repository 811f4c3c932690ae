//! The journal of a cluster: the same records as the embedded store, kept in a NATS JetStream
//! stream replicated across the NATS servers, so that the node that takes a session over after
//! its owner died answers retried calls as the owner would have.
//!
//! **Layout.** One stream (default `SWITCHBOARD_JOURNAL`, subjects `sbj.>`, file storage, `R`
//! replicas, messages older than the retention dropped). Every record of session `S` is a
//! message on subject `sbj.S`; a message carries one batch of [`Write`]s and the owner's lease
//! epoch. A session's state is the replay of its subject.
//!
//! **Fencing.** Every publish carries `Nats-Expected-Last-Subject-Sequence`: the sequence of the
//! last message this node wrote (or read) on the session's subject. A node that claims the
//! session writes a `claim` message first, so the old owner's next write finds the subject moved
//! on and is refused by the stream itself ([`JournalError::Fenced`]) — whatever the old owner
//! believes about its lease. Writes of one session are serialised (each needs the sequence the
//! previous one got) and grouped: writes that arrive while one publish is in flight go out
//! together in the next.
//!
//! **Memory.** The owner keeps the call records of the sessions it holds (read at claim time,
//! then written through), so a lookup never waits for the network.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use serde::{Deserialize, Serialize};

use super::{CallRecord, FlushCounts, JournalError, Write};
use crate::metrics::JournalMetrics;

/// Default stream name.
pub const STREAM: &str = "SWITCHBOARD_JOURNAL";
/// Subject prefix of the stream.
const PREFIX: &str = "sbj";
/// How many times a claim re-reads a subject that moved under it before giving up.
const CLAIM_TRIES: usize = 5;
/// How long a read or write is retried while the stream has no leader.
const SETTLE: Duration = Duration::from_secs(8);
/// How many moved sessions are remembered (for their refused writes to be told).
const MOVED_KEPT: usize = 4096;
/// How long opening the stream is retried at start-up.
const OPEN_SETTLE: Duration = Duration::from_secs(30);

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
}

/// One message on a session's subject.
#[derive(Debug, Serialize, Deserialize)]
struct Message {
    epoch: u64,
    entries: Vec<Entry>,
}

/// What this node knows of a session it owns.
#[derive(Debug, Default)]
struct State {
    epoch: u64,
    /// Sequence of the last message on the session's subject (0: none).
    last_seq: u64,
    calls: HashMap<String, CallRecord>,
    record: Option<String>,
    /// Refused once: nothing more is written.
    fenced: bool,
}

type Waiter = tokio::sync::oneshot::Sender<Result<(), JournalError>>;

/// One owned session: its state, and the writes waiting for the next publish.
#[derive(Debug, Default)]
struct Log {
    state: Mutex<State>,
    pending: Mutex<Vec<(Vec<Entry>, Waiter)>>,
    /// Held while a publish is in flight.
    publishing: tokio::sync::Mutex<()>,
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
    stream: jetstream::stream::Stream,
    stream_name: String,
    node: String,
    retention: Duration,
    logs: Mutex<HashMap<String, Arc<Log>>>,
    /// Sessions let go because another node took them over: a later write of this node for
    /// one of them is a refusal like one the stream makes (told to `on_fenced`).
    moved: Mutex<std::collections::HashSet<String>>,
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

fn nats_error(stream: &str, e: impl std::fmt::Display) -> JournalError {
    JournalError::Io {
        file: std::path::PathBuf::from(format!("nats:{stream}")),
        detail: e.to_string(),
    }
}

/// The subject of session `id`'s records.
fn subject(id: &str) -> String {
    format!("{PREFIX}.{id}")
}

/// Whether `id` can be a subject token (session ids are `[A-Za-z0-9_-]`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Replicated {
    /// Opens (creating if missing) stream `name` with `replicas` replicas and messages kept for
    /// `retention`, for node `node`; `on_fenced` is told each session whose write was refused.
    pub async fn open(
        js: jetstream::Context,
        name: &str,
        replicas: usize,
        retention: Duration,
        node: &str,
        on_fenced: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Result<Replicated, JournalError> {
        let config = jetstream::stream::Config {
            name: name.to_string(),
            subjects: vec![format!("{PREFIX}.>")],
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            max_age: retention,
            allow_direct: true,
            ..Default::default()
        };
        // Retried for a while: a stream or its leader may be in the making (another node
        // created it a moment ago, a fresh NATS cluster is still placing streams, or a server
        // just restarted).
        let started = Instant::now();
        let stream = loop {
            match js.get_or_create_stream(config.clone()).await {
                Ok(stream) => break stream,
                Err(e) if started.elapsed() >= OPEN_SETTLE => {
                    return Err(nats_error(name, format!("cannot open the stream: {e}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        };
        Ok(Replicated {
            js,
            stream,
            stream_name: name.to_string(),
            node: node.to_string(),
            retention,
            logs: Mutex::new(HashMap::new()),
            moved: Mutex::new(std::collections::HashSet::new()),
            counts: Arc::new(Mutex::new(FlushCounts::default())),
            metrics: JournalMetrics::new(),
            closed: AtomicBool::new(false),
            on_fenced,
        })
    }

    /// The stream's name.
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

    /// Whether this node holds session `id`'s journal (created or claimed here, not fenced).
    pub fn holds(&self, id: &str) -> bool {
        lock(&self.logs).contains_key(id)
    }

    /// Starts the journal of a session created here at lease epoch `epoch` (its subject must be
    /// empty: the first write is refused otherwise).
    pub fn start(&self, id: &str, epoch: u64) {
        let log = Log::default();
        lock(&log.state).epoch = epoch;
        lock(&self.logs).insert(id.to_string(), Arc::new(log));
    }

    /// Lets go of session `id` here because another node owns it now (its records stay in the
    /// stream for the new owner; a later write of this node for it is refused).
    pub fn release(&self, id: &str) {
        if lock(&self.logs).remove(id).is_some() {
            let mut moved = lock(&self.moved);
            if moved.len() >= MOVED_KEPT {
                moved.clear();
            }
            moved.insert(id.to_string());
        }
    }

    /// Gives up a claim of session `id` this node could not use (the session would not reopen
    /// here): unlike [`Replicated::release`], no other node is known to own it.
    pub fn abandon(&self, id: &str) {
        lock(&self.logs).remove(id);
    }

    /// Reads session `id`'s records and takes it over at lease epoch `epoch`: writes a claim
    /// message fenced on the last one read, so that the previous owner can write nothing more.
    /// [`Claimed::Unknown`] when the journal holds no session of that id (never created, or
    /// closed for good).
    pub async fn claim(&self, id: &str, epoch: u64) -> Result<Claimed, JournalError> {
        if !valid_id(id) {
            return Ok(Claimed::Unknown);
        }
        for _ in 0..CLAIM_TRIES {
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
            match self.publish(id, &message, state.last_seq).await {
                Ok(seq) => {
                    let log = Log::default();
                    *lock(&log.state) = State {
                        epoch,
                        last_seq: seq,
                        ..state
                    };
                    lock(&self.logs).insert(id.to_string(), Arc::new(log));
                    lock(&self.moved).remove(id);
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
        let subject = subject(id);
        let mut state = State::default();
        let mut next = 1u64;
        let mut since_answer = Instant::now();
        loop {
            let got = self
                .stream
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
            let Ok(decoded) = serde_json::from_slice::<Message>(&message.payload) else {
                tracing::warn!(session = %id, seq = message.sequence, "journal: a record does not decode; skipped");
                continue;
            };
            state.epoch = state.epoch.max(decoded.epoch);
            for entry in decoded.entries {
                match entry {
                    Entry::Call { id, record } => {
                        state.calls.insert(id, *record);
                    }
                    Entry::Session { record } => state.record = Some(record),
                    Entry::Forget => {
                        state.calls.clear();
                        state.record = None;
                    }
                    Entry::Claim { .. } => {}
                }
            }
        }
        Ok(state)
    }

    /// Publishes `message` on session `id`'s subject, expecting `last_seq` to be the last
    /// message there; its sequence, or [`JournalError::Fenced`] if the subject moved on.
    async fn publish(
        &self,
        id: &str,
        message: &Message,
        last_seq: u64,
    ) -> Result<u64, JournalError> {
        let payload = serde_json::to_vec(message).map_err(|e| nats_error(&self.stream_name, e))?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            last_seq.to_string().as_str(),
        );
        // The same id for every try of this write: a try whose acknowledgement was lost is
        // acknowledged again as a duplicate, not refused as a moved subject.
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("{}.{id}.{}.{last_seq}", self.node, message.epoch).as_str(),
        );
        let started = Instant::now();
        let ack = loop {
            let sent = self
                .js
                .publish_with_headers(subject(id), headers.clone(), payload.clone().into())
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
        let elapsed = started.elapsed();
        let records = message.entries.len();
        self.metrics.flush(records, elapsed);
        lock(&self.counts).add(records, elapsed);
        match ack {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                Err(JournalError::Fenced {
                    session: id.to_string(),
                })
            }
            Err(e) => Err(nats_error(&self.stream_name, e)),
        }
    }

    /// The records of calls `ids` of session `id` (from memory).
    pub fn lookup(&self, session: &str, ids: &[&str]) -> Vec<Option<CallRecord>> {
        let Some(log) = lock(&self.logs).get(session).cloned() else {
            return vec![None; ids.len()];
        };
        let state = lock(&log.state);
        ids.iter().map(|id| state.calls.get(*id).cloned()).collect()
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
            if lock(&self.moved).remove(&session) {
                tracing::warn!(session = %session, node = %self.node, "journal: refused, another node owns the session now");
                (self.on_fenced)(&session);
            }
            return Err(fenced());
        };
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
            if let Err(e) = self.stream.purge().filter(subject(&session)).await {
                tracing::warn!(session = %session, error = %e, "journal: a closed session's records were not purged (the age limit will drop them)");
            }
        }
        outcome
    }

    /// One publish carrying `batch`; tells each waiter the outcome.
    async fn flush(&self, session: &str, log: &Log, batch: Vec<(Vec<Entry>, Waiter)>) {
        let (epoch, last_seq, fenced) = {
            let s = lock(&log.state);
            (s.epoch, s.last_seq, s.fenced)
        };
        let (entries, waiters): (Vec<Vec<Entry>>, Vec<Waiter>) = batch.into_iter().unzip();
        let message = Message {
            epoch,
            entries: entries.into_iter().flatten().collect(),
        };
        let outcome = if fenced {
            Err(JournalError::Fenced {
                session: session.to_string(),
            })
        } else {
            self.publish(session, &message, last_seq).await
        };
        let outcome = match outcome {
            Ok(seq) => {
                let mut s = lock(&log.state);
                s.last_seq = seq;
                for entry in message.entries {
                    match entry {
                        Entry::Call { id, record } => {
                            s.calls.insert(id, *record);
                        }
                        Entry::Session { record } => s.record = Some(record),
                        Entry::Forget | Entry::Claim { .. } => {}
                    }
                }
                Ok(())
            }
            Err(e @ JournalError::Fenced { .. }) => {
                let first = !std::mem::replace(&mut lock(&log.state).fenced, true);
                if first {
                    lock(&self.logs).remove(session);
                    tracing::warn!(session = %session, node = %self.node, "journal: refused, another node owns the session now");
                    (self.on_fenced)(session);
                }
                Err(e)
            }
            Err(e) => Err(e),
        };
        for waiter in waiters {
            let _ = waiter.send(outcome.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_become_subjects() {
        assert!(valid_id("s0123abcd"));
        assert_eq!(subject("s1"), "sbj.s1");
        for bad in ["", "a.b", "a*", "a>", "a b", &"s".repeat(129)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
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
