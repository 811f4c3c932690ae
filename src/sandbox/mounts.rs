//! Hides the host's socket directories from a confined call. Landlock (before ABI 9) does not
//! mediate `connect` on a path-based unix socket, so a command that knows a socket's path — a
//! Docker socket in `/run`, an `SSH_AUTH_SOCK` in `/tmp`, a user's agent under `/home` — could
//! reach it. In the call's own mount namespace (made by `unshare --mount-proc`, private), the
//! trampoline covers [`HIDDEN`] with empty tmpfs mounts, after taking a detached copy of the
//! workspace and the private `TMPDIR` when they lie below one of them, and puts those copies back
//! at their usual paths. The host's mounts are untouched (nothing propagates out of a private
//! namespace); the command sees the same paths for everything it is allowed to use.

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

/// Covers [`HIDDEN`], keeping `keep` (the workspace, the `TMPDIR`) visible where it was. Call it
/// only in a private mount namespace, before Landlock (which forbids mounting).
pub fn hide_host_dirs(keep: &[&Path]) -> Result<(), String> {
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
    Ok(())
}
