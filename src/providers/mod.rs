//! HTTP model providers: Anthropic Messages ([`AnthropicProvider`]) and OpenAI Chat
//! Completions–compatible servers ([`OpenAiProvider`]), streaming or not.
//!
//! Both keep the loop's Anthropic-shaped history and hand back Anthropic-shaped content blocks,
//! so the agent loop sees one format. Streaming answers are read as server-sent events
//! (`sse`); tool arguments are assembled from their fragments and parsed once per block
//! (`assemble`); each completed block is reported at once (for eager dispatch). Failed requests
//! are retried as `retry` describes. TLS is rustls with the `ring` provider; HTTP/1.1.

mod anthropic;
mod assemble;
mod openai;
mod retry;
mod sse;

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::provider::{EventSink, ModelResponse, ProviderError};
pub use anthropic::AnthropicProvider;
pub use openai::OpenAiProvider;
pub use retry::RetryPolicy;
use sse::{SseEvent, SseParser};

/// The public Anthropic endpoint (`ANTHROPIC_BASE_URL` overrides it).
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The public OpenAI endpoint (`OPENAI_BASE_URL` overrides it).
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Default request timeout: the whole answer when not streaming; when streaming, the wait for
/// the response headers and for each next piece of the stream.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest wait for a TCP + TLS connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach one HTTP provider.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Base URL without the endpoint path (`https://api.anthropic.com`, `http://127.0.0.1:8080/v1`).
    pub base_url: String,
    /// The API key (`None`: no auth header, for local OpenAI-compatible servers).
    pub api_key: Option<String>,
    /// See [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Retries.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish()
    }
}

impl HttpConfig {
    /// A config with the default timeout and retries.
    pub fn new(base_url: impl Into<String>, api_key: Option<String>) -> Self {
        HttpConfig {
            base_url: base_url.into(),
            api_key,
            timeout: DEFAULT_TIMEOUT,
            retry: RetryPolicy::default(),
        }
    }
}

pub use crate::tls::install_crypto_provider;

/// Reads a setting from the environment: `None` when unset or blank.
pub fn env_value(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// One failed attempt.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: ProviderError,
    pub retryable: bool,
    pub retry_after: Option<f64>,
}

impl Failure {
    pub(crate) fn fatal(error: ProviderError) -> Self {
        Failure {
            error,
            retryable: false,
            retry_after: None,
        }
    }
}

/// The HTTP client of one provider.
pub(crate) struct Http {
    client: reqwest::Client,
    /// `anthropic` or `openai` (metrics label, error prefix).
    pub name: &'static str,
    /// The variable to check on 401/403.
    pub key_variable: &'static str,
    pub config: HttpConfig,
}

impl Http {
    pub(crate) fn new(
        name: &'static str,
        key_variable: &'static str,
        mut config: HttpConfig,
    ) -> Result<Self, ProviderError> {
        crate::tls::install_crypto_provider();
        config.base_url = config.base_url.trim_end_matches('/').to_string();
        let url = reqwest::Url::parse(&config.base_url).map_err(|e| {
            ProviderError::Config(format!("{name}: bad base URL {:?}: {e}", config.base_url))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ProviderError::Config(format!(
                "{name}: base URL must be http or https: {}",
                config.base_url
            )));
        }
        config.retry.max_attempts = config.retry.max_attempts.max(1);
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(config.timeout))
            .user_agent(concat!("switchboard/", env!("CARGO_PKG_VERSION")));
        let host = url.host_str().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if loopback {
            builder = builder.no_proxy();
        }
        let client = builder
            .build()
            .map_err(|e| ProviderError::Config(format!("{name}: cannot build HTTP client: {e}")))?;
        Ok(Http {
            client,
            name,
            key_variable,
            config,
        })
    }

    /// Runs `attempt` until it succeeds, fails for good, or the attempts run out.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut attempt: F) -> Result<T, ProviderError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let max = self.config.retry.max_attempts;
        let mut n = 0;
        loop {
            n += 1;
            let failure = match attempt().await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            if !failure.retryable || n >= max {
                return Err(match failure.error {
                    ProviderError::Status {
                        provider,
                        status,
                        message,
                        ..
                    } => ProviderError::Status {
                        provider,
                        status,
                        message,
                        attempts: n,
                    },
                    ProviderError::Request(detail) if n > 1 => {
                        ProviderError::Request(format!("{detail} (after {n} attempts)"))
                    }
                    other => other,
                });
            }
            let wait = self.config.retry.delay(n, failure.retry_after);
            tracing::warn!(
                provider = self.name,
                "{}; retrying in {:.1}s (attempt {} of {max})",
                failure.error,
                wait.as_secs_f64(),
                n + 1
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// One model exchange, retried as [`Http::retrying`] says: POST `body` to `url`, then read
    /// the whole JSON answer with `whole`, or — with a `sink` — the event stream through a fresh
    /// decoder `D`, reporting complete blocks to the sink as they arrive.
    pub(crate) async fn exchange<D: StreamDecoder + Default>(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        sink: Option<&EventSink>,
        whole: fn(&Value) -> Result<ModelResponse, ProviderError>,
    ) -> Result<ModelResponse, ProviderError> {
        self.retrying(|| async move {
            let (response, started) = self.send(url, headers, body).await?;
            match sink {
                None => {
                    let doc = self.read_json(response, started).await?;
                    whole(&doc).map_err(Failure::fatal)
                }
                Some(sink) => {
                    self.read_stream(response, started, D::default(), sink)
                        .await
                }
            }
        })
        .await
    }

    /// Sends one request; a non-2xx answer or a transport failure is a [`Failure`] (recorded
    /// in the metrics). On success the caller reads the body and records the request.
    pub(crate) async fn send(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(reqwest::Response, Instant), Failure> {
        let started = Instant::now();
        let mut request = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = match tokio::time::timeout(self.config.timeout, request.send()).await {
            Err(_) => {
                self.record("error", started);
                return Err(Failure {
                    error: ProviderError::Request(format!(
                        "{}: no response from {url} within {:?}",
                        self.name, self.config.timeout
                    )),
                    retryable: true,
                    retry_after: None,
                });
            }
            Ok(Err(e)) => {
                self.record("error", started);
                return Err(Failure {
                    error: ProviderError::Request(format!(
                        "{}: cannot reach {url}: {}",
                        self.name,
                        error_chain(&e)
                    )),
                    retryable: !e.is_builder(),
                    retry_after: None,
                });
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok((response, started));
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = retry::parse_retry_after(
            header("retry-after").as_deref(),
            header("retry-after-ms").as_deref(),
        );
        let text = tokio::time::timeout(self.config.timeout, response.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        self.record(&status.to_string(), started);
        let message = error_message(&text);
        let error = if status == 401 || status == 403 {
            ProviderError::Auth {
                provider: self.name.to_string(),
                status,
                message,
                variable: self.key_variable.to_string(),
            }
        } else {
            ProviderError::Status {
                provider: self.name.to_string(),
                status,
                message,
                attempts: 1,
            }
        };
        Err(Failure {
            error,
            retryable: retry::is_retryable_status(status),
            retry_after,
        })
    }

    /// Reads a whole JSON body (not streaming) and records the request.
    pub(crate) async fn read_json(
        &self,
        response: reqwest::Response,
        started: Instant,
    ) -> Result<Value, Failure> {
        let left = self.config.timeout.saturating_sub(started.elapsed());
        let bytes = match tokio::time::timeout(left, response.bytes()).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => {
                self.record("error", started);
                return Err(Failure {
                    error: ProviderError::Request(format!(
                        "{}: reading the answer failed: {}",
                        self.name,
                        error_chain(&e)
                    )),
                    retryable: true,
                    retry_after: None,
                });
            }
            Err(_) => {
                self.record("error", started);
                return Err(Failure {
                    error: ProviderError::Request(format!(
                        "{}: no complete answer within {:?}",
                        self.name, self.config.timeout
                    )),
                    retryable: true,
                    retry_after: None,
                });
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(value) => {
                self.record("ok", started);
                Ok(value)
            }
            Err(e) => {
                self.record("error", started);
                Err(Failure::fatal(ProviderError::BadResponse(format!(
                    "{}: the answer is not JSON: {e}",
                    self.name
                ))))
            }
        }
    }

    /// Reads an event stream into `decoder` until it says it is done (or the stream ends), then
    /// records the request. Failures after a block was reported are not retryable.
    pub(crate) async fn read_stream<D: StreamDecoder>(
        &self,
        mut response: reqwest::Response,
        started: Instant,
        mut decoder: D,
        sink: &EventSink,
    ) -> Result<ModelResponse, Failure> {
        let result = async {
            let mut parser = SseParser::new();
            loop {
                let chunk = match tokio::time::timeout(self.config.timeout, response.chunk()).await
                {
                    Err(_) => {
                        return Err(Failure {
                            error: ProviderError::Request(format!(
                                "{}: the stream stalled for {:?}",
                                self.name, self.config.timeout
                            )),
                            retryable: !decoder.emitted(),
                            retry_after: None,
                        });
                    }
                    Ok(Err(e)) => {
                        return Err(Failure {
                            error: ProviderError::Request(format!(
                                "{}: the stream broke: {}",
                                self.name,
                                error_chain(&e)
                            )),
                            retryable: !decoder.emitted(),
                            retry_after: None,
                        });
                    }
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(chunk))) => chunk,
                };
                let events = parser.push(&chunk).map_err(|e| {
                    Failure::fatal(ProviderError::BadResponse(format!("{}: {e}", self.name)))
                })?;
                for event in events {
                    if decoder.event(event, sink)? {
                        return decoder.finish();
                    }
                }
            }
            for event in parser.finish() {
                if decoder.event(event, sink)? {
                    break;
                }
            }
            decoder.finish()
        }
        .await;
        self.record(if result.is_ok() { "ok" } else { "error" }, started);
        result
    }

    fn record(&self, status: &str, started: Instant) {
        crate::metrics::model_request(self.name, status, started.elapsed());
    }
}

/// Turns server-sent events into content blocks.
pub(crate) trait StreamDecoder {
    /// Takes one event; `Ok(true)` when the answer is complete.
    fn event(&mut self, event: SseEvent, sink: &EventSink) -> Result<bool, Failure>;
    /// True once a block was reported (from then on, a failure is not retried).
    fn emitted(&self) -> bool;
    /// The whole answer.
    fn finish(&mut self) -> Result<ModelResponse, Failure>;
}

/// The error message of an API error body (`{"error":{"type":…,"message":…}}` in both formats),
/// else the start of the body.
pub(crate) fn error_message(body: &str) -> String {
    let doc: Option<Value> = serde_json::from_str(body).ok();
    let from_json = doc.as_ref().and_then(|doc| {
        let error = doc.get("error").unwrap_or(doc);
        if let Some(s) = error.as_str() {
            return Some(s.to_string());
        }
        let message = error.get("message").and_then(Value::as_str)?;
        Some(match error.get("type").and_then(Value::as_str) {
            Some(kind) if !kind.is_empty() => format!("{kind}: {message}"),
            _ => message.to_string(),
        })
    });
    from_json.unwrap_or_else(|| {
        let trimmed = body.trim();
        if trimmed.is_empty() {
            "(empty body)".to_string()
        } else {
            trimmed.chars().take(300).collect()
        }
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_error_bodies_give_their_message() {
        assert_eq!(
            error_message(
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#
            ),
            "authentication_error: invalid x-api-key"
        );
        assert_eq!(
            error_message(
                r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#
            ),
            "invalid_request_error: Incorrect API key provided"
        );
        assert_eq!(error_message(r#"{"error":"nope"}"#), "nope");
        assert_eq!(
            error_message("<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        assert_eq!(error_message(""), "(empty body)");
    }

    #[test]
    fn bad_base_urls_are_config_errors() {
        assert!(matches!(
            Http::new(
                "openai",
                "OPENAI_API_KEY",
                HttpConfig::new("not a url", None)
            ),
            Err(ProviderError::Config(_))
        ));
        assert!(matches!(
            Http::new("openai", "OPENAI_API_KEY", HttpConfig::new("ftp://x", None)),
            Err(ProviderError::Config(_))
        ));
        assert!(
            Http::new(
                "openai",
                "OPENAI_API_KEY",
                HttpConfig::new("http://127.0.0.1:1/v1/", None)
            )
            .is_ok()
        );
    }

    #[test]
    fn the_key_is_not_printed() {
        let text = format!(
            "{:?}",
            HttpConfig::new("https://x", Some("sk-secret".into()))
        );
        assert!(!text.contains("sk-secret"));
    }
}
