//! The flags of `switchboard load` ([`LoadArgs`]) and their small value types and parsers.

use std::path::PathBuf;
use std::time::Duration;

use super::workload::{self, ToolKind};
use crate::command::TelemetryArgs;

/// `--baseline`: what the engine is compared with in the same run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// The direct in-process loop: validate + call + encode, no actors.
    Direct,
}

/// `--workload-set`: a fixed set of workloads run in sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadSet {
    /// The six workloads of `peers.md` and the two write workloads, one JSON line each.
    Peers,
    /// The sidecar's cost: the in-process engine versus the same turns over HTTP to a server
    /// started in this process, for one-call turns and 64 sessions × 8 no-op calls.
    Serve,
}

/// Flags of `switchboard load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Concurrent sessions, each with its own task.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub sessions: u32,
    /// Turns per session (instead of --duration).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000), conflicts_with = "duration")]
    pub turns: Option<u64>,
    /// Run for this long, e.g. `10s` (default 5s when --turns is not given). With --idle: hold
    /// the sessions this long, sampling RSS.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Calls in each turn.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub calls_per_turn: u32,
    /// Which tools the calls go to.
    #[arg(long, value_enum, default_value_t = ToolKind::Noop)]
    pub tool: ToolKind,
    /// How long each `sleep` call sleeps, in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub sleep_ms: u64,
    /// Hash rounds of each `cpu` call (its `n`).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=workload::CPU_WORK_MAX))]
    pub cpu_work: u64,
    /// Share of calls sent to the tool's serial (not concurrency-safe) variant, 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    pub serial_ratio: f64,
    /// Share of calls that fail before running, 0 to 1: half unknown tools, half invalid arguments.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    pub error_rate: f64,
    /// Engine worker actors (default: the engine's own, one per CPU and at least 2).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: Option<u32>,
    /// Run the same workload through this baseline too, in the same run, and report the ratio.
    #[arg(long, value_enum)]
    pub baseline: Option<Baseline>,
    /// Run a fixed set of workloads instead (one JSON line each, with its direct ratio).
    #[arg(long, value_enum, conflicts_with_all = ["idle", "baseline"], group = "rounds_mode")]
    pub workload_set: Option<WorkloadSet>,
    /// Run the workload on an engine recording metrics (the exporter's recorder) and on one
    /// recording nothing, alternating --rounds times in this process, and report the cost
    /// (`metrics_cost` = 1 − on ÷ off calls/s, each side's best round).
    #[arg(long, group = "rounds_mode",
          conflicts_with_all = ["idle", "baseline", "target", "faults", "mcp_call"])]
    pub compare_metrics: bool,
    /// Run the engine with a durable call journal in a fresh subdirectory of DIR (created if
    /// missing), one per engine phase and removed after it: an intent before each call and its
    /// answer after, each durable before the call starts and before the turn is answered.
    #[arg(long, value_name = "DIR",
          conflicts_with_all = ["idle", "workload_set", "target", "mcp_call"])]
    pub journal: Option<PathBuf>,
    /// Run the workload on an engine with the journal (--journal DIR) and on one without,
    /// alternating --rounds times in this process, each side also timing sequential one-call
    /// turns of one session, and report the cost (`journal_cost` = 1 − on ÷ off calls/s, each
    /// side's best round), flushes per second and calls per flush.
    #[arg(long, group = "rounds_mode", requires = "journal",
          conflicts_with_all = ["idle", "baseline", "target", "faults", "mcp_call"])]
    pub compare_journal: bool,
    /// Hold --sessions idle sessions and report the memory of each (answer memory empty) and of
    /// one kept answer.
    #[arg(long, conflicts_with_all = ["turns", "baseline"])]
    pub idle: bool,
    /// Run the engine under this permission policy (rules and hooks; ask is deny); with
    /// `--baseline direct` the ratio shows what the policy adds (the direct loop has none).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["workload_set", "target", "idle"])]
    pub policy: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON document and a latency picture (`load.json`, `latency.svg`) into DIR.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long, short)]
    pub quiet: bool,
    /// Unmeasured warm-up before each measured phase, e.g. `500ms` (peers: a tenth of the
    /// duration, at most 200ms).
    #[arg(long, value_parser = parse_warmup)]
    pub warmup: Option<Duration>,
    /// Hard cap on each phase, whatever --turns says.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub max_time: Duration,
    /// With --workload-set: alternate the engine and direct phases this many times per workload
    /// and report each side's best round (with --compare-metrics or --compare-journal: the on and
    /// off phases).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100), requires = "rounds_mode")]
    pub rounds: u32,
    /// Seed of the call mix (errors, serial share, mixed tools).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Inject faults at these rates, e.g. `panic=0.01,hang=0.01,cancel=0.01`: a share of calls
    /// go to a tool that panics or one that hangs until its 200 ms timeout, a share of turns are
    /// cancelled 0–2 ms after they start. The run then checks that every call was still answered
    /// exactly once, in order (and, with --duration, that RSS stayed flat). Engine only.
    #[arg(long, value_parser = workload::parse_faults, conflicts_with_all = ["baseline", "workload_set", "idle"])]
    pub faults: Option<workload::Faults>,
    /// Drive a running `switchboard serve` at http://HOST:PORT instead of an in-process engine
    /// (started with --with-load-tools for the noop, sleep and cpu tools; its sleep is 10 ms).
    #[arg(long, value_name = "URL", conflicts_with_all = ["baseline", "workload_set", "idle", "faults"])]
    pub target: Option<String>,
    /// File whose first line is the server's bearer token (otherwise SWITCHBOARD_TOKEN, or none).
    #[arg(long, value_name = "FILE", requires = "target")]
    pub token_file: Option<PathBuf>,
    /// MCP servers (with --mcp-call).
    #[command(flatten)]
    pub mcp: crate::mcp::command::McpArgs,
    /// Drive this MCP tool (its registry name, `mcp__server__tool`) instead of the workload
    /// tools: every call of every turn goes to it; `--baseline direct` then makes the same calls
    /// with a direct rmcp client.
    #[arg(long, value_name = "NAME", requires = "mcp_config",
          conflicts_with_all = ["workload_set", "idle", "faults"])]
    pub mcp_call: Option<String>,
    /// The arguments of every --mcp-call call (a JSON object; default `{}`).
    #[arg(long, value_name = "JSON", requires = "mcp_call")]
    pub mcp_args: Option<String>,
    /// Metrics.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0 and 1"))
    }
}

fn parse_warmup(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))?;
    if d > Duration::from_secs(3600) {
        return Err("at most 1h".into());
    }
    Ok(d)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = parse_warmup(s)?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}
