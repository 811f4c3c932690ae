//! `studies`: measurements of Switchboard's own parts that serve no user at run time, kept out of
//! the shipped binary.
//!
//! * `tool-search` — how well (top-1, top-5, MRR over the benchmark catalog of real tools and its
//!   queries, tuning and held-out sets) and how fast (p50/p99 per search over 10,000 tools, costly
//!   `regex:` patterns, and searches beside them) `tool_search` finds deferred tools
//!   ([`tool_search`]).
//! * `sandbox` — what a sandboxed `bash true` costs against a bare fork-exec of the same command,
//!   at 1 and 16 sessions ([`sandbox`]).
//!
//! Each prints one JSON document per line and exits 1 when the study fails (a search that errs,
//! a call that does not succeed), 2 on bad flags. The figures in `docs/` name the command that
//! produced them.

mod samples;
mod sandbox;
mod tool_search;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "studies",
    about = "Studies of Switchboard's own parts (not shipped)"
)]
struct Cli {
    #[command(subcommand)]
    study: Study,
}

#[derive(Subcommand)]
enum Study {
    /// `tool_search`: recall over the benchmark catalog and its queries, then latency over
    /// 10,000 tools; one JSON line per set and per query form.
    ToolSearch {
        /// The catalog of tool definitions (default: the repository's
        /// benches/tool_search/catalog.json).
        #[arg(long, value_name = "FILE")]
        catalog: Option<PathBuf>,
        /// The queries, one JSON object a line; `tasks.jsonl` beside them is read too when it
        /// exists (default: the repository's benches/tool_search/queries.jsonl).
        #[arg(long, value_name = "FILE")]
        queries: Option<PathBuf>,
        /// Time the latency phases may take at most, e.g. `10s`.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        max_time: Duration,
    },
    /// A sandboxed `bash true` (sandbox off, workspace-write, read-only) against a bare fork-exec
    /// of `bash -c true`, at 1 and 16 sessions; one JSON line per row.
    Sandbox {
        /// Calls per session in each row (instead of --duration).
        #[arg(long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        turns: Option<u64>,
        /// How long each row runs (default 2s).
        #[arg(long, value_parser = parse_duration)]
        duration: Option<Duration>,
        /// Hard stop of each row, either way.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        max_time: Duration,
        /// No progress lines on stderr.
        #[arg(long)]
        quiet: bool,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))?;
    if d.is_zero() || d > Duration::from_secs(3600) {
        return Err("must be more than zero and at most 1h".into());
    }
    Ok(d)
}

/// The repository's `benches/tool_search/`, wherever the study is run from.
fn tool_search_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tool_search")
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let lines = match cli.study {
        Study::ToolSearch {
            catalog,
            queries,
            max_time,
        } => {
            let catalog = catalog.unwrap_or_else(|| tool_search_dir().join("catalog.json"));
            let queries = queries.unwrap_or_else(|| tool_search_dir().join("queries.jsonl"));
            tool_search::run(&catalog, &queries, max_time).await
        }
        Study::Sandbox {
            turns,
            duration,
            max_time,
            quiet,
        } => {
            let bounds = sandbox::Bounds {
                calls: turns,
                duration: duration.unwrap_or(sandbox::DEFAULT_DURATION),
                max_time,
            };
            sandbox::run(bounds, !quiet).await
        }
    };
    match lines {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("studies: {e}");
            ExitCode::FAILURE
        }
    }
}
