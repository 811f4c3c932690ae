//! `ToolSpec`: the single source of a tool — name, description, input schema, handler and policy.
//!
//! The model catalog and the executor both come from a `ToolSpec`; nothing keeps a second list. A
//! handler is one of three kinds, and the kind decides where it runs:
//!
//! * [`Handler::Inline`] — synchronous and cheap (microseconds). Runs where the call lands (in the
//!   scheduler or worker), with no task spawned. It cannot be interrupted, so its timeout is not
//!   enforced: use it only for work that never blocks.
//! * [`Handler::Async`] — a future. Spawned as its own task, under its deadline and cancellation.
//! * [`Handler::Blocking`] — synchronous work that may block (file I/O). Runs on tokio's blocking
//!   pool so it never stalls the async runtime. On timeout the call is answered at once; the thread
//!   finishes in the background and its result is dropped.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::protocol::ErrorCode;

/// What a handler returns: the content the model reads, or a typed error.
pub type ToolOutcome = Result<String, ToolError>;

/// A handler's failure: a stable code and a human-readable detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// The stable code.
    pub code: ErrorCode,
    /// The detail after `Error [<code>]: `.
    pub detail: String,
}

impl ToolError {
    /// An error with any code.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        ToolError {
            code,
            detail: detail.into(),
        }
    }
    /// `execution_error`: the handler ran and failed.
    pub fn execution(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::ExecutionError, detail)
    }
    /// `permission_denied`: refused by policy.
    pub fn permission(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::PermissionDenied, detail)
    }
    /// `invalid_arguments`: the arguments passed the schema but still cannot be used.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArguments, detail)
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error [{}]: {}", self.code, self.detail)
    }
}

impl std::error::Error for ToolError {}

/// What a handler knows about the call it serves.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The call's `tool_use_id`.
    pub call_id: Arc<str>,
    /// When the call must be answered by (its policy timeout from the moment it started).
    pub deadline: Instant,
    /// Cancelled when the turn, the session or the engine is cancelled. Long-running handlers should
    /// watch it (`select!`) and stop promptly; the engine answers the call `cancelled` either way.
    pub cancel: CancellationToken,
}

/// Synchronous handler signature (inline and blocking kinds).
pub type SyncHandlerFn = dyn Fn(&Value, &ToolContext) -> ToolOutcome + Send + Sync;
/// Async handler signature: owns its arguments (moved out of the call, never cloned).
pub type AsyncHandlerFn =
    dyn Fn(Value, ToolContext) -> BoxFuture<'static, ToolOutcome> + Send + Sync;

/// How a tool runs. See the module docs for where each kind executes.
#[derive(Clone)]
pub enum Handler {
    /// Cheap synchronous work, run in place.
    Inline(Arc<SyncHandlerFn>),
    /// A future, spawned with a deadline and cancellation.
    Async(Arc<AsyncHandlerFn>),
    /// Blocking synchronous work, run on the blocking pool.
    Blocking(Arc<SyncHandlerFn>),
}

impl Handler {
    /// Wraps a cheap synchronous function.
    pub fn inline<F>(f: F) -> Self
    where
        F: Fn(&Value, &ToolContext) -> ToolOutcome + Send + Sync + 'static,
    {
        Handler::Inline(Arc::new(f))
    }

    /// Wraps an async function.
    pub fn future<F, Fut>(f: F) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutcome> + Send + 'static,
    {
        Handler::Async(Arc::new(move |args, ctx| Box::pin(f(args, ctx))))
    }

    /// Wraps a synchronous function that may block.
    pub fn blocking<F>(f: F) -> Self
    where
        F: Fn(&Value, &ToolContext) -> ToolOutcome + Send + Sync + 'static,
    {
        Handler::Blocking(Arc::new(f))
    }

    /// True for the inline kind.
    pub fn is_inline(&self) -> bool {
        matches!(self, Handler::Inline(_))
    }

    /// The kind's name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Handler::Inline(_) => "inline",
            Handler::Async(_) => "async",
            Handler::Blocking(_) => "blocking",
        }
    }
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handler::{}", self.kind())
    }
}

/// Execution policy of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolPolicy {
    /// May run at the same time as neighbouring concurrency-safe calls of the same turn.
    pub concurrency_safe: bool,
    /// Deadline from the moment the handler starts (async and blocking handlers).
    pub timeout: Duration,
    /// Largest `content` handed back, in bytes; longer output keeps head and tail around a
    /// `… N bytes truncated …` marker.
    pub output_cap: usize,
    /// At most this many calls of this tool run at once (async and blocking handlers); `None`:
    /// only the engine's global cap applies. Calls beyond it wait in a bounded line, then are
    /// answered `overloaded`.
    pub max_concurrency: Option<usize>,
}

impl Default for ToolPolicy {
    /// Not concurrency-safe (the conservative choice), 120 s timeout, 50,000-byte output cap,
    /// no per-tool concurrency cap.
    fn default() -> Self {
        ToolPolicy {
            concurrency_safe: false,
            timeout: Duration::from_secs(120),
            output_cap: 50_000,
            max_concurrency: None,
        }
    }
}

/// One tool: the single source of its catalog entry and its execution.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// What the model reads about the tool.
    pub description: String,
    /// A JSON Schema object schema for the arguments.
    pub input_schema: Value,
    /// The implementation.
    pub handler: Handler,
    /// Concurrency safety, timeout, output cap.
    pub policy: ToolPolicy,
}

impl ToolSpec {
    /// A spec with the default policy (serial, 120 s, 50,000 bytes).
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        handler: Handler,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema,
            handler,
            policy: ToolPolicy::default(),
        }
    }

    /// Marks the tool concurrency-safe (read-only, no shared effects).
    pub fn concurrency_safe(mut self, safe: bool) -> Self {
        self.policy.concurrency_safe = safe;
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.policy.timeout = timeout;
        self
    }

    /// Sets the output cap in bytes.
    pub fn output_cap(mut self, bytes: usize) -> Self {
        self.policy.output_cap = bytes;
        self
    }

    /// Caps how many calls of this tool run at once.
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.policy.max_concurrency = Some(n.max(1));
        self
    }
}

/// Cuts `text` to at most about `cap` bytes, keeping the head and the tail around a
/// `… N bytes truncated …` marker. Cuts fall on UTF-8 character boundaries.
pub fn cap_output(text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let keep_head = cap / 2;
    let keep_tail = cap - keep_head;
    let mut head_end = keep_head;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - keep_tail;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let dropped = tail_start - head_end;
    format!(
        "{}\n… {dropped} bytes truncated …\n{}",
        &text[..head_end],
        &text[tail_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_untouched() {
        assert_eq!(cap_output("abc".into(), 10), "abc");
    }

    #[test]
    fn long_output_keeps_head_and_tail_on_char_boundaries() {
        let text = "é".repeat(100); // 200 bytes
        let capped = cap_output(text, 51);
        assert!(capped.starts_with('é') && capped.ends_with('é'));
        assert!(capped.contains("bytes truncated"));
        let (head, rest) = capped.split_once("\n… ").unwrap();
        let (marker, tail) = rest.split_once(" …\n").unwrap();
        let dropped: usize = marker.split(' ').next().unwrap().parse().unwrap();
        assert_eq!(head.len() + dropped + tail.len(), 200);
        assert!(head.len() + tail.len() <= 51);
    }
}
