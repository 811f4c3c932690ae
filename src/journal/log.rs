//! The journal's write-ahead log, `DIR/journal.log`: where a flush makes calls' records durable
//! (one `pwrite` and one `fdatasync`), before the writer applies them to the redb file in large,
//! rare checkpoints.
//!
//! **Layout.** The file has a fixed size, chosen when it is created and written with zeros then,
//! so that a flush overwrites blocks the file already has: `fdatasync` then writes the data and no
//! file-system metadata. A 4 KiB header (magic, the file's size, the boot it was last opened in, a
//! CRC) is followed by *groups*, one per flush, each 32-byte aligned:
//!
//! ```text
//! group header (32 bytes): magic u32 | payload length u32 | sequence u64 | clock ms u64 |
//!                          payload CRC u32 | header CRC u32
//! payload: records, each: key length u32 | value length u32 | key | value (a call record's JSON,
//!          or — the key length's top bit set — a session record under the session's id)
//! ```
//!
//! The groups fill one *half* of the log at a time: while the writer appends to one, a
//! checkpoint puts the other's records into the redb file; the writer goes back to a half only
//! once its records are there.
//!
//! Every flush writes its group and, right after it, an *end mark* (a group header with the next
//! sequence and no payload), in one `pwrite`; the next flush writes over the end mark. Sequences
//! never repeat: after a checkpoint the log is written from its start again, and what is left of
//! the groups before it has lower sequences than the redb file's `log_seq` says were applied.
//!
//! **Reading it back** ([`Log::open`]): the half that goes on from the last checkpoint, then the
//! other if it goes on from there; in each, from its start, every group whose sequence is the next
//! one expected, until an end mark or a group from before the last checkpoint. Anything else is
//! damage, refused with the file's name — with one exception: a flush torn by a crash. A write
//! cut by a `kill -9` is a prefix of its group (its header is whole: groups are aligned, and a
//! write is never cut inside its first 32 bytes) and has no end mark behind it; a group that was
//! acknowledged always has one (or the next group's header). So a group whose payload fails its
//! CRC is a torn flush — never acknowledged, dropped — only when no header with the next sequence
//! follows it. After a power loss (the header's boot id differs from this boot's) any blocks of
//! the last flush may be missing, and the log ends at the first group that does not check.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{JournalError, damaged, io};

/// The log's file name inside the journal's directory.
pub const LOG_NAME: &str = "journal.log";

const FILE_MAGIC: &[u8; 8] = b"SBJLOG\0\x01";
const GROUP_MAGIC: u32 = 0x4742_4a53; // "SJBG"
/// Where the first group starts (the header has a block of its own).
pub(super) const START: u64 = 4096;
const HEADER_USED: usize = 8 + 8 + 40 + 4;
const GROUP_HEADER: usize = 32;

/// The size of a new log: 16 MiB, or an eighth of the free space when that is less (at least
/// 256 KiB): a journal on a small file system still opens.
const MAX_SIZE: u64 = 16 << 20;
const MIN_SIZE: u64 = 256 << 10;

/// A record's key length with this bit set: a session record (else a call's).
const SESSION_BIT: u32 = 1 << 31;

/// One group read back: its sequence, its clock reading, its call records and its session
/// records.
#[derive(Debug)]
pub(super) struct Group {
    pub seq: u64,
    pub clock_ms: u64,
    pub records: Vec<(String, Vec<u8>)>,
    pub sessions: Vec<(String, Vec<u8>)>,
}

/// The open log: its file, size, its two halves and where the next group goes in each.
#[derive(Debug)]
pub(super) struct Log {
    file: File,
    path: PathBuf,
    /// Bytes in each half (a multiple of 32).
    half: u64,
    /// The half written now; the other one is free, or holds the records a checkpoint is
    /// putting into the file.
    active: usize,
    /// Where the next group is written in each half (its end mark's offset).
    tails: [u64; 2],
    /// The last group's bytes, kept for the next (no fresh pages for every flush).
    buf: Vec<u8>,
}

fn align(n: usize) -> usize {
    n.div_ceil(GROUP_HEADER) * GROUP_HEADER
}

fn boot_id() -> [u8; 40] {
    let mut out = [0u8; 40];
    if let Ok(id) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let id = id.trim().as_bytes();
        let n = id.len().min(40);
        out[..n].copy_from_slice(&id[..n]);
    }
    out
}

fn header_bytes(size: u64, boot: &[u8; 40]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_USED);
    h.extend_from_slice(FILE_MAGIC);
    h.extend_from_slice(&size.to_le_bytes());
    h.extend_from_slice(boot);
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// A group header: `len` 0 is an end mark.
fn group_header(seq: u64, clock_ms: u64, payload: &[u8]) -> [u8; GROUP_HEADER] {
    let mut h = [0u8; GROUP_HEADER];
    h[0..4].copy_from_slice(&GROUP_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..24].copy_from_slice(&clock_ms.to_le_bytes());
    let payload_crc = if payload.is_empty() {
        0
    } else {
        crc32fast::hash(payload)
    };
    h[24..28].copy_from_slice(&payload_crc.to_le_bytes());
    let crc = crc32fast::hash(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A group header that checks: (payload length, sequence, clock, payload CRC).
fn parse_header(h: &[u8]) -> Option<(usize, u64, u64, u32)> {
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
    if h.len() < GROUP_HEADER || u32_at(0) != GROUP_MAGIC || crc32fast::hash(&h[..28]) != u32_at(28)
    {
        return None;
    }
    Some((u32_at(4) as usize, u64_at(8), u64_at(16), u32_at(24)))
}

/// A group's call records and session records.
type Parsed = (Vec<(String, Vec<u8>)>, Vec<(String, Vec<u8>)>);

fn parse_records(mut p: &[u8]) -> Option<Parsed> {
    let (mut calls, mut sessions) = (Vec::new(), Vec::new());
    while !p.is_empty() {
        if p.len() < 8 {
            return None;
        }
        let klen = u32::from_le_bytes(p[0..4].try_into().ok()?);
        let k = (klen & !SESSION_BIT) as usize;
        let v = u32::from_le_bytes(p[4..8].try_into().ok()?) as usize;
        let rest = &p[8..];
        if rest.len() < k + v {
            return None;
        }
        let key = std::str::from_utf8(&rest[..k]).ok()?.to_string();
        let into = if klen & SESSION_BIT != 0 {
            &mut sessions
        } else {
            &mut calls
        };
        into.push((key, rest[k..k + v].to_vec()));
        p = &rest[k + v..];
    }
    Some((calls, sessions))
}

/// What [`Log::open`] found.
#[derive(Debug)]
pub(super) struct Opened {
    pub log: Log,
    /// Groups after `applied`, in order.
    pub groups: Vec<Group>,
    /// A torn last flush that was dropped (said at warn level by the caller).
    pub torn: Option<String>,
}

impl Log {
    /// Opens the log at `path`, reading back the groups after sequence `applied` (what the redb
    /// file says its last checkpoint holds). A missing log is created when `create` (the redb
    /// file has never had one, or is new); otherwise its absence is damage.
    pub(super) fn open(path: &Path, applied: u64, create: bool) -> Result<Opened, JournalError> {
        let exists = match std::fs::metadata(path) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io(path, e)),
        };
        if !exists {
            if !create {
                return Err(damaged(
                    path,
                    "the log is missing, and the journal file says one was in use: the records \
                     of the last moments before the engine stopped would be lost",
                ));
            }
            return Ok(Opened {
                log: Log::create(path)?,
                groups: Vec::new(),
                torn: None,
            });
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io(path, e))?;
        let len = file.metadata().map_err(|e| io(path, e))?.len();
        let mut header = [0u8; HEADER_USED];
        if len < START || file.read_exact_at(&mut header, 0).is_err() {
            return Err(damaged(
                path,
                format!("the log is {len} bytes, shorter than its header"),
            ));
        }
        let crc = u32::from_le_bytes(header[HEADER_USED - 4..].try_into().unwrap_or_default());
        if &header[..8] != FILE_MAGIC || crc32fast::hash(&header[..HEADER_USED - 4]) != crc {
            return Err(damaged(path, "the log's header does not check"));
        }
        let size = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        if size != len {
            return Err(damaged(
                path,
                format!(
                    "the log is {len} bytes where its header says {size}: it was cut or extended"
                ),
            ));
        }
        let same_boot = header[16..56] == boot_id();
        let mut bytes = vec![0u8; (size - START) as usize];
        file.read_exact_at(&mut bytes, START)
            .map_err(|e| io(path, e))?;
        let half = half_of(size) as usize;
        let (groups, torn) =
            read_halves([&bytes[..half], &bytes[half..2 * half]], applied, same_boot)
                .map_err(|detail| damaged(path, detail))?;
        let log = Log {
            file,
            path: path.to_path_buf(),
            half: half as u64,
            active: 0,
            tails: [START, START + half as u64],
            buf: Vec::new(),
        };
        // This boot's id, so that the next opening knows whether a power loss came between.
        log.file
            .write_all_at(&header_bytes(size, &boot_id()), 0)
            .and_then(|()| log.file.sync_data())
            .map_err(|e| io(path, e))?;
        Ok(Opened { log, groups, torn })
    }

    /// Creates a log of the size free space allows, written with zeros (its blocks allocated).
    fn create(path: &Path) -> Result<Log, JournalError> {
        let free = rustix::fs::statvfs(path.parent().unwrap_or(Path::new(".")))
            .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
            .unwrap_or(MAX_SIZE * 8);
        let size = (free / 8).clamp(MIN_SIZE, MAX_SIZE) & !4095;
        // Written under another name and renamed: a log is never seen half made.
        let tmp = path.with_extension("log.new");
        let made = (|| -> std::io::Result<File> {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            let zeros = vec![0u8; 1 << 20];
            let mut at = 0;
            while at < size {
                let n = (size - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            file.write_all_at(&header_bytes(size, &boot_id()), 0)?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
            Ok(file)
        })();
        match made {
            Ok(file) => Ok(Log {
                file,
                path: path.to_path_buf(),
                half: half_of(size),
                active: 0,
                tails: [START, START + half_of(size)],
                buf: Vec::new(),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(io(
                    path,
                    format!("cannot create the log ({size} bytes): {e}"),
                ))
            }
        }
    }

    /// The bytes a group of `calls` and `sessions` records takes, with its end mark.
    pub(super) fn group_bytes(
        calls: &[(String, Vec<u8>)],
        sessions: &[(String, Vec<u8>)],
    ) -> usize {
        let payload: usize = calls
            .iter()
            .chain(sessions)
            .map(|(k, v)| 8 + k.len() + v.len())
            .sum();
        GROUP_HEADER + align(payload) + GROUP_HEADER
    }

    /// Where half `i` starts and ends.
    fn region(&self, i: usize) -> (u64, u64) {
        let from = START + i as u64 * self.half;
        (from, from + self.half)
    }

    /// Whether a group of `bytes` fits in the active half after what is written there now.
    pub(super) fn fits(&self, bytes: usize) -> bool {
        self.tails[self.active] + bytes as u64 <= self.region(self.active).1
    }

    /// Whether a group of `bytes` fits in an empty half at all.
    pub(super) fn could_ever_fit(&self, bytes: usize) -> bool {
        bytes as u64 <= self.half
    }

    /// How full the active half is, 0.0–1.0.
    pub(super) fn fill(&self) -> f64 {
        let (from, _) = self.region(self.active);
        (self.tails[self.active] - from) as f64 / self.half as f64
    }

    /// Writes group `seq` of `calls` and `sessions` records and its end mark in the active
    /// half, and makes them durable.
    pub(super) fn append(
        &mut self,
        seq: u64,
        clock_ms: u64,
        calls: &[(String, Vec<u8>)],
        sessions: &[(String, Vec<u8>)],
    ) -> std::io::Result<()> {
        let total = Self::group_bytes(calls, sessions);
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.reserve(total);
        buf.resize(GROUP_HEADER, 0);
        let tagged = calls
            .iter()
            .map(|r| (0, r))
            .chain(sessions.iter().map(|r| (SESSION_BIT, r)));
        for (bit, (k, v)) in tagged {
            buf.extend_from_slice(&(k.len() as u32 | bit).to_le_bytes());
            buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
            buf.extend_from_slice(k.as_bytes());
            buf.extend_from_slice(v);
        }
        let payload_len = buf.len() - GROUP_HEADER;
        let header = group_header(seq, clock_ms, &buf[GROUP_HEADER..]);
        buf[..GROUP_HEADER].copy_from_slice(&header);
        buf.resize(GROUP_HEADER + align(payload_len), 0);
        buf.extend_from_slice(&group_header(seq + 1, clock_ms, &[]));
        debug_assert_eq!(buf.len(), total);
        if !self.fits(total) {
            return Err(std::io::Error::other("the log's half is full"));
        }
        let at = self.tails[self.active];
        let written = self
            .file
            .write_all_at(&buf, at)
            .and_then(|()| self.file.sync_data());
        // Kept for the next flush unless it grew large (a group of big answers).
        if buf.capacity() <= 1 << 20 {
            self.buf = buf;
        }
        written?;
        self.tails[self.active] += (total - GROUP_HEADER) as u64;
        Ok(())
    }

    /// Goes on in the other half, from its start (its records must be in the file by now:
    /// what is left there is older than the checkpoint, and read as such).
    pub(super) fn switch(&mut self) {
        self.active ^= 1;
        self.tails[self.active] = self.region(self.active).0;
    }

    /// After a checkpoint of everything: both halves start again.
    pub(super) fn reset(&mut self) {
        self.active = 0;
        self.tails = [self.region(0).0, self.region(1).0];
    }

    /// The log's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// The bytes of each half of a log of `size`.
fn half_of(size: u64) -> u64 {
    ((size - START) / 2) & !(GROUP_HEADER as u64 - 1)
}

/// The groups after `applied` in the two halves: the half that goes on from `applied` first,
/// then the other if it goes on from there. A group of a later sequence anywhere in a half not
/// read (in this boot) is damage: the groups before it are missing.
fn read_halves(
    halves: [&[u8]; 2],
    applied: u64,
    same_boot: bool,
) -> Result<(Vec<Group>, Option<String>), String> {
    let mut groups: Vec<Group> = Vec::new();
    let mut torn = None;
    let mut read = [false; 2];
    loop {
        let expected = groups.last().map_or(applied, |g| g.seq) + 1;
        let next = (0..2).find(|&i| {
            !read[i]
                && parse_header(&halves[i][..GROUP_HEADER])
                    .is_some_and(|(len, seq, ..)| seq == expected && len > 0)
        });
        let Some(i) = next else { break };
        read[i] = true;
        let (more, _, cut) = read_groups(halves[i], expected - 1, same_boot)
            .map_err(|e| format!("{e} (half {i})"))?;
        torn = torn.or(cut);
        if more.is_empty() {
            break;
        }
        groups.extend(more);
    }
    if same_boot {
        let expected = groups.last().map_or(applied, |g| g.seq) + 1;
        for i in (0..2).filter(|&i| !read[i]) {
            let first = &halves[i][..GROUP_HEADER];
            if parse_header(first).is_none() && first.iter().any(|&b| b != 0) {
                return Err(format!(
                    "the log's first group header in half {i} does not check"
                ));
            }
            // A group of a later sequence, or an end mark behind one: groups are missing. (The
            // end mark of the last group a checkpoint applied has the next sequence: allowed.)
            let later = (0..halves[i].len().saturating_sub(GROUP_HEADER - 1))
                .step_by(GROUP_HEADER)
                .filter_map(|at| parse_header(&halves[i][at..at + GROUP_HEADER]))
                .find(|&(len, seq, ..)| seq > expected || (len > 0 && seq == expected));
            if let Some((_, seq, ..)) = later {
                return Err(format!(
                    "the log holds sequence {seq} in half {i}, but group {expected} is missing"
                ));
            }
        }
    }
    Ok((groups, torn))
}

/// The groups after `applied` in `bytes` (one half of the log), where they end, and a torn
/// last flush if one was dropped; `Err` names the damage.
fn read_groups(
    bytes: &[u8],
    applied: u64,
    same_boot: bool,
) -> Result<(Vec<Group>, usize, Option<String>), String> {
    let mut groups = Vec::new();
    let mut at = 0usize;
    let mut expected = applied + 1;
    let header_at = |at: usize| bytes.get(at..at + GROUP_HEADER).and_then(parse_header);
    loop {
        let offset = at;
        let Some((len, seq, clock_ms, payload_crc)) = header_at(at) else {
            // A header that does not check: the end of a flush a crash cut (it never got to
            // write its end mark), unless a group or end mark of a later sequence follows —
            // then an acknowledged header was damaged.
            if same_boot && later_header(bytes, at, expected) {
                return Err(format!(
                    "the log's group header at byte {offset} of its half does not check (sequence \
                     {expected} expected, and later ones follow)"
                ));
            }
            let zeros = bytes[at..(at + GROUP_HEADER).min(bytes.len())]
                .iter()
                .all(|&b| b == 0);
            let torn = (!zeros).then(|| {
                format!(
                    "the log ends at byte {offset} of its half in a flush a crash or power loss cut"
                )
            });
            return Ok((groups, at, torn));
        };
        if seq < expected {
            // Written before the last checkpoint: where the log starts again, or behind a
            // complete group whose end mark a crash kept from being written.
            if at != 0 && same_boot && later_header(bytes, at, expected) {
                return Err(format!(
                    "the log's group at byte {offset} of its half has sequence {seq} where {expected} was \
                     expected, and later ones follow"
                ));
            }
            return Ok((groups, at, None));
        }
        if seq > expected && !same_boot {
            let torn = format!(
                "the log ends at byte {offset} of its half: a power loss cut its last flush"
            );
            return Ok((groups, at, Some(torn)));
        }
        if seq > expected {
            return Err(format!(
                "the log's group at byte {offset} of its half has sequence {seq}, but {expected} is missing"
            ));
        }
        if len == 0 {
            return Ok((groups, at, None));
        }
        let body = at + GROUP_HEADER;
        let next = body + align(len);
        let payload = bytes.get(body..body + len);
        let checks = payload.is_some_and(|p| crc32fast::hash(p) == payload_crc);
        if !checks {
            // Acknowledged groups have a header with the next sequence behind them; a flush a
            // crash cut has not.
            let followed = header_at(next).is_some_and(|(_, s, ..)| s == expected + 1);
            if followed && same_boot {
                return Err(format!(
                    "the log's group {seq} at byte {offset} of its half fails its checksum"
                ));
            }
            let torn = format!(
                "the log ends at byte {offset} of its half in a flush the crash cut (group {seq}, never \
                 acknowledged)"
            );
            return Ok((groups, at, Some(torn)));
        }
        let Some((records, sessions)) = payload.and_then(parse_records) else {
            return Err(format!(
                "the log's group {seq} at byte {offset} of its half does not decode"
            ));
        };
        groups.push(Group {
            seq,
            clock_ms,
            records,
            sessions,
        });
        expected += 1;
        at = next;
    }
}

/// Whether a group header with a sequence of `expected` or later checks anywhere after `at`.
fn later_header(bytes: &[u8], at: usize, expected: u64) -> bool {
    (at + GROUP_HEADER..bytes.len().saturating_sub(GROUP_HEADER - 1))
        .step_by(GROUP_HEADER)
        .any(|i| parse_header(&bytes[i..i + GROUP_HEADER]).is_some_and(|(_, s, ..)| s >= expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recs(n: usize, tag: &str) -> Vec<(String, Vec<u8>)> {
        (0..n)
            .map(|i| {
                (
                    format!("s\0{tag}{i}"),
                    format!("{{\"v\":{i}}}").into_bytes(),
                )
            })
            .collect()
    }

    /// Where the end mark behind the group at `at` is.
    fn end_mark(bytes: &[u8], at: usize) -> usize {
        let (len, ..) = parse_header(&bytes[at..at + GROUP_HEADER]).unwrap();
        at + GROUP_HEADER + align(len)
    }

    fn open(path: &Path, applied: u64) -> Result<Opened, JournalError> {
        Log::open(path, applied, false)
    }

    #[test]
    fn groups_are_read_back_in_order_until_the_end_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_NAME);
        let mut log = Log::open(&path, 0, true).unwrap().log;
        log.append(1, 10, &recs(3, "a"), &[]).unwrap();
        let session = vec![("s1".to_string(), b"{\"tools\":[]}".to_vec())];
        log.append(2, 20, &recs(1, "b"), &session).unwrap();
        drop(log);
        let opened = open(&path, 0).unwrap();
        assert_eq!(opened.groups.len(), 2);
        assert_eq!(opened.groups[0].records, recs(3, "a"));
        assert!(opened.groups[0].sessions.is_empty());
        assert_eq!(opened.groups[1].records, recs(1, "b"));
        assert_eq!(opened.groups[1].sessions, session);
        assert_eq!((opened.groups[1].seq, opened.groups[1].clock_ms), (2, 20));
        assert!(opened.torn.is_none());
        // What a checkpoint applied (it applies every group there is) is not read again.
        assert!(open(&path, 2).unwrap().groups.is_empty());
    }

    #[test]
    fn after_a_checkpoint_the_old_groups_are_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_NAME);
        let mut log = Log::open(&path, 0, true).unwrap().log;
        log.append(1, 1, &recs(20, "long"), &[]).unwrap();
        log.append(2, 1, &recs(20, "long"), &[]).unwrap();
        log.reset();
        // A shorter group over the first: its end mark ends the log, the rest is old.
        log.append(3, 2, &recs(1, "new"), &[]).unwrap();
        drop(log);
        let opened = open(&path, 2).unwrap();
        assert_eq!(opened.groups.len(), 1);
        assert_eq!(opened.groups[0].records, recs(1, "new"));
        // Reset and nothing written since: nothing to read.
        let mut log = open(&path, 3).unwrap().log;
        log.reset();
        drop(log);
        assert!(open(&path, 3).unwrap().groups.is_empty());
    }

    #[test]
    fn the_two_halves_are_read_in_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_NAME);
        let mut log = Log::open(&path, 0, true).unwrap().log;
        log.append(1, 1, &recs(2, "a"), &[]).unwrap();
        log.append(2, 1, &recs(2, "b"), &[]).unwrap();
        log.switch();
        log.append(3, 2, &recs(2, "c"), &[]).unwrap();
        log.append(4, 2, &recs(2, "d"), &[]).unwrap();
        drop(log);
        let seqs = |applied| -> Vec<u64> {
            open(&path, applied)
                .unwrap()
                .groups
                .iter()
                .map(|g| g.seq)
                .collect()
        };
        // Nothing applied: both halves, the first one first.
        assert_eq!(seqs(0), [1, 2, 3, 4]);
        // The first half's checkpoint done: the second only.
        assert_eq!(seqs(2), [3, 4]);
        assert!(seqs(4).is_empty());
        // Back in the first half after the second's checkpoint: group 5 over group 1.
        let mut log = open(&path, 4).unwrap().log;
        log.switch();
        log.switch();
        log.append(5, 3, &recs(1, "e"), &[]).unwrap();
        drop(log);
        assert_eq!(seqs(4), [5]);
        // The first half damaged where its group 5 is, while the checkpoint of 3–4 is not yet
        // in the file: group 5 is missing behind 4, and that is refused, not dropped.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[START as usize + 9] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let e = open(&path, 2).unwrap_err();
        assert!(matches!(e, JournalError::Damaged { .. }), "{e}");
    }

    #[test]
    fn a_flush_cut_short_is_dropped_and_a_damaged_group_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_NAME);
        let mut log = Log::open(&path, 0, true).unwrap().log;
        log.append(1, 1, &recs(50, "a"), &[]).unwrap();
        let second = log.tails[0] as usize;
        log.append(2, 1, &recs(50, "b"), &[]).unwrap();
        drop(log);
        let good = std::fs::read(&path).unwrap();

        // A bit flipped in the first group (acknowledged: the second follows it): refused.
        let mut bad = good.clone();
        bad[START as usize + 100] ^= 0x04;
        std::fs::write(&path, &bad).unwrap();
        let e = open(&path, 0).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");

        // A bit flipped in the last group (acknowledged: its end mark follows): refused.
        let mut bad = good.clone();
        bad[second + 100] ^= 0x04;
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(open(&path, 0), Err(JournalError::Damaged { .. })));

        // The last flush cut by a crash: its header whole, the rest of it (and its end mark)
        // never written. Dropped; the first group stays.
        let mut cut = good.clone();
        let end = good.len();
        for b in &mut cut[second + GROUP_HEADER + 64..end] {
            *b = 0;
        }
        std::fs::write(&path, &cut).unwrap();
        let opened = open(&path, 0).unwrap();
        assert_eq!(opened.groups.len(), 1);
        assert!(opened.torn.is_some());

        // A complete last group whose end mark a crash kept from being written: both groups.
        let mut no_end = good.clone();
        for b in &mut no_end[end_mark(&good, second)..end_mark(&good, second) + GROUP_HEADER] {
            *b = 0;
        }
        std::fs::write(&path, &no_end).unwrap();
        assert_eq!(open(&path, 0).unwrap().groups.len(), 2);

        // A header that does not check, in this boot: damage.
        let mut bad = good.clone();
        bad[second + 9] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(open(&path, 0), Err(JournalError::Damaged { .. })));

        // Cut, emptied, zeroed header: refused, naming the file.
        for damage in [
            good[..good.len() / 2].to_vec(),
            Vec::new(),
            [vec![0u8; 4096], good[4096..].to_vec()].concat(),
        ] {
            std::fs::write(&path, &damage).unwrap();
            let e = open(&path, 0).unwrap_err();
            assert!(matches!(e, JournalError::Damaged { .. }), "{e}");
            assert!(e.to_string().contains(LOG_NAME), "{e}");
        }
    }

    #[test]
    fn a_missing_log_is_created_only_when_none_was_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_NAME);
        assert!(matches!(open(&path, 5), Err(JournalError::Damaged { .. })));
        let log = Log::open(&path, 0, true).unwrap().log;
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(log.half * 2 + START <= size);
        assert!((MIN_SIZE..=MAX_SIZE).contains(&size));
    }
}
