//! The physical floor of the sidecar's hop, for `--workload-set serve`: a bare HTTP/1.1 echo
//! server (axum on hyper, as the sidecar is) on a free loopback port, and the round trips of the
//! load generator's own client to it — the same connections, request heads and bodies as the
//! HTTP phase, with nothing between the socket and the answer but HTTP itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::driver::Bounds;
use super::http::{Connection, Endpoint};
use super::stats::histogram;

/// Round trips per connection at most (with a turn bound, that bound).
const MAX_ROUND_TRIPS: u64 = 1_000_000;

/// A running echo server.
pub struct Echo {
    endpoint: Arc<Endpoint>,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<()>,
}

/// What the echo measured: round trips per second over all connections, and each round trip's
/// latency.
pub struct EchoPhase {
    /// Round trips answered.
    pub round_trips: u64,
    /// How long the phase ran.
    pub elapsed: Duration,
    /// Round-trip latencies (ns).
    pub latency: Histogram<u64>,
}

impl EchoPhase {
    /// Round trips per second.
    pub fn per_s(&self) -> f64 {
        self.round_trips as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl Echo {
    /// Starts the server on `127.0.0.1`, a free port: `POST /echo` answers its request's body.
    pub async fn start() -> Result<Echo, String> {
        let app = axum::Router::new().route(
            "/echo",
            axum::routing::post(|body: axum::body::Bytes| async move { body }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot bind the echo server: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("the echo server has no address: {e}"))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Echo {
            endpoint: Arc::new(Endpoint::parse(&format!("http://{addr}"), None)?),
            stop,
            serving,
        })
    }

    /// `connections` keep-alive connections at once, each sending `body` and reading it back
    /// one round trip after another, within `bounds` (its turn count per connection, or its
    /// time). An answer that is not the body sent back is an error.
    pub async fn measure(
        &self,
        connections: usize,
        body: &Arc<Vec<u8>>,
        bounds: &Bounds,
    ) -> Result<EchoPhase, String> {
        let limit = bounds.turns.min(MAX_ROUND_TRIPS);
        let started = Instant::now();
        let deadline = started + bounds.stop_after;
        let tasks: Vec<_> = (0..connections.max(1))
            .map(|_| {
                let endpoint = Arc::clone(&self.endpoint);
                let body = Arc::clone(body);
                tokio::spawn(async move {
                    let mut conn = Connection::new(endpoint);
                    let mut latency = histogram();
                    let mut done = 0u64;
                    while done < limit && Instant::now() < deadline {
                        let sent = Instant::now();
                        let (status, answer) = conn.request("POST", "/echo", &body).await?;
                        if status != 200 || answer != *body {
                            return Err(format!(
                                "the echo server answered {status} with {} bytes instead of the \
                                 {} sent",
                                answer.len(),
                                body.len()
                            ));
                        }
                        let ns = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        latency.saturating_record(ns.max(1));
                        done += 1;
                    }
                    Ok::<_, String>((done, latency))
                })
            })
            .collect();
        let mut phase = EchoPhase {
            round_trips: 0,
            elapsed: Duration::ZERO,
            latency: histogram(),
        };
        for task in tasks {
            let (done, latency) = task
                .await
                .map_err(|e| format!("an echo connection failed: {e}"))??;
            phase.round_trips += done;
            let _ = phase.latency.add(&latency);
        }
        phase.elapsed = started.elapsed();
        Ok(phase)
    }

    /// Stops the server.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.serving.await;
    }
}
