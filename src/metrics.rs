//! Every metric Switchboard exports: names, kinds, units, help text, buckets, and cached handles.
//!
//! This is the only module that calls the `metrics` macros. Conventions (Prometheus): counters end
//! in `_total`, durations are `_seconds` histograms with explicit buckets from 50 µs to 120 s,
//! levels are gauges. Labels are bounded: `tool` is a registered tool name, with every unknown name
//! folded into [`UNKNOWN_TOOL`]; `outcome` is `ok` or an error code; `mode` is `concurrent` or
//! `serial`; `provider` and `status` come from the provider layer. Never a call id or session id.
//!
//! Handles are cached (per tool at registration, per engine at build) so the hot path does no
//! label hashing or registry lookup: a recorder must be installed *before* the engine is built,
//! or the engine records into the no-op recorder.
//!
//! Histograms are pre-aggregated here (`histograms`): the exporter's recorder is a
//! [`PreAggregated`] wrapper that keeps every histogram in fixed, per-thread-sharded bucket
//! counters ([`buckets`] gives each name's bounds) and hands counters and gauges to the
//! Prometheus recorder. Counters and gauges stay there because they already cost one atomic add
//! on a cached handle and need no upkeep; only its histograms buffered raw samples (and replacing
//! every counter by a no-op made no difference beyond the noise in `load --compare-metrics`).

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Unit, counter, gauge, histogram};

use crate::protocol::{ErrorCode, ToolDispatchResult};

// The Prometheus recorder, `/metrics` and logging set-up. Its file is `src/exporter.rs`, in the
// front-end support layer; nested here for embedders.
#[path = "exporter.rs"]
pub mod exporter;
pub(crate) mod histograms;
pub use histograms::{HistogramSnapshot, Histograms, PreAggregated, ShardedHistogram};

/// The `tool` label value that every unknown tool name is folded into.
pub const UNKNOWN_TOOL: &str = "_unknown";

/// Calls answered, by tool and outcome.
pub const TOOL_CALLS_TOTAL: &str = "switchboard_tool_calls_total";
/// Handler run time, by tool.
pub const TOOL_CALL_DURATION_SECONDS: &str = "switchboard_tool_call_duration_seconds";
/// From scheduled (turn arrived) to handler started, by tool.
pub const TOOL_CALL_QUEUE_SECONDS: &str = "switchboard_tool_call_queue_seconds";
/// A turn in to its ordered results out.
pub const TURN_DISPATCH_SECONDS: &str = "switchboard_turn_dispatch_seconds";
/// Calls per turn.
pub const TURN_CALLS: &str = "switchboard_turn_calls";
/// Stages run, by mode.
pub const STAGES_TOTAL: &str = "switchboard_stages_total";
/// Calls per stage, by mode.
pub const STAGE_CALLS: &str = "switchboard_stage_calls";
/// From a call's turn arriving to the last earlier conflicting call finishing, by tool (calls
/// that waited for at least one conflicting call only).
pub const CALL_CONFLICT_WAIT_SECONDS: &str = "switchboard_call_conflict_wait_seconds";
/// Async and blocking calls running now.
pub const CALLS_IN_FLIGHT: &str = "switchboard_calls_in_flight";
/// Sessions open now.
pub const SESSIONS_ACTIVE: &str = "switchboard_sessions_active";
/// Tools registered now.
pub const REGISTRY_TOOLS: &str = "switchboard_registry_tools";
/// Worker actors replaced after dying.
pub const WORKER_RESTARTS_TOTAL: &str = "switchboard_worker_restarts_total";
/// Model requests, by provider and status.
pub const MODEL_REQUESTS_TOTAL: &str = "switchboard_model_requests_total";
/// Model request latency, by provider.
pub const MODEL_REQUEST_SECONDS: &str = "switchboard_model_request_seconds";
/// 1 while an MCP server is connected, 0 otherwise, by server.
pub const MCP_SERVER_UP: &str = "switchboard_mcp_server_up";
/// MCP server restarts after it exited or its connection broke, by server.
pub const MCP_SERVER_RESTARTS_TOTAL: &str = "switchboard_mcp_server_restarts_total";
/// `tools/call` round trips to MCP servers, by server.
pub const MCP_REQUEST_SECONDS: &str = "switchboard_mcp_request_seconds";
/// Always 1; the `version` label carries the crate version.
pub const BUILD_INFO: &str = "switchboard_build_info";
/// HTTP requests answered by `serve` and by the `--metrics-addr` endpoint, by route template
/// and status.
pub const HTTP_REQUESTS_TOTAL: &str = "switchboard_http_requests_total";
/// HTTP request latency of `serve` and the metrics endpoint (to the response head), by route
/// template.
pub const HTTP_REQUEST_SECONDS: &str = "switchboard_http_request_seconds";
/// Always 1; `mode` is the sandbox mode of bash commands, `landlock_abi` the kernel's Landlock ABI.
pub const SANDBOX_INFO: &str = "switchboard_sandbox_info";
/// Policy decisions, by tool and decision (`allow`, `deny`, `approved`, `refused`).
pub const PERMISSION_DECISIONS_TOTAL: &str = "switchboard_permission_decisions_total";
/// Audit lines lost, by reason ([`AuditLoss`]): dropped because the audit log's buffer was full,
/// or not written because a write failed (a full disk).
pub const AUDIT_DROPPED_TOTAL: &str = "switchboard_audit_dropped_total";
/// `tool_search` calls, by query form.
pub const TOOL_SEARCH_TOTAL: &str = "switchboard_tool_search_total";
/// Calls of a tool that `tool_search` returned earlier in the same session (its first call
/// after each search that returned it).
pub const TOOL_SEARCH_HITS_TOTAL: &str = "switchboard_tool_search_hits_total";
/// Calls of a deferred tool the session had never been shown (called by its exact name).
pub const DEFERRED_CALLS_UNREVEALED_TOTAL: &str = "switchboard_deferred_calls_unrevealed_total";
/// Bytes of tool definitions a catalog left out of the model's context by deferring them.
pub const CATALOG_BYTES_AVOIDED: &str = "switchboard_catalog_bytes_avoided";
/// Durable flushes of the call journal (each one group commit).
pub const JOURNAL_FLUSHES_TOTAL: &str = "switchboard_journal_flushes_total";
/// Records (intents, results, session records) made durable by one journal flush.
pub const JOURNAL_RECORDS_PER_FLUSH: &str = "switchboard_journal_records_per_flush";
/// How long one journal flush took (write and fsync).
pub const JOURNAL_FLUSH_SECONDS: &str = "switchboard_journal_flush_seconds";
/// How long one journal checkpoint took (the log's records into the journal file).
pub const JOURNAL_CHECKPOINT_SECONDS: &str = "switchboard_journal_checkpoint_seconds";
/// Cluster mode: bytes of answered calls' records the node's journal keeps in memory (bounded
/// per session and by `--cluster-journal-memory`).
pub const CLUSTER_JOURNAL_MEMORY_BYTES: &str = "switchboard_cluster_journal_memory_bytes";
/// Cluster mode: reads of a session's records from the stream for calls the node let go of from
/// memory.
pub const CLUSTER_JOURNAL_STREAM_READS_TOTAL: &str =
    "switchboard_cluster_journal_stream_reads_total";
/// 1 while the call journal can record calls, 0 while it is failing (a full disk, its file
/// removed).
pub const JOURNAL_HEALTHY: &str = "switchboard_journal_healthy";
/// Calls answered from a session's stored answers (a re-sent `tool_use_id`), without running.
pub const DEDUP_HITS_TOTAL: &str = "switchboard_dedup_hits_total";
/// Calls answered `outcome_unknown`: retried after a crash that interrupted their run.
pub const OUTCOME_UNKNOWN_TOTAL: &str = "switchboard_outcome_unknown_total";
/// Progress events of running calls sent to a listener (a streamed turn).
pub const PROGRESS_EVENTS_TOTAL: &str = "switchboard_progress_events_total";
/// Bytes of output text those progress events carried.
pub const PROGRESS_BYTES_TOTAL: &str = "switchboard_progress_bytes_total";
/// Bytes of output a call's progress left out (its caps, a reader that does not keep up, or
/// what was still pending when the call ended).
pub const PROGRESS_DROPPED_BYTES_TOTAL: &str = "switchboard_progress_dropped_bytes_total";
/// Cluster mode: sessions this node owns (holds the lease of).
pub const CLUSTER_LEASES_HELD: &str = "switchboard_cluster_leases_held";
/// Cluster mode: requests this node relayed to a session's owner, by outcome.
pub const CLUSTER_FORWARDS_TOTAL: &str = "switchboard_cluster_forwards_total";
/// Cluster mode: sessions this node took over from a node that died or stopped.
pub const CLUSTER_FAILOVERS_TOTAL: &str = "switchboard_cluster_failovers_total";
/// Cluster mode: journal writes of this node refused because another node owns the session.
pub const CLUSTER_FENCING_REFUSALS_TOTAL: &str = "switchboard_cluster_fencing_refusals_total";
/// Cluster mode: sessions this node let go of because its own heartbeat was not renewed for half
/// the lease TTL (their running commands stopped).
pub const CLUSTER_SELF_FENCED_TOTAL: &str = "switchboard_cluster_self_fenced_total";

/// What kind of metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic counter.
    Counter,
    /// Level.
    Gauge,
    /// Histogram with [`DURATION_BUCKETS`] or [`COUNT_BUCKETS`].
    Histogram,
}

/// The declaration of one metric.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// Full Prometheus name.
    pub name: &'static str,
    /// Kind.
    pub kind: Kind,
    /// Unit.
    pub unit: Unit,
    /// Labels it carries.
    pub labels: &'static [&'static str],
    /// HELP text.
    pub help: &'static str,
}

/// Every metric, declared once.
pub const METRICS: &[MetricDef] = &[
    MetricDef {
        name: TOOL_CALLS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["tool", "outcome"],
        help: "Tool calls answered, by tool (unknown names folded into _unknown) and outcome (ok or an error code).",
    },
    MetricDef {
        name: TOOL_CALL_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &["tool"],
        help: "Handler run time of tool calls that ran.",
    },
    MetricDef {
        name: TOOL_CALL_QUEUE_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &["tool"],
        help: "Time from a call's turn reaching the scheduler to its handler starting.",
    },
    MetricDef {
        name: TURN_DISPATCH_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &[],
        help: "Time from a turn reaching the scheduler to its ordered results being ready.",
    },
    MetricDef {
        name: TURN_CALLS,
        kind: Kind::Histogram,
        unit: Unit::Count,
        labels: &[],
        help: "Tool calls per dispatched turn.",
    },
    MetricDef {
        name: STAGES_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["mode"],
        help: "Stages of the dispatched turns' plans, by mode: the calls at one depth of a turn's dependency graph, which never conflict with each other (serial: one exclusive call).",
    },
    MetricDef {
        name: STAGE_CALLS,
        kind: Kind::Histogram,
        unit: Unit::Count,
        labels: &["mode"],
        help: "Calls per stage of a turn's plan, by mode.",
    },
    MetricDef {
        name: CALL_CONFLICT_WAIT_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &["tool"],
        help: "How long calls waited for earlier conflicting calls of their turn (from the turn arriving to the last of them finishing), by tool. Only calls that had to wait are recorded.",
    },
    MetricDef {
        name: CALLS_IN_FLIGHT,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &[],
        help: "Async and blocking tool calls running now (inline calls finish in microseconds and are not counted).",
    },
    MetricDef {
        name: SESSIONS_ACTIVE,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &[],
        help: "Engine sessions open now.",
    },
    MetricDef {
        name: REGISTRY_TOOLS,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &[],
        help: "Tools registered now.",
    },
    MetricDef {
        name: WORKER_RESTARTS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Worker actors replaced after dying.",
    },
    MetricDef {
        name: MODEL_REQUESTS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["provider", "status"],
        help: "Model requests made by agent loops, by provider and status (ok, an HTTP status, or error).",
    },
    MetricDef {
        name: MODEL_REQUEST_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &["provider"],
        help: "Model request latency, by provider.",
    },
    MetricDef {
        name: MCP_SERVER_UP,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &["server"],
        help: "1 while the MCP server is connected and its tools are registered, 0 otherwise.",
    },
    MetricDef {
        name: MCP_SERVER_RESTARTS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["server"],
        help: "MCP server restarts after the server exited or its connection broke.",
    },
    MetricDef {
        name: MCP_REQUEST_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &["server"],
        help: "tools/call round trips to the MCP server (answered, failed or abandoned).",
    },
    MetricDef {
        name: BUILD_INFO,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &["version"],
        help: "Always 1; the version label carries the Switchboard version.",
    },
    MetricDef {
        name: HTTP_REQUESTS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["route", "status"],
        help: "HTTP requests answered by serve and by the --metrics-addr endpoint, by route template (never a session id; unmatched paths are _unmatched) and status code.",
    },
    MetricDef {
        name: HTTP_REQUEST_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &["route"],
        help: "Time from an HTTP request arriving (at serve or the --metrics-addr endpoint) to its response head (a stream's events come later), by route template.",
    },
    MetricDef {
        name: SANDBOX_INFO,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &["mode", "landlock_abi"],
        help: "Always 1; mode is the sandbox mode of process-running tools (workspace-write, read-only, best-effort, off), landlock_abi the kernel's Landlock ABI (0: none).",
    },
    MetricDef {
        name: PERMISSION_DECISIONS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["tool", "decision"],
        help: "Calls decided by the policy layer, by tool and decision (allow, deny, approved, refused).",
    },
    MetricDef {
        name: AUDIT_DROPPED_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["reason"],
        help: "Audit log lines lost, by reason: buffer_full (the writer could not keep up) or write_failed (a write failed, e.g. a full disk, or a deleted log could not be created again); the calls themselves were answered.",
    },
    MetricDef {
        name: TOOL_SEARCH_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["form"],
        help: "tool_search calls, by query form (keywords, select, regex).",
    },
    MetricDef {
        name: TOOL_SEARCH_HITS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Calls of a tool that tool_search returned earlier in the same session (the first call after each search that returned it).",
    },
    MetricDef {
        name: DEFERRED_CALLS_UNREVEALED_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Calls of a deferred tool that the session had never been shown (called by its exact name, unsearched); they are validated and run like any other.",
    },
    MetricDef {
        name: CATALOG_BYTES_AVOIDED,
        kind: Kind::Histogram,
        unit: Unit::Bytes,
        labels: &[],
        help: "Per catalog served while tools are deferred: bytes of tool definitions (as JSON) kept out of the model's context.",
    },
    MetricDef {
        name: JOURNAL_FLUSHES_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Durable flushes of the call journal; each covers every intent, result and session record waiting at that moment.",
    },
    MetricDef {
        name: JOURNAL_RECORDS_PER_FLUSH,
        kind: Kind::Histogram,
        unit: Unit::Count,
        labels: &[],
        help: "Records (intents, results, session records) made durable by one journal flush.",
    },
    MetricDef {
        name: JOURNAL_HEALTHY,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &[],
        help: "1 while the call journal can record calls; 0 while it is failing (a full disk, its file removed or replaced): side-effect calls are refused until it recovers.",
    },
    MetricDef {
        name: JOURNAL_FLUSH_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &[],
        help: "Duration of one journal flush (write and fsync).",
    },
    MetricDef {
        name: JOURNAL_CHECKPOINT_SECONDS,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: &[],
        help: "Duration of one journal checkpoint: the write-ahead log's records put into the journal file (one two-phase commit), off the calls' path.",
    },
    MetricDef {
        name: CLUSTER_JOURNAL_MEMORY_BYTES,
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        labels: &[],
        help: "Cluster mode: bytes of answered calls' records this node's journal keeps in memory (at most 1,024 answers and 8 MiB per session, and --cluster-journal-memory over all).",
    },
    MetricDef {
        name: CLUSTER_JOURNAL_STREAM_READS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Cluster mode: reads of a session's records from the stream for a retried call whose record this node had let go from memory.",
    },
    MetricDef {
        name: CLUSTER_LEASES_HELD,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: &["node"],
        help: "Cluster mode: sessions this node owns (their lease names it).",
    },
    MetricDef {
        name: CLUSTER_FORWARDS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["node", "outcome"],
        help: "Cluster mode: requests this node relayed over NATS to the node owning their session (outcome: ok when the owner answered, unreachable when it did not, cut when its answer broke off after it began).",
    },
    MetricDef {
        name: CLUSTER_FAILOVERS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["node"],
        help: "Cluster mode: sessions this node took over after their owner's lease expired.",
    },
    MetricDef {
        name: CLUSTER_FENCING_REFUSALS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["node"],
        help: "Cluster mode: sessions whose journal write from this node was refused because another node took them over (by the stream, or by this node once it saw the new owner); nothing more is written or answered for them here.",
    },
    MetricDef {
        name: CLUSTER_SELF_FENCED_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &["node"],
        help: "Cluster mode: sessions this node let go of because its own heartbeat had not been renewed for half the lease TTL (cut off from NATS, or stalled): their running commands were stopped, and nothing more runs for them here until the node takes them back.",
    },
    MetricDef {
        name: DEDUP_HITS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Calls answered from the session's stored answers (a re-sent tool_use_id), without running anything.",
    },
    MetricDef {
        name: OUTCOME_UNKNOWN_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Side-effect calls answered outcome_unknown: the engine stopped (or its journal could not record the answer) while their first run was in progress.",
    },
    MetricDef {
        name: PROGRESS_EVENTS_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: &[],
        help: "Progress events of running calls (a command's output, a progress value) sent to a listener of a streamed turn.",
    },
    MetricDef {
        name: PROGRESS_BYTES_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Bytes,
        labels: &[],
        help: "Bytes of output text carried by progress events.",
    },
    MetricDef {
        name: PROGRESS_DROPPED_BYTES_TOTAL,
        kind: Kind::Counter,
        unit: Unit::Bytes,
        labels: &[],
        help: "Bytes of a running call's output its progress left out: over the per-call or per-turn cap of unsent output (a reader that does not keep up), or still unsent when the call ended.",
    },
];

/// Buckets of every `_seconds` histogram: 50 µs to 120 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Buckets of the calls-per-turn and calls-per-stage histograms.
pub const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0, 128.0];

/// Buckets of the byte-size histograms: 1 KiB to 16 MiB.
pub const BYTES_BUCKETS: &[f64] = &[
    0.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
];

/// The bucket bounds of histogram `name`: [`COUNT_BUCKETS`] for the declared count histograms
/// (calls per turn, per stage), [`BYTES_BUCKETS`] for byte sizes, [`DURATION_BUCKETS`] for every
/// other (`_seconds`) one.
pub fn buckets(name: &str) -> &'static [f64] {
    match METRICS.iter().find(|m| m.name == name) {
        Some(m) if m.kind == Kind::Histogram && m.unit == Unit::Count => COUNT_BUCKETS,
        Some(m) if m.kind == Kind::Histogram && m.unit == Unit::Bytes => BYTES_BUCKETS,
        _ => DURATION_BUCKETS,
    }
}

/// Registers HELP text and units with the installed recorder. Call right after installing it.
pub fn describe_all() {
    for m in METRICS {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.unit, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.unit, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.unit, m.help),
        }
    }
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// Cached handles of one tool label.
#[derive(Debug, Clone)]
pub struct ToolMetrics {
    ok: Counter,
    errors: [Counter; ErrorCode::ALL.len()],
    duration: Histogram,
    queue: Histogram,
    conflict_wait: Histogram,
}

impl ToolMetrics {
    /// Handles for `tool` (a registered name, or [`UNKNOWN_TOOL`]).
    pub fn new(tool: &str) -> Self {
        let tool = tool.to_string();
        let outcome =
            |o: &'static str| counter!(TOOL_CALLS_TOTAL, "tool" => tool.clone(), "outcome" => o);
        ToolMetrics {
            ok: outcome("ok"),
            errors: ErrorCode::ALL.map(|c| outcome(c.as_str())),
            duration: histogram!(TOOL_CALL_DURATION_SECONDS, "tool" => tool.clone()),
            queue: histogram!(TOOL_CALL_QUEUE_SECONDS, "tool" => tool.clone()),
            conflict_wait: histogram!(CALL_CONFLICT_WAIT_SECONDS, "tool" => tool),
        }
    }

    /// Records one answered call. Run and queue time are recorded only for calls that ran.
    #[inline]
    pub fn record(&self, result: &ToolDispatchResult) {
        match result.error {
            None => self.ok.increment(1),
            Some(code) => self.errors[code as usize].increment(1),
        }
        if result.timing.ran {
            self.duration.record(result.timing.run);
            self.queue.record(result.timing.queued);
        }
    }
}

impl ToolMetrics {
    /// A call of this tool waited `waited` (since its turn arrived) for earlier conflicting calls.
    #[inline]
    pub fn conflict_waited(&self, waited: Duration) {
        self.conflict_wait.record(waited);
    }
}

/// Cached handles of one engine.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    /// Handles of the `_unknown` tool label.
    pub unknown: ToolMetrics,
    turn_dispatch: Histogram,
    turn_calls: Histogram,
    stages_concurrent: Counter,
    stages_serial: Counter,
    stage_calls_concurrent: Histogram,
    stage_calls_serial: Histogram,
    in_flight: Gauge,
    sessions: Gauge,
    registry_tools: Gauge,
    worker_restarts: Counter,
    tool_search: [Counter; 3],
    tool_search_hits: Counter,
    deferred_unrevealed: Counter,
    catalog_bytes_avoided: Histogram,
    dedup_hits: Counter,
    outcome_unknown: Counter,
    /// Handles of the progress metrics.
    pub progress: ProgressMetrics,
}

/// Handles of the progress metrics ([`crate::tool::Progress`]).
#[derive(Debug, Clone)]
pub struct ProgressMetrics {
    events: Counter,
    bytes: Counter,
    dropped: Counter,
}

impl ProgressMetrics {
    /// Handles from the recorder installed now.
    pub fn new() -> Self {
        ProgressMetrics {
            events: zeroed(counter!(PROGRESS_EVENTS_TOTAL)),
            bytes: zeroed(counter!(PROGRESS_BYTES_TOTAL)),
            dropped: zeroed(counter!(PROGRESS_DROPPED_BYTES_TOTAL)),
        }
    }

    /// One event sent, carrying `bytes` of output text.
    pub fn sent(&self, bytes: usize) {
        self.events.increment(1);
        self.bytes.increment(bytes as u64);
    }

    /// `bytes` of output left out.
    pub fn dropped(&self, bytes: usize) {
        self.dropped.increment(bytes as u64);
    }
}

impl Default for ProgressMetrics {
    fn default() -> Self {
        ProgressMetrics::new()
    }
}

/// Handles of the journal's metrics.
#[derive(Debug, Clone)]
pub struct JournalMetrics {
    healthy: Gauge,
    flushes: Counter,
    records: Histogram,
    seconds: Histogram,
    checkpoint_seconds: Histogram,
}

impl JournalMetrics {
    /// Handles from the recorder installed now.
    pub fn new() -> Self {
        let healthy = gauge!(JOURNAL_HEALTHY);
        healthy.set(1.0);
        JournalMetrics {
            healthy,
            flushes: zeroed(counter!(JOURNAL_FLUSHES_TOTAL)),
            records: histogram!(JOURNAL_RECORDS_PER_FLUSH),
            seconds: histogram!(JOURNAL_FLUSH_SECONDS),
            checkpoint_seconds: histogram!(JOURNAL_CHECKPOINT_SECONDS),
        }
    }

    /// One checkpoint took `elapsed`.
    pub fn checkpoint(&self, elapsed: Duration) {
        self.checkpoint_seconds.record(elapsed);
    }

    /// Whether the journal can record calls now.
    pub fn healthy(&self, healthy: bool) {
        self.healthy.set(if healthy { 1.0 } else { 0.0 });
    }

    /// One flush of `records` records took `elapsed`.
    pub fn flush(&self, records: usize, elapsed: Duration) {
        self.flushes.increment(1);
        self.records.record(records as f64);
        self.seconds.record(elapsed);
    }
}

/// Handles of the cluster journal's memory metrics.
#[derive(Debug, Clone)]
pub struct ReplicatedMetrics {
    memory: Gauge,
    stream_reads: Counter,
}

impl ReplicatedMetrics {
    /// Handles from the recorder installed now.
    pub fn new() -> Self {
        ReplicatedMetrics {
            memory: gauge!(CLUSTER_JOURNAL_MEMORY_BYTES),
            stream_reads: zeroed(counter!(CLUSTER_JOURNAL_STREAM_READS_TOTAL)),
        }
    }

    /// The journal keeps `bytes` of answered records in memory now.
    pub fn memory(&self, bytes: usize) {
        self.memory.set(bytes as f64);
    }

    /// A session's records were read from the stream for calls let go of from memory.
    pub fn stream_read(&self) {
        self.stream_reads.increment(1);
    }
}

impl Default for ReplicatedMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Handles of the cluster metrics of one node.
#[derive(Debug, Clone)]
pub struct ClusterMetrics {
    leases: Gauge,
    forwards_ok: Counter,
    forwards_unreachable: Counter,
    forwards_cut: Counter,
    failovers: Counter,
    fenced: Counter,
    self_fenced: Counter,
}

/// How a forwarded request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardOutcome {
    /// The owner answered (its answer began to arrive; see `Cut`).
    Ok,
    /// The owner did not answer (no node listening, or silent too long before its answer).
    Unreachable,
    /// The owner's answer stopped part way.
    Cut,
}

impl ClusterMetrics {
    /// Handles for node `node` from the recorder installed now.
    pub fn new(node: &str) -> Self {
        let node = node.to_string();
        let leases = gauge!(CLUSTER_LEASES_HELD, "node" => node.clone());
        leases.set(0.0);
        let forward = |outcome: &'static str| {
            zeroed(counter!(CLUSTER_FORWARDS_TOTAL, "node" => node.clone(), "outcome" => outcome))
        };
        ClusterMetrics {
            forwards_ok: forward("ok"),
            forwards_unreachable: forward("unreachable"),
            forwards_cut: forward("cut"),
            failovers: zeroed(counter!(CLUSTER_FAILOVERS_TOTAL, "node" => node.clone())),
            fenced: zeroed(counter!(CLUSTER_FENCING_REFUSALS_TOTAL, "node" => node.clone())),
            self_fenced: zeroed(counter!(CLUSTER_SELF_FENCED_TOTAL, "node" => node)),
            leases,
        }
    }

    /// This node now owns `n` sessions.
    pub fn leases(&self, n: usize) {
        self.leases.set(n as f64);
    }

    /// A request was relayed to its session's owner.
    pub fn forward(&self, outcome: ForwardOutcome) {
        match outcome {
            ForwardOutcome::Ok => &self.forwards_ok,
            ForwardOutcome::Unreachable => &self.forwards_unreachable,
            ForwardOutcome::Cut => &self.forwards_cut,
        }
        .increment(1);
    }

    /// A session was taken over from a dead node.
    pub fn failover(&self) {
        self.failovers.increment(1);
    }

    /// A journal write was refused: another node owns the session.
    pub fn fenced(&self) {
        self.fenced.increment(1);
    }

    /// This node let go of `n` sessions: its heartbeat was not renewed for half the TTL.
    pub fn self_fenced(&self, n: usize) {
        self.self_fenced.increment(n as u64);
    }
}

impl Default for JournalMetrics {
    fn default() -> Self {
        JournalMetrics::new()
    }
}

impl EngineMetrics {
    /// Handles from the recorder installed now.
    pub fn new() -> Self {
        let restarts = counter!(WORKER_RESTARTS_TOTAL);
        restarts.increment(0);
        let in_flight = gauge!(CALLS_IN_FLIGHT);
        in_flight.increment(0.0);
        let sessions = gauge!(SESSIONS_ACTIVE);
        sessions.increment(0.0);
        EngineMetrics {
            unknown: ToolMetrics::new(UNKNOWN_TOOL),
            turn_dispatch: histogram!(TURN_DISPATCH_SECONDS),
            turn_calls: histogram!(TURN_CALLS),
            stages_concurrent: counter!(STAGES_TOTAL, "mode" => "concurrent"),
            stages_serial: counter!(STAGES_TOTAL, "mode" => "serial"),
            stage_calls_concurrent: histogram!(STAGE_CALLS, "mode" => "concurrent"),
            stage_calls_serial: histogram!(STAGE_CALLS, "mode" => "serial"),
            in_flight,
            sessions,
            registry_tools: gauge!(REGISTRY_TOOLS),
            worker_restarts: restarts,
            tool_search: SEARCH_FORMS.map(|form| {
                let c = counter!(TOOL_SEARCH_TOTAL, "form" => form);
                c.increment(0);
                c
            }),
            tool_search_hits: zeroed(counter!(TOOL_SEARCH_HITS_TOTAL)),
            deferred_unrevealed: zeroed(counter!(DEFERRED_CALLS_UNREVEALED_TOTAL)),
            catalog_bytes_avoided: histogram!(CATALOG_BYTES_AVOIDED),
            dedup_hits: zeroed(counter!(DEDUP_HITS_TOTAL)),
            outcome_unknown: zeroed(counter!(OUTCOME_UNKNOWN_TOTAL)),
            progress: ProgressMetrics::new(),
        }
    }

    /// `n` calls were answered from stored answers.
    pub fn dedup_hits(&self, n: usize) {
        self.dedup_hits.increment(n as u64);
    }

    /// A retried call was answered `outcome_unknown`.
    pub fn outcome_unknown(&self) {
        self.outcome_unknown.increment(1);
    }

    /// A `tool_search` call of query form `form` (`keywords`, `select` or `regex`).
    pub fn tool_search(&self, form: &str) {
        if let Some(i) = SEARCH_FORMS.iter().position(|f| *f == form) {
            self.tool_search[i].increment(1);
        }
    }

    /// A call of a deferred tool: `unrevealed` when the session had never been shown it,
    /// `search_hit` when it is the first call since a search returned it.
    pub fn deferred_call(&self, unrevealed: bool, search_hit: bool) {
        if unrevealed {
            self.deferred_unrevealed.increment(1);
        }
        if search_hit {
            self.tool_search_hits.increment(1);
        }
    }

    /// A catalog was served while tools are deferred, keeping `bytes` of definitions out.
    pub fn catalog_bytes_avoided(&self, bytes: usize) {
        self.catalog_bytes_avoided.record(bytes as f64);
    }

    /// A turn finished.
    #[inline]
    pub fn turn(&self, calls: usize, elapsed: Duration) {
        self.turn_dispatch.record(elapsed);
        self.turn_calls.record(calls as f64);
    }

    /// A stage started.
    #[inline]
    pub fn stage(&self, concurrent: bool, calls: usize) {
        if concurrent {
            self.stages_concurrent.increment(1);
            self.stage_calls_concurrent.record(calls as f64);
        } else {
            self.stages_serial.increment(1);
            self.stage_calls_serial.record(calls as f64);
        }
    }

    /// `n` serial stages (one call each) started: one update for all of them.
    #[inline]
    pub fn serial_stages(&self, n: usize) {
        if n > 0 {
            self.stages_serial.increment(n as u64);
            self.stage_calls_serial.record_many(1.0, n);
        }
    }

    /// An async or blocking call is running for as long as the guard lives.
    #[inline]
    pub fn in_flight_guard(&self) -> InFlightGuard<'_> {
        self.in_flight.increment(1.0);
        InFlightGuard(&self.in_flight)
    }

    /// A session opened (`+1`) or closed (`-1`).
    pub fn sessions(&self, delta: f64) {
        self.sessions.increment(delta);
    }

    /// The engine's sandbox mode and the kernel's Landlock ABI (an info gauge, always 1).
    pub fn sandbox_info(&self, mode: &'static str, landlock_abi: i32) {
        gauge!(SANDBOX_INFO, "mode" => mode, "landlock_abi" => landlock_abi.to_string()).set(1.0);
    }

    /// The registry now holds `n` tools.
    pub fn registry_tools(&self, n: usize) {
        self.registry_tools.set(n as f64);
    }

    /// A worker was replaced.
    pub fn worker_restarted(&self) {
        self.worker_restarts.increment(1);
    }
}

/// The `form` label values of [`TOOL_SEARCH_TOTAL`].
pub const SEARCH_FORMS: [&str; 3] = ["keywords", "select", "regex"];

fn zeroed(counter: Counter) -> Counter {
    counter.increment(0);
    counter
}

/// Counts one running call in `switchboard_calls_in_flight` until dropped.
#[derive(Debug)]
pub struct InFlightGuard<'a>(&'a Gauge);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Runs `f` with a recorder that records nothing, so the metric handles it creates are inert
/// (for tool sets built outside an engine, such as the direct baseline's).
pub fn detached<T>(f: impl FnOnce() -> T) -> T {
    metrics::with_local_recorder(&metrics::NoopRecorder, f)
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The `route` label of requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "_unmatched";

/// Cached handles of `serve`'s HTTP metrics: one histogram per route template, one counter
/// per route and status (made on first use; statuses are few).
#[derive(Debug)]
pub struct HttpMetrics {
    seconds: std::collections::HashMap<&'static str, Histogram>,
    requests: std::sync::RwLock<std::collections::HashMap<(&'static str, u16), Counter>>,
}

impl HttpMetrics {
    /// Handles for these route templates (and [`UNMATCHED_ROUTE`]).
    pub fn new(routes: &[&'static str]) -> Self {
        let seconds = routes
            .iter()
            .copied()
            .chain([UNMATCHED_ROUTE])
            .map(|r| (r, histogram!(HTTP_REQUEST_SECONDS, "route" => r)))
            .collect();
        HttpMetrics {
            seconds,
            requests: Default::default(),
        }
    }

    /// The label value of a matched route template: the template itself if it was given to
    /// [`HttpMetrics::new`], else [`UNMATCHED_ROUTE`] (no allocation either way).
    pub fn route(&self, template: Option<&str>) -> &'static str {
        template
            .and_then(|t| self.seconds.get_key_value(t))
            .map_or(UNMATCHED_ROUTE, |(r, _)| *r)
    }

    /// One request answered. `route` is a template given to [`HttpMetrics::new`]; any other
    /// value is recorded as [`UNMATCHED_ROUTE`].
    pub fn request(&self, route: &str, status: u16, elapsed: Duration) {
        let (route, hist) = match self.seconds.get_key_value(route) {
            Some((r, h)) => (*r, h),
            None => (UNMATCHED_ROUTE, &self.seconds[UNMATCHED_ROUTE]),
        };
        hist.record(elapsed);
        let key = (route, status);
        if let Some(c) = self
            .requests
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            c.increment(1);
            return;
        }
        let mut map = self.requests.write().unwrap_or_else(|p| p.into_inner());
        map.entry(key)
            .or_insert_with(
                || counter!(HTTP_REQUESTS_TOTAL, "route" => route, "status" => status.to_string()),
            )
            .increment(1);
    }
}

/// Cached handles of one MCP server label (a configured server name: bounded).
#[derive(Debug, Clone)]
pub struct McpServerMetrics {
    up: Gauge,
    restarts: Counter,
    request: Histogram,
}

impl McpServerMetrics {
    /// Handles for `server`; the series exist (at 0) from now on.
    pub fn new(server: &str) -> Self {
        let up = gauge!(MCP_SERVER_UP, "server" => server.to_string());
        up.set(0.0);
        let restarts = counter!(MCP_SERVER_RESTARTS_TOTAL, "server" => server.to_string());
        restarts.increment(0);
        McpServerMetrics {
            up,
            restarts,
            request: histogram!(MCP_REQUEST_SECONDS, "server" => server.to_string()),
        }
    }

    /// The server is connected (`true`) or not.
    pub fn up(&self, up: bool) {
        self.up.set(if up { 1.0 } else { 0.0 });
    }

    /// The server is being restarted.
    pub fn restarted(&self) {
        self.restarts.increment(1);
    }

    /// One `tools/call` round trip took `elapsed`.
    pub fn request(&self, elapsed: Duration) {
        self.request.record(elapsed);
    }
}

/// One tool's `switchboard_permission_decisions_total` handles (one per decision), made on the
/// tool's first decision and read without a lock afterwards.
pub type DecisionCounters = std::sync::OnceLock<[Counter; 4]>;

/// Why audit lines were lost: the `reason` label of [`AUDIT_DROPPED_TOTAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditLoss {
    /// `buffer_full`: the writer's buffer was full (the disk or pipe slower than the calls), so
    /// the line was dropped rather than hold the call back.
    BufferFull,
    /// `write_failed`: the line reached the writer but not the file — a write failed (a full
    /// disk), or the log was deleted and could not be created again.
    WriteFailed,
}

impl AuditLoss {
    /// Every reason, in the order of [`AuditLoss::label`]'s index.
    pub const ALL: [AuditLoss; 2] = [AuditLoss::BufferFull, AuditLoss::WriteFailed];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            AuditLoss::BufferFull => "buffer_full",
            AuditLoss::WriteFailed => "write_failed",
        }
    }
}

/// Cached handles of the policy layer: the audit drop counters, one per [`AuditLoss`] (the
/// decision counters live with each registered tool, [`DecisionCounters`]; tool names come from
/// the registry, so the label stays bounded).
#[derive(Debug, Clone)]
pub struct PolicyMetrics {
    audit_dropped: [Counter; 2],
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PolicyMetrics {
    /// The decision values, in the order of the cached handles.
    pub const DECISIONS: [&'static str; 4] = ["allow", "deny", "approved", "refused"];

    /// Handles from the recorder installed now.
    pub fn new() -> Self {
        let audit_dropped = AuditLoss::ALL.map(|reason| {
            let counter = counter!(AUDIT_DROPPED_TOTAL, "reason" => reason.label());
            counter.increment(0);
            counter
        });
        PolicyMetrics { audit_dropped }
    }

    /// One decision about a call of `tool`, counted in its cached handles.
    pub fn decision(&self, handles: &DecisionCounters, tool: &str, decision: &str) {
        let Some(i) = Self::DECISIONS.iter().position(|d| *d == decision) else {
            return;
        };
        handles.get_or_init(|| {
            Self::DECISIONS.map(|d| {
                counter!(PERMISSION_DECISIONS_TOTAL, "tool" => tool.to_string(), "decision" => d)
            })
        })[i]
            .increment(1);
    }

    /// Audit lines lost, and why.
    pub fn audit_dropped(&self, reason: AuditLoss, lines: u64) {
        self.audit_dropped[reason as usize].increment(lines);
    }
}

/// Records one model request (the slow path: labels are looked up per call).
pub fn model_request(provider: &str, status: &str, elapsed: Duration) {
    counter!(MODEL_REQUESTS_TOTAL, "provider" => provider.to_string(), "status" => status.to_string())
        .increment(1);
    histogram!(MODEL_REQUEST_SECONDS, "provider" => provider.to_string()).record(elapsed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        for m in METRICS {
            assert!(m.name.starts_with("switchboard_"), "{}", m.name);
            match m.kind {
                Kind::Counter => assert!(m.name.ends_with("_total"), "{}", m.name),
                Kind::Histogram if m.unit == Unit::Seconds => {
                    assert!(m.name.ends_with("_seconds"), "{}", m.name)
                }
                _ => assert!(!m.name.ends_with("_total"), "{}", m.name),
            }
            assert!(!m.help.is_empty());
            assert!(!m.labels.iter().any(|l| l.ends_with("id")), "{}", m.name);
        }
    }

    #[test]
    fn count_histograms_use_count_buckets_and_the_rest_durations() {
        assert_eq!(buckets(TURN_CALLS), COUNT_BUCKETS);
        assert_eq!(buckets(STAGE_CALLS), COUNT_BUCKETS);
        for m in METRICS.iter().filter(|m| m.kind == Kind::Histogram) {
            if m.unit == Unit::Seconds {
                assert_eq!(buckets(m.name), DURATION_BUCKETS, "{}", m.name);
            }
        }
    }

    #[test]
    fn duration_buckets_span_50us_to_120s_in_order() {
        assert_eq!(DURATION_BUCKETS.first(), Some(&0.00005));
        assert_eq!(DURATION_BUCKETS.last(), Some(&120.0));
        assert!(DURATION_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
