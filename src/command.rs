//! What every subcommand shares, so that none of them imports [`crate::cli`]: reporting to the
//! terminal ([`say`], [`fail`]) and the metrics flags of the long-running commands
//! ([`TelemetryArgs`]), the sandbox flags of every command that runs tools ([`SandboxArgs`]), and the [`Interrupt`] (SIGINT/SIGTERM, taken over before anything runs). `cli` parses the command line and calls the subcommands; the subcommands
//! (`run`/`chat`, `demo`, `load`, …) depend on this module, never on `cli`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::sandbox::parse_bytes;
use crate::sandbox::{SandboxConfig, SandboxLimits, SandboxMode};

mod interrupt;
pub use interrupt::{Early, INTERRUPTED, Interrupt};

/// The call journal flags of `dispatch`, `serve` and `run`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct JournalArgs {
    /// Record every call in a durable journal in DIR (created if missing): a turn sent again is
    /// answered from it, also after a restart, and a side-effect call interrupted by a crash is
    /// answered outcome_unknown instead of running twice.
    #[arg(long, value_name = "DIR")]
    pub journal: Option<PathBuf>,
    /// How long the journal keeps answers in full (default 24h, at least 1m): an older answer
    /// leaves a tombstone, so a late retry of its call is refused, never run.
    #[arg(long, value_name = "DURATION", value_parser = journal_retention,
          requires = "journal")]
    pub journal_retention: Option<std::time::Duration>,
}

/// A `--journal-retention` value: a duration of at least [`crate::journal::MIN_RETENTION`].
pub(crate) fn journal_retention(text: &str) -> Result<std::time::Duration, String> {
    let retention = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if retention < crate::journal::MIN_RETENTION {
        return Err(format!(
            "at least {} (a client's retry can come minutes after the first copy)",
            humantime::format_duration(crate::journal::MIN_RETENTION)
        ));
    }
    Ok(retention)
}

impl JournalArgs {
    /// The builder with the journal, if one was asked for.
    pub fn apply(&self, builder: crate::EngineBuilder) -> crate::EngineBuilder {
        match &self.journal {
            None => builder,
            Some(dir) => {
                let builder = builder.journal(dir);
                match self.journal_retention {
                    Some(r) => builder.journal_retention(r),
                    None => builder,
                }
            }
        }
    }
}

/// Metrics flags of the long-running commands.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TelemetryArgs {
    /// Serve Prometheus metrics on ADDR (`/metrics`, `/healthz`), e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Write the final Prometheus exposition to PATH when the command ends.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
}

/// Writes `text` to stdout as it is; a closed stdout (`… | head`) is ignored, never a panic.
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// Says `switchboard: <message>` on stderr (a closed stderr is ignored, never a panic).
pub fn say(message: &str) {
    let _ = writeln!(std::io::stderr(), "switchboard: {message}");
}

/// Why the engine of a command that takes `--sandbox` could not be built, in one line: a sandbox
/// mode this machine cannot enforce also names the flag that chooses another mode (the library's
/// own message names only the modes, as a library user has no flags).
pub fn engine_error(e: &crate::RegistryError) -> String {
    match e {
        crate::RegistryError::Sandbox(crate::sandbox::SandboxError::Unenforceable { .. }) => {
            format!("{e} (--sandbox best-effort, --sandbox off)")
        }
        _ => e.to_string(),
    }
}

/// Says why the command failed and gives its exit code.
pub fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    say(&message.to_string());
    ExitCode::from(code)
}

/// Removes the temp files killed writers left in `ws` (see
/// [`crate::workspace::Workspace::remove_stale_temp_files`]), saying so in the log.
pub fn remove_stale_temps(ws: &crate::workspace::Workspace) {
    let removed = ws.remove_stale_temp_files();
    if removed > 0 {
        tracing::info!(removed, "removed temp files left by writers that are gone");
    }
}

/// Sandbox flags of every command that runs tools (see `docs/sandbox.md`).
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// How bash commands are confined: workspace-write (the default), read-only, best-effort
    /// (whatever the kernel offers, saying what is missing), or off.
    #[arg(long = "sandbox", value_name = "MODE", default_value = "workspace-write",
          value_parser = |s: &str| s.parse::<SandboxMode>())]
    pub mode: SandboxMode,
    /// Let bash commands use the network (default: none, a loopback-only network namespace).
    #[arg(long)]
    pub allow_network: bool,
    /// Processes at once per bash call.
    #[arg(long, value_name = "N", default_value_t = SandboxLimits::default().max_processes)]
    pub max_processes: u64,
    /// Memory per bash call (e.g. 2G, 512M).
    #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = parse_bytes)]
    pub max_memory: u64,
    /// Largest file a bash command may write (e.g. 1G).
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_bytes)]
    pub max_file_size: u64,
    /// All the files of a bash call's private TMPDIR together (e.g. 512M, 2G); held in memory.
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = parse_bytes)]
    pub max_tmp_size: u64,
    /// Let bash commands read and execute PATH (never write it), even where the sandbox hides
    /// its directory (a toolchain under a home directory); repeatable.
    #[arg(long = "sandbox-read", value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// Let bash commands read and execute every directory on this process's PATH (the
    /// toolchains it would run), as `--sandbox-read` does.
    #[arg(long = "sandbox-read-path")]
    pub read_path_env: bool,
}

impl Default for SandboxArgs {
    fn default() -> Self {
        let limits = SandboxLimits::default();
        SandboxArgs {
            mode: SandboxMode::default(),
            allow_network: false,
            max_processes: limits.max_processes,
            max_memory: limits.max_memory,
            max_file_size: limits.max_file_size,
            max_tmp_size: limits.max_tmp_size,
            read: Vec::new(),
            read_path_env: false,
        }
    }
}

impl SandboxArgs {
    /// The engine's sandbox config.
    pub fn config(&self) -> SandboxConfig {
        let cwd = std::env::current_dir().unwrap_or_default();
        let mut read: Vec<PathBuf> = self.read.iter().map(|p| cwd.join(p)).collect();
        if self.read_path_env {
            read.extend(path_dirs(std::env::var_os("PATH")));
        }
        SandboxConfig::new(self.mode)
            .read_paths(read)
            .allow_network(self.allow_network)
            .limits(SandboxLimits {
                max_processes: self.max_processes,
                max_memory: self.max_memory,
                max_file_size: self.max_file_size,
                max_tmp_size: self.max_tmp_size,
            })
    }
}

/// The existing absolute directories of a `PATH` value (a relative or missing entry is skipped:
/// it names nothing a command could rely on).
pub fn path_dirs(path: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    path.map(|p| {
        std::env::split_paths(&p)
            .filter(|d| d.is_absolute() && d.is_dir())
            .collect()
    })
    .unwrap_or_default()
}

/// Policy flags of every command that runs tools (see `docs/permissions.md`).
#[derive(Debug, Clone, clap::Args)]
pub struct PolicyArgs {
    /// Permission rules and external hooks for every call: a JSON file in Claude Code's settings
    /// shape (`{"permissions": {"allow", "ask", "deny", "default"}, "hooks": {…}}`).
    #[arg(long = "policy", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Write one JSON line per call (decision, outcome, duration, SHA-256 of the arguments).
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Also write each call's arguments into the audit log.
    #[arg(long, requires = "audit_log")]
    pub audit_args: bool,
    /// How long a call that needs approval waits for one before it is denied.
    #[arg(long, value_name = "D", default_value = "60s", value_parser = humantime::parse_duration)]
    pub approval_timeout: std::time::Duration,
}

impl Default for PolicyArgs {
    fn default() -> Self {
        PolicyArgs {
            file: None,
            audit_log: None,
            audit_args: false,
            approval_timeout: crate::policy::DEFAULT_APPROVAL_TIMEOUT,
        }
    }
}

/// Why the policy flags cannot be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyFlagsError {
    /// The `--policy` file is refused (it names the file and the rule at fault).
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// SIGHUP, which reopens the audit log, cannot be caught.
    #[error("cannot catch SIGHUP for the audit log: {0}")]
    Sighup(#[source] std::io::Error),
    /// The `--audit-log` file cannot be opened.
    #[error("cannot open audit log {}: {source}", path.display())]
    AuditLog {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl PolicyArgs {
    /// The policy the flags ask for (`None`: no `--policy` and no `--audit-log`), with
    /// `approver` answering `ask`. The error names the file and the rule at fault.
    pub fn policy(
        &self,
        approver: std::sync::Arc<dyn crate::policy::Approver>,
    ) -> Result<Option<crate::policy::Policy>, PolicyFlagsError> {
        if self.file.is_none() && self.audit_log.is_none() {
            return Ok(None);
        }
        let mut policy = match &self.file {
            Some(path) => crate::policy::Policy::load(path)?,
            None => crate::policy::Policy::allow_all(),
        };
        policy = policy
            .approver(approver)
            .approval_timeout(self.approval_timeout);
        if let Some(path) = &self.audit_log {
            // SIGHUP reopens the log (after a rotation), as log tools expect, instead of ending
            // the process; caught before the file is opened, so none comes in between.
            let reopen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            signal_hook::flag::register(
                signal_hook::consts::SIGHUP,
                std::sync::Arc::clone(&reopen),
            )
            .map_err(PolicyFlagsError::Sighup)?;
            let log = crate::policy::AuditLog::open_reopening(path, self.audit_args, reopen)
                .map_err(|source| PolicyFlagsError::AuditLog {
                    path: path.clone(),
                    source,
                })?;
            policy = policy.audit(log);
        }
        Ok(Some(policy))
    }

    /// `builder` under the flags' policy (non-interactive: `ask` is denied, and says so).
    pub fn apply(
        &self,
        builder: crate::EngineBuilder,
    ) -> Result<crate::EngineBuilder, PolicyFlagsError> {
        self.apply_with(builder, std::sync::Arc::new(crate::policy::RefuseAll))
    }

    /// `builder` under the flags' policy, `approver` answering `ask`.
    pub fn apply_with(
        &self,
        builder: crate::EngineBuilder,
        approver: std::sync::Arc<dyn crate::policy::Approver>,
    ) -> Result<crate::EngineBuilder, PolicyFlagsError> {
        Ok(match self.policy(approver)? {
            Some(policy) => builder.policy(policy),
            None => builder,
        })
    }
}
