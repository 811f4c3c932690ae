//! The audit log: one JSON line per call, written by a thread of its own.
//!
//! A call hands its line to a bounded buffer and goes on ([`AuditLog::record`] never blocks); the
//! writer thread drains the buffer into the file, everything queued in one `write`. What the log
//! promises:
//!
//! * **No loss goes uncounted.** A line is lost only when the buffer is full (the disk or the pipe
//!   is slower than the calls: a call is never held back) or when it cannot be written (a full
//!   disk; the file deleted and not creatable again). Every such line is counted, once, in
//!   [`AuditLog::dropped`] and in `switchboard_audit_dropped_total{reason}` (`buffer_full`,
//!   `write_failed`); a line cut short by a failing write counts as lost, and the next line starts
//!   on a line of its own.
//! * **A loss is said once, at error level**, when lines start being lost — not per line or per
//!   batch — and once more (a warning, with how many were lost) when lines have been written again
//!   after [`QUIET`] without a loss.
//! * **Rotation and deletion are followed.** Before each write (once per batch: everything queued
//!   at that moment) the writer compares the device and inode the path names with the open file's;
//!   when the file was deleted or renamed (log rotation without `copytruncate`), or
//!   [`AuditLog::reopen`] was asked for (the CLI does on SIGHUP), it opens the path again,
//!   creating it, appending, never truncating. Lines never go to a deleted file: when the path
//!   cannot be opened again, lines are written to the file still open only if it still has a
//!   name (renamed), and are counted as lost otherwise.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::metrics::{AuditLoss, PolicyMetrics};

/// Lines the buffer holds before new ones are dropped.
pub const AUDIT_BUFFER: usize = 8_192;

/// Longest subject (path or command) written, in bytes.
pub const SUBJECT_CAP: usize = 256;

/// How long lines must have been written without a loss before a loss is said again (at error
/// level) rather than only counted.
pub const QUIET: Duration = Duration::from_secs(10);

/// One call's audit line.
#[derive(Debug, Serialize)]
pub struct AuditLine {
    /// RFC 3339 time the call was answered (UTC, milliseconds).
    pub time: String,
    /// The session's id.
    pub session: String,
    /// The call's `tool_use_id`.
    pub tool_use_id: String,
    /// The tool name.
    pub tool: String,
    /// Path or command, truncated to [`SUBJECT_CAP`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// `allow`, `deny`, `approved`, `refused`.
    pub decision: &'static str,
    /// What decided: `rule:…`, `hook:…`, `approver`, `default`.
    pub by: String,
    /// `ok` or the error code of the answer.
    pub outcome: &'static str,
    /// From the policy decision to the answer, in milliseconds.
    pub duration_ms: f64,
    /// SHA-256 of the arguments' JSON (hex).
    pub args_sha256: String,
    /// The arguments themselves (only with `--audit-args`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<serde_json::Value>,
}

/// The log: a bounded buffer in front of a writer thread.
#[derive(Debug, Clone)]
pub struct AuditLog {
    tx: SyncSender<Msg>,
    losses: Arc<Losses>,
    reopen: Arc<AtomicBool>,
    with_args: bool,
}

/// Lines lost, counted where they are lost: by a caller (buffer full) or the writer (a failed
/// write); and whether the loss has been said.
#[derive(Debug)]
struct Losses {
    path: PathBuf,
    dropped: AtomicU64,
    metrics: OnceLock<PolicyMetrics>,
    /// When this log was opened: the origin of `last_loss`.
    opened: Instant,
    /// Lines are being lost: said (at error level) when it became true; cleared by the writer
    /// once lines have been written for [`QUIET`] without a loss.
    failing: AtomicBool,
    /// `dropped` when the loss being said began.
    dropped_before: AtomicU64,
    /// Milliseconds from `opened` to the last loss.
    last_loss: AtomicU64,
}

impl Losses {
    fn new(path: &Path) -> Losses {
        Losses {
            path: path.to_path_buf(),
            dropped: AtomicU64::new(0),
            metrics: OnceLock::new(),
            opened: Instant::now(),
            failing: AtomicBool::new(false),
            dropped_before: AtomicU64::new(0),
            last_loss: AtomicU64::new(0),
        }
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Counts `lines` lost for `reason`; the first loss since lines were last written says so.
    fn lost(&self, reason: AuditLoss, lines: u64, why: &dyn std::fmt::Display) {
        let before = self.dropped.fetch_add(lines, Ordering::Relaxed);
        if let Some(m) = self.metrics.get() {
            m.audit_dropped(reason, lines);
        }
        self.last_loss.store(self.millis(), Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            self.dropped_before.store(before, Ordering::Relaxed);
            tracing::error!(
                "audit log {}: lines are being lost ({why}); every lost line is counted in \
                 switchboard_audit_dropped_total{{reason=\"{}\"}}; said again only after {}s \
                 of lines written without a loss",
                self.path.display(),
                reason.label(),
                QUIET.as_secs()
            );
        }
    }

    /// A batch was written whole: a loss being said ends once none came for [`QUIET`].
    fn written(&self) {
        if !self.failing.load(Ordering::Relaxed) {
            return;
        }
        let quiet = self
            .millis()
            .saturating_sub(self.last_loss.load(Ordering::Relaxed));
        if u128::from(quiet) >= QUIET.as_millis() && self.failing.swap(false, Ordering::Relaxed) {
            let lost =
                self.dropped.load(Ordering::Relaxed) - self.dropped_before.load(Ordering::Relaxed);
            tracing::warn!(
                "audit log {}: lines are written again; {lost} line(s) were lost meanwhile",
                self.path.display()
            );
        }
    }
}

impl AuditLog {
    /// Appends to `path` (created if missing). A FIFO is opened read-write, so opening it never
    /// waits for a reader. `with_args` writes the arguments beside their hash.
    pub fn open(path: &Path, with_args: bool) -> io::Result<AuditLog> {
        Self::open_with(path, with_args, AUDIT_BUFFER)
    }

    /// [`AuditLog::open`] with a buffer of `capacity` lines.
    pub fn open_with(path: &Path, with_args: bool, capacity: usize) -> io::Result<AuditLog> {
        Self::open_inner(path, with_args, capacity, Arc::new(AtomicBool::new(false)))
    }

    /// [`AuditLog::open`] that also reopens when `reopen` is set (by a signal handler registered
    /// before the file is opened, so no signal finds the log without one).
    #[cfg(feature = "cli")]
    pub(crate) fn open_reopening(
        path: &Path,
        with_args: bool,
        reopen: Arc<AtomicBool>,
    ) -> io::Result<AuditLog> {
        Self::open_inner(path, with_args, AUDIT_BUFFER, reopen)
    }

    fn open_inner(
        path: &Path,
        with_args: bool,
        capacity: usize,
        reopen: Arc<AtomicBool>,
    ) -> io::Result<AuditLog> {
        let target = Target::open(path)?;
        let (tx, rx) = sync_channel(capacity.max(1));
        let losses = Arc::new(Losses::new(path));
        let writer = Writer {
            target,
            losses: Arc::clone(&losses),
            reopen: Arc::clone(&reopen),
            torn: false,
            reopen_failed: false,
        };
        std::thread::Builder::new()
            .name("switchboard-audit".into())
            .spawn(move || writer.run(rx))?;
        Ok(AuditLog {
            tx,
            losses,
            reopen,
            with_args,
        })
    }

    pub(crate) fn with_metrics(self, metrics: PolicyMetrics) -> Self {
        let _ = self.losses.metrics.set(metrics);
        self
    }

    /// Whether lines carry the arguments.
    pub fn with_args(&self) -> bool {
        self.with_args
    }

    /// Lines lost: dropped because the buffer was full, or not written because a write failed.
    pub fn dropped(&self) -> u64 {
        self.losses.dropped.load(Ordering::Relaxed)
    }

    /// Opens the path again before the next line is written (what log tools expect on SIGHUP
    /// after they rotated the file). A deleted or renamed file is noticed without it.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }

    /// Queues one line; never blocks (a full buffer drops it and counts the drop).
    pub(crate) fn record(&self, line: &AuditLine) {
        let text = match serde_json::to_string(line) {
            Ok(text) => text,
            // Not expected (plain strings and numbers); counted all the same.
            Err(e) => return self.losses.lost(AuditLoss::WriteFailed, 1, &e),
        };
        match self.tx.try_send(Msg::Line(text)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.losses
                    .lost(AuditLoss::BufferFull, 1, &"the writer's buffer is full")
            }
            Err(TrySendError::Disconnected(_)) => {
                self.losses
                    .lost(AuditLoss::WriteFailed, 1, &"the writer thread is gone")
            }
        }
    }

    /// Waits (at most `patience`) until every line queued so far has been written (or counted
    /// as lost).
    pub fn flush(&self, patience: Duration) {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let until = std::time::Instant::now() + patience;
        let mut msg = Msg::Flush(done_tx);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(back)) if std::time::Instant::now() < until => {
                    msg = back;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(TrySendError::Full(_)) => return,
            }
        }
        let _ = done_rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now()));
    }
}

/// What the writer thread is sent.
#[derive(Debug)]
enum Msg {
    Line(String),
    Flush(std::sync::mpsc::Sender<()>),
}

/// The file the writer appends to, and which file the path named when it was opened.
struct Target {
    path: PathBuf,
    file: File,
    fifo: bool,
    /// Device and inode of the open file.
    id: (u64, u64),
}

impl Target {
    fn open(path: &Path) -> io::Result<Target> {
        let is_fifo = std::fs::metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_fifo()
        });
        let file = if is_fifo {
            OpenOptions::new().read(true).write(true).open(path)?
        } else {
            OpenOptions::new().create(true).append(true).open(path)?
        };
        let meta = file.metadata()?;
        Ok(Target {
            path: path.to_path_buf(),
            file,
            fifo: is_fifo,
            id: (meta.dev(), meta.ino()),
        })
    }

    /// True when the path no longer names the open file (deleted, or renamed and replaced).
    fn moved(&self) -> bool {
        !self.fifo && std::fs::metadata(&self.path).map_or(true, |m| (m.dev(), m.ino()) != self.id)
    }

    /// True when the open file has no name left (deleted): what is written to it is lost.
    fn deleted(&self) -> bool {
        self.file.metadata().is_ok_and(|m| m.nlink() == 0)
    }
}

/// The writer thread's state.
struct Writer {
    target: Target,
    losses: Arc<Losses>,
    reopen: Arc<AtomicBool>,
    /// The last write stopped inside a line: the next one starts on a new line.
    torn: bool,
    /// Opening the path again failed (said once, until it works).
    reopen_failed: bool,
}

impl Writer {
    fn run(mut self, rx: Receiver<Msg>) {
        let mut batch = Vec::with_capacity(64 * 1024);
        let mut ends: Vec<usize> = Vec::new();
        while let Ok(first) = rx.recv() {
            let mut next = Some(first);
            while let Some(msg) = next {
                match msg {
                    Msg::Line(line) => {
                        batch.extend_from_slice(line.as_bytes());
                        batch.push(b'\n');
                        ends.push(batch.len());
                    }
                    Msg::Flush(done) => {
                        self.write(&mut batch, &mut ends);
                        let _ = done.send(());
                    }
                }
                next = rx.try_recv().ok();
            }
            self.write(&mut batch, &mut ends);
        }
    }

    /// Writes the batch (its lines end at `ends`) and empties it; every line not wholly written
    /// is counted as lost.
    fn write(&mut self, batch: &mut Vec<u8>, ends: &mut Vec<usize>) {
        if ends.is_empty() {
            return;
        }
        let written = self.write_lines(batch, ends);
        batch.clear();
        ends.clear();
        match written {
            Ok(()) => self.losses.written(),
            Err((lost, why)) => self.losses.lost(AuditLoss::WriteFailed, lost as u64, &why),
        }
    }

    /// Writes the lines to the file the path names now; `Err` with how many were not wholly
    /// written, and why.
    fn write_lines(&mut self, batch: &[u8], ends: &[usize]) -> Result<(), (usize, String)> {
        if self.reopen.swap(false, Ordering::Relaxed) || self.target.moved() {
            self.reopen_path().map_err(|why| (ends.len(), why))?;
        }
        if self.torn {
            // Whatever the last write left half-written ends here, on a line of its own.
            match self.target.file.write(b"\n") {
                Ok(1) => self.torn = false,
                Ok(_) => return Err((ends.len(), "a write failed".into())),
                Err(e) => return Err((ends.len(), e.to_string())),
            }
        }
        let mut written = 0;
        let mut error = None;
        while written < batch.len() {
            match self.target.file.write(&batch[written..]) {
                Ok(0) => {
                    error = Some(io::Error::from(io::ErrorKind::WriteZero));
                    break;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        let lost = ends.iter().filter(|&&end| end > written).count();
        if lost == 0 {
            return Ok(());
        }
        self.torn = !ends.contains(&written) && written > 0;
        Err((
            lost,
            error.map_or_else(|| "a write failed".to_string(), |e| e.to_string()),
        ))
    }

    /// Opens the path again (it was deleted, renamed, or SIGHUP asked). When that fails, the
    /// file still open is kept if it still has a name (renamed: its lines are on disk); a
    /// deleted one is not written to — `Err`: the batch is lost.
    fn reopen_path(&mut self) -> Result<(), String> {
        match Target::open(&self.target.path) {
            Ok(target) => {
                self.target = target;
                self.torn = false;
                self.reopen_failed = false;
                Ok(())
            }
            Err(e) => {
                let why = format!("cannot open {} again: {e}", self.target.path.display());
                if self.target.deleted() {
                    return Err(why);
                }
                if !self.reopen_failed {
                    self.reopen_failed = true;
                    tracing::warn!("audit log: {why}; writing to the file still open");
                }
                Ok(())
            }
        }
    }
}

/// SHA-256 of a value's compact JSON, in hex.
pub fn sha256_hex(value: &serde_json::Value) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `text` cut to at most `cap` bytes on a character boundary.
pub fn truncate(text: &str, cap: usize) -> String {
    if text.len() <= cap {
        return text.to_string();
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Now as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(now.as_millis() as u64))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(i: usize) -> AuditLine {
        AuditLine {
            time: now_rfc3339(),
            session: "s1".into(),
            tool_use_id: format!("t{i}"),
            tool: "bash".into(),
            subject: Some("ls".into()),
            decision: "allow",
            by: "default".into(),
            outcome: "ok",
            duration_ms: 0.5,
            args_sha256: sha256_hex(&serde_json::json!({"command": "ls"})),
            args: None,
        }
    }

    #[test]
    fn every_line_reaches_the_file_as_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, false).unwrap();
        for i in 0..500 {
            log.record(&line(i));
        }
        log.flush(Duration::from_secs(10));
        let text = std::fs::read_to_string(&path).unwrap();
        let ids: Vec<String> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["tool_use_id"].to_string()
            })
            .collect();
        assert_eq!(ids.len(), 500);
        assert_eq!(log.dropped(), 0);
    }

    #[test]
    fn lines_a_full_disk_refuses_are_counted_as_dropped() {
        // /dev/full answers every write with ENOSPC, as a full disk does.
        let log = AuditLog::open(Path::new("/dev/full"), false).unwrap();
        for i in 0..25 {
            log.record(&line(i));
        }
        log.flush(Duration::from_secs(10));
        assert_eq!(log.dropped(), 25);
    }

    #[test]
    fn a_deleted_or_renamed_log_is_opened_again_before_the_next_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, false).unwrap();
        log.record(&line(1));
        log.flush(Duration::from_secs(10));
        std::fs::remove_file(&path).unwrap();
        log.record(&line(2));
        log.flush(Duration::from_secs(10));
        assert_eq!(ids(&path), ["t2"], "the deleted log is created again");
        let rotated = dir.path().join("audit.jsonl.1");
        std::fs::rename(&path, &rotated).unwrap();
        std::fs::write(&path, "").unwrap();
        log.record(&line(3));
        log.flush(Duration::from_secs(10));
        assert_eq!(ids(&rotated), ["t2"]);
        assert_eq!(
            ids(&path),
            ["t3"],
            "after a rotation, lines go to the new file"
        );
        log.reopen();
        log.record(&line(4));
        log.flush(Duration::from_secs(10));
        assert_eq!(
            ids(&path),
            ["t3", "t4"],
            "reopening appends, never truncates"
        );
        assert_eq!(log.dropped(), 0);
    }

    fn ids(p: &Path) -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["tool_use_id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn a_deleted_log_whose_path_cannot_be_created_again_gets_no_line_and_each_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let path = logs.join("audit.jsonl");
        let log = AuditLog::open(&path, false).unwrap();
        log.record(&line(1));
        log.flush(Duration::from_secs(10));
        // The file and its directory deleted: the path cannot be opened again, and a line
        // written to the deleted file would be lost without a trace.
        std::fs::remove_dir_all(&logs).unwrap();
        for i in 2..5 {
            log.record(&line(i));
            log.flush(Duration::from_secs(10));
        }
        assert_eq!(
            log.dropped(),
            3,
            "every line the deleted file would have had"
        );
        std::fs::create_dir(&logs).unwrap();
        log.record(&line(5));
        log.flush(Duration::from_secs(10));
        assert_eq!(
            ids(&path),
            ["t5"],
            "written again once the path can be created"
        );
        assert_eq!(log.dropped(), 3);
    }

    #[test]
    fn a_renamed_log_keeps_its_lines_while_its_path_cannot_be_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, false).unwrap();
        log.record(&line(1));
        log.flush(Duration::from_secs(10));
        let rotated = dir.path().join("audit.jsonl.1");
        std::fs::rename(&path, &rotated).unwrap();
        // Something that is no file takes the path: the renamed file, still named, gets the line.
        std::fs::create_dir(&path).unwrap();
        log.record(&line(2));
        log.flush(Duration::from_secs(10));
        assert_eq!(ids(&rotated), ["t1", "t2"]);
        assert_eq!(log.dropped(), 0);
        std::fs::remove_dir(&path).unwrap();
        log.record(&line(3));
        log.flush(Duration::from_secs(10));
        assert_eq!(ids(&path), ["t3"]);
    }

    #[test]
    fn the_hash_is_sha256_of_the_compact_json() {
        // echo -n '{"command":"ls"}' | sha256sum
        assert_eq!(
            sha256_hex(&serde_json::json!({"command": "ls"})),
            "4cf29611a66934862f29acfcc817e30b905c1ab73d5e65831413eb6b454d49db"
        );
    }

    #[test]
    fn subjects_are_cut_on_char_boundaries() {
        assert_eq!(truncate("ééé", 3), "é");
        assert_eq!(truncate("abc", 256), "abc");
    }
}
