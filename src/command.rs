//! What every subcommand shares, so that none of them imports [`crate::cli`]: reporting to the
//! terminal ([`say`], [`fail`]) and the metrics flags of the long-running commands
//! ([`TelemetryArgs`]), the sandbox flags of every command that runs tools ([`SandboxArgs`]), and the [`Interrupt`] (SIGINT/SIGTERM, taken over before anything runs). `cli` parses the command line and calls the subcommands; the subcommands
//! (`run`/`chat`, `demo`, `load`, …) depend on this module, never on `cli`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::sandbox::mode::parse_bytes;
use crate::sandbox::{SandboxConfig, SandboxLimits, SandboxMode};

mod interrupt;
pub use interrupt::{INTERRUPTED, Interrupt, TERMINATED};

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

/// Says why the command failed and gives its exit code.
pub fn fail(code: u8, message: &str) -> ExitCode {
    say(message);
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

/// Sandbox flags of every command that runs tools (see the README's "Sandbox" section).
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
        }
    }
}

impl SandboxArgs {
    /// The engine's sandbox config.
    pub fn config(&self) -> SandboxConfig {
        SandboxConfig::new(self.mode)
            .allow_network(self.allow_network)
            .limits(SandboxLimits {
                max_processes: self.max_processes,
                max_memory: self.max_memory,
                max_file_size: self.max_file_size,
            })
    }
}
