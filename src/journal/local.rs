//! The embedded journal: one redb file and its write-ahead log (`log.rs`), the writer thread
//! that owns every write to them, its health, its clock, its checkpoints and its compaction.
//!
//! **Who owns what.** [`Shared`] is what the engine's tasks and the writer thread both see: the
//! open database (swapped out while it is reopened), the journal's health, the set of call keys
//! the file and the log hold, the log's records not yet in the file, and the journal clock. Only
//! the writer thread writes to the log, swaps the database, changes the health, the key set and
//! adds to the log's records; it alone holds the log ([`Tail`]). The file is written by the
//! writer and by the checkpoint it starts on a thread of its own — one at a time: the writer waits
//! for the checkpoint in flight before it starts another or writes the file itself.
//!
//! **Flush and checkpoint.** A round's call records go to the log as one group (durable when
//! `fdatasync` returns) and into `pending`, which reads look at before the file. A checkpoint
//! (every second, or when the active half of the log is three quarters full) sets the active
//! half's records aside (`pending.frozen`), lets the log go on in its other half, and writes them
//! into the file on its own thread in one two-phase transaction, with the last group's sequence
//! (`log_seq` in the `meta` table), then lets them go. A full checkpoint (before compaction,
//! forgetting a session, closing, healing) waits for that one and writes the rest itself, and
//! both halves start again. Opening
//! puts into the file whatever the log holds past `log_seq`, so an acknowledged record is in
//! one of the two at any moment. Session records travel the same way (read back merged with the
//! file's); a round that forgets a session, or too large for a half of the log, is committed to
//! the file directly after a checkpoint.
//!
//! **Health.** Before every flush the writer checks that the path still names the file it opened
//! (a directory removed or replaced under a running engine is noticed); a flush that fails (a
//! full disk, an I/O error) leaves the journal failing. While failing, every write is refused at
//! once — so nothing that needs an intent runs — and the writer reopens the file every
//! [`HEAL_EVERY`] until it works again: a full disk heals without a restart once space is back.
//!
//! **Damage.** Only a missing file starts an empty journal. An empty, zeroed, truncated or
//! foreign file, and any page whose checksum fails, stops the opening with
//! [`JournalError::Damaged`] — and so does a log that does not check (`log.rs` tells a flush a
//! crash cut, never acknowledged, from damage), or a missing log where the file had one.
//! Commits are two-phase (redb's `set_two_phase_commit`): the commit slot a commit wrote is made
//! the primary only once it is durable, so a damaged primary slot is refused instead of silently
//! falling back to the commit before it.
//!
//! **Clock.** Records are stamped with the journal's own clock: the time it had at its last
//! commit or flush (stored in the file, and in each log group) plus the time the engine has run
//! since it opened it. Wall-clock
//! steps in either direction, and the time the engine was down, never age a record.
//!
//! **Compaction** ([`compact`], at open and every [`compact_every`] while the engine runs):
//! an answer older than the retention is replaced by a tombstone (its argument digest, its error
//! code and whether it ran), so a late retry is still recognised and never runs; a session with
//! no session record whose newest call is older than the retention is forgotten whole. Freed
//! pages are reused, so under a steady load the file stops growing.

use std::collections::{HashMap, HashSet};
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

use super::log::{LOG_NAME, Log};
use super::{Batch, CallRecord, FlushCounts, Job, JournalError, Write, damaged, io};
use crate::locks::lock;
use crate::metrics::JournalMetrics;

pub(super) const CALLS: TableDefinition<&str, &[u8]> = TableDefinition::new("calls");
pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The journal clock's reading at the last commit (milliseconds).
const CLOCK_KEY: &str = "clock_ms";
/// The sequence of the last log group a checkpoint applied (present once the file has a log).
const LOG_SEQ_KEY: &str = "log_seq";

/// A checkpoint is made when the log is this full…
const CHECKPOINT_FILL: f64 = 0.75;
/// …or when its oldest record not yet in the redb file is this old (it bounds the time a
/// restart spends reading the log back).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

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
    /// Hashes of every call key in the file or the log: an id not in it is read from nowhere.
    known: Mutex<HashSet<u64, foldhash::fast::FixedState>>,
    /// The log next to the file, and its device and inode.
    log_file: PathBuf,
    log_identity: (u64, u64),
    /// Records durable in the log and not yet in the redb file (the newest per key): read
    /// before the file.
    pending: Mutex<Pending>,
    hasher: foldhash::fast::FixedState,
    pub(super) clock: Clock,
    metrics: JournalMetrics,
}

/// A half's records, newest per key.
type Records = HashMap<Arc<str>, Arc<[u8]>, foldhash::fast::RandomState>;

/// One half's records: calls' and sessions'.
#[derive(Default, Clone)]
struct Half {
    calls: Records,
    sessions: Records,
}

/// The log's records that are not in the redb file yet.
#[derive(Default)]
pub(super) struct Pending {
    /// Those of the half written now.
    active: Half,
    /// Those of the other half, being put into the file by a checkpoint (or left by one that
    /// failed), with the last group sequence they cover.
    frozen: Option<(Arc<Half>, u64)>,
}

impl Pending {
    fn get(&self, key: &str) -> Option<&Arc<[u8]>> {
        self.active
            .calls
            .get(key)
            .or_else(|| self.frozen.as_ref().and_then(|(h, _)| h.calls.get(key)))
    }
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
        let file = &self.file;
        let decode = |bytes: &[u8]| {
            serde_json::from_slice(bytes)
                .map(Some)
                .map_err(|e| damaged(file, format!("a call record does not decode: {e}")))
        };
        // The log's records first: a checkpoint puts them in the file before it lets them go.
        let mut out = vec![None; keys.len()];
        let mut missing = Vec::new();
        {
            let pending = lock(&self.pending);
            for (i, key) in keys.iter().enumerate() {
                match pending.get(key.as_str()) {
                    Some(bytes) => out[i] = decode(bytes)?,
                    None => missing.push(i),
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let db = self.db()?;
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let table = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        for i in missing {
            if let Some(value) = table.get(keys[i].as_str()).map_err(|e| io(file, e))? {
                out[i] = decode(value.value())?;
            }
        }
        Ok(out)
    }

    /// Every session record.
    pub(super) fn sessions(&self) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        // The log's first (newest wins), then the file's that the log does not override. The
        // log's are copied before the file is read: a checkpoint puts them in the file before
        // it lets them go, so none is missed in between.
        let mut from_log: HashMap<String, Vec<u8>> = HashMap::new();
        {
            let pending = lock(&self.pending);
            let halves = pending
                .frozen
                .iter()
                .map(|(h, _)| &**h)
                .chain([&pending.active]);
            for half in halves {
                for (id, bytes) in &half.sessions {
                    from_log.insert(id.to_string(), bytes.to_vec());
                }
            }
        }
        let db = self.db()?;
        let file = &self.file;
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let table = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| io(file, e))? {
            let (k, v) = entry.map_err(|e| io(file, e))?;
            if !from_log.contains_key(k.value()) {
                out.push((k.value().to_string(), v.value().to_vec()));
            }
        }
        out.extend(from_log);
        Ok(out)
    }

    /// Whether the path still names the file this journal opened.
    fn check_file(&self) -> Result<(), String> {
        for (file, identity) in [
            (&self.file, self.identity),
            (&self.log_file, self.log_identity),
        ] {
            match std::fs::metadata(file) {
                Ok(m) if (m.dev(), m.ino()) == identity => {}
                Ok(_) => {
                    return Err(format!(
                        "the journal file {} was replaced by another file while the engine ran; \
                         restart the engine to use the new file",
                        file.display()
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "the journal file {} is gone ({e}): its directory was removed or moved \
                         while the engine ran; put it back, or restart the engine",
                        file.display()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Opens the journal file `file` (created only if missing) and its log, checks them whole, puts
/// what the log holds beyond the file's last checkpoint into the file, and reads what the writer
/// needs: the clock and the call keys. Returns the log for the writer (started by the caller).
pub(super) fn open(file: &Path, retention: Duration) -> Result<(Shared, Tail), JournalError> {
    let db = open_db(file, true)?;
    // Make sure every table exists (and that a foreign redb file is refused now). Two-phase,
    // like every commit here: the last commit decides which slot is the primary, and only a
    // two-phase one lets a damaged primary be refused rather than rolled back from.
    let mut txn = db.begin_write().map_err(|e| damaged(file, e))?;
    txn.set_two_phase_commit(true);
    {
        txn.open_table(CALLS).map_err(|e| damaged(file, e))?;
        txn.open_table(SESSIONS).map_err(|e| damaged(file, e))?;
        txn.open_table(META).map_err(|e| damaged(file, e))?;
    }
    txn.commit().map_err(|e| damaged(file, e))?;
    let (clock_ms, applied) = {
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let meta = txn.open_table(META).map_err(|e| io(file, e))?;
        let get = |key: &str| -> Result<Option<u64>, JournalError> {
            Ok(meta.get(key).map_err(|e| io(file, e))?.map(|v| v.value()))
        };
        (get(CLOCK_KEY)?, get(LOG_SEQ_KEY)?)
    };
    // The log: read back what the last checkpoint did not apply. A file that has had a log
    // needs it (its last records may be there only); one that never had one gets a new one.
    let log_file = file.with_file_name(LOG_NAME);
    let opened = Log::open(&log_file, applied.unwrap_or(0), applied.is_none())?;
    if let Some(torn) = &opened.torn {
        tracing::warn!(journal = %log_file.display(), "{torn}: dropped (it was never acknowledged)");
    }
    let mut log = opened.log;
    let last = opened.groups.last().map(|g| g.seq);
    let next_seq = last.or(applied).unwrap_or(0) + 1;
    // A journal without a clock yet (new, or written by an older version) starts it at the
    // wall clock: its records were stamped with it.
    let clock_ms = opened
        .groups
        .iter()
        .map(|g| g.clock_ms)
        .chain(clock_ms)
        .max()
        .unwrap_or_else(super::now_ms);
    if applied.is_none() || last.is_some() {
        let mut txn = db.begin_write().map_err(|e| io(file, e))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| io(file, e))?;
        txn.set_two_phase_commit(true);
        {
            let mut calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
            let mut sessions = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
            for group in &opened.groups {
                for (key, bytes) in &group.records {
                    calls
                        .insert(key.as_str(), bytes.as_slice())
                        .map_err(|e| io(file, e))?;
                }
                for (id, bytes) in &group.sessions {
                    sessions
                        .insert(id.as_str(), bytes.as_slice())
                        .map_err(|e| io(file, e))?;
                }
            }
            let mut meta = txn.open_table(META).map_err(|e| io(file, e))?;
            meta.insert(LOG_SEQ_KEY, last.or(applied).unwrap_or(0))
                .map_err(|e| io(file, e))?;
            meta.insert(CLOCK_KEY, clock_ms).map_err(|e| io(file, e))?;
        }
        txn.commit().map_err(|e| io(file, e))?;
        log.reset();
    }
    let hasher = foldhash::fast::FixedState::default();
    let known = {
        let txn = db.begin_read().map_err(|e| io(file, e))?;
        let calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        let mut known = HashSet::with_capacity_and_hasher(
            calls.len().map_err(|e| io(file, e))? as usize,
            foldhash::fast::FixedState::default(),
        );
        for entry in calls.iter().map_err(|e| io(file, e))? {
            let (k, _) = entry.map_err(|e| io(file, e))?;
            known.insert(hasher.hash_one(k.value()));
        }
        known
    };
    let identity = |path: &Path| -> Result<(u64, u64), JournalError> {
        let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
        Ok((meta.dev(), meta.ino()))
    };
    let shared = Shared {
        file: file.to_path_buf(),
        identity: identity(file)?,
        retention,
        db: ArcSwapOption::new(Some(Arc::new(db))),
        healthy: AtomicBool::new(true),
        failure: Mutex::new(String::new()),
        known: Mutex::new(known),
        log_identity: identity(&log_file)?,
        log_file,
        pending: Mutex::new(Pending::default()),
        hasher,
        clock: Clock {
            base_ms: clock_ms,
            opened: Instant::now(),
        },
        metrics: JournalMetrics::new(),
    };
    Ok((
        shared,
        Tail {
            log,
            next_seq,
            oldest: None,
            inflight: None,
        },
    ))
}

/// What only the writer thread holds: the log, the next group's sequence, and since when the
/// log holds records the file does not.
pub(super) struct Tail {
    log: Log,
    next_seq: u64,
    oldest: Option<Instant>,
    /// The checkpoint running on a thread of its own, if one is.
    inflight: Option<std::thread::JoinHandle<Result<(), JournalError>>>,
}

/// The writer thread: one flush per round, covering every batch waiting when the round began
/// (one group in the log, or — for a session forgotten, and groups larger than a half of the
/// log — one transaction in the file); between rounds, the checkpoint, the file's check, healing and
/// compaction.
pub(super) fn writer(
    shared: Arc<Shared>,
    mut tail: Tail,
    rx: mpsc::Receiver<Job>,
    counts: &Mutex<FlushCounts>,
) {
    let every = compact_every(shared.retention);
    let mut compacted = Instant::now();
    let mut checked = Instant::now();
    let mut tried = Instant::now();
    shared.metrics.healthy(true);
    loop {
        let wait = CHECK_EVERY
            .min(HEAL_EVERY)
            .min(tail.oldest.map_or(Duration::MAX, |t| {
                CHECKPOINT_EVERY.saturating_sub(t.elapsed())
            }));
        let mut compact_asks = Vec::new();
        let mut batches: Vec<Batch> = Vec::new();
        let mut take = |job: Job| match job {
            Job::Write(batch) => batches.push(batch),
            Job::Compact(reply) => compact_asks.push(reply),
        };
        match rx.recv_timeout(wait) {
            Ok(first) => take(first),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Closed: the log's records into the file and the clock's last reading, so that
                // the time the engine is down never counts. A checkpoint still running is waited
                // for in any case (nothing writes the file once the writer is gone); if it
                // failed, its records are still pending, and the checkpoint below retries them.
                let _ = settle(&shared, &mut tail);
                if shared.health().is_ok() {
                    let _ = checkpoint(&shared, &mut tail).and_then(|()| commit(&shared, &[]));
                }
                break;
            }
        }
        while let Ok(more) = rx.try_recv() {
            take(more);
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
        // A failing journal whose file is still its own tries to reopen it, and to put the
        // log's records into it.
        if shared.db.load().is_none() && tried.elapsed() >= HEAL_EVERY {
            tried = Instant::now();
            if shared.check_file().is_ok() {
                match open_db(&shared.file, false) {
                    Ok(db) => {
                        shared.db.store(Some(Arc::new(db)));
                        match checkpoint(&shared, &mut tail) {
                            Ok(()) => shared.recover(),
                            Err(e) => after_failure(&shared, e.to_string()),
                        }
                    }
                    Err(e) => shared.fail(format!("cannot reopen after a failed write: {e}")),
                }
            }
        }
        let due = !compact_asks.is_empty() || compacted.elapsed() >= every;
        if shared.health().is_ok() && due {
            compacted = Instant::now();
            // Compaction reads the file: the log's records go into it first.
            let done = checkpoint(&shared, &mut tail).and_then(|()| compact(&shared));
            if let Err(e) = &done {
                tracing::error!(journal = %shared.file.display(), error = %e, "journal compaction failed");
                after_failure(&shared, e.to_string());
            }
            for reply in compact_asks.drain(..) {
                let _ = reply.send(done.clone());
            }
        }
        for reply in compact_asks {
            let _ = reply.send(Err(shared.failing()));
        }
        if !batches.is_empty() {
            let records: usize = batches.iter().map(|b| b.writes.len()).sum();
            if shared.health().is_err() {
                let refused = shared.failing();
                for batch in batches {
                    let _ = batch.done.send(Err(refused.clone()));
                }
                continue;
            }
            let started = Instant::now();
            let outcome = flush(&shared, &mut tail, &batches);
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
        // A checkpoint that finished: its outcome. The next one, when the active half fills up
        // or its oldest record waited long enough.
        let finished = tail.inflight.as_ref().is_some_and(|h| h.is_finished());
        let full = tail.log.fill() >= CHECKPOINT_FILL;
        let old = tail.oldest.is_some_and(|t| t.elapsed() >= CHECKPOINT_EVERY);
        let outcome = if shared.health().is_err() {
            Ok(())
        } else if full || old {
            rotate(&shared, &mut tail)
        } else if finished {
            settle(&shared, &mut tail)
        } else {
            Ok(())
        };
        if let Err(e) = outcome {
            tracing::error!(journal = %shared.file.display(), error = %e, "journal checkpoint failed");
            after_failure(&shared, e.to_string());
        }
    }
}

/// One round's flush: the calls' and sessions' records as one group in the log when they fit;
/// otherwise (a session forgotten — its calls are deleted by range in the file —, a group
/// larger than a half of the log) the log's records into the file and this round's writes in
/// the same file, in one transaction.
fn flush(shared: &Arc<Shared>, tail: &mut Tail, batches: &[Batch]) -> Result<(), JournalError> {
    let mut records = Vec::with_capacity(batches.iter().map(|b| b.writes.len()).sum());
    let mut sessions = Vec::new();
    let mut forgets = false;
    for write in batches.iter().flat_map(|b| &b.writes) {
        match write {
            Write::Call {
                session,
                id,
                record,
            } => {
                let bytes = serde_json::to_vec(record).map_err(|e| io(&shared.file, e))?;
                records.push((super::call_key(session, id), bytes));
            }
            Write::Session { id, bytes } => sessions.push((id.clone(), bytes.clone())),
            Write::ForgetSession { .. } => forgets = true,
        }
    }
    let bytes = Log::group_bytes(&records, &sessions);
    if forgets || !tail.log.could_ever_fit(bytes) {
        checkpoint(shared, tail)?;
        return commit(shared, batches);
    }
    if !tail.log.fits(bytes) {
        rotate(shared, tail)?;
    }
    let seq = tail.next_seq;
    tail.log
        .append(seq, shared.clock.now_ms(), &records, &sessions)
        .map_err(|e| io(tail.log.path(), e))?;
    tail.next_seq += 1;
    tail.oldest.get_or_insert_with(Instant::now);
    let mut hashes = Vec::with_capacity(records.len());
    {
        let mut pending = lock(&shared.pending);
        for (key, bytes) in records {
            hashes.push(shared.key_hash(&key));
            pending
                .active
                .calls
                .insert(Arc::from(key), Arc::from(bytes));
        }
        for (id, bytes) in sessions {
            pending
                .active
                .sessions
                .insert(Arc::from(id), Arc::from(bytes));
        }
    }
    lock(&shared.known).extend(hashes);
    Ok(())
}

/// Puts every record of the log into the file — the checkpoint in flight first, or what a
/// failed one left, then the active half's — and lets both halves start again. For what reads
/// the file whole (compaction), writes to it directly (a session forgotten), heals or closes.
fn checkpoint(shared: &Arc<Shared>, tail: &mut Tail) -> Result<(), JournalError> {
    // A checkpoint that failed leaves its records in `frozen`: they are applied again below,
    // so its error is not the answer here.
    let _ = settle(shared, tail);
    let frozen = lock(&shared.pending).frozen.clone();
    if let Some((records, seq)) = frozen {
        apply(shared, &records, seq)?;
        lock(&shared.pending).frozen = None;
    }
    if tail.oldest.is_some() {
        let records = lock(&shared.pending).active.clone();
        apply(shared, &records, tail.next_seq - 1)?;
        // Only the writer adds to `pending`: what was copied above is all there is.
        lock(&shared.pending).active = Half::default();
    }
    tail.log.reset();
    tail.oldest = None;
    Ok(())
}

/// Starts a checkpoint of the active half's records on a thread of its own and goes on in the
/// other half — once the checkpoint before has finished (the writer waits for it here, which
/// is what holds a load back when checkpoints cannot keep up).
fn rotate(shared: &Arc<Shared>, tail: &mut Tail) -> Result<(), JournalError> {
    if tail.oldest.is_none() {
        return Ok(());
    }
    settle(shared, tail)?;
    if lock(&shared.pending).frozen.is_some() {
        // What a failed checkpoint left (the journal healed since): everything, here.
        return checkpoint(shared, tail);
    }
    let seq = tail.next_seq - 1;
    let records = {
        let mut pending = lock(&shared.pending);
        let records = Arc::new(std::mem::take(&mut pending.active));
        pending.frozen = Some((Arc::clone(&records), seq));
        records
    };
    let on_thread = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("journal-checkpoint".into())
        .spawn(move || {
            apply(&on_thread, &records, seq)?;
            lock(&on_thread.pending).frozen = None;
            Ok(())
        });
    match spawned {
        Ok(handle) => {
            tail.inflight = Some(handle);
            tail.log.switch();
            tail.oldest = None;
            Ok(())
        }
        // No thread: the checkpoint is made here instead.
        Err(_) => checkpoint(shared, tail),
    }
}

/// Waits for the checkpoint in flight, if any: its outcome.
fn settle(shared: &Shared, tail: &mut Tail) -> Result<(), JournalError> {
    match tail.inflight.take() {
        Some(handle) => handle
            .join()
            .unwrap_or_else(|_| Err(io(&shared.file, "the journal's checkpoint thread panicked"))),
        None => Ok(()),
    }
}

/// Puts `records` into the file in one two-phase transaction, noting `log_seq` as the last log
/// group it holds (in key order: neighbouring keys share B-tree pages).
fn apply(shared: &Shared, records: &Half, log_seq: u64) -> Result<(), JournalError> {
    let started = Instant::now();
    let file = &shared.file;
    let mut sorted: Vec<(&Arc<str>, &Arc<[u8]>)> = records.calls.iter().collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let db = shared.db()?;
    let mut txn = db.begin_write().map_err(|e| io(file, e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| io(file, e))?;
    txn.set_two_phase_commit(true);
    {
        let mut calls = txn.open_table(CALLS).map_err(|e| io(file, e))?;
        for (key, bytes) in sorted {
            calls.insert(&**key, &**bytes).map_err(|e| io(file, e))?;
        }
        let mut sessions = txn.open_table(SESSIONS).map_err(|e| io(file, e))?;
        for (id, bytes) in &records.sessions {
            sessions.insert(&**id, &**bytes).map_err(|e| io(file, e))?;
        }
        let mut meta = txn.open_table(META).map_err(|e| io(file, e))?;
        meta.insert(LOG_SEQ_KEY, log_seq).map_err(|e| io(file, e))?;
        meta.insert(CLOCK_KEY, shared.clock.now_ms())
            .map_err(|e| io(file, e))?;
    }
    txn.commit().map_err(|e| io(file, e))?;
    shared.metrics.checkpoint(started.elapsed());
    Ok(())
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
