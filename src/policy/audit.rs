//! The audit log: one JSON line per call, written by a thread of its own.
//!
//! A call hands its line to a bounded buffer and goes on ([`AuditLog::record`] never blocks); the
//! writer thread drains the buffer into the file and flushes whenever it runs dry. When the buffer
//! is full — the disk (or the pipe) is slower than the calls — the line is dropped and counted
//! ([`AuditLog::dropped`], `switchboard_audit_dropped_total`); a call is never held back.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::metrics::PolicyMetrics;

/// Lines the buffer holds before new ones are dropped.
pub const AUDIT_BUFFER: usize = 8_192;

/// Longest subject (path or command) written, in bytes.
pub const SUBJECT_CAP: usize = 256;

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
    dropped: Arc<AtomicU64>,
    with_args: bool,
    metrics: Option<PolicyMetrics>,
}

impl AuditLog {
    /// Appends to `path` (created if missing). A FIFO is opened read-write, so opening it never
    /// waits for a reader. `with_args` writes the arguments beside their hash.
    pub fn open(path: &Path, with_args: bool) -> io::Result<AuditLog> {
        Self::open_with(path, with_args, AUDIT_BUFFER)
    }

    /// [`AuditLog::open`] with a buffer of `capacity` lines.
    pub fn open_with(path: &Path, with_args: bool, capacity: usize) -> io::Result<AuditLog> {
        let is_fifo = std::fs::metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_fifo()
        });
        let file = if is_fifo {
            OpenOptions::new().read(true).write(true).open(path)?
        } else {
            OpenOptions::new().create(true).append(true).open(path)?
        };
        let (tx, rx) = sync_channel(capacity.max(1));
        std::thread::Builder::new()
            .name("switchboard-audit".into())
            .spawn(move || write_lines(rx, file))?;
        Ok(AuditLog {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            with_args,
            metrics: None,
        })
    }

    pub(crate) fn with_metrics(mut self, metrics: PolicyMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Whether lines carry the arguments.
    pub fn with_args(&self) -> bool {
        self.with_args
    }

    /// Lines dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Queues one line; never blocks (a full buffer drops it and counts the drop).
    pub(crate) fn record(&self, line: &AuditLine) {
        let Ok(text) = serde_json::to_string(line) else {
            return;
        };
        match self.tx.try_send(Msg::Line(text)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.metrics {
                    m.audit_dropped();
                }
            }
        }
    }

    /// Waits (at most `patience`) until every line queued so far has reached the file.
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

fn write_lines(rx: Receiver<Msg>, file: File) {
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next {
            match msg {
                Msg::Flush(done) => {
                    let _ = out.flush();
                    let _ = done.send(());
                }
                Msg::Line(line) => {
                    if out
                        .write_all(line.as_bytes())
                        .and_then(|()| out.write_all(b"\n"))
                        .is_err()
                    {
                        tracing::warn!("audit log: write failed; a line is lost");
                    }
                }
            }
            next = rx.try_recv().ok();
        }
        let _ = out.flush();
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
