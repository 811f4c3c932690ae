//! The call journal: what a session's calls were and how they were answered, made durable so that
//! a client retrying a turn after the engine crashed or restarted gets the same answers, and no
//! side-effect call runs twice.
//!
//! One embedded [`redb`] file, `DIR/journal.redb`, with two tables: `calls`, keyed by
//! `session \0 tool_use_id`, holding a [`CallRecord`] (the tool, an argument digest, the effect
//! class, and the answer once there is one), and `sessions`, keyed by session id, holding what a
//! front end needs to reopen the session after a restart (opaque bytes here); and beside it its
//! write-ahead log, `DIR/journal.log` (`log.rs`).
//!
//! **Group commit.** Writes are handed to one writer thread. It takes every write waiting at that
//! moment — from every session — appends the calls' records to the log as one group and makes it
//! durable (one `pwrite`, one `fdatasync` of blocks the file already has), then wakes each
//! writer. A write returns only once durable, so a call whose intent was written starts only
//! after its intent is on disk, and an answer leaves the engine only after it is. Under load, one
//! flush covers many calls; alone, a call pays one flush. Every second, or when the log is three
//! quarters full, a *checkpoint* puts the log's records into the redb file (one two-phase
//! transaction, the newest record per call only) and the log starts again; forgetting a
//! session goes to the file directly, after a checkpoint. The writer keeps running totals
//! ([`Journal::flush_counts`]) beside its metrics, so a caller can see how many records each
//! flush carried without a recorder.
//!
//! **Retention, health, damage and the clock** are the embedded store's (`local.rs`): answers
//! older than the retention become tombstones (a late retry is recognised, never run), a full disk
//! heals without a restart, only a missing file starts an empty journal, and records are stamped
//! with a clock that wall-clock steps do not move.
//!
//! **Replicated.** In cluster mode the same interface is kept in a NATS JetStream stream instead
//! ([`replicated`]): one subject per session, every write fenced by the session's last sequence.
//! This file holds the embedded store and what both share.

pub mod lease;
mod local;
mod log;
pub mod replicated;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::locks::lock;
use crate::protocol::{Block, ErrorCode, Image, Timing, ToolDispatchResult, ToolReference};

pub use local::Compacted;

/// The journal file's name inside its directory.
pub const FILE_NAME: &str = "journal.redb";

/// Default retention of answered calls.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The shortest retention a journal accepts: a client's retry (a timed-out request sent again, a
/// harness restarted) can come minutes after the first copy.
pub const MIN_RETENTION: Duration = Duration::from_secs(60);

/// Why the journal cannot be used.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum JournalError {
    /// The file exists and is not a readable journal.
    Damaged {
        /// The journal file.
        file: PathBuf,
        /// What the store reported.
        detail: String,
    },
    /// Another process has the journal open.
    InUse {
        /// The journal file.
        file: PathBuf,
    },
    /// Reading or writing failed (a full disk, an I/O error).
    Io {
        /// The journal file.
        file: PathBuf,
        /// What failed, with the cause's own text.
        detail: String,
        /// The cause (an I/O, store or NATS error), when there is one at hand: a journal that
        /// failed earlier keeps only its description. [`std::error::Error::source`] gives the
        /// cause itself (not this `Arc`), so `downcast_ref` finds it.
        source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// The retention asked for is shorter than [`MIN_RETENTION`].
    Retention {
        /// The retention asked for.
        retention: Duration,
    },
    /// The journal's writer has stopped (the engine is shutting down).
    Closed,
    /// Another node owns the session now (cluster mode): its journal moved on past what this
    /// node wrote, so this node writes nothing more for it.
    Fenced {
        /// The session id.
        session: String,
    },
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalError::Damaged { file, detail } => {
                let file = file.display();
                write!(
                    f,
                    "the journal {file} is damaged ({detail}); move it aside to start with an \
                     empty journal (e.g. `mv {file} {file}.damaged`): the answers it holds are \
                     then forgotten"
                )
            }
            JournalError::InUse { file } => write!(
                f,
                "the journal {} is in use by another process (one engine per journal; waited 5 s \
                 for it to let go)",
                file.display()
            ),
            JournalError::Io { file, detail, .. } => {
                write!(f, "the journal {}: {detail}", file.display())
            }
            JournalError::Retention { retention } => write!(
                f,
                "a journal retention of {} is too short: the floor is {} (a client's retry can \
                 come minutes after the first copy)",
                humantime::format_duration(*retention),
                humantime::format_duration(MIN_RETENTION)
            ),
            JournalError::Closed => f.write_str("the journal is closed"),
            JournalError::Fenced { session } => write!(
                f,
                "session {session} is owned by another node now; this node writes nothing more \
                 for it"
            ),
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JournalError::Io {
                source: Some(source),
                ..
            } => Some(source.as_ref() as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

/// What running a call twice would do, as the journal records it (see [`crate::Effect`]).
pub use crate::tool::Effect;

/// One call as the journal knows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallRecord {
    /// The tool name as the model sent it.
    pub tool: String,
    /// SHA-256 of the tool name and the arguments' compact JSON (hex).
    pub digest: String,
    /// The tool's effect class when the call was made (`read_only`, `idempotent`,
    /// `side_effect`).
    pub effect: String,
    /// When the record was last written, in milliseconds of the journal's clock
    /// ([`Journal::now_ms`]).
    pub at_ms: u64,
    /// The answer; `None` while only the intent is recorded, or once it was dropped.
    pub answer: Option<StoredAnswer>,
    /// Set once retention dropped the answer's content: what is left of it (a tombstone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Dropped>,
}

/// What a tombstone keeps of an answer whose content retention dropped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Dropped {
    /// The answer's error code, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether a handler ran.
    pub ran: bool,
}

/// Where a call stands in the journal ([`CallRecord::state`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RecordState<'a> {
    /// Only its intent: it started and its answer was never recorded.
    Started,
    /// Answered: the stored answer.
    Answered(&'a StoredAnswer),
    /// Answered long ago: only a tombstone is left.
    Tombstone(&'a Dropped),
}

impl CallRecord {
    /// This record with its answer's content dropped (what retention leaves of an answer
    /// older than it); `None` when it holds no answer (an intent, or a tombstone already).
    pub fn tombstone(&self) -> Option<CallRecord> {
        let answer = self.answer.as_ref()?;
        Some(CallRecord {
            tool: self.tool.clone(),
            digest: self.digest.clone(),
            effect: self.effect.clone(),
            at_ms: self.at_ms,
            answer: None,
            dropped: Some(Dropped {
                error: answer.error.clone(),
                ran: answer.ran,
            }),
        })
    }

    /// Where the call stands.
    pub fn state(&self) -> RecordState<'_> {
        match (&self.answer, &self.dropped) {
            (Some(answer), _) => RecordState::Answered(answer),
            (None, Some(dropped)) => RecordState::Tombstone(dropped),
            (None, None) => RecordState::Started,
        }
    }
}

/// A stored answer: enough to hand back the same `tool_result`, byte for byte.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredAnswer {
    /// The `tool_use_id`.
    pub id: String,
    /// The tool name as sent.
    pub tool: String,
    /// The text content.
    pub content: String,
    /// Blocks of a result with images or tool references.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Vec<StoredBlock>>,
    /// The error code, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Queue time, nanoseconds.
    pub queued_ns: u64,
    /// Run time, nanoseconds.
    pub run_ns: u64,
    /// Whether a handler ran.
    pub ran: bool,
}

/// A stored result block.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum StoredBlock {
    /// Text.
    Text(String),
    /// An image: media type and base64 data.
    Image(String, String),
    /// A tool reference: name and definition text.
    ToolReference(String, String),
}

impl StoredAnswer {
    /// The stored form of `result`.
    pub fn of(result: &ToolDispatchResult) -> StoredAnswer {
        StoredAnswer {
            id: result.tool_use_id.to_string(),
            tool: result.tool_name.to_string(),
            content: result.content.clone(),
            blocks: result.blocks.as_ref().map(|blocks| {
                blocks
                    .iter()
                    .map(|b| match b {
                        Block::Text(t) => StoredBlock::Text(t.clone()),
                        Block::Image(i) => StoredBlock::Image(i.media_type.clone(), i.data.clone()),
                        Block::ToolReference(r) => {
                            StoredBlock::ToolReference(r.tool_name.clone(), r.definition.clone())
                        }
                    })
                    .collect()
            }),
            error: result.error.map(|c| c.as_str().to_string()),
            queued_ns: result.timing.queued.as_nanos() as u64,
            run_ns: result.timing.run.as_nanos() as u64,
            ran: result.timing.ran,
        }
    }

    /// The result it stands for.
    pub fn to_result(&self) -> ToolDispatchResult {
        ToolDispatchResult {
            tool_use_id: Arc::from(self.id.as_str()),
            tool_name: Arc::from(self.tool.as_str()),
            content: self.content.clone(),
            blocks: self.blocks.as_ref().map(|blocks| {
                blocks
                    .iter()
                    .map(|b| match b {
                        StoredBlock::Text(t) => Block::Text(t.clone()),
                        StoredBlock::Image(m, d) => Block::Image(Image {
                            media_type: m.clone(),
                            data: d.clone(),
                        }),
                        StoredBlock::ToolReference(n, d) => Block::ToolReference(ToolReference {
                            tool_name: n.clone(),
                            definition: d.clone(),
                        }),
                    })
                    .collect()
            }),
            error: self
                .error
                .as_deref()
                .map(|c| ErrorCode::parse(c).unwrap_or(ErrorCode::ExecutionError)),
            timing: Timing {
                queued: Duration::from_nanos(self.queued_ns),
                run: Duration::from_nanos(self.run_ns),
                ran: self.ran,
            },
        }
    }
}

/// One write to the journal.
#[derive(Debug)]
pub enum Write {
    /// Puts `record` for call `id` of `session`.
    Call {
        /// The session id.
        session: Arc<str>,
        /// The `tool_use_id`.
        id: Arc<str>,
        /// The record.
        record: Box<CallRecord>,
    },
    /// Puts a session's record (opaque bytes the front end reads back).
    Session {
        /// The session id.
        id: String,
        /// The record.
        bytes: Vec<u8>,
    },
    /// Deletes a session's record.
    ForgetSession {
        /// The session id.
        id: String,
    },
}

struct Batch {
    writes: Vec<Write>,
    done: tokio::sync::oneshot::Sender<Result<(), JournalError>>,
}

/// What the writer thread is asked to do.
enum Job {
    /// Make these writes durable.
    Write(Batch),
    /// Compact (after putting the log's records into the file) and answer.
    Compact(mpsc::SyncSender<Result<Compacted, JournalError>>),
}

/// What the writer has flushed since the journal opened ([`Journal::flush_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushCounts {
    /// Flushes: one transaction and one durable commit each (failed ones included).
    pub flushes: u64,
    /// Records those flushes carried (intents, answers, session records).
    pub records: u64,
    /// Time spent in them: writing the records and making the commit durable.
    pub busy: Duration,
}

impl FlushCounts {
    /// What was flushed between `earlier` and `self` (two readings of the same journal).
    pub fn since(self, earlier: FlushCounts) -> FlushCounts {
        FlushCounts {
            flushes: self.flushes.saturating_sub(earlier.flushes),
            records: self.records.saturating_sub(earlier.records),
            busy: self.busy.saturating_sub(earlier.busy),
        }
    }

    /// One flush of `records` records that took `elapsed`.
    fn add(&mut self, records: usize, elapsed: Duration) {
        self.flushes += 1;
        self.records += records as u64;
        self.busy += elapsed;
    }
}

/// The durable call journal (cheap to clone; clones share the store and its writer): an
/// embedded file ([`Journal::open`]) or a replicated stream ([`Journal::replicated`]).
#[derive(Clone)]
pub struct Journal {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Local(Arc<Inner>),
    Replicated(Arc<replicated::Replicated>),
}

/// The embedded store: what its writer shares with the engine, and the way to the writer.
struct Inner {
    shared: Arc<local::Shared>,
    /// The writer's running totals (locked once per flush).
    counts: Arc<std::sync::Mutex<FlushCounts>>,
    queue: std::sync::Mutex<Option<mpsc::Sender<Job>>>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.queue
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(writer) = self
            .writer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = writer.join();
        }
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.backend {
            Backend::Local(inner) => f
                .debug_struct("Journal")
                .field("file", &inner.shared.file)
                .finish(),
            Backend::Replicated(r) => f
                .debug_struct("Journal")
                .field("stream", &r.stream_name())
                .finish(),
        }
    }
}

/// An I/O failure of `file`, keeping its cause.
fn io(file: &Path, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> JournalError {
    let e = e.into();
    JournalError::Io {
        file: file.to_path_buf(),
        detail: e.to_string(),
        source: Some(Arc::from(e)),
    }
}

/// The journal `file` is damaged: `e` says how.
fn damaged(file: &Path, e: impl std::fmt::Display) -> JournalError {
    JournalError::Damaged {
        file: file.to_path_buf(),
        detail: e.to_string(),
    }
}

/// Unix milliseconds now (the wall clock).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The key of call `id` of `session`.
fn call_key(session: &str, id: &str) -> String {
    let mut key = String::with_capacity(session.len() + 1 + id.len());
    key.push_str(session);
    key.push('\0');
    key.push_str(id);
    key
}

impl Journal {
    /// Opens (or creates, when the file is missing) the journal in directory `dir` (created if
    /// missing), keeping answers for `retention` (at least [`MIN_RETENTION`]), checks every page
    /// of it, and compacts it.
    pub fn open(dir: &Path, retention: Duration) -> Result<Journal, JournalError> {
        if retention < MIN_RETENTION {
            return Err(JournalError::Retention { retention });
        }
        let file = dir.join(FILE_NAME);
        std::fs::create_dir_all(dir).map_err(|e| JournalError::Io {
            file: file.clone(),
            detail: format!("cannot create the directory {}: {e}", dir.display()),
            source: Some(std::sync::Arc::new(e)),
        })?;
        // Taken on the caller's thread: an engine built under a local recorder
        // (`metrics::with_local_recorder`) records its journal there too.
        let (shared, tail) = local::open(&file, retention)?;
        let shared = Arc::new(shared);
        local::compact(&shared)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let counts = Arc::new(std::sync::Mutex::new(FlushCounts::default()));
        let writer_counts = Arc::clone(&counts);
        let writer_shared = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || local::writer(writer_shared, tail, rx, &writer_counts))
            .map_err(|e| JournalError::Io {
                file: file.clone(),
                detail: format!("cannot start the writer thread: {e}"),
                source: Some(std::sync::Arc::new(e)),
            })?;
        Ok(Journal {
            backend: Backend::Local(Arc::new(Inner {
                shared,
                counts,
                queue: std::sync::Mutex::new(Some(tx)),
                writer: std::sync::Mutex::new(Some(writer)),
            })),
        })
    }

    /// A journal kept in a replicated JetStream stream (cluster mode).
    pub fn replicated(journal: Arc<replicated::Replicated>) -> Journal {
        Journal {
            backend: Backend::Replicated(journal),
        }
    }

    /// How long answered calls are kept.
    pub fn retention(&self) -> Duration {
        match &self.backend {
            Backend::Local(inner) => inner.shared.retention,
            Backend::Replicated(r) => r.retention(),
        }
    }

    /// The time records are stamped with, in milliseconds: the embedded journal's own clock,
    /// which advances only while an engine has it open (wall-clock steps do not move it); the
    /// wall clock for a replicated journal (its stream ages messages by it).
    pub fn now_ms(&self) -> u64 {
        match &self.backend {
            Backend::Local(inner) => inner.shared.clock.now_ms(),
            Backend::Replicated(_) => now_ms(),
        }
    }

    /// `Ok` while the journal can record calls; why not while it cannot (its file removed or
    /// replaced, a write failed — a full disk — and it has not reopened yet).
    /// The error is [`JournalError::Io`], its `detail` saying what failed.
    pub fn health(&self) -> Result<(), JournalError> {
        match &self.backend {
            Backend::Local(inner) => inner.shared.health().map_err(|detail| JournalError::Io {
                file: inner.shared.file.clone(),
                detail,
                source: None,
            }),
            Backend::Replicated(_) => Ok(()),
        }
    }

    /// How many flushes the writer has made so far, the records they carried and the time they
    /// took (take two readings and [`FlushCounts::since`] for a stretch of time). Replicated: one
    /// flush is one acknowledged publish.
    pub fn flush_counts(&self) -> FlushCounts {
        let counts = match &self.backend {
            Backend::Local(inner) => &inner.counts,
            Backend::Replicated(r) => r.counts(),
        };
        *lock(counts)
    }

    /// Makes `writes` durable, together with every other write waiting now (one group in the
    /// log, one `fdatasync`; replicated: one acknowledged publish per session). Returns once they are
    /// durable; refused at once while the journal is failing ([`Journal::health`]).
    pub async fn write(&self, writes: Vec<Write>) -> Result<(), JournalError> {
        if writes.is_empty() {
            return Ok(());
        }
        let inner = match &self.backend {
            Backend::Local(inner) => inner,
            Backend::Replicated(r) => return r.write(writes).await,
        };
        let (done, wait) = tokio::sync::oneshot::channel();
        {
            let queue = lock(&inner.queue);
            let Some(queue) = queue.as_ref() else {
                return Err(JournalError::Closed);
            };
            queue
                .send(Job::Write(Batch { writes, done }))
                .map_err(|_| JournalError::Closed)?;
        }
        wait.await.unwrap_or(Err(JournalError::Closed))
    }

    /// The records of calls `ids` of `session`, `None` where there is none. An id the file
    /// certainly does not hold (the usual case: a new call) is answered without a read; the
    /// others are read in one transaction on tokio's blocking pool. A read that fails is an
    /// error — never "none".
    pub async fn lookup(
        &self,
        session: &str,
        ids: &[&str],
    ) -> Result<Vec<Option<CallRecord>>, JournalError> {
        let inner = match &self.backend {
            Backend::Local(inner) => inner,
            Backend::Replicated(r) => return r.lookup(session, ids).await,
        };
        let keys: Vec<String> = ids.iter().map(|id| call_key(session, id)).collect();
        let held: Vec<usize> = (0..keys.len())
            .filter(|&i| inner.shared.may_hold(&keys[i]))
            .collect();
        let mut out = vec![None; keys.len()];
        if held.is_empty() {
            return Ok(out);
        }
        let shared = Arc::clone(&inner.shared);
        let wanted: Vec<String> = held.iter().map(|&i| keys[i].clone()).collect();
        let read = tokio::task::spawn_blocking(move || shared.read(&wanted))
            .await
            .map_err(|e| io(&inner.shared.file, format!("the read stopped: {e}")))??;
        for (i, record) in held.into_iter().zip(read) {
            out[i] = record;
        }
        Ok(out)
    }

    /// Every session record: `(id, bytes)`. Replicated: none — a cluster node claims sessions
    /// one at a time, when a request names one ([`replicated::Replicated::claim`]).
    pub fn sessions(&self) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        match &self.backend {
            Backend::Local(inner) => inner.shared.sessions(),
            Backend::Replicated(_) => Ok(Vec::new()),
        }
    }

    /// Replaces answers older than the retention with tombstones and forgets sessions without a
    /// session record and no call that recent (the writer does it every quarter retention, at
    /// most hourly). Replicated: the stream's own age limit does it (nothing here).
    pub fn compact(&self) -> Result<Compacted, JournalError> {
        let inner = match &self.backend {
            Backend::Local(inner) => inner,
            Backend::Replicated(_) => return Ok(Compacted::default()),
        };
        // The writer does it, between two flushes: it puts the log's records into the file
        // first (compaction reads the file).
        let (reply, answer) = mpsc::sync_channel(1);
        {
            let queue = lock(&inner.queue);
            let Some(queue) = queue.as_ref() else {
                return Err(JournalError::Closed);
            };
            queue
                .send(Job::Compact(reply))
                .map_err(|_| JournalError::Closed)?;
        }
        answer.recv().unwrap_or(Err(JournalError::Closed))
    }

    /// Stops taking writes; the writer ends once those queued now are durable (the file is
    /// released when the last clone is dropped).
    pub fn close(&self) {
        match &self.backend {
            Backend::Local(inner) => {
                lock(&inner.queue).take();
            }
            Backend::Replicated(r) => r.close(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tool: &str, answer: Option<StoredAnswer>) -> CallRecord {
        CallRecord {
            tool: tool.into(),
            digest: "d".into(),
            effect: "side_effect".into(),
            at_ms: now_ms(),
            answer,
            dropped: None,
        }
    }

    fn call(session: &str, id: &str, record: CallRecord) -> Write {
        Write::Call {
            session: session.into(),
            id: id.into(),
            record: Box::new(record),
        }
    }

    fn ok_answer(id: &str) -> StoredAnswer {
        StoredAnswer::of(&ToolDispatchResult::error(
            id.into(),
            "bash".into(),
            ErrorCode::Timeout,
            "slow",
            Timing::default(),
        ))
    }

    #[tokio::test]
    async fn a_write_is_found_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let result = ToolDispatchResult::error(
            "t1".into(),
            "bash".into(),
            ErrorCode::Timeout,
            "slow",
            Timing::default(),
        );
        {
            let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
            j.write(vec![call(
                "s",
                "t1",
                record("bash", Some(StoredAnswer::of(&result))),
            )])
            .await
            .unwrap();
            j.close();
        }
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        let found = j.lookup("s", &["t1", "t2"]).await.unwrap();
        assert_eq!(
            found[0]
                .as_ref()
                .unwrap()
                .answer
                .as_ref()
                .unwrap()
                .to_result(),
            result
        );
        assert!(found[1].is_none());
    }

    #[test]
    fn an_io_error_keeps_its_cause_for_downcast() {
        let e = JournalError::Io {
            file: "/j/journal.redb".into(),
            detail: "a write failed: no space left".into(),
            source: Some(std::sync::Arc::new(std::io::Error::from(
                std::io::ErrorKind::StorageFull,
            ))),
        };
        assert_eq!(
            e.to_string(),
            "the journal /j/journal.redb: a write failed: no space left"
        );
        let io = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the cause itself is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
        assert!(std::error::Error::source(&JournalError::Closed).is_none());
        let damaged = JournalError::Damaged {
            file: "/j/journal.redb".into(),
            detail: "bad header".into(),
        };
        assert!(
            damaged
                .to_string()
                .contains("(e.g. `mv /j/journal.redb /j/journal.redb.damaged`)"),
            "{damaged}"
        );
    }

    #[test]
    fn a_retention_below_the_floor_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = Journal::open(dir.path(), Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, JournalError::Retention { .. }), "{e}");
        assert!(
            e.to_string().contains("2s") && e.to_string().contains("1m"),
            "{e}"
        );
        assert!(!dir.path().join(FILE_NAME).exists());
        assert!(Journal::open(dir.path(), MIN_RETENTION).is_ok());
    }

    #[tokio::test]
    async fn compaction_keeps_every_id_it_saw_as_long_as_its_session_lives() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), Duration::from_secs(60)).unwrap();
        let aged = |mut r: CallRecord| {
            r.at_ms = j.now_ms().saturating_sub(120_000);
            r
        };
        j.write(vec![
            // A session the front end recorded: its old answer becomes a tombstone, its old
            // intent stays as it is.
            Write::Session {
                id: "kept".into(),
                bytes: b"{}".to_vec(),
            },
            call(
                "kept",
                "answered",
                aged(record("bash", Some(ok_answer("answered")))),
            ),
            call("kept", "started", aged(record("bash", None))),
            // A session without a record, active lately: the same.
            call("live", "old", aged(record("bash", Some(ok_answer("old"))))),
            call("live", "new", record("bash", Some(ok_answer("new")))),
            // A session without a record whose last call is older than the retention: forgotten.
            call("gone", "a", aged(record("bash", Some(ok_answer("a"))))),
            call("gone", "b", aged(record("bash", None))),
        ])
        .await
        .unwrap();
        let done = j.compact().unwrap();
        assert_eq!(
            done,
            Compacted {
                tombstoned: 2,
                deleted: 2
            }
        );
        let kept = j.lookup("kept", &["answered", "started"]).await.unwrap();
        let tomb = kept[0].as_ref().unwrap();
        assert_eq!(
            tomb.state(),
            RecordState::Tombstone(&Dropped {
                error: Some("timeout".into()),
                ran: false
            })
        );
        assert_eq!(tomb.digest, "d");
        assert_eq!(kept[1].as_ref().unwrap().state(), RecordState::Started);
        let live = j.lookup("live", &["old", "new"]).await.unwrap();
        assert!(matches!(
            live[0].as_ref().unwrap().state(),
            RecordState::Tombstone(_)
        ));
        assert!(matches!(
            live[1].as_ref().unwrap().state(),
            RecordState::Answered(_)
        ));
        assert!(
            j.lookup("gone", &["a", "b"])
                .await
                .unwrap()
                .iter()
                .all(Option::is_none)
        );
        // A second pass has nothing left to do.
        assert_eq!(j.compact().unwrap(), Compacted::default());
    }

    #[tokio::test]
    async fn forgetting_a_session_deletes_its_calls() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        j.write(vec![
            Write::Session {
                id: "s".into(),
                bytes: b"{}".to_vec(),
            },
            call("s", "a", record("bash", None)),
            call("s2", "a", record("bash", None)),
        ])
        .await
        .unwrap();
        j.write(vec![Write::ForgetSession { id: "s".into() }])
            .await
            .unwrap();
        assert!(j.lookup("s", &["a"]).await.unwrap()[0].is_none());
        assert!(j.lookup("s2", &["a"]).await.unwrap()[0].is_some());
        assert!(j.sessions().unwrap().is_empty());
    }

    #[tokio::test]
    async fn flush_counts_count_each_flush_and_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        let start = j.flush_counts();
        let noop = |id: &str| call("s", id, record("noop", None));
        // Awaited one after the other: nothing else waits, so each write is one flush.
        j.write(vec![noop("a"), noop("b"), noop("c")])
            .await
            .unwrap();
        j.write(vec![noop("d")]).await.unwrap();
        j.write(Vec::new()).await.unwrap();
        let counted = j.flush_counts().since(start);
        assert_eq!((counted.flushes, counted.records), (2, 4));
        assert!(counted.busy > Duration::ZERO);
    }

    #[tokio::test]
    async fn a_journal_opened_under_a_local_recorder_records_its_flushes_there() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let dir = tempfile::tempdir().unwrap();
        let j = metrics::with_local_recorder(&recorder, || {
            Journal::open(dir.path(), DEFAULT_RETENTION).unwrap()
        });
        j.write(vec![call("s", "a", record("noop", None))])
            .await
            .unwrap();
        let snapshot = snapshotter.snapshot().into_vec();
        let value = |name: &str| {
            snapshot
                .iter()
                .find(|(key, ..)| key.key().name() == name)
                .map(|(.., value)| value)
        };
        assert_eq!(
            value(crate::metrics::JOURNAL_FLUSHES_TOTAL),
            Some(&DebugValue::Counter(1))
        );
        assert_eq!(
            value(crate::metrics::JOURNAL_HEALTHY),
            Some(&DebugValue::Gauge(1.0.into()))
        );
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), vec![0x5au8; 8192]).unwrap();
        let e = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, JournalError::Damaged { .. }), "{text}");
        assert!(text.contains(FILE_NAME) && text.contains("mv "), "{text}");
    }

    #[test]
    fn an_empty_file_is_refused_not_taken_for_a_new_journal() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"").unwrap();
        let e = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap_err();
        assert!(matches!(e, JournalError::Damaged { .. }), "{e}");
        assert!(e.to_string().contains("empty"), "{e}");
        assert_eq!(
            std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len(),
            0
        );
    }

    /// A journal holding one answered call `a` of session `s`: the file's bytes as a `kill -9`
    /// right after the answer was acknowledged leaves them (read while the journal is open).
    async fn journal_with_one_answer(dir: &Path) -> Vec<u8> {
        let j = Journal::open(dir, DEFAULT_RETENTION).unwrap();
        j.write(vec![call("s", "a", record("bash", Some(ok_answer("a"))))])
            .await
            .unwrap();
        let bytes = std::fs::read(dir.join(FILE_NAME)).unwrap();
        j.close();
        drop(j);
        bytes
    }

    #[tokio::test]
    async fn a_bit_flipped_in_the_primary_commit_slot_is_refused_not_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = journal_with_one_answer(dir.path()).await;
        // redb's header: the god byte at 9 (bit 0: which of the two 128-byte commit slots, at
        // 64 and 192, is the primary).
        let primary = if bytes[9] & 1 == 0 { 64 } else { 192 };
        bytes[primary + 40] ^= 0x10;
        std::fs::write(dir.path().join(FILE_NAME), &bytes).unwrap();
        let e = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap_err();
        assert!(matches!(e, JournalError::Damaged { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_bit_flipped_in_the_primary_slot_of_a_reopened_journal_is_refused() {
        // Reopened, written (to the log only), then killed: the file's last commit is the one
        // its opening made, and that one is two-phase too.
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("j");
        journal_with_one_answer(&first).await;
        let j = Journal::open(&first, DEFAULT_RETENTION).unwrap();
        j.write(vec![call("s", "b", record("bash", Some(ok_answer("b"))))])
            .await
            .unwrap();
        let crashed = dir.path().join("crashed");
        files_as_a_crash_leaves_them(&first, &crashed);
        let mut bytes = std::fs::read(crashed.join(FILE_NAME)).unwrap();
        let primary = if bytes[9] & 1 == 0 { 64 } else { 192 };
        bytes[primary + 16] ^= 0x20;
        std::fs::write(crashed.join(FILE_NAME), &bytes).unwrap();
        let e = Journal::open(&crashed, DEFAULT_RETENTION).unwrap_err();
        assert!(matches!(e, JournalError::Damaged { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_bit_flipped_in_the_other_commit_slot_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = journal_with_one_answer(dir.path()).await;
        let secondary = if bytes[9] & 1 == 0 { 192 } else { 64 };
        bytes[secondary + 40] ^= 0x10;
        std::fs::write(dir.path().join(FILE_NAME), &bytes).unwrap();
        // The slot no commit relies on: the journal opens with its acknowledged answer.
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        let found = j.lookup("s", &["a"]).await.unwrap();
        assert!(matches!(
            found[0].as_ref().unwrap().state(),
            RecordState::Answered(_)
        ));
    }

    #[tokio::test]
    async fn a_bit_flipped_in_a_data_page_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = journal_with_one_answer(dir.path()).await;
        // Every page past the header, one at a time: none opens as a silently different journal.
        let mut refused = 0;
        let mut opened_intact = 0;
        for page in (4096..bytes.len()).step_by(4096) {
            let mut damaged = bytes.clone();
            damaged[page + 100] ^= 0x01;
            std::fs::write(dir.path().join(FILE_NAME), &damaged).unwrap();
            match Journal::open(dir.path(), DEFAULT_RETENTION) {
                Err(JournalError::Damaged { .. }) => refused += 1,
                Err(e) => panic!("page {page}: {e}"),
                Ok(j) => {
                    // A free page: the acknowledged answer must still be there.
                    let found = j.lookup("s", &["a"]).await.unwrap();
                    assert!(
                        matches!(
                            found[0].as_ref().map(CallRecord::state),
                            Some(RecordState::Answered(_))
                        ),
                        "page {page} opened without the answer"
                    );
                    opened_intact += 1;
                    j.close();
                }
            }
        }
        assert!(
            refused > 0,
            "no damaged page was noticed ({opened_intact} opened)"
        );
    }

    /// Copies of the journal's files as a `kill -9` leaves them: read while it is open.
    fn files_as_a_crash_leaves_them(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for name in [FILE_NAME, log::LOG_NAME] {
            std::fs::write(to.join(name), std::fs::read(from.join(name)).unwrap()).unwrap();
        }
    }

    #[tokio::test]
    async fn an_acknowledged_write_survives_a_crash_in_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let crashed = dir.path().join("crashed");
        let j = Journal::open(&dir.path().join("j"), DEFAULT_RETENTION).unwrap();
        j.write(vec![call("s", "a", record("bash", Some(ok_answer("a"))))])
            .await
            .unwrap();
        j.write(vec![call("s", "b", record("bash", None))])
            .await
            .unwrap();
        // Before any checkpoint: the records are in the log only.
        files_as_a_crash_leaves_them(&dir.path().join("j"), &crashed);
        let again = Journal::open(&crashed, DEFAULT_RETENTION).unwrap();
        let found = again.lookup("s", &["a", "b", "c"]).await.unwrap();
        assert!(matches!(
            found[0].as_ref().map(CallRecord::state),
            Some(RecordState::Answered(_))
        ));
        assert_eq!(found[1].as_ref().unwrap().state(), RecordState::Started);
        assert!(found[2].is_none());
        again.close();
        drop(again);
        // Opened once more (the log's records are in the file now): the same.
        let third = Journal::open(&crashed, DEFAULT_RETENTION).unwrap();
        let found = third.lookup("s", &["a", "b"]).await.unwrap();
        assert!(found.iter().all(Option::is_some));
    }

    #[tokio::test]
    async fn session_records_go_through_the_log_and_survive_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("j");
        let j = Journal::open(&first, DEFAULT_RETENTION).unwrap();
        j.write(vec![Write::Session {
            id: "s".into(),
            bytes: b"v1".to_vec(),
        }])
        .await
        .unwrap();
        // Updated (a tool revealed, say): the newest record is the one read back.
        j.write(vec![
            Write::Session {
                id: "s".into(),
                bytes: b"v2".to_vec(),
            },
            call("s", "a", record("bash", None)),
        ])
        .await
        .unwrap();
        assert_eq!(
            j.sessions().unwrap(),
            vec![("s".to_string(), b"v2".to_vec())]
        );
        let crashed = dir.path().join("crashed");
        files_as_a_crash_leaves_them(&first, &crashed);
        let again = Journal::open(&crashed, DEFAULT_RETENTION).unwrap();
        assert_eq!(
            again.sessions().unwrap(),
            vec![("s".to_string(), b"v2".to_vec())]
        );
        assert!(again.lookup("s", &["a"]).await.unwrap()[0].is_some());
        // Compaction checkpoints first: the record is in the file, once.
        again.compact().unwrap();
        assert_eq!(again.sessions().unwrap().len(), 1);
        // Forgotten: gone from both.
        again
            .write(vec![Write::ForgetSession { id: "s".into() }])
            .await
            .unwrap();
        assert!(again.sessions().unwrap().is_empty());
        assert!(again.lookup("s", &["a"]).await.unwrap()[0].is_none());
    }

    #[tokio::test]
    async fn a_damaged_or_missing_log_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j"), DEFAULT_RETENTION).unwrap();
        j.write(vec![call("s", "a", record("bash", Some(ok_answer("a"))))])
            .await
            .unwrap();
        let crashed = dir.path().join("crashed");
        files_as_a_crash_leaves_them(&dir.path().join("j"), &crashed);
        let log = crashed.join(log::LOG_NAME);
        let good = std::fs::read(&log).unwrap();
        // A bit flipped in the acknowledged group's record (behind the 4 KiB header and the
        // group's 32-byte header).
        let mut bad = good.clone();
        bad[4096 + 32 + 20] ^= 0x02;
        std::fs::write(&log, &bad).unwrap();
        let e = Journal::open(&crashed, DEFAULT_RETENTION).unwrap_err();
        assert!(matches!(e, JournalError::Damaged { .. }), "{e}");
        assert!(
            e.to_string().contains(log::LOG_NAME) && e.to_string().contains("mv "),
            "{e}"
        );
        // Cut to half: refused.
        std::fs::write(&log, &good[..good.len() / 2]).unwrap();
        assert!(matches!(
            Journal::open(&crashed, DEFAULT_RETENTION),
            Err(JournalError::Damaged { .. })
        ));
        // Removed after the crash: refused (its records would be lost), not made anew.
        std::fs::remove_file(&log).unwrap();
        let e = Journal::open(&crashed, DEFAULT_RETENTION).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert!(!log.exists());
        // Put back whole: the answer is there.
        std::fs::write(&log, &good).unwrap();
        let again = Journal::open(&crashed, DEFAULT_RETENTION).unwrap();
        assert!(again.lookup("s", &["a"]).await.unwrap()[0].is_some());
    }

    #[tokio::test]
    async fn writes_larger_than_the_log_go_through_checkpoints_and_are_all_found() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        let log_size = std::fs::metadata(dir.path().join(log::LOG_NAME))
            .unwrap()
            .len() as usize;
        // Each write a quarter of the log: the log fills and is checkpointed again and again.
        let big = |id: &str| {
            let mut answer = ok_answer(id);
            answer.content = "x".repeat(log_size / 4);
            call("s", id, record("bash", Some(answer)))
        };
        let ids: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
        for id in &ids {
            j.write(vec![big(id)]).await.unwrap();
        }
        assert_eq!(
            std::fs::metadata(dir.path().join(log::LOG_NAME))
                .unwrap()
                .len() as usize,
            log_size,
            "the log never grows"
        );
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let found = j.lookup("s", &refs).await.unwrap();
        assert!(found.iter().all(Option::is_some));
        j.close();
        drop(j);
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        let found = j.lookup("s", &refs).await.unwrap();
        assert!(found.iter().all(|r| {
            r.as_ref()
                .and_then(|r| r.answer.as_ref())
                .is_some_and(|a| a.content.len() == log_size / 4)
        }));
    }

    #[tokio::test]
    async fn a_journal_whose_directory_is_moved_away_refuses_writes_until_it_is_back() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("j");
        let moved = parent.path().join("j.moved");
        let j = Journal::open(&dir, DEFAULT_RETENTION).unwrap();
        j.write(vec![call("s", "a", record("bash", None))])
            .await
            .unwrap();
        std::fs::rename(&dir, &moved).unwrap();
        let e = j
            .write(vec![call("s", "b", record("bash", None))])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("gone"), "{e}");
        assert!(j.health().unwrap_err().to_string().contains(FILE_NAME));
        std::fs::rename(&moved, &dir).unwrap();
        j.write(vec![call("s", "c", record("bash", None))])
            .await
            .unwrap();
        assert!(j.health().is_ok());
        let found = j.lookup("s", &["a", "b", "c"]).await.unwrap();
        assert!(found[0].is_some() && found[1].is_none() && found[2].is_some());
    }
}
