//! The OS sandbox of process-running tools (bash): each call's command is confined by Landlock to
//! its own session's workspace and a private `TMPDIR`, has no network (a loopback-only network
//! namespace) and namespaces of its own (PID, mount, IPC, UTS, cgroup), runs under per-call
//! process, memory, file-size, scratch-space and CPU limits, and dies with the engine. See
//! `docs/sandbox.md` for what each mode blocks and what it does not.
//!
//! * `mode`: what is asked ([`SandboxConfig`], [`SandboxMode`], [`SandboxLimits`]).
//! * `probe`: what this machine can enforce, found when the engine is built.
//! * `landlock_rules`: the Landlock ruleset.
//! * `cgroup`: per-call `pids` and `memory` cgroups.
//! * `contain`: process-tree control without confinement, for helpers such as MCP stdio servers
//!   (process group, parent-death signal, a cgroup of their own or a token sweep).
//! * `mounts`: the call's mount namespace: its `/proc`, the host's socket directories and a root
//!   engine's root-only `/etc` entries hidden, the `TMPDIR` tmpfs.
//! * `exec`: the trampoline (`switchboard sandbox-exec`, or the small `switchboard-sandbox`
//!   binary), which makes the call's namespaces, forks their init, confines itself and runs the
//!   command.
//! * `fork`: the crate's one `unsafe` exception, `fork(2)` of the single-threaded trampoline.
//! * `spawner`: the trampoline started once per engine (`sandbox-exec --spawner`), which forks
//!   each call's trampoline on the engine's request — no program start per call but the
//!   command's shell; `spawned`: the engine's side of it ([`Running`], [`Spawned`]).
//! * `launch`: the engine's side of one call (the trampoline's command line, the private
//!   `TMPDIR`, the cgroups, the verdict on limits) — confined, or unconfined (`off`) with the
//!   trampoline only as the init of the call's namespaces.
//!
//! A [`Sandbox`] is built once per engine ([`Sandbox::prepare`]) and reaches every call through
//! its [`crate::SessionScope`] (`ctx.session.sandbox()`); a context made by hand, outside an
//! engine, carries none and its commands run unconfined.

mod caps;
mod cgroup;
mod contain;
mod exec;
mod fork;
mod landlock_rules;
mod launch;
mod mode;
mod mounts;
mod policy;
// The engine process's own hardening, and the process groups of calls: foundation modules
// (`src/process_guard.rs`, `src/process_tree.rs`) that the sandbox builds on, nested here for
// embedders.
mod probe;
#[path = "../process_guard.rs"]
pub mod process_guard;
#[path = "../process_tree.rs"]
pub mod process_tree;
mod slots;
mod spawned;
mod spawner;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

pub(crate) use contain::{Containment, Tree};
pub use exec::{exec_main, run_if_requested};
pub use launch::CallSandbox;
pub(crate) use mode::human_bytes;
#[cfg(feature = "cli")]
pub(crate) use mode::parse_bytes;
pub use mode::{SandboxConfig, SandboxError, SandboxLimits, SandboxMode};
pub use mounts::HIDDEN as HIDDEN_DIRS;
pub use policy::CallCommand;
pub use probe::{SandboxStatus, find_trampoline, this_binary_is_the_trampoline};
pub use spawned::{OutputPipe, Running, Spawned};

/// An engine's sandbox: its config and what the machine offers for it.
#[derive(Debug, Clone)]
pub struct Sandbox {
    config: SandboxConfig,
    status: SandboxStatus,
    /// The mode's shortfalls on this machine (empty for `off`).
    degraded: Vec<String>,
    /// The process that forks each call's trampoline, shared by every clone.
    spawner: std::sync::Arc<spawned::SpawnerSlot>,
    /// Confined calls' directories and cgroups kept for later calls, shared by every clone.
    slots: std::sync::Arc<slots::Slots>,
}

impl Sandbox {
    /// Checks that `config` can be enforced here. `Err` (one sentence naming what is missing)
    /// for `workspace-write` or `read-only` when it cannot; `best-effort` never fails and `off`
    /// probes nothing. Logs the mode in force (and a warning for `off` or missing parts).
    pub fn prepare(mut config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        config.read_paths = resolve_read_paths(&config.read_paths)?;
        if !config.mode.confines() {
            tracing::warn!(
                "sandbox: off — bash commands can read and write everything this user can, and \
                 reach the network"
            );
            // The trampoline still serves as the init of each call's PID namespace (cheaper
            // than `unshare` and an init shell), when there is one that answers.
            let trampoline = config
                .trampoline
                .clone()
                .or_else(find_trampoline)
                .filter(|t| probe::probe_landlock(t) >= 0);
            return Ok(Sandbox {
                config,
                status: SandboxStatus {
                    trampoline,
                    ..SandboxStatus::default()
                },
                degraded: Vec::new(),
                spawner: Default::default(),
                slots: Default::default(),
            });
        }
        let status = SandboxStatus::probe(&config);
        slots::remove_stale();
        let missing = status.missing(&config);
        let mut degraded = missing.degraded;
        if !missing.required.is_empty() {
            if config.mode != SandboxMode::BestEffort {
                return Err(SandboxError::Unenforceable {
                    mode: config.mode,
                    missing: missing.required,
                });
            }
            degraded.splice(0..0, missing.required);
        }
        let sandbox = Sandbox {
            config,
            status,
            degraded,
            spawner: Default::default(),
            slots: Default::default(),
        };
        tracing::info!(
            mode = %sandbox.config.mode,
            landlock_abi = sandbox.status.landlock_abi,
            network = if sandbox.config.allow_network { "allowed" } else { "none" },
            "sandbox in force"
        );
        if !sandbox.degraded.is_empty() {
            tracing::warn!(
                "sandbox {}: running without {}",
                sandbox.config.mode,
                sandbox.degraded.join("; ")
            );
        }
        Ok(sandbox)
    }

    /// No confinement, without the start-up warning (contexts made outside an engine).
    pub fn off() -> Sandbox {
        Sandbox {
            config: SandboxConfig::off(),
            status: SandboxStatus::default(),
            degraded: Vec::new(),
            spawner: Default::default(),
            slots: Default::default(),
        }
    }

    /// The pid of the spawner that forks this engine's calls, while one runs (it starts with
    /// the first call).
    pub async fn spawner_pid(&self) -> Option<u32> {
        self.spawner.pid().await
    }

    /// The mode in force.
    pub fn mode(&self) -> SandboxMode {
        self.config.mode
    }

    /// The config it was prepared from.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// What the machine offers.
    pub fn status(&self) -> &SandboxStatus {
        &self.status
    }

    /// What the mode lacks on this machine (`best-effort`), or degrades to (fallback limits).
    pub fn degraded(&self) -> &[String] {
        &self.degraded
    }

    /// True when commands are confined.
    pub fn confines(&self) -> bool {
        self.config.mode.confines() && self.status.trampoline.is_some()
    }

    /// Whether files of the workspace may be written (false in `read-only`).
    pub fn workspace_writable(&self) -> bool {
        self.config.mode.workspace_writable()
    }

    /// The sandbox as JSON (for `switchboard tools --json` and `/healthz`-style reports).
    pub fn describe(&self) -> Value {
        let cg = &self.status.cgroups;
        let limits = &self.config.limits;
        json!({
            "mode": self.config.mode.as_str(),
            "landlock_abi": self.status.landlock_abi,
            "network": if self.config.allow_network { "allowed" }
                       else if self.status.network_namespace { "none (network namespace)" }
                       else { "none (landlock tcp)" },
            "max_processes": limits.max_processes,
            "max_processes_by": if cg.pids.is_some() { "pids cgroup" } else { "RLIMIT_NPROC" },
            "max_memory_bytes": limits.max_memory,
            "max_memory_by": if cg.memory.is_some() { "memory cgroup" } else { "RLIMIT_AS" },
            "max_file_size_bytes": limits.max_file_size,
            "max_tmp_size_bytes": limits.max_tmp_size,
            "namespaces": self.status.namespaces,
            "trampoline": self.status.trampoline.as_ref().map(|p| p.display().to_string()),
            "read_paths": self.config.read_paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "missing": self.degraded,
        })
    }

    /// The same sandbox with network access allowed or not: the per-tool override for a custom
    /// process-running tool that needs (or must never have) the network whatever the engine's
    /// `--allow-network` says. Use it with [`Sandbox::begin_call`] and [`CallSandbox::command`].
    pub fn with_network(&self, allow: bool) -> Sandbox {
        let mut sandbox = self.clone();
        sandbox.config.allow_network = allow;
        sandbox
    }

    /// Sets up one confined call in `workspace` whose command may run for `budget`.
    pub fn begin_call(
        &self,
        workspace: &Path,
        budget: Duration,
    ) -> std::io::Result<Option<CallSandbox>> {
        if !self.confines() {
            return Ok(None);
        }
        CallSandbox::new(self, workspace, budget).map(Some)
    }

    /// Sets up one unconfined call (mode `off`) whose PID and mount namespaces have the
    /// trampoline as init ([`CallSandbox::command`] with `unshare` and its flags, as for a
    /// confined call). `None` in a confining mode (use [`Sandbox::begin_call`]) or when no
    /// trampoline was found; then `unshare` and an init shell do the same, one program start
    /// dearer.
    pub fn begin_unconfined_call(&self) -> std::io::Result<Option<CallSandbox>> {
        match &self.status.trampoline {
            Some(trampoline) if !self.config.mode.confines() => {
                CallSandbox::unconfined(trampoline.clone(), &self.spawner).map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// The read paths resolved (symlinks followed, as the trampoline opens them), duplicates dropped;
/// a relative, missing or unreadable one is refused.
fn resolve_read_paths(
    paths: &[std::path::PathBuf],
) -> Result<Vec<std::path::PathBuf>, SandboxError> {
    let mut resolved: Vec<std::path::PathBuf> = Vec::with_capacity(paths.len());
    for path in paths {
        let bad = |reason: String| SandboxError::BadReadPath {
            path: path.clone(),
            reason,
        };
        if !path.is_absolute() {
            return Err(bad("not an absolute path".into()));
        }
        let real = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
        if !resolved.contains(&real) {
            resolved.push(real);
        }
    }
    Ok(resolved)
}
