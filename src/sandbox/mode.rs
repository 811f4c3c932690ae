//! What an engine asks of its sandbox: the [`SandboxMode`], network access, the per-call
//! [`SandboxLimits`], and where the trampoline binary is ([`SandboxConfig`]). Plain data: nothing
//! here touches the kernel (see [`crate::sandbox::probe`] for what the kernel can enforce).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// How much a process-running tool (bash) may touch. Names follow Codex's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// The default: read the system (`/usr`, `/bin`, `/lib*`, `/etc`, `/opt`, the call's own
    /// `/proc`, a few `/dev` nodes), read and write the session's workspace and a private
    /// `TMPDIR`, nothing else. The engine refuses to start if the kernel cannot enforce it.
    #[default]
    WorkspaceWrite,
    /// Like `workspace-write`, but the workspace is read-only (the private `TMPDIR` stays
    /// writable); `write_file` and `edit_file` answer `permission_denied`.
    ReadOnly,
    /// Runs with whatever the kernel offers of `workspace-write`, and says at start what is
    /// missing. Never refuses to start.
    BestEffort,
    /// No confinement (the behaviour before the sandbox); a warning is logged at start.
    Off,
}

impl SandboxMode {
    /// The mode's name on the command line, in logs and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::BestEffort => "best-effort",
            SandboxMode::Off => "off",
        }
    }

    /// True when commands are confined at all.
    pub fn confines(self) -> bool {
        self != SandboxMode::Off
    }

    /// True when the workspace may be written.
    pub fn workspace_writable(self) -> bool {
        self != SandboxMode::ReadOnly
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a sandbox setting was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The mode cannot be enforced on this machine ([`crate::sandbox::Sandbox::prepare`]).
    #[error(
        "sandbox mode {mode} cannot be enforced on this machine: missing {}; the best-effort \
         mode runs with what is there, and the off mode runs commands unconfined",
        missing.join("; ")
    )]
    Unenforceable {
        /// The mode asked for.
        mode: SandboxMode,
        /// What this machine lacks, one sentence each.
        missing: Vec<String>,
    },
    /// Not a mode's name.
    #[error("unknown sandbox mode {0:?} (workspace-write, read-only, best-effort, off)")]
    UnknownMode(String),
    /// Not a size, or a size of zero or beyond 2^64 bytes.
    #[error("not a size: {0:?} (e.g. 2G, 256M, 1048576)")]
    BadSize(String),
    /// A path given to read cannot be used.
    #[error("cannot let commands read {}: {reason}", path.display())]
    BadReadPath {
        /// The path.
        path: PathBuf,
        /// Why (not absolute, missing, unreadable).
        reason: String,
    },
}

impl FromStr for SandboxMode {
    type Err = SandboxError;

    fn from_str(s: &str) -> Result<Self, SandboxError> {
        match s {
            "workspace-write" => Ok(SandboxMode::WorkspaceWrite),
            "read-only" => Ok(SandboxMode::ReadOnly),
            "best-effort" => Ok(SandboxMode::BestEffort),
            "off" => Ok(SandboxMode::Off),
            other => Err(SandboxError::UnknownMode(other.to_string())),
        }
    }
}

/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// Per-call limits of a confined command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Processes (and threads) at once: a pids cgroup when one can be created, else
    /// `RLIMIT_NPROC` (which the kernel does not apply to root). Default 256.
    pub max_processes: u64,
    /// Memory in bytes: a memory cgroup when one can be created, else `RLIMIT_AS` per process.
    /// Default 2 GiB.
    pub max_memory: u64,
    /// Largest file a command may write, in bytes (`RLIMIT_FSIZE`). Default 1 GiB.
    pub max_file_size: u64,
    /// All the files of the call's private `TMPDIR` together, in bytes: it is a tmpfs of this
    /// size in the call's mount namespace (in memory, so it counts against `max_memory` where a
    /// memory cgroup is in force). Default 512 MiB.
    pub max_tmp_size: u64,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            max_processes: 256,
            max_memory: 2 * GIB,
            max_file_size: GIB,
            max_tmp_size: 512 * MIB,
        }
    }
}

/// An engine's sandbox settings (see [`crate::EngineBuilder::sandbox`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    /// The mode (default `workspace-write`).
    pub mode: SandboxMode,
    /// Let commands use the network (default: no network).
    pub allow_network: bool,
    /// Per-call limits.
    pub limits: SandboxLimits,
    /// The `switchboard` binary used as the trampoline. `None`: found automatically (see
    /// [`crate::sandbox::find_trampoline`]).
    pub trampoline: Option<PathBuf>,
    /// More paths commands may read and execute (never write), beside the system's: toolchains
    /// installed under a home directory, for example. Absolute; each must exist.
    pub read_paths: Vec<PathBuf>,
}

impl SandboxConfig {
    /// A config in `mode` with default limits and no network.
    pub fn new(mode: SandboxMode) -> Self {
        SandboxConfig {
            mode,
            ..SandboxConfig::default()
        }
    }

    /// No confinement.
    pub fn off() -> Self {
        SandboxConfig::new(SandboxMode::Off)
    }

    /// Uses `path` (an installed `switchboard` binary, or any binary that calls
    /// [`crate::sandbox::exec_main`]) as the trampoline.
    pub fn trampoline(mut self, path: impl Into<PathBuf>) -> Self {
        self.trampoline = Some(path.into());
        self
    }

    /// Allows (or forbids) network access.
    pub fn allow_network(mut self, allow: bool) -> Self {
        self.allow_network = allow;
        self
    }

    /// Sets the per-call limits.
    pub fn limits(mut self, limits: SandboxLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Lets commands read and execute what lies under `paths` (never write it): kept visible
    /// where the sandbox hides a directory (`/home`, `/root`, …) and allowed by Landlock.
    pub fn read_paths(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        self.read_paths.extend(paths);
        self
    }
}

/// `2 GiB`, `256 MiB`, `1536 KiB`, `100 bytes`.
pub fn human_bytes(n: u64) -> String {
    if n >= GIB && n.is_multiple_of(GIB) {
        format!("{} GiB", n / GIB)
    } else if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(any(test, feature = "cli"))]
/// Parses a size: a number of bytes, optionally followed by `K`, `M`, `G` (powers of 1024,
/// also written `KiB`, `MiB`, `GiB`).
pub fn parse_bytes(s: &str) -> Result<u64, SandboxError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| SandboxError::BadSize(s.to_string()))?;
    let scale = match unit.trim() {
        "" => 1,
        "K" | "KiB" | "k" => 1024,
        "M" | "MiB" => MIB,
        "G" | "GiB" => GIB,
        _ => return Err(SandboxError::BadSize(s.to_string())),
    };
    n.checked_mul(scale)
        .filter(|n| *n > 0)
        .ok_or_else(|| SandboxError::BadSize(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_bytes_read_naturally() {
        for mode in [
            SandboxMode::WorkspaceWrite,
            SandboxMode::ReadOnly,
            SandboxMode::BestEffort,
            SandboxMode::Off,
        ] {
            assert_eq!(mode.as_str().parse::<SandboxMode>(), Ok(mode));
        }
        assert!("none".parse::<SandboxMode>().is_err());
        assert_eq!(human_bytes(2 * GIB), "2 GiB");
        assert_eq!(human_bytes(256 * MIB), "256 MiB");
        assert_eq!(human_bytes(100), "100 bytes");
        assert_eq!(parse_bytes("2G"), Ok(2 * GIB));
        assert_eq!(parse_bytes("256MiB"), Ok(256 * MIB));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("0").is_err() && parse_bytes("12X").is_err());
    }
}
