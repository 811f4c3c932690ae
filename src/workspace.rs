//! The workspace: the one directory the built-in file tools may touch, and the only way they touch it.
//!
//! A [`Workspace`] owns the canonical root path and a capability handle ([`cap_std::fs::Dir`]) opened
//! on it. Every file operation of the built-in tools goes through that handle, never through
//! `std::fs` with a joined path, so confinement does not depend on a check made before the access:
//!
//! 1. [`Workspace::relative`] turns the model's path into a workspace-relative one. It refuses empty,
//!    NUL-containing and over-long paths or names (`invalid_arguments`), any `..` component, and absolute paths
//!    that are not inside the canonical root compared component by component (`permission_denied`).
//!    `~` is never expanded: it is an ordinary file name.
//! 2. cap-std then resolves the relative path beneath the handle (`openat2(RESOLVE_BENEATH)` on
//!    Linux, a checked walk elsewhere). A symlink anywhere on the way — leaf, directory component,
//!    chain, magic `/proc/self/…` link — that would lead outside fails with
//!    `io::ErrorKind::PermissionDenied` and *no* OS error code ("a path led outside of the
//!    filesystem"); [`Workspace::io_error`] maps that to `permission_denied`
//!    `path escapes workspace: P`. A genuine `EACCES` carries an OS code and stays an
//!    `execution_error`. Note that cap-std refuses any symlink whose target climbs above the root
//!    even if it comes back down (`../ws/x`).
//!
//! It also owns [`Workspace::write_atomic`], the single write path shared by `write_file` and
//! `edit_file`: temp file beside the target, `sync_all`, rename over it; temp files that killed
//! writers left behind are removed by [`Workspace::remove_stale_temp_files`] and before each write.

use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cap_std::fs::{Dir, OpenOptions};

use crate::protocol::ErrorCode;
use crate::protocol::ToolError;

/// Longest path (in bytes) a tool accepts.
pub const MAX_PATH_BYTES: usize = 4096;

/// Longest single path component (file or directory name), in bytes, as on Linux filesystems.
pub const MAX_NAME_BYTES: usize = 255;

/// Distinguishes temp files made by concurrent writes in this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

mod temp_files;
use temp_files::MAX_TEMP_SCAN;
use temp_files::{LiveTemp, TEMP_MARK, remove_stale_temps};

/// The directory the file tools are confined to: its canonical path and a capability handle on it.
#[derive(Clone, Debug)]
pub struct Workspace {
    /// Shared: every session of an engine clones its workspace.
    root: Arc<Path>,
    dir: Arc<Dir>,
    /// Whether `read_file`/`edit_file` may open files with more than one name (see
    /// [`Workspace::allow_hard_links`]).
    hard_links: bool,
}

impl Workspace {
    /// Opens `root`, which must be an existing directory. The path is canonicalized first, so
    /// absolute paths given by the model are compared against the real location.
    pub fn open(root: impl AsRef<Path>) -> io::Result<Workspace> {
        let root = std::fs::canonicalize(root.as_ref())?;
        if !std::fs::metadata(&root)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("workspace root is not a directory: {}", root.display()),
            ));
        }
        let dir = Dir::open_ambient_dir(&root, cap_std::ambient_authority())?;
        Ok(Workspace {
            root: Arc::from(root),
            dir: Arc::new(dir),
            hard_links: false,
        })
    }

    /// Lets `read_file` and `edit_file` open regular files that have more than one hard link.
    ///
    /// By default they refuse them (`permission_denied`, `hard-linked file: P`): a hard link
    /// inside the workspace may be another name of a file outside it (planted by a bash command,
    /// or left by a tool), and no path check can tell — both names are the same file. Allow them
    /// for workspaces that hard-link on purpose (pnpm's `node_modules`, `cp -al` snapshots).
    /// `write_file` is unaffected either way: it replaces the name it is given and never writes
    /// through a link, so the file's other names keep the old content.
    pub fn allow_hard_links(mut self, allow: bool) -> Workspace {
        self.hard_links = allow;
        self
    }

    /// Whether files with more than one hard link may be read and edited.
    pub fn hard_links_allowed(&self) -> bool {
        self.hard_links
    }

    /// The canonical root path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The capability handle every file access goes through.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Turns a model-supplied path into a workspace-relative path, or a ToolError.
    ///
    /// The result never contains `..`, never is absolute, and is `.` for the root itself. It is
    /// only a lexical check: symlinks are enforced later by the handle.
    pub fn relative(&self, path: &str) -> Result<PathBuf, ToolError> {
        if path.is_empty() {
            return Err(ToolError::invalid("path must not be empty"));
        }
        if path.contains('\0') {
            return Err(ToolError::invalid("path must not contain NUL bytes"));
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(ToolError::invalid(format!(
                "path is longer than {MAX_PATH_BYTES} bytes"
            )));
        }
        if is_windows_form(path) {
            return Err(ToolError::permission(format!(
                "Windows path forms (a drive letter, a UNC share or a leading backslash) are not workspace paths: {path}"
            )));
        }
        let given = Path::new(path);
        if given.components().any(|c| c == Component::ParentDir) {
            return Err(escapes(path));
        }
        let inside = if given.is_absolute() {
            given.strip_prefix(&self.root).map_err(|_| escapes(path))?
        } else {
            given
        };
        let mut rel = PathBuf::new();
        for component in inside.components() {
            match component {
                Component::Normal(name) if name.len() > MAX_NAME_BYTES => {
                    return Err(ToolError::invalid(format!(
                        "path component is longer than {MAX_NAME_BYTES} bytes"
                    )));
                }
                Component::Normal(name) => rel.push(name),
                Component::CurDir => {}
                // Unreachable after the checks above, but refuse rather than assume.
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(escapes(path));
                }
            }
        }
        if rel.as_os_str().is_empty() {
            rel.push(".");
        }
        Ok(rel)
    }

    /// Maps an I/O error from the handle to a ToolError about the model's path `shown`.
    ///
    /// cap-std's escape error (`PermissionDenied` without an OS code) becomes `permission_denied`
    /// `path escapes workspace: P`; `NotFound` becomes `file not found: P`; anything else is an
    /// `execution_error` carrying the system message.
    pub fn io_error(shown: &str, err: &io::Error) -> ToolError {
        match err.kind() {
            io::ErrorKind::PermissionDenied if err.raw_os_error().is_none() => escapes(shown),
            io::ErrorKind::NotFound => ToolError::execution(format!("file not found: {shown}")),
            io::ErrorKind::IsADirectory => ToolError::execution(format!("is a directory: {shown}")),
            _ => ToolError::execution(format!("{err}: {shown}")),
        }
    }

    /// Replaces the file at `rel` with `bytes` atomically; `shown` is the model's path, for errors.
    ///
    /// Parent directories are created. The bytes go to a temp file in the same directory, are
    /// synced, get the old file's permissions (and, when the engine may, its owner) if it existed,
    /// and the temp file is renamed over the target; on any failure the temp file is removed and
    /// the old content stays. A symlink leaf is resolved through the handle and its target
    /// written instead, if that target is inside the workspace and exists; otherwise the write is
    /// refused (`permission_denied`). The rename replaces a directory entry of a handle opened
    /// beneath the root, so a symlink swapped in meanwhile is replaced, never followed.
    pub fn write_atomic(&self, rel: &Path, bytes: &[u8], shown: &str) -> Result<(), ToolError> {
        self.write_atomic_unless(rel, bytes, shown, &|| true)
    }

    /// [`Workspace::write_atomic`] that asks `may_commit` right before the rename — the point of
    /// no return — and gives up when it says no, leaving the old content and no temp file
    /// (`cancelled`). Tools pass their call's [`crate::ToolContext::begin_commit`], so a call the
    /// engine has given up (cancelled, past its deadline) never changes the file, and a call that
    /// did change it is answered with its real result, never `cancelled` or `timeout`.
    pub fn write_atomic_unless(
        &self,
        rel: &Path,
        bytes: &[u8],
        shown: &str,
        may_commit: &dyn Fn() -> bool,
    ) -> Result<(), ToolError> {
        self.write_atomic_with(rel, shown, may_commit, |file| file.write_all(bytes))
    }

    /// [`Workspace::write_atomic_unless`] with the temp file's content produced by `fill`.
    fn write_atomic_with(
        &self,
        rel: &Path,
        shown: &str,
        may_commit: &dyn Fn() -> bool,
        fill: impl FnOnce(&mut cap_std::fs::File) -> io::Result<()>,
    ) -> Result<(), ToolError> {
        let target = self.write_target(rel, shown)?;
        let (Some(name), parent) = (target.file_name(), target.parent()) else {
            return Err(ToolError::execution(format!("is a directory: {shown}")));
        };
        let parent_dir = match parent {
            Some(p) if !p.as_os_str().is_empty() => {
                self.dir
                    .create_dir_all(p)
                    .map_err(|e| Self::io_error(shown, &e))?;
                self.dir
                    .open_dir(p)
                    .map_err(|e| Self::io_error(shown, &e))?
            }
            _ => self
                .dir
                .try_clone()
                .map_err(|e| Self::io_error(shown, &e))?,
        };
        let old = match parent_dir.symlink_metadata(name) {
            Ok(meta) if meta.is_dir() => {
                return Err(ToolError::execution(format!("is a directory: {shown}")));
            }
            Ok(meta) if meta.is_file() => Some(meta),
            // A symlink swapped in meanwhile is replaced by the rename, never followed.
            Ok(meta) if meta.file_type().is_symlink() => None,
            // FIFOs, sockets and devices are not files to overwrite.
            Ok(_) => {
                return Err(ToolError::execution(format!("not a regular file: {shown}")));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(Self::io_error(shown, &e)),
        };

        // Temp files left by writers that are gone (a SIGKILL mid-write) go first.
        remove_stale_temps(&parent_dir, MAX_TEMP_SCAN);
        let (temp_name, mut file, _live) = create_temp(&parent_dir, name, shown)?;
        let written = (|| {
            fill(&mut file)?;
            if let Some(meta) = &old {
                use cap_std::fs::MetadataExt;
                // Keep the owner where we may (root); an ordinary user keeps its own.
                if (meta.uid(), meta.gid())
                    != (
                        rustix::process::geteuid().as_raw(),
                        rustix::process::getegid().as_raw(),
                    )
                {
                    let _ = std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()));
                }
                file.set_permissions(meta.permissions())?;
            }
            file.sync_all()?;
            drop(file);
            // The point of no return: past it the call is answered with what happened.
            if !may_commit() {
                return Ok(false);
            }
            parent_dir.rename(&temp_name, &parent_dir, name)?;
            Ok(true)
        })();
        match written {
            Ok(true) => {}
            Ok(false) => {
                let _ = parent_dir.remove_file(&temp_name);
                return Err(ToolError::new(
                    ErrorCode::Cancelled,
                    format!("cancelled before {shown} was replaced; it is unchanged"),
                ));
            }
            Err(e) => {
                let _ = parent_dir.remove_file(&temp_name);
                return Err(Self::io_error(shown, &e));
            }
        }
        // Make the rename durable; a failure here does not undo the write.
        if let Ok(d) = parent_dir.open(".") {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Where a write to `rel` lands: `rel` itself, or the in-workspace target of a symlink leaf.
    fn write_target(&self, rel: &Path, shown: &str) -> Result<PathBuf, ToolError> {
        match self.dir.symlink_metadata(rel) {
            Ok(meta) if meta.file_type().is_symlink() => match self.dir.canonicalize(rel) {
                Ok(resolved) => Ok(resolved),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ToolError::permission(
                    format!("symlink target does not exist: {shown}"),
                )),
                Err(e) => Err(Self::io_error(shown, &e)),
            },
            Ok(_) => Ok(rel.to_path_buf()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(rel.to_path_buf()),
            Err(e) => Err(Self::io_error(shown, &e)),
        }
    }
}

/// True for the Windows path forms a POSIX path would otherwise take as literal names: a drive
/// letter (`C:`, `C:\x`, `C:/x`, drive-relative `C:x`), a UNC or device path (`\\server\share`,
/// `\\?\C:\`) and a path rooted at the current drive (`\x`).
fn is_windows_form(path: &str) -> bool {
    let bytes = path.as_bytes();
    let drive = bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':';
    drive || bytes.first() == Some(&b'\\')
}

/// `permission_denied`: `path escapes workspace: P`.
fn escapes(shown: &str) -> ToolError {
    ToolError::permission(format!("path escapes workspace: {shown}"))
}

/// Creates a fresh temp file `.{name}.switchboard-tmp-{pid}-{n}` in `dir` (never reusing one;
/// `name` cut to its first 64 bytes). It counts as live (never stale) while the returned guard
/// is held.
fn create_temp(
    dir: &Dir,
    name: &std::ffi::OsStr,
    shown: &str,
) -> Result<(PathBuf, cap_std::fs::File, LiveTemp), ToolError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    // A prefix of the name, so that the temp name stays within the limit for a long name.
    let lossy = name.to_string_lossy();
    let mut cut = lossy.len().min(64);
    while !lossy.is_char_boundary(cut) {
        cut -= 1;
    }
    let stem = &lossy[..cut];
    let mut last_err = None;
    for _ in 0..16 {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        // Live before it exists, so a cleaner never sees it unclaimed.
        let live = LiveTemp::claim(n);
        let temp = PathBuf::from(format!(".{stem}{TEMP_MARK}{}-{n}", std::process::id()));
        match dir.open_with(&temp, &options) {
            Ok(file) => return Ok((temp, file, live)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(Workspace::io_error(shown, &e)),
        }
    }
    let err = last_err.unwrap_or_else(|| io::Error::other("could not create a temp file"));
    Err(Workspace::io_error(shown, &err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_normalised_without_touching_the_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        assert_eq!(ws.relative("./a/./b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(ws.relative(".").unwrap(), PathBuf::from("."));
        assert_eq!(ws.relative("~/x").unwrap(), PathBuf::from("~/x"));
        let abs = ws.root().join("z");
        assert_eq!(
            ws.relative(abs.to_str().unwrap()).unwrap(),
            PathBuf::from("z")
        );
        assert_eq!(
            ws.relative("a/../b").unwrap_err().code,
            ErrorCode::PermissionDenied
        );
        for bad in ["..", "../x", "a/..", "./..", "a/b/../../..", "/..", "//.."] {
            assert_eq!(
                ws.relative(bad).unwrap_err().code,
                ErrorCode::PermissionDenied,
                "{bad}"
            );
        }
        for windows in [
            "C:\\Users\\x.txt",
            "c:/Users/x.txt",
            "D:x.txt",
            "C:",
            "\\\\server\\share\\x.txt",
            "\\\\?\\C:\\x",
            "\\x.txt",
        ] {
            let err = ws.relative(windows).unwrap_err();
            assert_eq!(err.code, ErrorCode::PermissionDenied, "{windows}");
            assert!(err.detail.contains("Windows path"), "{}", err.detail);
        }
        // Only the Windows forms: a colon or backslash later in a name stays an ordinary name.
        assert_eq!(ws.relative("ab:c").unwrap(), PathBuf::from("ab:c"));
        assert_eq!(ws.relative("a\\b").unwrap(), PathBuf::from("a\\b"));
        for bad in ["", "a\0b", &"x".repeat(MAX_PATH_BYTES + 1)] {
            assert_eq!(
                ws.relative(bad).unwrap_err().code,
                ErrorCode::InvalidArguments
            );
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_write_that_fails_midway_keeps_the_old_content_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        std::fs::write(ws.root().join("f.txt"), "old content").unwrap();
        let failing = |file: &mut cap_std::fs::File| -> io::Result<()> {
            file.write_all(b"half of the new")?;
            Err(io::Error::other("disk full"))
        };
        let err = ws
            .write_atomic_with(Path::new("f.txt"), "f.txt", &|| true, failing)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError);
        assert!(err.detail.contains("disk full"), "{}", err.detail);
        assert_eq!(
            std::fs::read_to_string(ws.root().join("f.txt")).unwrap(),
            "old content"
        );
        assert_eq!(names(ws.root()), ["f.txt"]);

        // A new file that fails is not created at all.
        std::fs::create_dir(ws.root().join("sub")).unwrap();
        let err = ws
            .write_atomic_with(Path::new("sub/new.txt"), "sub/new.txt", &|| true, failing)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError);
        assert!(names(&ws.root().join("sub")).is_empty());
    }

    #[test]
    fn a_write_cancelled_before_the_rename_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        std::fs::write(ws.root().join("f.txt"), "old").unwrap();
        for name in ["f.txt", "new.txt"] {
            let err = ws
                .write_atomic_unless(Path::new(name), b"new", name, &|| false)
                .unwrap_err();
            assert_eq!(err.code, ErrorCode::Cancelled);
        }
        assert_eq!(
            std::fs::read_to_string(ws.root().join("f.txt")).unwrap(),
            "old"
        );
        assert_eq!(names(ws.root()), ["f.txt"]);
    }
}
