//! The call journal: what a session's calls were and how they were answered, made durable so that
//! a client retrying a turn after the engine crashed or restarted gets the same answers, and no
//! side-effect call runs twice.
//!
//! One embedded [`redb`] file, `DIR/journal.redb`, with two tables: `calls`, keyed by
//! `session \0 tool_use_id`, holding a [`CallRecord`] (the tool, an argument digest, the effect
//! class, and the answer once there is one), and `sessions`, keyed by session id, holding what a
//! front end needs to reopen the session after a restart (opaque bytes here).
//!
//! **Group commit.** Writes are handed to one writer thread. It takes every write waiting at that
//! moment — from every session — applies them in one transaction and makes it durable (one
//! fsync), then wakes each writer. A write returns only once durable, so a call whose intent was
//! written starts only after its intent is on disk, and an answer leaves the engine only after it
//! is. Under load, one flush covers many calls; alone, a call pays one flush. The writer keeps
//! running totals ([`Journal::flush_counts`]) beside its metrics, so a caller can see how many
//! records each flush carried without a recorder.
//!
//! **Compaction.** Records answered longer ago than the retention (default 24 hours) are deleted
//! when the journal opens and then hourly; so are intents that old that were never answered.
//!
//! **Damage.** A file that does not open as a journal stops start-up with a message naming it
//! and how to move it aside ([`JournalError::Damaged`]); a journal is never silently replaced by
//! an empty one.
//!
//! **Replicated.** In cluster mode the same interface is kept in a NATS JetStream stream instead
//! ([`replicated`]): one subject per session, every write fenced by the session's last sequence.
//! This file holds the embedded store and what both share.

pub mod replicated;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};
use serde::{Deserialize, Serialize};

use crate::metrics::JournalMetrics;
use crate::protocol::{Block, ErrorCode, Image, Timing, ToolDispatchResult, ToolReference};

const CALLS: TableDefinition<&str, &[u8]> = TableDefinition::new("calls");
const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");

/// The journal file's name inside its directory.
pub const FILE_NAME: &str = "journal.redb";

/// Default retention of answered calls.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Why the journal cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The file exists and is not a readable journal.
    #[error(
        "the journal {file} is damaged ({detail}); move it aside to start with an empty journal \
         (e.g. `mv {file} {file}.damaged`): the answers it holds are then forgotten"
    )]
    Damaged {
        /// The journal file.
        file: PathBuf,
        /// What the store reported.
        detail: String,
    },
    /// Another process has the journal open.
    #[error(
        "the journal {file} is in use by another process (one engine per journal; waited 5 s \
         for it to let go)"
    )]
    InUse {
        /// The journal file.
        file: PathBuf,
    },
    /// Reading or writing failed (a full disk, an I/O error).
    #[error("the journal {file}: {detail}")]
    Io {
        /// The journal file.
        file: PathBuf,
        /// What failed.
        detail: String,
    },
    /// The journal's writer has stopped (the engine is shutting down).
    #[error("the journal is closed")]
    Closed,
    /// Another node owns the session now (cluster mode): its journal moved on past what this
    /// node wrote, so this node writes nothing more for it.
    #[error("session {session} is owned by another node now; this node writes nothing more for it")]
    Fenced {
        /// The session id.
        session: String,
    },
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
    /// Unix milliseconds when the record was last written.
    pub at_ms: u64,
    /// The answer; `None` while only the intent is recorded.
    pub answer: Option<StoredAnswer>,
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

struct Inner {
    db: Arc<Database>,
    file: PathBuf,
    retention: Duration,
    /// The writer's running totals (locked once per flush).
    counts: Arc<std::sync::Mutex<FlushCounts>>,
    queue: std::sync::Mutex<Option<mpsc::Sender<Batch>>>,
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
                .field("file", &inner.file)
                .finish(),
            Backend::Replicated(r) => f
                .debug_struct("Journal")
                .field("stream", &r.stream_name())
                .finish(),
        }
    }
}

/// Unix milliseconds now.
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
    /// Opens (or creates) the journal in directory `dir` (created if missing), keeping answered
    /// calls for `retention`, and compacts it.
    pub fn open(dir: &Path, retention: Duration) -> Result<Journal, JournalError> {
        let file = dir.join(FILE_NAME);
        std::fs::create_dir_all(dir).map_err(|e| JournalError::Io {
            file: file.clone(),
            detail: format!("cannot create the directory {}: {e}", dir.display()),
        })?;
        let db = open_db(&file)?;
        // Make sure both tables exist (and that a foreign redb file is refused now).
        let txn = db.begin_write().map_err(|e| damaged(&file, e))?;
        {
            txn.open_table(CALLS).map_err(|e| damaged(&file, e))?;
            txn.open_table(SESSIONS).map_err(|e| damaged(&file, e))?;
        }
        txn.commit().map_err(|e| damaged(&file, e))?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel::<Batch>();
        let writer_db = Arc::clone(&db);
        let writer_file = file.clone();
        let counts = Arc::new(std::sync::Mutex::new(FlushCounts::default()));
        let writer_counts = Arc::clone(&counts);
        // Taken here, on the caller's thread: an engine built under a local recorder
        // (`metrics::with_local_recorder`) records its journal there too.
        let metrics = JournalMetrics::new();
        let writer = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || {
                writer(
                    writer_db,
                    writer_file,
                    rx,
                    metrics,
                    &writer_counts,
                    retention,
                )
            })
            .map_err(|e| JournalError::Io {
                file: file.clone(),
                detail: format!("cannot start the writer thread: {e}"),
            })?;
        let inner = Arc::new(Inner {
            db,
            file,
            retention,
            counts,
            queue: std::sync::Mutex::new(Some(tx)),
            writer: std::sync::Mutex::new(Some(writer)),
        });
        compact(&inner.db, &inner.file, inner.retention)?;
        Ok(Journal {
            backend: Backend::Local(inner),
        })
    }

    /// A journal kept in a replicated JetStream stream (cluster mode).
    pub fn replicated(journal: Arc<replicated::Replicated>) -> Journal {
        Journal {
            backend: Backend::Replicated(journal),
        }
    }

    /// The replicated store, in cluster mode.
    pub fn as_replicated(&self) -> Option<&Arc<replicated::Replicated>> {
        match &self.backend {
            Backend::Local(_) => None,
            Backend::Replicated(r) => Some(r),
        }
    }

    /// How long answered calls are kept.
    pub fn retention(&self) -> Duration {
        match &self.backend {
            Backend::Local(inner) => inner.retention,
            Backend::Replicated(r) => r.retention(),
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
        *counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes `writes` durable, together with every other write waiting now (one transaction,
    /// one fsync; replicated: one acknowledged publish per session). Returns once they are
    /// durable.
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
            let queue = inner
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(queue) = queue.as_ref() else {
                return Err(JournalError::Closed);
            };
            queue
                .send(Batch { writes, done })
                .map_err(|_| JournalError::Closed)?;
        }
        wait.await.unwrap_or(Err(JournalError::Closed))
    }

    /// The records of calls `ids` of `session` (one read transaction), `None` where there is
    /// none.
    pub fn lookup(
        &self,
        session: &str,
        ids: &[&str],
    ) -> Result<Vec<Option<CallRecord>>, JournalError> {
        let inner = match &self.backend {
            Backend::Local(inner) => inner,
            Backend::Replicated(r) => return Ok(r.lookup(session, ids)),
        };
        let file = &inner.file;
        let txn = inner.db.begin_read().map_err(|e| io(file, e))?;
        let table = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        ids.iter()
            .map(|id| {
                let Some(value) = table
                    .get(call_key(session, id).as_str())
                    .map_err(|e| io(file, e))?
                else {
                    return Ok(None);
                };
                serde_json::from_slice(value.value())
                    .map(Some)
                    .map_err(|e| damaged(file, format!("a call record does not decode: {e}")))
            })
            .collect()
    }

    /// Every session record: `(id, bytes)`. Replicated: none — a cluster node claims sessions
    /// one at a time, when a request names one ([`replicated::Replicated::claim`]).
    pub fn sessions(&self) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        let inner = match &self.backend {
            Backend::Local(inner) => inner,
            Backend::Replicated(_) => return Ok(Vec::new()),
        };
        let file = &inner.file;
        let txn = inner.db.begin_read().map_err(|e| io(file, e))?;
        let table = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| io(file, e))? {
            let (k, v) = entry.map_err(|e| io(file, e))?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Deletes call records older than the retention (answered or not); returns how many.
    /// Replicated: the stream's own age limit does it (0 here).
    pub fn compact(&self) -> Result<usize, JournalError> {
        match &self.backend {
            Backend::Local(inner) => compact(&inner.db, &inner.file, inner.retention),
            Backend::Replicated(_) => Ok(0),
        }
    }

    /// Stops taking writes; the writer ends once those queued now are durable (the file is
    /// released when the last clone is dropped).
    pub fn close(&self) {
        match &self.backend {
            Backend::Local(inner) => {
                inner
                    .queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
            }
            Backend::Replicated(r) => r.close(),
        }
    }
}

/// How often the writer compacts the journal (besides at open).
const COMPACT_EVERY: Duration = Duration::from_secs(3600);

/// Deletes call records older than `retention`; returns how many.
fn compact(db: &Database, file: &Path, retention: Duration) -> Result<usize, JournalError> {
    let cutoff = now_ms().saturating_sub(retention.as_millis() as u64);
    let mut txn = db.begin_write().map_err(|e| io(file, e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| io(file, e))?;
    let removed = {
        let mut table = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        let before = table.len().map_err(|e| io(file, e))?;
        table
            .retain(|_, v| serde_json::from_slice::<CallRecord>(v).is_ok_and(|r| r.at_ms >= cutoff))
            .map_err(|e| io(file, e))?;
        before - table.len().map_err(|e| io(file, e))?
    };
    txn.commit().map_err(|e| io(file, e))?;
    Ok(removed as usize)
}

/// The writer thread: one transaction and one durable commit per round, covering every batch
/// waiting when the round began; every [`COMPACT_EVERY`], a compaction.
fn writer(
    db: Arc<Database>,
    file: PathBuf,
    rx: mpsc::Receiver<Batch>,
    metrics: JournalMetrics,
    counts: &std::sync::Mutex<FlushCounts>,
    retention: Duration,
) {
    let mut compacted = Instant::now();
    loop {
        if compacted.elapsed() >= COMPACT_EVERY {
            if let Err(e) = compact(&db, &file, retention) {
                tracing::error!(journal = %file.display(), error = %e, "journal compaction failed");
            }
            compacted = Instant::now();
        }
        let first = match rx.recv_timeout(COMPACT_EVERY.saturating_sub(compacted.elapsed())) {
            Ok(first) => first,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let mut batches = vec![first];
        while let Ok(more) = rx.try_recv() {
            batches.push(more);
        }
        let started = Instant::now();
        let records: usize = batches.iter().map(|b| b.writes.len()).sum();
        let outcome = commit(&db, &file, &batches);
        let elapsed = started.elapsed();
        metrics.flush(records, elapsed);
        counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(records, elapsed);
        if let Err(e) = &outcome {
            tracing::error!(journal = %file.display(), error = %e, "journal flush failed");
        }
        for batch in batches {
            let _ = batch.done.send(outcome.clone());
        }
    }
}

fn commit(db: &Database, file: &Path, batches: &[Batch]) -> Result<(), JournalError> {
    let mut txn = db.begin_write().map_err(|e| io(file, e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| io(file, e))?;
    {
        let mut calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        let mut sessions = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
        for write in batches.iter().flat_map(|b| &b.writes) {
            match write {
                Write::Call {
                    session,
                    id,
                    record,
                } => {
                    let bytes = serde_json::to_vec(record).map_err(|e| io(file, e))?;
                    calls
                        .insert(call_key(session, id).as_str(), bytes.as_slice())
                        .map_err(|e| io(file, e))?;
                }
                Write::Session { id, bytes } => {
                    sessions
                        .insert(id.as_str(), bytes.as_slice())
                        .map_err(|e| io(file, e))?;
                }
                Write::ForgetSession { id } => {
                    sessions.remove(id.as_str()).map_err(|e| io(file, e))?;
                }
            }
        }
    }
    txn.commit().map_err(|e| io(file, e))
}

/// How long opening waits for another process to let go of the file: a process killed a moment
/// ago may still have it open through a child it was starting (until the child's `exec`).
const LOCK_WAIT: Duration = Duration::from_secs(5);

fn open_db(file: &Path) -> Result<Database, JournalError> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // The integrity check at open (checksums of every page) turns a damaged file into an
        // error here, instead of a wrong read later.
        match Database::builder()
            .set_check_integrity_on_open(true)
            .create(file)
        {
            Ok(db) => return Ok(db),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(open_error(file, e)),
        }
    }
}

fn io(file: &Path, e: impl std::fmt::Display) -> JournalError {
    JournalError::Io {
        file: file.to_path_buf(),
        detail: e.to_string(),
    }
}

fn damaged(file: &Path, e: impl std::fmt::Display) -> JournalError {
    JournalError::Damaged {
        file: file.to_path_buf(),
        detail: e.to_string(),
    }
}

fn open_error(file: &Path, e: redb::DatabaseError) -> JournalError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => JournalError::InUse {
            file: file.to_path_buf(),
        },
        redb::DatabaseError::Storage(redb::StorageError::Io(e))
            if e.kind() != std::io::ErrorKind::InvalidData
                && e.kind() != std::io::ErrorKind::UnexpectedEof =>
        {
            io(file, e)
        }
        other => damaged(file, other),
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
        }
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
            j.write(vec![Write::Call {
                session: "s".into(),
                id: "t1".into(),
                record: Box::new(record("bash", Some(StoredAnswer::of(&result)))),
            }])
            .await
            .unwrap();
            j.close();
        }
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        let found = j.lookup("s", &["t1", "t2"]).unwrap();
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

    #[tokio::test]
    async fn compaction_drops_only_old_records() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), Duration::from_secs(60)).unwrap();
        let mut old = record("bash", None);
        old.at_ms -= 120_000;
        j.write(vec![
            Write::Call {
                session: "s".into(),
                id: "old".into(),
                record: Box::new(old),
            },
            Write::Call {
                session: "s".into(),
                id: "new".into(),
                record: Box::new(record("bash", None)),
            },
        ])
        .await
        .unwrap();
        assert_eq!(j.compact().unwrap(), 1);
        let found = j.lookup("s", &["old", "new"]).unwrap();
        assert!(found[0].is_none() && found[1].is_some());
    }

    #[tokio::test]
    async fn flush_counts_count_each_flush_and_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), DEFAULT_RETENTION).unwrap();
        let start = j.flush_counts();
        let call = |id: &str| Write::Call {
            session: "s".into(),
            id: id.into(),
            record: Box::new(record("noop", None)),
        };
        // Awaited one after the other: nothing else waits, so each write is one flush.
        j.write(vec![call("a"), call("b"), call("c")])
            .await
            .unwrap();
        j.write(vec![call("d")]).await.unwrap();
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
        j.write(vec![Write::Call {
            session: "s".into(),
            id: "a".into(),
            record: Box::new(record("noop", None)),
        }])
        .await
        .unwrap();
        let flushes = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(key, ..)| key.key().name() == crate::metrics::JOURNAL_FLUSHES_TOTAL)
            .map(|(.., value)| value);
        assert_eq!(flushes, Some(DebugValue::Counter(1)));
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
}
