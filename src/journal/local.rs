//! The embedded journal: one redb file, the writer thread that owns every write to it, its
//! health, its clock and its compaction.
//!
//! **Who owns what.** [`Shared`] is what the engine's tasks and the writer thread both see: the
//! open database (swapped out while it is reopened), the journal's health, the set of call keys
//! the file holds, and the journal clock. Only the writer thread writes to the file, swaps the
//! database, changes the health and the key set.
//!
//! **Health.** Before every flush the writer checks that the path still names the file it opened
//! (a directory removed or replaced under a running engine is noticed); a flush that fails (a
//! full disk, an I/O error) leaves the journal failing. While failing, every write is refused at
//! once — so nothing that needs an intent runs — and the writer reopens the file every
//! [`HEAL_EVERY`] until it works again: a full disk heals without a restart once space is back.
//!
//! **Damage.** Only a missing file starts an empty journal. An empty, zeroed, truncated or
//! foreign file, and any page whose checksum fails, stops the opening with
//! [`JournalError::Damaged`]. Commits are two-phase (redb's `set_two_phase_commit`): the commit
//! slot a commit wrote is made the primary only once it is durable, so a damaged primary slot is
//! refused instead of silently falling back to the commit before it.
//!
//! **Clock.** Records are stamped with the journal's own clock: the time it had at its last
//! commit (stored in the file) plus the time the engine has run since it opened it. Wall-clock
//! steps in either direction, and the time the engine was down, never age a record.
//!
//! **Compaction** ([`compact`], at open and every [`compact_every`] while the engine runs):
//! an answer older than the retention is replaced by a tombstone (its argument digest, its error
//! code and whether it ran), so a late retry is still recognised and never runs; a session with
//! no session record whose newest call is older than the retention is forgotten whole. Freed
//! pages are reused, so under a steady load the file stops growing.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use super::{Batch, CallRecord, FlushCounts, JournalError, Write};
use crate::locks::lock;
use crate::metrics::JournalMetrics;

pub(super) const CALLS: TableDefinition<&str, &[u8]> = TableDefinition::new("calls");
pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The journal clock's reading at the last commit (milliseconds).
const CLOCK_KEY: &str = "clock_ms";

/// redb's page cache for the journal (its default is 1 GiB; the integrity check at open reads
/// the whole file through it).
const CACHE_BYTES: usize = 32 << 20;
/// How long opening waits for another process to let go of the file: a process killed a moment
/// ago may still have it open through a child it was starting (until the child's `exec`).
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// How often a failing journal tries to reopen its file.
pub(super) const HEAL_EVERY: Duration = Duration::from_millis(500);
/// How often an idle writer checks that its file is still there.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often the writer compacts: a quarter of the retention, at least every 15 s and at most
/// every hour.
pub(super) fn compact_every(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(15), Duration::from_secs(3600))
}

/// The journal's clock: milliseconds that advance only while an engine has the journal open.
#[derive(Debug)]
pub(super) struct Clock {
    base_ms: u64,
    opened: Instant,
}

impl Clock {
    pub(super) fn now_ms(&self) -> u64 {
        self.base_ms + self.opened.elapsed().as_millis() as u64
    }
}

/// What the engine's tasks and the writer thread share.
pub(super) struct Shared {
    pub(super) file: PathBuf,
    /// Device and inode of the file opened (to notice it removed or replaced).
    identity: (u64, u64),
    pub(super) retention: Duration,
    /// The open database; `None` while the writer reopens it after a failure.
    db: ArcSwapOption<Database>,
    healthy: AtomicBool,
    /// Why the journal is failing (empty while healthy).
    failure: Mutex<String>,
    /// Hashes of every call key in the file: an id not in it is read from nowhere.
    known: Mutex<HashSet<u64, foldhash::fast::FixedState>>,
    hasher: foldhash::fast::FixedState,
    pub(super) clock: Clock,
    metrics: JournalMetrics,
}

impl Shared {
    fn key_hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Ok while the journal can write; the reason while it cannot.
    pub(super) fn health(&self) -> Result<(), String> {
        if self.healthy.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(lock(&self.failure).clone())
        }
    }

    fn fail(&self, detail: String) {
        if self.healthy.swap(false, Ordering::AcqRel) {
            tracing::error!(journal = %self.file.display(), error = %detail,
                "journal failing: calls that need an intent are refused until it recovers");
        }
        *lock(&self.failure) = detail;
        self.metrics.healthy(false);
    }

    fn recover(&self) {
        if !self.healthy.swap(true, Ordering::AcqRel) {
            tracing::warn!(journal = %self.file.display(), "journal recovered: writing again");
        }
        lock(&self.failure).clear();
        self.metrics.healthy(true);
    }

    fn failing(&self) -> JournalError {
        JournalError::Io {
            file: self.file.clone(),
            detail: self.health().err().unwrap_or_default(),
            source: None,
        }
    }

    /// The open database, or why there is none.
    fn db(&self) -> Result<Arc<Database>, JournalError> {
        self.db.load_full().ok_or_else(|| self.failing())
    }

    /// True when the file may hold a record under `key` (false: it certainly does not).
    pub(super) fn may_hold(&self, key: &str) -> bool {
        lock(&self.known).contains(&self.key_hash(key))
    }

    /// Reads the records under `keys` (`None` where there is none).
    pub(super) fn read(&self, keys: &[String]) -> Result<Vec<Option<CallRecord>>, JournalError> {
        let db = self.db()?;
        let file = &self.file;
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let table = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        keys.iter()
            .map(|key| {
                let Some(value) = table.get(key.as_str()).map_err(|e| io(file, e))? else {
                    return Ok(None);
                };
                serde_json::from_slice(value.value())
                    .map(Some)
                    .map_err(|e| damaged(file, format!("a call record does not decode: {e}")))
            })
            .collect()
    }

    /// Every session record.
    pub(super) fn sessions(&self) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        let db = self.db()?;
        let file = &self.file;
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let table = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| io(file, e))? {
            let (k, v) = entry.map_err(|e| io(file, e))?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Whether the path still names the file this journal opened.
    fn check_file(&self) -> Result<(), String> {
        match std::fs::metadata(&self.file) {
            Ok(m) if (m.dev(), m.ino()) == self.identity => Ok(()),
            Ok(_) => Err(format!(
                "the journal file {} was replaced by another file while the engine ran; \
                 restart the engine to use the new file",
                self.file.display()
            )),
            Err(e) => Err(format!(
                "the journal file {} is gone ({e}): its directory was removed or moved while the \
                 engine ran; put it back, or restart the engine",
                self.file.display()
            )),
        }
    }
}

/// Opens the journal file `file` (created only if missing), checks it whole, and reads what the
/// writer needs: the clock and the call keys. The writer is started by the caller.
pub(super) fn open(file: &Path, retention: Duration) -> Result<Shared, JournalError> {
    let db = open_db(file, true)?;
    // Make sure every table exists (and that a foreign redb file is refused now).
    let txn = db.begin_write().map_err(|e| damaged(file, e))?;
    {
        txn.open_table(CALLS).map_err(|e| damaged(file, e))?;
        txn.open_table(SESSIONS).map_err(|e| damaged(file, e))?;
        txn.open_table(META).map_err(|e| damaged(file, e))?;
    }
    txn.commit().map_err(|e| damaged(file, e))?;
    let hasher = foldhash::fast::FixedState::default();
    let (base_ms, known) = {
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let meta = txn.open_table(META).map_err(|e| io(file, e))?;
        let base = meta
            .get(CLOCK_KEY)
            .map_err(|e| io(file, e))?
            .map(|v| v.value());
        let calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        let mut known = HashSet::with_capacity_and_hasher(
            calls.len().map_err(|e| io(file, e))? as usize,
            foldhash::fast::FixedState::default(),
        );
        for entry in calls.iter().map_err(|e| io(file, e))? {
            let (k, _) = entry.map_err(|e| io(file, e))?;
            known.insert(hasher.hash_one(k.value()));
        }
        // A journal without a clock yet (new, or written by an older version) starts it at the
        // wall clock: its records were stamped with it.
        (base.unwrap_or_else(super::now_ms), known)
    };
    let meta = std::fs::metadata(file).map_err(|e| io(file, e))?;
    Ok(Shared {
        file: file.to_path_buf(),
        identity: (meta.dev(), meta.ino()),
        retention,
        db: ArcSwapOption::new(Some(Arc::new(db))),
        healthy: AtomicBool::new(true),
        failure: Mutex::new(String::new()),
        known: Mutex::new(known),
        hasher,
        clock: Clock {
            base_ms,
            opened: Instant::now(),
        },
        metrics: JournalMetrics::new(),
    })
}

/// The writer thread: one transaction and one durable commit per round, covering every batch
/// waiting when the round began; between rounds, the file's check, healing and compaction.
pub(super) fn writer(shared: Arc<Shared>, rx: mpsc::Receiver<Batch>, counts: &Mutex<FlushCounts>) {
    let every = compact_every(shared.retention);
    let mut compacted = Instant::now();
    let mut checked = Instant::now();
    let mut tried = Instant::now();
    shared.metrics.healthy(true);
    loop {
        let first = match rx.recv_timeout(CHECK_EVERY.min(HEAL_EVERY)) {
            Ok(first) => Some(first),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Closed: the clock's last reading, so that the time the engine is down
                // never counts.
                if shared.health().is_ok() {
                    let _ = commit(&shared, &[]);
                }
                break;
            }
        };
        let mut batches: Vec<Batch> = first.into_iter().collect();
        while let Ok(more) = rx.try_recv() {
            batches.push(more);
        }
        // The file's check: before every flush, and every CHECK_EVERY when idle.
        if !batches.is_empty() || checked.elapsed() >= CHECK_EVERY {
            checked = Instant::now();
            match shared.check_file() {
                Ok(()) => {
                    if shared.db.load().is_some() && shared.health().is_err() {
                        shared.recover();
                    }
                }
                Err(detail) => shared.fail(detail),
            }
        }
        // A failing journal whose file is still its own tries to reopen it.
        if shared.db.load().is_none() && tried.elapsed() >= HEAL_EVERY {
            tried = Instant::now();
            if shared.check_file().is_ok() {
                match open_db(&shared.file, false) {
                    Ok(db) => {
                        shared.db.store(Some(Arc::new(db)));
                        shared.recover();
                    }
                    Err(e) => shared.fail(format!("cannot reopen after a failed write: {e}")),
                }
            }
        }
        if shared.health().is_ok() && compacted.elapsed() >= every {
            compacted = Instant::now();
            if let Err(e) = compact(&shared) {
                tracing::error!(journal = %shared.file.display(), error = %e, "journal compaction failed");
                after_failure(&shared, e.to_string());
            }
        }
        if batches.is_empty() {
            continue;
        }
        let records: usize = batches.iter().map(|b| b.writes.len()).sum();
        if shared.health().is_err() {
            let refused = shared.failing();
            for batch in batches {
                let _ = batch.done.send(Err(refused.clone()));
            }
            continue;
        }
        let started = Instant::now();
        let outcome = commit(&shared, &batches);
        let elapsed = started.elapsed();
        shared.metrics.flush(records, elapsed);
        lock(counts).add(records, elapsed);
        if let Err(e) = &outcome {
            tracing::error!(journal = %shared.file.display(), error = %e, "journal flush failed");
            after_failure(&shared, e.to_string());
        }
        for batch in batches {
            let _ = batch.done.send(outcome.clone());
        }
    }
}

/// A write failed: the journal is failing, and its database (which refuses every later write
/// after an I/O error) is dropped, to be reopened.
fn after_failure(shared: &Shared, detail: String) {
    shared.fail(detail);
    if let Some(mut db) = shared.db.swap(None) {
        // Readers hold a clone for one read at most: wait for them to let go, so that the file
        // is closed (and its lock released) before it is opened again.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match Arc::try_unwrap(db) {
                Ok(db) => {
                    drop(db);
                    break;
                }
                Err(still) if Instant::now() < deadline => {
                    db = still;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => break,
            }
        }
    }
}

fn commit(shared: &Shared, batches: &[Batch]) -> Result<(), JournalError> {
    let file = &shared.file;
    let db = shared.db()?;
    let mut txn = db.begin_write().map_err(|e| io(file, e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| io(file, e))?;
    txn.set_two_phase_commit(true);
    let mut added = Vec::new();
    let mut removed = Vec::new();
    {
        let mut calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        let mut sessions = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
        let mut meta = txn.open_table(META).map_err(|e| io(file, e))?;
        for write in batches.iter().flat_map(|b| &b.writes) {
            match write {
                Write::Call {
                    session,
                    id,
                    record,
                } => {
                    let bytes = serde_json::to_vec(record).map_err(|e| io(file, e))?;
                    let key = super::call_key(session, id);
                    calls
                        .insert(key.as_str(), bytes.as_slice())
                        .map_err(|e| io(file, e))?;
                    added.push(shared.key_hash(&key));
                }
                Write::Session { id, bytes } => {
                    sessions
                        .insert(id.as_str(), bytes.as_slice())
                        .map_err(|e| io(file, e))?;
                }
                Write::ForgetSession { id } => {
                    sessions.remove(id.as_str()).map_err(|e| io(file, e))?;
                    let (from, to) = session_range(id);
                    calls
                        .retain_in(from.as_str()..to.as_str(), |k, _| {
                            removed.push(shared.key_hash(k));
                            false
                        })
                        .map_err(|e| io(file, e))?;
                }
            }
        }
        meta.insert(CLOCK_KEY, shared.clock.now_ms())
            .map_err(|e| io(file, e))?;
    }
    txn.commit().map_err(|e| io(file, e))?;
    let mut known = lock(&shared.known);
    for h in removed {
        known.remove(&h);
    }
    known.extend(added);
    Ok(())
}

/// The keys of session `id`'s calls: `id \0 …`, from `id \0` up to (not including) `id \x01`.
fn session_range(id: &str) -> (String, String) {
    (format!("{id}\0"), format!("{id}\x01"))
}

/// What compaction did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// Answers replaced by tombstones.
    pub tombstoned: usize,
    /// Call records deleted with their session.
    pub deleted: usize,
}

/// Replaces answers older than the retention with tombstones, and forgets sessions without a
/// session record whose newest call is that old.
pub(super) fn compact(shared: &Shared) -> Result<Compacted, JournalError> {
    let file = &shared.file;
    let cutoff = shared
        .clock
        .now_ms()
        .saturating_sub(shared.retention.as_millis() as u64);
    let db = shared.db()?;
    // Read first (what changes), then write it in one transaction.
    let mut tombstones: Vec<(String, Vec<u8>)> = Vec::new();
    let mut expired: Vec<String> = Vec::new();
    {
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        let sessions = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
        // Keys are `session \0 id`, sorted: one session's calls are together.
        let mut current: Option<(String, u64, bool)> = None;
        let close = |done: Option<(String, u64, bool)>, expired: &mut Vec<String>| {
            if let Some((session, newest, recorded)) = done
                && !recorded
                && newest < cutoff
            {
                expired.push(session);
            }
        };
        for entry in calls.iter().map_err(|e| io(file, e))? {
            let (k, v) = entry.map_err(|e| io(file, e))?;
            let key = k.value();
            let session = key.split('\0').next().unwrap_or_default();
            let record: CallRecord = match serde_json::from_slice(v.value()) {
                Ok(record) => record,
                Err(e) => {
                    return Err(damaged(file, format!("a call record does not decode: {e}")));
                }
            };
            if current.as_ref().is_none_or(|(s, ..)| s != session) {
                let recorded = sessions.get(session).map_err(|e| io(file, e))?.is_some();
                close(
                    current.replace((session.to_string(), 0, recorded)),
                    &mut expired,
                );
            }
            if let Some((_, newest, _)) = &mut current {
                *newest = (*newest).max(record.at_ms);
            }
            if record.at_ms < cutoff
                && let Some(tomb) = record.tombstone()
            {
                let bytes = serde_json::to_vec(&tomb).map_err(|e| io(file, e))?;
                tombstones.push((key.to_string(), bytes));
            }
        }
        close(current.take(), &mut expired);
    }
    if tombstones.is_empty() && expired.is_empty() {
        return Ok(Compacted::default());
    }
    let mut txn = db.begin_write().map_err(|e| io(file, e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| io(file, e))?;
    txn.set_two_phase_commit(true);
    let mut removed = Vec::new();
    let mut tombstoned = 0;
    {
        let mut calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        let expired_set: HashSet<&str> = expired.iter().map(String::as_str).collect();
        for (key, bytes) in &tombstones {
            let session = key.split('\0').next().unwrap_or_default();
            if !expired_set.contains(session) {
                calls
                    .insert(key.as_str(), bytes.as_slice())
                    .map_err(|e| io(file, e))?;
                tombstoned += 1;
            }
        }
        for session in &expired {
            let (from, to) = session_range(session);
            calls
                .retain_in(from.as_str()..to.as_str(), |k, _| {
                    removed.push(shared.key_hash(k));
                    false
                })
                .map_err(|e| io(file, e))?;
        }
        let mut meta = txn.open_table(META).map_err(|e| io(file, e))?;
        meta.insert(CLOCK_KEY, shared.clock.now_ms())
            .map_err(|e| io(file, e))?;
    }
    txn.commit().map_err(|e| io(file, e))?;
    let deleted = removed.len();
    let mut known = lock(&shared.known);
    for h in removed {
        known.remove(&h);
    }
    Ok(Compacted {
        tombstoned,
        deleted,
    })
}

/// Opens (`create`: or creates, when missing) the database at `file`, checking every page.
fn open_db(file: &Path, create: bool) -> Result<Database, JournalError> {
    let exists = match std::fs::metadata(file) {
        Ok(m) if m.len() == 0 => {
            return Err(damaged(
                file,
                "the file is empty (0 bytes), as a file system may leave a file after a power \
                 loss; it is not taken for a new journal",
            ));
        }
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io(file, e)),
    };
    if !exists && !create {
        return Err(io(file, "the file is gone"));
    }
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let mut builder = Database::builder();
        // The integrity check at open (checksums of every page) turns a damaged file into an
        // error here, instead of a wrong read later.
        builder
            .set_check_integrity_on_open(true)
            .set_cache_size(CACHE_BYTES);
        let opened = if exists {
            builder.open(file)
        } else {
            builder.create(file)
        };
        match opened {
            Ok(db) => return Ok(db),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(open_error(file, e)),
        }
    }
}

pub(super) fn io(
    file: &Path,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> JournalError {
    let e = e.into();
    JournalError::Io {
        file: file.to_path_buf(),
        detail: e.to_string(),
        source: Some(Arc::from(e)),
    }
}

pub(super) fn damaged(file: &Path, e: impl std::fmt::Display) -> JournalError {
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

    #[tokio::test]
    async fn the_clock_starts_from_the_file_not_the_wall_clock() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(super::super::FILE_NAME);
        super::super::Journal::open(dir.path(), super::super::DEFAULT_RETENTION)
            .unwrap()
            .close();
        // As if the last commit had been made when the journal's clock read 5,000 ms (and the
        // wall clock said something else entirely).
        {
            let db = Database::create(&file).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(CLOCK_KEY, 5_000)
                .unwrap();
            txn.commit().unwrap();
        }
        let j = super::super::Journal::open(dir.path(), super::super::DEFAULT_RETENTION).unwrap();
        let now = j.now_ms();
        assert!((5_000..65_000).contains(&now), "{now}");
        j.close();
        drop(j);
        // Closing stores the clock's last reading: the next engine goes on from there.
        let db = Database::open(&file).unwrap();
        let txn = db.begin_read().unwrap();
        let stored = txn
            .open_table(META)
            .unwrap()
            .get(CLOCK_KEY)
            .unwrap()
            .unwrap()
            .value();
        assert!((now..65_000).contains(&stored), "{now} → {stored}");
    }
}
