//! The call's private mount namespace: the host's socket directories hidden, and the call's
//! `TMPDIR` a bounded tmpfs.
//!
//! Landlock (before ABI 9) does not mediate `connect` on a path-based unix socket, so a command
//! that knows a socket's path — a Docker socket in `/run`, an `SSH_AUTH_SOCK` in `/tmp`, a user's
//! agent under `/home` — could reach it. In the call's own mount namespace (made by `unshare
//! --mount-proc`, private), the trampoline covers [`HIDDEN`] with empty tmpfs mounts, after
//! taking a detached copy of the workspace (and of the read paths) when they lie below one of
//! them, and puts those copies back at their usual paths. The `TMPDIR` gets a fresh tmpfs of its
//! own, of the call's `max_tmp_size`: all its files together cannot outgrow it (a write past it
//! fails with `ENOSPC`), and it vanishes with the namespace. The host's mounts are untouched
//! (nothing propagates out of a private namespace); the command sees the same paths for
//! everything it is allowed to use.

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

/// Covers [`HIDDEN`], keeping `keep` (the workspace, the read paths) visible where it was, and
/// mounts `scratch`. Call it only in a private mount namespace, before Landlock (which forbids
/// mounting).
pub fn hide_host_dirs(keep: &[&Path], scratch: &Scratch<'_>) -> Result<(), String> {
    // Nothing done here may reach the parent namespace.
    mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| format!("cannot make the mounts private: {e}"))?;
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
    for dir in &hidden {
        mount(
            "tmpfs",
            *dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            c"mode=755,size=64k",
        )
        .map_err(|e| format!("cannot cover {}: {e}", dir.display()))?;
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
