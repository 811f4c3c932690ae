//! What this machine can enforce, found once when an engine is built: the trampoline binary,
//! the kernel's Landlock ABI (asked of the trampoline itself, so a broken trampoline is found at
//! start, not at the first call), whether network namespaces and the other per-call namespaces
//! ([`CALL_NAMESPACES`]) work, and which per-call cgroups can be created.
//! [`SandboxStatus::missing`] turns that into the list of what a mode would lack.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use super::cgroup::CgroupParents;
use super::exec::SUBCOMMAND;
use super::mode::SandboxConfig;

/// Environment variable naming the trampoline binary (overrides the automatic search).
pub const TRAMPOLINE_VAR: &str = "SWITCHBOARD_TRAMPOLINE";

/// The namespaces each call gets beside its PID, mount and network ones, when the kernel has
/// them: IPC (System V shared memory, semaphores and message queues, POSIX message queues —
/// another call's, or a host process's, are out of sight), UTS (a host name of its own) and
/// cgroup (its own cgroups appear as the root; the host's layout stays hidden).
pub const CALL_NAMESPACES: [&str; 3] = ["ipc", "uts", "cgroup"];

/// What the kernel and the installation offer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxStatus {
    /// The trampoline binary, if one was found and answered the probe.
    pub trampoline: Option<PathBuf>,
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: i32,
    /// `unshare --net` works (a loopback-only network namespace per call).
    pub network_namespace: bool,
    /// Which of the per-call namespaces beyond mount, pid and network (IPC, UTS, cgroup)
    /// `unshare` can create here.
    pub namespaces: Vec<&'static str>,
    /// Where per-call cgroups are created.
    pub(crate) cgroups: CgroupParents,
}

impl SandboxStatus {
    /// True when each call's bash commands get a cgroup of their own with a process limit.
    pub fn limits_processes(&self) -> bool {
        self.cgroups.pids.is_some()
    }

    /// True when each call's bash commands get a cgroup of their own with a memory limit.
    pub fn limits_memory(&self) -> bool {
        self.cgroups.memory.is_some()
    }

    /// Probes the machine for `config` (a few milliseconds: two short-lived processes).
    pub fn probe(config: &SandboxConfig) -> SandboxStatus {
        let trampoline = config.trampoline.clone().or_else(find_trampoline);
        let landlock_abi = trampoline.as_deref().map_or(0, probe_landlock);
        SandboxStatus {
            trampoline: trampoline.filter(|_| landlock_abi >= 0),
            landlock_abi: landlock_abi.max(0),
            network_namespace: probe_netns(),
            namespaces: probe_namespaces(),
            cgroups: CgroupParents::find(),
        }
    }

    /// What `config` asks for that this machine cannot give, one phrase each. Anything listed
    /// under "required" stops an enforcing mode from starting; the rest is reported.
    pub(crate) fn missing(&self, config: &SandboxConfig) -> Missing {
        let mut m = Missing::default();
        if self.trampoline.is_none() {
            m.required.push(format!(
                "the trampoline binary (no `switchboard` binary found: set {TRAMPOLINE_VAR} or \
                 SandboxConfig::trampoline)"
            ));
            // Landlock is probed through the trampoline: without one, nothing is known of it.
            m.required
                .push("Landlock (not probed: the trampoline is what probes it)".into());
        } else if self.landlock_abi < 1 {
            m.required
                .push("Landlock (the kernel has none: file access cannot be confined)".into());
        } else if self.landlock_abi < 3 {
            m.degraded
                .push("Landlock truncate control (ABI 3; the kernel has an older one)".into());
        }
        if self.trampoline.is_some() && self.landlock_abi < 6 {
            m.degraded
                .push("Landlock scoping of signals and abstract unix sockets (ABI 6)".to_string());
        }
        if !config.allow_network && !self.network_namespace && self.landlock_abi < 4 {
            m.required.push(
                "network isolation (no network namespace and no Landlock TCP rules, ABI 4)".into(),
            );
        } else if !config.allow_network && !self.network_namespace {
            m.degraded
                .push("a network namespace (TCP is refused by Landlock; UDP is not)".into());
        }
        for ns in CALL_NAMESPACES {
            if !self.namespaces.contains(&ns) {
                m.degraded.push(match ns {
                    "ipc" => "an IPC namespace (System V IPC and POSIX message queues are the \
                              host's)"
                        .to_string(),
                    other => format!("a {other} namespace"),
                });
            }
        }
        if self.cgroups.pids.is_none() {
            m.degraded.push(
                "a writable pids cgroup (RLIMIT_NPROC instead, which does not bind root)".into(),
            );
        }
        if self.cgroups.memory.is_none() {
            m.degraded
                .push("a writable memory cgroup (RLIMIT_AS per process instead)".into());
        }
        m
    }
}

/// What a mode would lack on this machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Missing {
    /// Without these the mode cannot be enforced.
    pub required: Vec<String>,
    /// Weaker than the full mode, still enforced.
    pub degraded: Vec<String>,
}

/// Set by the `switchboard` binary itself: whatever its file is called, it is the trampoline.
static THIS_BINARY_IS_THE_TRAMPOLINE: AtomicBool = AtomicBool::new(false);

/// Says that this process's binary is the `switchboard` CLI (it answers `sandbox-exec`), so a copy
/// renamed or installed under another name still finds its trampoline: itself.
pub fn this_binary_is_the_trampoline() {
    THIS_BINARY_IS_THE_TRAMPOLINE.store(true, Ordering::Relaxed);
}

/// The name of the small trampoline-only binary, preferred beside the `switchboard` one.
pub const SMALL_TRAMPOLINE: &str = "switchboard-sandbox";

/// The trampoline binary: `$SWITCHBOARD_TRAMPOLINE`; else the `switchboard` binary — this
/// process's own when it is the `switchboard` CLI (whatever its name) or is named `switchboard`,
/// else one beside this process's binary or one directory up (how `cargo test` lays out test
/// binaries) — or rather the small `switchboard-sandbox` beside it, when there is one (the same
/// trampoline, cheaper to start). `None` if there is none.
pub fn find_trampoline() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(TRAMPOLINE_VAR) {
        return Some(PathBuf::from(path)).filter(|p| executable(p));
    }
    let me = std::env::current_exe().ok()?;
    let full = if THIS_BINARY_IS_THE_TRAMPOLINE.load(Ordering::Relaxed)
        || me.file_name().is_some_and(|n| n == "switchboard")
    {
        me
    } else {
        let dir = me.parent()?;
        [Some(dir), dir.parent()]
            .into_iter()
            .flatten()
            .map(|d| d.join("switchboard"))
            .find(|p| executable(p))?
    };
    let small = full.parent().map(|d| d.join(SMALL_TRAMPOLINE));
    Some(small.filter(|p| executable(p)).unwrap_or(full))
}

fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Asks the trampoline for the Landlock ABI; -1 if it does not answer like a trampoline.
pub(super) fn probe_landlock(trampoline: &Path) -> i32 {
    let out = Command::new(trampoline)
        .args([SUBCOMMAND, "--probe"])
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let Ok(out) = out else { return -1 };
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("landlock_abi=")
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// True when `unshare --net` (plain, or inside a user namespace) can start a process.
fn probe_netns() -> bool {
    unshare_works(&["--net"])
}

/// Which of [`CALL_NAMESPACES`] `unshare` can create (all at once, the usual case, in one try).
fn probe_namespaces() -> Vec<&'static str> {
    let flags: Vec<String> = CALL_NAMESPACES.iter().map(|ns| format!("--{ns}")).collect();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    if unshare_works(&flags) {
        return CALL_NAMESPACES.to_vec();
    }
    CALL_NAMESPACES
        .into_iter()
        .filter(|ns| unshare_works(&[&format!("--{ns}")]))
        .collect()
}

/// True when `unshare FLAGS -- true` (plain, or inside a user namespace) succeeds.
fn unshare_works(flags: &[&str]) -> bool {
    [&[][..], &["--user", "--map-root-user"][..]]
        .into_iter()
        .any(|user| {
            Command::new("unshare")
                .args(user)
                .args(flags)
                .args(["--", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::SandboxMode;

    fn full() -> SandboxStatus {
        SandboxStatus {
            trampoline: Some(PathBuf::from("/usr/bin/switchboard")),
            landlock_abi: 7,
            network_namespace: true,
            namespaces: CALL_NAMESPACES.to_vec(),
            cgroups: CgroupParents {
                pids: Some(PathBuf::from("/sys/fs/cgroup/pids")),
                memory: Some(PathBuf::from("/sys/fs/cgroup/memory")),
            },
        }
    }

    #[test]
    fn what_is_missing_is_named_and_graded() {
        let config = SandboxConfig::new(SandboxMode::WorkspaceWrite);
        assert_eq!(full().missing(&config), Missing::default());
        let no_landlock = SandboxStatus {
            landlock_abi: 0,
            network_namespace: false,
            ..full()
        };
        let m = no_landlock.missing(&config);
        assert!(m.required.iter().any(|r| r.starts_with("Landlock")));
        assert!(
            m.required
                .iter()
                .any(|r| r.starts_with("network isolation"))
        );
        // With the network allowed, its isolation is not asked for.
        let m = no_landlock.missing(&config.clone().allow_network(true));
        assert!(!m.required.iter().any(|r| r.starts_with("network")));
        // Landlock TCP rules stand in for a missing namespace, as a degradation.
        let old_kernel = SandboxStatus {
            landlock_abi: 4,
            network_namespace: false,
            cgroups: CgroupParents::default(),
            ..full()
        };
        let m = old_kernel.missing(&config);
        assert!(m.required.is_empty(), "{m:?}");
        assert_eq!(m.degraded.len(), 4, "{m:?}");
        let no_trampoline = SandboxStatus {
            trampoline: None,
            ..full()
        };
        assert!(no_trampoline.missing(&config).required[0].contains(TRAMPOLINE_VAR));
    }
}
