//! What every subcommand shares, so that none of them imports [`crate::cli`]: reporting to the
//! terminal ([`say`], [`fail`]) and the metrics flags of the long-running commands
//! ([`TelemetryArgs`]), and the [`Interrupt`] (SIGINT/SIGTERM, taken over before anything runs). `cli` parses the command line and calls the subcommands; the subcommands
//! (`run`/`chat`, `demo`, `load`, …) depend on this module, never on `cli`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

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
