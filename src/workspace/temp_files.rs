//! Temp files left behind by writers that are gone.
//!
//! Every write goes through a temp file `.NAME.switchboard-tmp-PID-N` beside its target (see
//! [`Workspace::write_atomic`]). A writer killed mid-write (SIGKILL, the OOM killer) leaves
//! that file, possibly as large as what it was writing. This module decides which temp files are
//! left over — their writer's pid is not alive, or is this process's pid but not one of its
//! writes in progress ([`LiveTemp`]) — and removes them: in one directory before each write, and
//! in the whole workspace with [`Workspace::remove_stale_temp_files`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use cap_std::fs::Dir;

use super::Workspace;

/// The counters of this process's temp files that are being written now: a temp file named with
/// this process's pid and a counter not in this set was left by an earlier process that had the
/// same pid (pids repeat, e.g. in containers), and is stale.
static LIVE_TEMPS: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

/// The part of a temp file's name between the target's name and the writer's pid.
pub(super) const TEMP_MARK: &str = ".switchboard-tmp-";

/// Most directory entries one write looks through for stale temp files.
pub const MAX_TEMP_SCAN: usize = 10_000;

/// Most directory entries [`Workspace::remove_stale_temp_files`] visits.
pub const MAX_TEMP_WALK: usize = 100_000;

/// Marks one of this process's temp files as being written, until dropped.
pub(super) struct LiveTemp(u64);

impl LiveTemp {
    pub(super) fn claim(n: u64) -> LiveTemp {
        live_temps().insert(n);
        LiveTemp(n)
    }
}

impl Drop for LiveTemp {
    fn drop(&mut self) {
        live_temps().remove(&self.0);
    }
}

fn live_temps() -> std::sync::MutexGuard<'static, BTreeSet<u64>> {
    // The set stays consistent whatever panicked while holding it (single inserts/removes).
    LIVE_TEMPS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The writer (pid, counter) of a temp file named `.{stem}.switchboard-tmp-{pid}-{n}`.
fn temp_writer(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix('.')?;
    let tail = &rest[rest.rfind(TEMP_MARK)? + TEMP_MARK.len()..];
    let (pid, n) = tail.split_once('-')?;
    Some((pid.parse().ok()?, n.parse().ok()?))
}

/// Whether the temp file of writer `(pid, n)` was left behind: its process is gone, or it has
/// this process's pid but is not one of its writes in progress. A pid that is alive but belongs
/// to another process (pids repeat) keeps its file: only ever too careful.
fn is_stale(pid: u32, n: u64) -> bool {
    if pid == std::process::id() {
        return !live_temps().contains(&n);
    }
    match i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        Some(pid) => rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH),
        None => true,
    }
}

/// Removes the stale temp files directly in `dir` (regular files only), looking at no more than
/// `limit` entries. Returns how many were removed; errors are skipped (best effort).
pub(super) fn remove_stale_temps(dir: &Dir, limit: usize) -> usize {
    let Ok(entries) = dir.entries() else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.take(limit).flatten() {
        let name = entry.file_name();
        let Some((pid, n)) = name.to_str().and_then(temp_writer) else {
            continue;
        };
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && is_stale(pid, n) && dir.remove_file(&name).is_ok() {
            removed += 1;
        }
    }
    removed
}

impl Workspace {
    /// Removes temp files (`.NAME.switchboard-tmp-PID-N`) that writers which are gone left
    /// anywhere in the workspace — a process killed mid-write (SIGKILL, OOM, power loss) leaves
    /// its temp file, possibly as large as the file it was writing. Call it when an engine
    /// starts on the workspace (the CLI does); every write also cleans its own directory.
    ///
    /// The walk never follows symlinks and stops after `MAX_TEMP_WALK` entries. Returns how
    /// many files were removed.
    pub fn remove_stale_temp_files(&self) -> usize {
        let mut removed = 0;
        let mut visited = 0usize;
        let mut pending: Vec<PathBuf> = vec![PathBuf::from(".")];
        while let Some(rel) = pending.pop() {
            let Ok(dir) = self.dir.open_dir(&rel) else {
                continue;
            };
            let Ok(entries) = dir.entries() else {
                continue;
            };
            for entry in entries.flatten() {
                visited += 1;
                if visited > MAX_TEMP_WALK {
                    return removed + remove_stale_temps(&dir, MAX_TEMP_SCAN);
                }
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(rel.join(entry.file_name()));
                }
            }
            removed += remove_stale_temps(&dir, MAX_TEMP_SCAN);
        }
        removed
    }
}
