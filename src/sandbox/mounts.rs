//! The call's private mount namespace: its own `/proc`, the host's socket directories hidden
//! (and, for a root engine, the root-only entries of `/etc`), and the call's `TMPDIR` a bounded
//! tmpfs.
//!
//! Landlock (before ABI 9) does not mediate `connect` on a path-based unix socket, so a command
//! that knows a socket's path — a Docker socket in `/run`, an `SSH_AUTH_SOCK` in `/tmp`, a user's
//! agent under `/home` — could reach it. In the call's own mount namespace (made by `unshare
//! --mount-proc`, private), the trampoline covers [`HIDDEN`] with one empty tmpfs, after
//! taking a detached copy of the workspace (and of the read paths) when they lie below one of
//! them, and puts those copies back at their usual paths. The `TMPDIR` gets a fresh tmpfs of its
//! own, of the call's `max_tmp_size`: all its files together cannot outgrow it (a write past it
//! fails with `ENOSPC`), and it vanishes with the namespace. The host's mounts are untouched
//! (nothing propagates out of a private namespace); the command sees the same paths for
//! everything it is allowed to use.
//!
//! A command of an engine running as root runs as uid 0 (without capabilities): it is the owner
//! of the host's root-owned files, so a `0640 root` file such as `/etc/shadow` would be readable
//! wherever Landlock lets it read. For such engines [`root_secrets`] lists what in [`SECRET_TREES`]
//! no other user may read, and the trampoline covers each of those in the call's namespace (a
//! file by `/dev/null`, a directory by an empty tmpfs): a root command reads what any user reads.

use std::path::{Path, PathBuf};

use rustix::fs::CWD;
use rustix::mount::{
    MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, mount, mount_change,
    move_mount, open_tree,
};

/// Directories covered by an empty tmpfs: where sockets and other users' files live.
pub const HIDDEN: [&str; 7] = [
    "/tmp", "/var/tmp", "/run", "/var/run", "/root", "/home", "/dev/shm",
];

/// System trees whose entries that other users may not read are hidden from a root command
/// (the rest of the readable system trees is what packages install world-readable).
pub const SECRET_TREES: [&str; 1] = ["/etc"];

/// Entries walked in [`SECRET_TREES`] at most (a tree beyond is walked no further, and said).
const MAX_WALKED: usize = 100_000;

/// The entries of [`SECRET_TREES`] other users may not read (a file without `o+r`, a directory
/// without `o+r` or `o+x`, not descended into), when this process runs as root; empty otherwise.
/// Walked once per process.
pub fn root_secrets() -> &'static [PathBuf] {
    static SECRETS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    SECRETS.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            return Vec::new();
        }
        let mut found = Vec::new();
        let mut walked = 0usize;
        for tree in SECRET_TREES {
            walk_secrets(Path::new(tree), &mut found, &mut walked);
        }
        if walked >= MAX_WALKED {
            tracing::warn!(
                walked,
                "sandbox: the system trees are too large to list every root-only file; some stay readable to root commands"
            );
        }
        found
    })
}

fn walk_secrets(dir: &Path, found: &mut Vec<PathBuf>, walked: &mut usize) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        *walked += 1;
        if *walked >= MAX_WALKED {
            return;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let mode = meta.permissions().mode();
        let path = entry.path();
        if meta.is_dir() {
            if mode & 0o005 != 0o005 {
                found.push(path);
            } else {
                walk_secrets(&path, found, walked);
            }
        } else if !meta.file_type().is_symlink() && mode & 0o004 == 0 {
            found.push(path);
        }
    }
}

/// Covers each of `secrets` (see [`root_secrets`]): a directory by an empty tmpfs, anything else
/// by `/dev/null`. Call it in a private mount namespace, before Landlock.
pub fn hide_secrets(secrets: &[PathBuf]) -> Result<(), String> {
    for path in secrets {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue; // gone since it was listed
        };
        let done = if meta.is_dir() {
            mount(
                "tmpfs",
                path,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RDONLY,
                c"mode=700,size=4k",
            )
        } else if meta.file_type().is_symlink() {
            continue;
        } else {
            rustix::mount::mount_bind("/dev/null", path)
        };
        done.map_err(|e| format!("cannot hide {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The call's private `TMPDIR`: a tmpfs mounted at `path`, of `size` bytes (`None`: tmpfs's
/// own default, half the machine's memory).
#[derive(Debug)]
pub struct Scratch<'a> {
    /// Where the command finds it.
    pub path: &'a Path,
    /// Its size in bytes.
    pub size: Option<u64>,
}

/// Inodes of a scratch tmpfs: one per 4 KiB of its size (at least 1,024), so a flood of empty
/// files is bounded too.
fn scratch_inodes(size: u64) -> u64 {
    (size / 4096).max(1024)
}

/// Makes every mount private (nothing done here reaches the parent namespace) and mounts a
/// fresh `/proc` for the call's PID namespace, as `unshare --mount-proc` does. Call it as pid 1
/// of fresh PID and mount namespaces.
pub fn mount_proc() -> Result<(), String> {
    mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| format!("cannot make the mounts private: {e}"))?;
    mount(
        "proc",
        "/proc",
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"",
    )
    .map_err(|e| format!("cannot mount /proc: {e}"))
}

/// Covers [`HIDDEN`], keeping `keep` (the workspace, the read paths) visible where it was, and
/// mounts `scratch`. Call it only in a private mount namespace, before Landlock (which forbids
/// mounting).
/// `private`: [`mount_proc`] made every mount private already.
pub fn hide_host_dirs(keep: &[&Path], scratch: &Scratch<'_>, private: bool) -> Result<(), String> {
    // Nothing done here may reach the parent namespace.
    if !private {
        mount_change(
            "/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        )
        .map_err(|e| format!("cannot make the mounts private: {e}"))?;
    }
    let hidden: Vec<&Path> = HIDDEN
        .iter()
        .map(Path::new)
        // Real directories only: `/var/run` is usually a link to `/run`.
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect();
    let mut kept = Vec::new();
    for path in keep {
        let path: PathBuf = path
            .canonicalize()
            .map_err(|e| format!("cannot resolve {}: {e}", path.display()))?;
        if hidden.iter().any(|h| path.starts_with(h)) {
            let tree = open_tree(
                CWD,
                &path,
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_RECURSIVE,
            )
            .map_err(|e| format!("cannot keep {}: {e}", path.display()))?;
            kept.push((path, tree));
        }
    }
    // One empty tmpfs covers them all: mounted on the first, bound on the others (a bind costs
    // about half of a tmpfs of its own, made and torn down with each call). What the engine
    // creates in it below — mount points of kept paths and of the `TMPDIR` — shows as empty
    // directories under each covered path, which Landlock lets the command neither list nor
    // open.
    for (i, dir) in hidden.iter().enumerate() {
        let covered = match i {
            0 => mount(
                "tmpfs",
                *dir,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                c"mode=755,size=64k",
            ),
            _ => rustix::mount::mount_bind(hidden[0], *dir),
        };
        covered.map_err(|e| format!("cannot cover {}: {e}", dir.display()))?;
    }
    for (path, tree) in kept {
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot recreate {}: {e}", path.display()))?;
        move_mount(
            &tree,
            "",
            CWD,
            &path,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(|e| format!("cannot put {} back: {e}", path.display()))?;
    }
    mount_scratch(scratch)
}

fn mount_scratch(scratch: &Scratch<'_>) -> Result<(), String> {
    let path = scratch.path;
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut options = String::from("mode=700");
    if let Some(size) = scratch.size {
        options.push_str(&format!(",size={size},nr_inodes={}", scratch_inodes(size)));
    }
    let options = std::ffi::CString::new(options).map_err(|e| e.to_string())?;
    mount(
        "tmpfs",
        path,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        options.as_c_str(),
    )
    .map_err(|e| format!("cannot mount the TMPDIR {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_tmpfs_bounds_its_inodes_with_its_size() {
        assert_eq!(scratch_inodes(512 << 20), 131_072);
        assert_eq!(scratch_inodes(1 << 20), 1024);
    }
}
