//! A small tmpfs mounted for one test — a disk that fills up on cue — and unmounted when the test
//! drops it. Mounting needs root; elsewhere the test says it skipped.

use std::path::{Path, PathBuf};

/// A tmpfs mounted at its path; unmounted when dropped.
pub struct Mounted(PathBuf);

impl Mounted {
    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Mounts a tmpfs of `size` (as `mount -o size=…` takes it: `64k`, `4m`) at `parent/small`, or
/// prints why it cannot (`SKIPPED: …`) and returns `None`.
pub fn small_tmpfs(parent: &Path, size: &str) -> Option<Mounted> {
    let dir = parent.join("small");
    std::fs::create_dir(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&dir)
        .output();
    match mounted {
        Ok(out) if out.status.success() => Some(Mounted(dir)),
        Ok(out) => {
            eprintln!(
                "SKIPPED: a small tmpfs cannot be mounted here (needs root): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            eprintln!("SKIPPED: `mount` cannot run here: {e}");
            None
        }
    }
}
