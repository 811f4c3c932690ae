//! What a confined call needs on the engine's side before its trampoline starts — a directory
//! (`tmp/`, the mount point of the call's `TMPDIR`, and `status`, the init's report) and the
//! call's cgroups with their limits set — made for a call and, once that call has ended, kept
//! for a later one instead of being removed: making them and removing them cost the engine
//! about a third of a millisecond of each call (see `docs/sandbox.md`, "What it costs").
//!
//! A slot serves one call at a time. It is given back off the async runtime once its call has
//! ended, and kept only when nothing of that call is left in it ([`Slot::recycle`]): its
//! cgroups hold no process, their memory cgroup holds little memory (a call's shared-memory
//! segments, freed by the kernel shortly after its IPC namespace ends, would otherwise count
//! against the next call), its `tmp/` is still an empty directory only the engine may enter (a
//! call with a mount namespace wrote into a tmpfs mounted over it, which ended with the
//! namespace), and its report is emptied. The limit counters a verdict reads are taken as the
//! next call's baseline then ([`super::cgroup::CallCgroup`]). Anything else is removed, as every
//! slot is when the engine's sandbox is dropped; what an engine killed with `kill -9` left is
//! removed by the next engine ([`remove_stale`]).

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::cgroup::{CallCgroup, CgroupParents};
use super::mode::SandboxLimits;

/// The most slots kept for later calls: as many as calls ran at once, up to this.
const MAX_FREE: usize = 32;

/// The start of a slot directory's name, before the engine's pid.
const DIR_PREFIX: &str = "switchboard-call-";

/// Removes, once per process and in a thread of its own, the slot directories that engines
/// killed with `kill -9` left in the temporary directory (their calls died with them, the
/// directories did not), as [`CgroupParents::find`] does for their cgroups. Directories of
/// live engines stay.
pub(super) fn remove_stale() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("switchboard-stale".into())
            .spawn(|| remove_stale_in(&std::env::temp_dir()));
    });
}

fn remove_stale_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, _)) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists()
            && entry.file_type().is_ok_and(|t| t.is_dir())
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The engine's slots not in use.
#[derive(Debug, Default)]
pub(super) struct Slots {
    /// Oldest first: each is given in turn (so none is left unused while others serve).
    free: Mutex<VecDeque<Slot>>,
}

/// One call's directory and cgroups.
#[derive(Debug)]
pub(super) struct Slot {
    /// Removed when the slot is.
    _dir: tempfile::TempDir,
    /// The call's `TMPDIR` (mode 0700).
    pub tmp: PathBuf,
    /// The init's report (mode 0600).
    pub status: PathBuf,
    /// `None` only while being removed.
    cgroup: Option<CallCgroup>,
    limits: SandboxLimits,
}

impl Slots {
    /// A slot for a call with `limits`: one kept from an earlier call, else a new one (its
    /// cgroups under `parents`).
    pub fn take(&self, parents: &CgroupParents, limits: &SandboxLimits) -> std::io::Result<Slot> {
        loop {
            let kept = self
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            match kept {
                // Still there (nothing removed it meanwhile) and for these limits.
                Some(slot) if slot.limits == *limits && slot.intact() => return Ok(slot),
                Some(slot) => drop(slot),
                None => return Slot::new(parents, limits),
            }
        }
    }

    /// Takes back the slot of a call that has ended: kept for a later call when nothing of that
    /// call is left in it, else removed. Blocking (file system and cgroup writes): run it off
    /// the async runtime.
    pub fn give_back(&self, mut slot: Slot) {
        if slot.recycle() {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() < MAX_FREE {
                free.push_back(slot);
            }
        }
    }
}

impl Slot {
    fn new(parents: &CgroupParents, limits: &SandboxLimits) -> std::io::Result<Slot> {
        // Named after this process, so that an engine killed with `kill -9` leaves nothing
        // that the next engine does not remove ([`remove_stale`]).
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()?;
        let tmp = dir.path().join("tmp");
        std::fs::DirBuilder::new().mode(0o700).create(&tmp)?;
        let status = dir.path().join("status");
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&status)?;
        Ok(Slot {
            _dir: dir,
            tmp,
            status,
            cgroup: Some(parents.create_call(limits)),
            limits: *limits,
        })
    }

    /// The call's cgroups.
    pub fn cgroup(&self) -> &CallCgroup {
        self.cgroup
            .as_ref()
            .expect("present until the slot is removed")
    }

    /// Its directory, report and cgroups are still there.
    fn intact(&self) -> bool {
        self.tmp.is_dir() && self.status.is_file() && self.cgroup().dirs_exist()
    }

    /// Readies the slot for another call; false when something of the last one is left in it
    /// (then it is to be removed). See the module documentation.
    fn recycle(&mut self) -> bool {
        let tmp_pristine = std::fs::symlink_metadata(&self.tmp).is_ok_and(|m| {
            m.is_dir()
                && m.mode() & 0o7777 == 0o700
                && m.uid() == rustix::process::geteuid().as_raw()
        }) && std::fs::read_dir(&self.tmp).is_ok_and(|mut d| d.next().is_none());
        tmp_pristine
            && empty_report(&self.status)
            && self.cgroup.as_mut().is_some_and(CallCgroup::recycle)
    }
}

/// Empties the init's report, which must still be a plain file of the engine's (mode 0600).
fn empty_report(status: &Path) -> bool {
    let Ok(file) = OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(status)
    else {
        return false;
    };
    file.metadata()
        .is_ok_and(|m| m.is_file() && m.mode() & 0o7777 == 0o600)
        && file.set_len(0).is_ok()
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Kills whatever is left in the cgroups and removes them (bounded); the directory goes
        // with `dir`.
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_slot_directories_of_engines_that_are_gone_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        // Pid 0 is never a process; this test's is alive.
        let gone = tmp.path().join(format!("{DIR_PREFIX}0-abc123"));
        let live = tmp
            .path()
            .join(format!("{DIR_PREFIX}{}-abc123", std::process::id()));
        // An unconfined call's report file, and a name of another shape.
        let file = tmp.path().join(format!("{DIR_PREFIX}0-report"));
        let other = tmp.path().join(format!("{DIR_PREFIX}abc123"));
        for dir in [&gone, &live, &other] {
            std::fs::create_dir_all(dir.join("tmp")).unwrap();
        }
        std::fs::write(&file, "").unwrap();
        remove_stale_in(tmp.path());
        assert!(!gone.exists());
        assert!(live.exists() && file.exists() && other.exists());
    }
}
