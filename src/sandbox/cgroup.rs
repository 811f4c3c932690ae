//! Per-call cgroups (cgroup v1 `pids` and `memory` controllers): the engine creates one directory
//! per controller for a confined call, under the engine's own cgroup (read from
//! `/proc/self/cgroup`), sets its limits, hands the `tasks` files to the trampoline (which
//! moves itself in before it execs, so every process of the call is counted from the start),
//! and reads after the call whether a limit was hit. Then it keeps them for a later call when
//! the call left nothing in them ([`CallCgroup::recycle`], through [`super::slots`]: one call
//! at a time), else kills whatever is left and removes the directories.
//!
//! The engine itself never joins these cgroups, so a limit can only ever kill the call's own
//! processes. On cgroup v2 or where the hierarchy is not writable, [`CgroupParents::find`] finds
//! nothing and the trampoline falls back to rlimits.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

use super::mode::{SandboxLimits, human_bytes};

/// Distinguishes the cgroups of concurrent calls.
static CALL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Where per-call cgroups are created (the engine's own cgroup of each controller), when
/// writable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupParents {
    /// The engine's `pids` cgroup directory.
    pub pids: Option<PathBuf>,
    /// The engine's `memory` cgroup directory.
    pub memory: Option<PathBuf>,
}

impl CgroupParents {
    /// Looks up the engine's v1 `pids` and `memory` cgroups and keeps those where a child
    /// directory can be created (tried once, then removed).
    pub fn find() -> Self {
        let table = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let parents = CgroupParents {
            pids: own_dir(&table, "pids").filter(|d| writable(d)),
            memory: own_dir(&table, "memory").filter(|d| writable(d)),
        };
        for dir in [&parents.pids, &parents.memory].into_iter().flatten() {
            remove_stale(dir);
        }
        parents
    }

    /// Creates the cgroups of one call with `limits`. A controller whose directory cannot be
    /// made is left out (the trampoline then uses the rlimit for it).
    pub fn create_call(&self, limits: &SandboxLimits) -> CallCgroup {
        let name = format!(
            "switchboard-{}-{}",
            std::process::id(),
            CALL_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let make = |parent: &Option<PathBuf>| {
            let dir = parent.as_ref()?.join(&name);
            std::fs::create_dir(&dir).ok()?;
            Some(dir)
        };
        let mut call = CallCgroup {
            pids: make(&self.pids),
            memory: make(&self.memory),
            limits: *limits,
            oom_kills_before: 0,
            refusals_before: 0,
        };
        if let Some(dir) = &call.pids
            && std::fs::write(dir.join("pids.max"), limits.max_processes.to_string()).is_err()
        {
            remove_dir(dir);
            call.pids = None;
        }
        if let Some(dir) = &call.memory {
            let bytes = limits.max_memory.to_string();
            if std::fs::write(dir.join("memory.limit_in_bytes"), &bytes).is_err() {
                remove_dir(dir);
                call.memory = None;
            } else {
                // Swap counts too where the kernel accounts it (best effort: often absent).
                let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), &bytes);
            }
        }
        call
    }
}

impl CgroupParents {
    /// A cgroup of its own for a helper's process tree, without limits: only so that every
    /// process of the tree can be found and killed ([`CallCgroup::remove`]). In the `pids`
    /// hierarchy where it is writable, else in the `memory` one; `None` without either.
    pub fn create_tree(&self) -> Option<CallCgroup> {
        let name = format!(
            "switchboard-{}-{}",
            std::process::id(),
            CALL_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let make = |parent: &Option<PathBuf>| {
            let dir = parent.as_ref()?.join(&name);
            std::fs::create_dir(&dir).ok().map(|()| dir)
        };
        let (pids, memory) = match make(&self.pids) {
            Some(dir) => (Some(dir), None),
            None => (None, Some(make(&self.memory)?)),
        };
        Some(CallCgroup {
            pids,
            memory,
            limits: SandboxLimits::default(),
            oom_kills_before: 0,
            refusals_before: 0,
        })
    }
}

/// `/sys/fs/cgroup/<controller>/<path>` for the v1 line of `/proc/self/cgroup` naming
/// `controller`.
fn own_dir(table: &str, controller: &str) -> Option<PathBuf> {
    table.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == controller).then(|| {
            Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(path.trim_start_matches('/'))
        })
    })
}

fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!("switchboard-probe-{}", std::process::id()));
    let made = std::fs::create_dir(&probe).is_ok();
    if made {
        let _ = std::fs::remove_dir(&probe);
    }
    made
}

/// Removes the call cgroups left behind by engines that are gone (killed with `kill -9`: their
/// commands died with them, their empty directories did not). Directories of live engines stay.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("switchboard-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir(dir);
}

/// One call's cgroups.
#[derive(Debug)]
pub struct CallCgroup {
    pids: Option<PathBuf>,
    memory: Option<PathBuf>,
    limits: SandboxLimits,
    /// The memory cgroup's OOM kills before this call (cgroups are kept for later calls:
    /// [`CallCgroup::recycle`]).
    oom_kills_before: u64,
    /// The forks the pids cgroup refused before this call.
    refusals_before: u64,
}

/// The most memory a call's memory cgroup may still hold to be kept for a later call (what a
/// call leaves is mostly the page cache of files it read, which the next call could reclaim;
/// above this it is removed instead).
const RECYCLE_MAX_USAGE: u64 = 16 << 20;

impl CallCgroup {
    /// The `cgroup.procs` files: a pid written there moves that whole process in.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.files("cgroup.procs")
    }

    /// The `tasks` files the trampoline writes `0` to, moving the thread that writes — the
    /// trampoline's only one — and so everything it then starts. Unlike a write to
    /// `cgroup.procs`, this takes no lock over every thread group of the system, whose release
    /// waits for an RCU grace period: measured here, that made one join in a hundred take
    /// 13–14 ms, where a write to `tasks` took at most 0.7 ms (`docs/sandbox.md`).
    pub fn task_files(&self) -> Vec<PathBuf> {
        self.files("tasks")
    }

    fn files(&self, name: &str) -> Vec<PathBuf> {
        [&self.pids, &self.memory]
            .into_iter()
            .flatten()
            .map(|d| d.join(name))
            .collect()
    }

    /// True when the pids controller bounds this call.
    pub fn limits_processes(&self) -> bool {
        self.pids.is_some()
    }

    /// True when the memory controller bounds this call.
    pub fn limits_memory(&self) -> bool {
        self.memory.is_some()
    }

    /// The limit the call ran into, as a sentence for the model: the kernel's OOM killer acted in
    /// the memory cgroup, or a fork was refused at the pids limit.
    pub fn limit_hit(&self) -> Option<String> {
        if let Some(dir) = &self.memory
            && counter(&dir.join("memory.oom_control"), "oom_kill") > self.oom_kills_before
        {
            // The call's own limit applied when its usage reached it; otherwise a limit above it
            // (the engine's cgroup, the machine) made the kernel kill in this call.
            let peak = std::fs::read_to_string(dir.join("memory.max_usage_in_bytes"))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            let own = peak.is_none_or(|p| p.saturating_add(1 << 20) >= self.limits.max_memory);
            return Some(if own {
                format!(
                    "killed: out of memory (limit {})",
                    human_bytes(self.limits.max_memory)
                )
            } else {
                oom_above(
                    peak.unwrap_or(0),
                    self.limits.max_memory,
                    enclosing_memory_limit(dir),
                )
            });
        }
        if let Some(dir) = &self.pids
            && counter(&dir.join("pids.events"), "max") > self.refusals_before
        {
            return Some(format!(
                "process limit reached (limit {} processes): new processes were refused",
                self.limits.max_processes
            ));
        }
        None
    }

    /// Its directories are all still there.
    pub fn dirs_exist(&self) -> bool {
        [&self.pids, &self.memory]
            .into_iter()
            .flatten()
            .all(|d| d.is_dir())
    }

    /// Readies these cgroups for another call once their call has ended: true when no process
    /// is left in them and the memory cgroup holds at most [`RECYCLE_MAX_USAGE`]; then its peak
    /// is reset and the counters [`CallCgroup::limit_hit`] reads become the next call's
    /// baseline. False: remove them instead. Blocking.
    pub fn recycle(&mut self) -> bool {
        let empty = [&self.pids, &self.memory].into_iter().flatten().all(|d| {
            std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|t| t.trim().is_empty())
        });
        if !empty {
            return false;
        }
        if let Some(dir) = &self.memory {
            let usage = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            if usage.is_none_or(|u| u > RECYCLE_MAX_USAGE)
                || std::fs::write(dir.join("memory.max_usage_in_bytes"), "0").is_err()
            {
                return false;
            }
            self.oom_kills_before = counter(&dir.join("memory.oom_control"), "oom_kill");
        }
        if let Some(dir) = &self.pids {
            self.refusals_before = counter(&dir.join("pids.events"), "max");
        }
        true
    }

    /// Kills every process still in the call's cgroups, then removes them (retrying while the
    /// kernel finishes reaping; bounded to about two seconds). Blocking: run it off the runtime.
    pub fn remove(self) {
        for dir in [&self.pids, &self.memory].into_iter().flatten() {
            for _ in 0..200 {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    if let Some(pid) = Pid::from_raw(pid) {
                        let _ = kill_process(pid, Signal::KILL);
                    }
                }
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The sentence for a call killed for memory by a limit other than its own: the enclosing
/// cgroup's limit when one could be read (`enclosing`: its size and directory), else "a limit
/// outside the engine" (the machine's memory, or a cgroup whose files cannot be read).
fn oom_above(peak: u64, own_limit: u64, enclosing: Option<(u64, PathBuf)>) -> String {
    let used = format!(
        "the call used at most {} of its own {}",
        human_bytes(peak),
        human_bytes(own_limit)
    );
    match enclosing {
        Some((limit, dir)) => format!(
            "killed: out of memory, by the memory limit of the cgroup {} that holds the engine ({}; {used})",
            dir.display(),
            human_bytes(limit)
        ),
        None => format!(
            "killed: out of memory, by a limit outside the engine: the machine's memory or a cgroup above it ({used})"
        ),
    }
}

/// The tightest memory limit of the cgroups above `dir` (a call's memory cgroup), with the
/// directory that sets it: cgroup v1's `memory.limit_in_bytes` or v2's `memory.max`, walking up
/// while the directory is a cgroup (`cgroup.procs`). `None` when no ancestor has a limit that
/// can be read, or only v1's "unlimited" (a number near 2^63).
fn enclosing_memory_limit(dir: &Path) -> Option<(u64, PathBuf)> {
    let mut tightest: Option<(u64, PathBuf)> = None;
    let mut up = dir.parent();
    while let Some(d) = up {
        if !d.join("cgroup.procs").exists() {
            break;
        }
        let limit = ["memory.limit_in_bytes", "memory.max"]
            .iter()
            .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
            .and_then(|t| t.trim().parse::<u64>().ok());
        if let Some(limit) = limit
            && limit < 1 << 60
            && tightest.as_ref().is_none_or(|(t, _)| limit < *t)
        {
            tightest = Some((limit, d.to_path_buf()));
        }
        up = d.parent();
    }
    tightest
}

/// The value of `key` in a `key value` lines file (0 when absent).
fn counter(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cgroup_paths_come_from_the_v1_lines() {
        let table = "9:name=systemd:/\n8:pids:/\n4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/\n";
        assert_eq!(
            own_dir(table, "pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids/"))
        );
        assert_eq!(
            own_dir(table, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/a/b"))
        );
        assert_eq!(
            own_dir(table, "cpuacct"),
            Some(PathBuf::from("/sys/fs/cgroup/cpuacct/c"))
        );
        assert_eq!(own_dir("0::/x\n", "pids"), None);
    }

    #[test]
    fn an_oom_by_an_enclosing_cgroup_names_its_limit_or_says_it_is_outside() {
        // A fake hierarchy: root (unlimited, v1's number) > caller (1 GiB) > engine (none, v2
        // "max") > call.
        let root = tempfile::tempdir().unwrap();
        let caller = root.path().join("caller");
        let engine = caller.join("engine");
        let call = engine.join("call");
        std::fs::create_dir_all(&call).unwrap();
        for d in [root.path(), &caller, &engine, &call] {
            std::fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        std::fs::write(
            root.path().join("memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        std::fs::write(caller.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        std::fs::write(engine.join("memory.max"), "max\n").unwrap();
        let found = enclosing_memory_limit(&call);
        assert_eq!(found, Some((1 << 30, caller.clone())));
        let text = oom_above(1_060_937_728, 2 << 30, found);
        assert!(
            text.contains(&format!(
                "by the memory limit of the cgroup {} that holds the engine (1 GiB; ",
                caller.display()
            )) && text.contains("of its own 2 GiB"),
            "{text}"
        );
        // Nothing readable above: said to be outside the engine.
        std::fs::remove_file(caller.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(enclosing_memory_limit(&call), None);
        let text = oom_above(5 << 20, 2 << 30, None);
        assert!(text.contains("a limit outside the engine"), "{text}");
    }
}
