//! The Prometheus exporter and log setup of the long-running commands.
//!
//! `--metrics-addr ADDR` installs the recorder and serves `GET /metrics` (text exposition
//! format) and `GET /healthz` on `ADDR` (counting its own requests in the HTTP metrics, so the
//! scrapes themselves show there); `--metrics-file PATH` writes the final exposition when the
//! command ends. With neither flag no recorder is installed and every metric handle is a no-op.
//! The recorder is installed before the engine is built, because the engine caches its metric
//! handles at build time.
//!
//! The recorder is [`crate::metrics::PreAggregated`] around the Prometheus recorder: counters and
//! gauges live in the Prometheus recorder, histograms in pre-aggregated sharded buckets
//! (`crate::metrics::histograms`); [`MetricsHandle::render`] writes both. Nothing buffers raw
//! samples, so there is no upkeep task. Logs go to stderr, as text or JSON lines.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tokio::task::JoinHandle;

use crate::metrics::{Histograms, HttpMetrics, PreAggregated, buckets, describe_all, histograms};

/// What `/metrics` and `--metrics-file` show: the Prometheus recorder's counters and gauges,
/// then the pre-aggregated histograms, in the Prometheus text format.
#[derive(Debug, Clone)]
pub struct MetricsHandle {
    prometheus: PrometheusHandle,
    histograms: Arc<Histograms>,
}

impl MetricsHandle {
    /// The exposition text now.
    pub fn render(&self) -> String {
        let mut text = self.prometheus.render();
        self.histograms.render_into(&mut text);
        text
    }

    /// Samples recorded in every series of histogram `name`.
    pub fn histogram_count(&self, name: &str) -> u64 {
        self.histograms.count(name)
    }

    /// Bytes held by the histogram buckets (fixed per series; see `crate::metrics::histograms`).
    pub fn histogram_bytes(&self) -> usize {
        self.histograms.memory_bytes()
    }
}

/// The recorder the exporter installs, not installed yet, with the handle that renders it
/// (`load --compare-metrics` builds engines under it without installing it).
pub fn recorder() -> (PreAggregated<PrometheusRecorder>, MetricsHandle) {
    let prometheus = PrometheusBuilder::new().build_recorder();
    let histograms = Arc::new(Histograms::new(buckets, histograms::default_shards()));
    let handle = MetricsHandle {
        prometheus: prometheus.handle(),
        histograms: Arc::clone(&histograms),
    };
    (PreAggregated::new(prometheus, histograms), handle)
}

/// Why the metrics exporter could not start or write its file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExporterError {
    /// Another metrics recorder is already installed in this process.
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(String),
    /// The `/metrics` address cannot be bound.
    #[error("cannot listen on {addr} for metrics: {source}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The metrics file cannot be written.
    #[error("cannot write metrics file {}: {source}", path.display())]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A running exporter (or none). Call [`Telemetry::finish`] when the command ends.
#[derive(Debug, Default)]
pub struct Telemetry {
    handle: Option<MetricsHandle>,
    tasks: Vec<JoinHandle<()>>,
    metrics_file: Option<PathBuf>,
    local_addr: Option<SocketAddr>,
}

impl Telemetry {
    /// Installs the recorder and starts the HTTP endpoint if asked to. Must run inside a tokio
    /// runtime, before the engine is built.
    pub async fn start(
        metrics_addr: Option<SocketAddr>,
        metrics_file: Option<PathBuf>,
    ) -> Result<Telemetry, ExporterError> {
        if metrics_addr.is_none() && metrics_file.is_none() {
            return Ok(Telemetry::default());
        }
        let handle = install_recorder()?;
        let mut tasks = Vec::new();
        let mut local_addr = None;
        if let Some(addr) = metrics_addr {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ExporterError::Listen { addr, source })?;
            local_addr = listener.local_addr().ok();
            let render = handle.clone();
            let http = Arc::new(HttpMetrics::new(&["/metrics", "/healthz"]));
            let app = Router::new()
                .route(
                    "/metrics",
                    get(move || {
                        let render = render.clone();
                        async move { render.render() }
                    }),
                )
                .route("/healthz", get(|| async { "ok\n" }))
                .layer(axum::middleware::from_fn(
                    move |request: Request, next: Next| {
                        let http = Arc::clone(&http);
                        async move {
                            let started = Instant::now();
                            let route = http.route(
                                request
                                    .extensions()
                                    .get::<MatchedPath>()
                                    .map(MatchedPath::as_str),
                            );
                            let response = next.run(request).await;
                            http.request(route, response.status().as_u16(), started.elapsed());
                            response
                        }
                    },
                ));
            tasks.push(tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!("metrics endpoint stopped: {e}");
                }
            }));
            tracing::info!(
                "serving metrics on http://{}/metrics",
                local_addr.unwrap_or(addr)
            );
        }
        Ok(Telemetry {
            handle: Some(handle),
            tasks,
            metrics_file,
            local_addr,
        })
    }

    /// The recorder's handle, if one was installed.
    pub fn handle(&self) -> Option<MetricsHandle> {
        self.handle.clone()
    }

    /// The address `/metrics` is served on (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The exposition text now (None without a recorder).
    pub fn render(&self) -> Option<String> {
        self.handle.as_ref().map(MetricsHandle::render)
    }

    /// Writes `--metrics-file` (if set) and stops the endpoint.
    pub async fn finish(self) -> Result<(), ExporterError> {
        let result = match (&self.metrics_file, self.render()) {
            (Some(path), Some(text)) => {
                std::fs::write(path, text).map_err(|source| ExporterError::WriteFile {
                    path: path.clone(),
                    source,
                })
            }
            _ => Ok(()),
        };
        for task in &self.tasks {
            task.abort();
        }
        result
    }
}

/// Installs the recorder process-wide and describes every metric; for commands that serve
/// `/metrics` themselves (`serve`). Must run before the engine is built.
pub fn install_recorder() -> Result<MetricsHandle, ExporterError> {
    let (recorder, handle) = recorder();
    metrics::set_global_recorder(recorder).map_err(|e| ExporterError::Recorder(e.to_string()))?;
    describe_all();
    Ok(handle)
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (with the current span and its parents).
    Json,
}

/// Logs to stderr, filtered by `RUST_LOG` (default `warn`; kameo's per-message spans are kept at
/// `warn` unless asked for). `RUST_LOG=switchboard=info` shows one line per call and per turn as
/// their spans close.
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,kameo=warn"));
    // A line when each span closes: every `execute_tool` span (with its `gen_ai.*` fields,
    // `error.type` and its busy/idle time) and every `dispatch_turn` span, at INFO.
    // Colours only on a terminal; and a closed stderr (`… 2>&1 | head`) must not bring the
    // engine down: the subscriber's own complaint about a failed write would go to that same
    // stderr through `eprintln!`, which panics.
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{EngineMetrics, ToolMetrics};
    use crate::protocol::{Timing, ToolDispatchResult};
    use std::time::Duration;

    #[test]
    fn counters_gauges_and_histograms_render_together() {
        let (recorder, handle) = recorder();
        metrics::with_local_recorder(&recorder, || {
            describe_all();
            let engine = EngineMetrics::new();
            let tool = ToolMetrics::new("echo");
            let timing = Timing {
                queued: Duration::from_micros(5),
                run: Duration::from_micros(30),
                ran: true,
            };
            tool.record(&ToolDispatchResult::ok(
                "t1".into(),
                "echo".into(),
                "hi".into(),
                timing,
            ));
            engine.turn(3, Duration::from_millis(2));
            engine.serial_stages(2);
        });
        let text = handle.render();
        for line in [
            "switchboard_tool_calls_total{tool=\"echo\",outcome=\"ok\"} 1",
            "# TYPE switchboard_tool_call_duration_seconds histogram",
            "switchboard_tool_call_duration_seconds_bucket{tool=\"echo\",le=\"0.00005\"} 1",
            "switchboard_tool_call_duration_seconds_count{tool=\"echo\"} 1",
            "switchboard_turn_calls_bucket{le=\"2\"} 0",
            "switchboard_turn_calls_bucket{le=\"3\"} 1",
            "switchboard_turn_calls_sum 3",
            "switchboard_turn_dispatch_seconds_bucket{le=\"0.0025\"} 1",
            "switchboard_stage_calls_count{mode=\"serial\"} 2",
            "switchboard_stages_total{mode=\"serial\"} 2",
            "switchboard_sessions_active 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        // Every histogram family is rendered once, by the pre-aggregated set only.
        assert_eq!(
            text.matches("# TYPE switchboard_tool_call_duration_seconds ")
                .count(),
            1
        );
        assert!(handle.histogram_bytes() > 0);
    }
}
