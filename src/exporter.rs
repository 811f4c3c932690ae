//! The Prometheus exporter and log setup of the long-running commands.
//!
//! `--metrics-addr ADDR` installs the Prometheus recorder and serves `GET /metrics` (text
//! exposition format) and `GET /healthz` on `ADDR` (counting its own requests in the HTTP
//! metrics, so the scrapes themselves show there); `--metrics-file PATH` writes the final
//! exposition when the command ends. With neither flag no recorder is installed and every metric
//! handle is a no-op. The recorder is installed before the engine is built, because the engine
//! caches its metric handles at build time. Logs go to stderr, as text or JSON lines.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::task::JoinHandle;

use crate::metrics::{
    COUNT_BUCKETS, DURATION_BUCKETS, HttpMetrics, STAGE_CALLS, TURN_CALLS, describe_all,
};

/// How often histogram samples are folded into their buckets. The recorder buffers every raw
/// sample until then, so the period bounds memory: at 2–3 M calls/s (two samples per call) a
/// 5 s period held ~400 MB; 100 ms holds a few MB.
const UPKEEP_PERIOD: Duration = Duration::from_millis(100);

/// A running exporter (or none). Call [`Telemetry::finish`] when the command ends.
#[derive(Debug, Default)]
pub struct Telemetry {
    handle: Option<PrometheusHandle>,
    tasks: Vec<JoinHandle<()>>,
    metrics_file: Option<PathBuf>,
    local_addr: Option<SocketAddr>,
}

/// The recorder with Switchboard's buckets: real Prometheus histograms, not summaries.
pub fn prometheus_builder() -> Result<PrometheusBuilder, String> {
    let err = |e: metrics_exporter_prometheus::BuildError| format!("metrics buckets: {e}");
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(Matcher::Full(TURN_CALLS.into()), COUNT_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(Matcher::Full(STAGE_CALLS.into()), COUNT_BUCKETS)
        .map_err(err)
}

impl Telemetry {
    /// Installs the recorder and starts the HTTP endpoint if asked to. Must run inside a tokio
    /// runtime, before the engine is built.
    pub async fn start(
        metrics_addr: Option<SocketAddr>,
        metrics_file: Option<PathBuf>,
    ) -> Result<Telemetry, String> {
        if metrics_addr.is_none() && metrics_file.is_none() {
            return Ok(Telemetry::default());
        }
        let (handle, upkeep) = install_recorder()?;
        let mut tasks = vec![upkeep];
        let mut local_addr = None;
        if let Some(addr) = metrics_addr {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} for metrics: {e}"))?;
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

    /// The address `/metrics` is served on (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The exposition text now (None without a recorder).
    pub fn render(&self) -> Option<String> {
        self.handle.as_ref().map(|h| {
            h.run_upkeep();
            h.render()
        })
    }

    /// Writes `--metrics-file` (if set) and stops the endpoint.
    pub async fn finish(self) -> Result<(), String> {
        let result = match (&self.metrics_file, self.render()) {
            (Some(path), Some(text)) => std::fs::write(path, text)
                .map_err(|e| format!("cannot write metrics file {}: {e}", path.display())),
            _ => Ok(()),
        };
        for task in &self.tasks {
            task.abort();
        }
        result
    }
}

/// Installs the Prometheus recorder process-wide, with its upkeep task, and describes every
/// metric; for commands that serve `/metrics` themselves (`serve`). Must run inside a tokio
/// runtime, before the engine is built.
pub fn install_recorder() -> Result<(PrometheusHandle, JoinHandle<()>), String> {
    let handle = prometheus_builder()?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    describe_all();
    let upkeep = handle.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok((handle, task))
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
