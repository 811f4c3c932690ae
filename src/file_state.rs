//! What a session knows about the files it touched, and the lock that makes a read–modify–write
//! of one file atomic against other writers.
//!
//! * [`FileStamps`] (one per session, in its [`crate::SessionScope`]): for each workspace path,
//!   the [`Stamp`] (device, inode, size, modification time) of the file as this session last read
//!   or wrote it. `write_file` and `edit_file` refuse to replace a file whose stamp moved since
//!   then — another session, another process or an outside editor changed it — with
//!   `execution_error` "modified since read at …"; the model recovers by reading it again. A file
//!   the session never read is not checked (a first `write_file` creates or replaces freely).
//! * [`DirLock`]: an exclusive advisory lock (`flock`) on the directory that holds the target,
//!   taken by `write_file` and `edit_file` for the whole check–read–modify–rename. Two editors of
//!   one file — two sessions of one engine or two engines on one workspace — run one after the
//!   other, so no successful edit is lost. The lock is on the directory, not the file, because
//!   the rename replaces the file's inode; it serialises writes within one directory only, for
//!   the milliseconds a write takes. Processes that do not take it (bash, editors) are not held
//!   back: for them the stamp check is what catches the change.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use cap_std::fs::{Metadata, MetadataExt};
use rustix::fs::{FlockOperation, flock};

use crate::protocol::ToolError;
use crate::workspace::Workspace;

/// A file's identity and version as seen at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl Stamp {
    /// The stamp of a file's metadata.
    pub fn of(meta: &Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }

    /// The stamp of the file at `rel` now, or `None` if there is none (or it cannot be read).
    pub fn now(ws: &Workspace, rel: &Path) -> Option<Stamp> {
        ws.dir().metadata(rel).ok().map(|m| Stamp::of(&m))
    }

    fn described(&self) -> String {
        let secs = u64::try_from(self.mtime.0).unwrap_or(0);
        let when = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        humantime::format_rfc3339_seconds(when).to_string()
    }
}

/// The stamps of the files one session read or wrote, by workspace-relative path.
#[derive(Debug, Default)]
pub struct FileStamps {
    /// Made at the first file seen: most sessions never read or write one (8 bytes in every
    /// session, not 48).
    #[allow(
        clippy::box_collection,
        reason = "an empty map is 48 bytes inline; a box is 8"
    )]
    seen: Mutex<Option<Box<HashMap<PathBuf, Stamp>>>>,
}

impl FileStamps {
    /// Records what the session saw of `rel` (after a read or its own write).
    pub fn record(&self, rel: &Path, stamp: Stamp) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_default()
            .insert(rel.to_path_buf(), stamp);
    }

    /// Refuses a write of `rel` if the file changed since this session last saw it. A file the
    /// session never saw, or that is gone now, passes.
    pub fn check_unchanged(
        &self,
        ws: &Workspace,
        rel: &Path,
        shown: &str,
    ) -> Result<(), ToolError> {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|seen| seen.get(rel).copied());
        match (seen, Stamp::now(ws, rel)) {
            (Some(seen), Some(now)) if seen != now => Err(ToolError::execution(format!(
                "{shown} was modified since this session read it at {} (by another session, \
                 process or editor); nothing was written: read it again, then retry",
                seen.described()
            ))),
            _ => Ok(()),
        }
    }
}

/// An exclusive advisory lock on a directory, released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _held: cap_std::fs::File,
}

impl DirLock {
    /// Locks the directory that will hold `rel` (its parent, or the nearest existing ancestor
    /// when the parent does not exist yet), waiting for other holders.
    pub fn for_path(ws: &Workspace, rel: &Path, shown: &str) -> Result<DirLock, ToolError> {
        let mut parent = rel.parent();
        let dir = loop {
            match parent {
                Some(p) if !p.as_os_str().is_empty() => match ws.dir().open_dir(p) {
                    Ok(dir) => break dir,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => parent = p.parent(),
                    Err(e) => return Err(Workspace::io_error(shown, &e)),
                },
                _ => {
                    break ws
                        .dir()
                        .try_clone()
                        .map_err(|e| Workspace::io_error(shown, &e))?;
                }
            }
        };
        // cap-std's directory handles are `O_PATH`, which `flock` refuses: lock an ordinary
        // read-only descriptor of the same directory.
        let held = dir.open(".").map_err(|e| Workspace::io_error(shown, &e))?;
        flock(&held, FlockOperation::LockExclusive).map_err(|e| {
            ToolError::execution(format!("cannot lock the directory of {shown}: {e}"))
        })?;
        Ok(DirLock { _held: held })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_is_refused_and_an_unseen_one_passes() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        std::fs::write(ws.root().join("a.txt"), "one").unwrap();
        let stamps = FileStamps::default();
        let rel = Path::new("a.txt");
        assert!(
            stamps.check_unchanged(&ws, rel, "a.txt").is_ok(),
            "never seen"
        );
        stamps.record(rel, Stamp::now(&ws, rel).unwrap());
        assert!(
            stamps.check_unchanged(&ws, rel, "a.txt").is_ok(),
            "unchanged"
        );
        // A replacement (new inode), as any atomic writer makes.
        std::fs::write(ws.root().join("b.tmp"), "two").unwrap();
        std::fs::rename(ws.root().join("b.tmp"), ws.root().join("a.txt")).unwrap();
        let err = stamps.check_unchanged(&ws, rel, "a.txt").unwrap_err();
        assert!(
            err.detail
                .starts_with("a.txt was modified since this session read it at ")
        );
    }

    #[test]
    fn the_directory_lock_excludes_a_second_holder_until_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let held = DirLock::for_path(&ws, Path::new("new/dir/f.txt"), "f").unwrap();
        let other = ws.dir().open(".").unwrap();
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_err());
        drop(held);
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_ok());
    }
}
