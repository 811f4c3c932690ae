//! The Landlock ruleset a confined command runs under, applied by the trampoline to itself just
//! before it execs the command (Landlock domains are inherited across `fork` and `exec` and can
//! never be lifted).
//!
//! Read and execute: [`SYSTEM_READ`] (the system's programs, libraries and configuration, and
//! `/proc` — the call's own, freshly mounted one when PID namespaces are in use). Read and write:
//! the device nodes of [`DEVICES`]; the workspace (read-only in `read-only` mode); the call's
//! private `TMPDIR`. Everything else — the workspace's parent, other workspaces, `/root`,
//! `/home`, the engine's files — is refused. Where the kernel allows it (ABI ≥ 6) the domain is
//! also *scoped*: no signals to processes outside it, no connecting to abstract unix sockets
//! created outside it. Without a network namespace, Landlock's TCP rules (ABI ≥ 4) refuse every
//! TCP `bind` and `connect`.
//!
//! The engine's spawner opens the fixed paths once ([`preopen`]); the calls it forks add their
//! rules from those descriptors and open only their own paths.

use std::os::fd::AsFd;
use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The newest Landlock ABI whose rights this module asks for (the crate handles older kernels).
pub const TARGET_ABI: ABI = ABI::V6;

/// Read-only (and executable) trees.
pub const SYSTEM_READ: [&str; 10] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
];

/// Device nodes a command may read and write.
pub const DEVICES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Descriptors (`O_PATH`) of the rules' fixed paths — [`SYSTEM_READ`] but `/proc`, and
/// [`DEVICES`] — opened once by the spawner ([`preopen`]) and inherited by every call it forks,
/// which then opens only its own paths (about 30 system calls fewer per call). `/proc` is not
/// among them: a call's rule must name its own `/proc`, a file system of its own.
static PREOPENED: std::sync::OnceLock<Vec<(&'static str, std::os::fd::OwnedFd)>> =
    std::sync::OnceLock::new();

/// Opens the fixed paths' descriptors for the processes this one forks from now on (the
/// spawner, before its first call). A path this machine lacks is left out, as [`restrict_self`]
/// leaves it out. The descriptors are close-on-exec.
pub fn preopen() {
    PREOPENED.get_or_init(|| {
        SYSTEM_READ
            .iter()
            .chain(DEVICES.iter())
            .filter(|p| **p != "/proc")
            .filter_map(|p| {
                let fd = rustix::fs::open(
                    *p,
                    rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .ok()?;
                Some((*p, fd))
            })
            .collect()
    });
}

/// What [`restrict_self`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The ABI the kernel offered (0: no Landlock).
    pub abi: i32,
    /// Every requested right was enforced.
    pub fully: bool,
}

/// Restricts the calling process (single-threaded: the trampoline) to the rules in the module
/// docs. `tcp` refuses TCP bind/connect through Landlock (used when there is no network
/// namespace). `Err` when nothing could be enforced or a rule could not be added.
pub fn restrict_self(
    workspace: &Path,
    workspace_writable: bool,
    tmp: &Path,
    extra_read: &[std::path::PathBuf],
    tcp: bool,
) -> Result<Applied, String> {
    let abi = TARGET_ABI;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let device: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::WriteFile;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(|e| format!("landlock: {e}"))?
        .scope(Scope::from_all(abi))
        .map_err(|e| format!("landlock: {e}"))?;
    if tcp {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(|e| format!("landlock: {e}"))?;
    }
    let mut created = ruleset.create().map_err(|e| format!("landlock: {e}"))?;
    let mut rules: Vec<(&Path, BitFlags<AccessFs>)> = Vec::new();
    let preopened = PREOPENED.get();
    if let Some(preopened) = preopened {
        for (path, fd) in preopened {
            let access = if DEVICES.contains(path) { device } else { read };
            created = created
                .add_rule(PathBeneath::new(fd.as_fd(), access))
                .map_err(|e| format!("landlock: rule for {path}: {e}"))?;
        }
    }
    for p in SYSTEM_READ {
        if preopened.is_none() || p == "/proc" {
            rules.push((Path::new(p), read));
        }
    }
    if preopened.is_none() {
        for p in DEVICES {
            rules.push((Path::new(p), device));
        }
    }
    for p in extra_read {
        rules.push((p.as_path(), read));
    }
    rules.push((workspace, if workspace_writable { all } else { read }));
    rules.push((tmp, all));
    for (path, access) in rules {
        // A system path this machine lacks (`/lib32`, `/dev/tty` without a terminal) is skipped;
        // the workspace and the temporary directory must exist.
        let fd = match PathFd::new(path) {
            Ok(fd) => fd,
            Err(_) if path != workspace && path != tmp => continue,
            Err(e) => return Err(format!("landlock: cannot open {}: {e}", path.display())),
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| format!("landlock: rule for {}: {e}", path.display()))?;
    }
    let status = created
        .restrict_self()
        .map_err(|e| format!("landlock: {e}"))?;
    let abi = match status.landlock {
        landlock::LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
        _ => 0,
    };
    match status.ruleset {
        RulesetStatus::NotEnforced => Err(format!(
            "landlock is not available in this kernel (ABI {abi})"
        )),
        RulesetStatus::PartiallyEnforced => Ok(Applied { abi, fully: false }),
        RulesetStatus::FullyEnforced => Ok(Applied { abi, fully: true }),
    }
}

/// The Landlock ABI of the running kernel (0: none), found by restricting the calling process
/// with a ruleset that only handles `Execute` and allows it everywhere (a no-op domain). Call it
/// only in a process about to exit (the trampoline's probe).
pub fn probe_abi() -> i32 {
    let attempt = || -> Result<i32, landlock::RulesetError> {
        let created = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::Execute)?
            .create()?;
        let root = match PathFd::new("/") {
            Ok(fd) => fd,
            Err(_) => return Ok(0),
        };
        let status = created
            .add_rule(PathBeneath::new(root, AccessFs::Execute))?
            .restrict_self()?;
        Ok(match status.landlock {
            landlock::LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
            _ => 0,
        })
    };
    attempt().unwrap_or(0)
}
