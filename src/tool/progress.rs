//! Live progress of a running call: a side channel that never changes the call's one result.
//!
//! A front end that wants progress makes a [`ProgressSink`] for a turn (a bounded channel) and
//! dispatches with it ([`crate::Session::dispatch_with_progress`]); every call of the turn that
//! runs then gets a live [`Progress`] handle in its [`crate::ToolContext`] (`ctx.progress`), an
//! inert one otherwise. A tool reports through it:
//!
//! * **output** ([`Progress::output`]): bytes a command wrote to stdout or stderr, as they come
//!   (`bash` tees both pipes here);
//! * **a progress value** ([`Progress::report`]): `progress`, an optional `total` and `message`,
//!   as MCP's `notifications/progress` carries them.
//!
//! Each [`ProgressEvent`] names the call (`tool_use_id`), carries a sequence number (1, 2, … per
//! call) and either output text (valid UTF-8, at most [`MAX_EVENT_TEXT`] bytes, cut at a line end
//! when it must be cut) or a value. The limits, so that a slow or absent reader never slows a
//! call nor holds unbounded memory:
//!
//! * a call sends at most one batch of events per [`MIN_INTERVAL`]; what comes meanwhile is
//!   coalesced (output appended, a value replaced by the newest) and sent when the interval is
//!   over — by a timer, so the last line of a quiet command is not held back;
//! * a call holds at most [`CALL_PENDING`] bytes of unsent output and a turn at most
//!   [`TURN_PENDING`]; what does not fit is dropped and counted: the next output event says how
//!   many bytes were left out before it (`dropped_bytes`);
//! * the sink's channel is bounded; a full channel leaves the output pending (within the caps
//!   above) and is tried again after the interval; nothing ever waits for the reader;
//! * when the call ends (answered, cancelled or timed out) the engine flushes what fits and
//!   closes the handle before the call's result is made: no progress event of a call follows its
//!   result, and nothing is sent after cancel. A call answered from memory or the journal (a
//!   retry) does not run, so it sends no progress.
//!
//! Every event sent is also a `progress` event on the call's tracing span and counted in
//! `switchboard_progress_events_total` / `_bytes_total` (`_dropped_bytes_total` for what the
//! caps left out).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::Span;

use crate::locks::lock;
use crate::metrics::ProgressMetrics;

/// The shortest time between two batches of one call's events.
pub const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// The most output text one event carries, in bytes.
pub const MAX_EVENT_TEXT: usize = 8 * 1024;
/// The most unsent output one call holds, in bytes.
pub const CALL_PENDING: usize = 64 * 1024;
/// The most unsent output the calls of one turn hold together, in bytes.
pub const TURN_PENDING: usize = 256 * 1024;

/// Which stream output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl OutputStream {
    /// `stdout` or `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }

    fn index(self) -> usize {
        match self {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        }
    }
}

/// What one progress event says.
#[derive(Debug, Clone, PartialEq)]
pub enum ProgressUpdate {
    /// Output the call's command wrote, as text.
    Output {
        /// The stream it came from.
        stream: OutputStream,
        /// The text (valid UTF-8; bytes that were not are replaced by U+FFFD).
        text: String,
    },
    /// A progress value.
    Value {
        /// How far the call is (in the tool's own unit).
        progress: f64,
        /// Out of how much, when known.
        total: Option<f64>,
        /// What it is doing, when it says.
        message: Option<String>,
    },
}

/// One progress event of a running call.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressEvent {
    /// The call's `tool_use_id`.
    pub tool_use_id: Arc<str>,
    /// 1 for the call's first event, then 2, 3, …
    pub seq: u64,
    /// Bytes of output the caps left out since the call's previous event.
    pub dropped_bytes: u64,
    /// What it says.
    pub update: ProgressUpdate,
}

impl ProgressEvent {
    /// The event as JSON, the shape of the sidecar's `event: progress` and of `dispatch
    /// --progress`: `{"tool_use_id", "seq", "kind": "output", "stream", "text"}` or
    /// `{"tool_use_id", "seq", "kind": "progress", "progress", "total"?, "message"?}`, with
    /// `"dropped_bytes"` when the caps left output out before it.
    pub fn to_json(&self) -> Value {
        let mut doc = match &self.update {
            ProgressUpdate::Output { stream, text } => json!({
                "tool_use_id": &*self.tool_use_id,
                "seq": self.seq,
                "kind": "output",
                "stream": stream.as_str(),
                "text": text,
            }),
            ProgressUpdate::Value {
                progress,
                total,
                message,
            } => {
                let mut doc = json!({
                    "tool_use_id": &*self.tool_use_id,
                    "seq": self.seq,
                    "kind": "progress",
                    "progress": progress,
                });
                if let Some(total) = total {
                    doc["total"] = json!(total);
                }
                if let Some(message) = message {
                    doc["message"] = json!(message);
                }
                doc
            }
        };
        if self.dropped_bytes > 0 {
            doc["dropped_bytes"] = json!(self.dropped_bytes);
        }
        doc
    }

    /// Bytes of output text it carries (0 for a value).
    pub fn text_len(&self) -> usize {
        match &self.update {
            ProgressUpdate::Output { text, .. } => text.len(),
            ProgressUpdate::Value { .. } => 0,
        }
    }
}

/// Where the progress of one turn's calls goes: the sending half of a bounded channel, shared
/// by the turn's calls, with the turn's budget of unsent output. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProgressSink {
    inner: Arc<SinkInner>,
}

#[derive(Debug)]
struct SinkInner {
    tx: mpsc::Sender<ProgressEvent>,
    /// Unsent output held by the turn's calls, in bytes (at most [`TURN_PENDING`]).
    pending: AtomicUsize,
}

impl SinkInner {
    /// Takes up to `want` bytes of the turn's budget; how many it got.
    fn reserve(&self, want: usize) -> usize {
        let mut held = self.pending.load(Ordering::Relaxed);
        loop {
            let got = want.min(TURN_PENDING.saturating_sub(held));
            if got == 0 {
                return 0;
            }
            match self.pending.compare_exchange_weak(
                held,
                held + got,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return got,
                Err(now) => held = now,
            }
        }
    }

    fn release(&self, n: usize) {
        if n > 0 {
            self.pending.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

impl ProgressSink {
    /// Events a sink buffers for its reader, as the sidecar's streamed turns use it.
    pub const DEFAULT_CAPACITY: usize = 64;

    /// A sink and the receiver its events arrive on, `capacity` events buffered (at least 1).
    pub fn channel(capacity: usize) -> (ProgressSink, mpsc::Receiver<ProgressEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let sink = ProgressSink {
            inner: Arc::new(SinkInner {
                tx,
                pending: AtomicUsize::new(0),
            }),
        };
        (sink, rx)
    }

    /// The live handle of one call of the turn.
    pub(crate) fn for_call(
        &self,
        tool_use_id: &Arc<str>,
        span: &Span,
        metrics: &ProgressMetrics,
    ) -> Progress {
        Progress(Some(Arc::new(CallProgress {
            tool_use_id: Arc::clone(tool_use_id),
            sink: Arc::clone(&self.inner),
            span: span.clone(),
            metrics: metrics.clone(),
            state: Mutex::new(State::default()),
        })))
    }
}

/// A call's progress handle ([`crate::ToolContext::progress`]): inert when nobody listens (every
/// method then returns at once), live when the turn was dispatched with a [`ProgressSink`].
/// Cheap to clone; never blocks.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<CallProgress>>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Progress").field(&self.is_on()).finish()
    }
}

impl Progress {
    /// Whether anybody listens (a tool may skip work that only feeds progress).
    pub fn is_on(&self) -> bool {
        self.0.as_ref().is_some_and(|c| !lock(&c.state).closed)
    }

    /// Output the call's command wrote to `stream` (any bytes: an incomplete UTF-8 character at
    /// the end waits for the rest, invalid bytes become U+FFFD).
    pub fn output(&self, stream: OutputStream, bytes: &[u8]) {
        if let Some(call) = &self.0
            && !bytes.is_empty()
        {
            call.push_output(stream, bytes);
        }
    }

    /// A progress value: `progress` so far, of `total` when known, with what it is doing.
    /// Values coalesce: when several come within 50 ms, the newest is sent.
    pub fn report(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        if let Some(call) = &self.0 {
            call.push_value(progress, total, message.map(str::to_string));
        }
    }

    /// Sends what fits of the pending output and closes the handle: nothing more is sent for
    /// this call. The engine calls it when the call ends, before its result is made.
    pub(crate) fn finish(&self) {
        if let Some(call) = &self.0 {
            call.finish();
        }
    }
}

struct CallProgress {
    tool_use_id: Arc<str>,
    sink: Arc<SinkInner>,
    span: Span,
    metrics: ProgressMetrics,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last event's sequence number.
    seq: u64,
    /// When the last batch was sent.
    last_sent: Option<Instant>,
    /// Unsent output per stream (stdout, stderr).
    out: [Vec<u8>; 2],
    /// The newest unsent value.
    value: Option<(f64, Option<f64>, Option<String>)>,
    /// Output bytes left out since the last event.
    dropped: u64,
    /// A timer will flush the pending output.
    timer: bool,
    /// Finished (or its reader is gone): nothing more is sent.
    closed: bool,
}

impl State {
    fn held(&self) -> usize {
        self.out[0].len() + self.out[1].len()
    }
}

impl CallProgress {
    fn push_output(self: &Arc<Self>, stream: OutputStream, bytes: &[u8]) {
        let mut st = lock(&self.state);
        if st.closed {
            return;
        }
        let room = CALL_PENDING.saturating_sub(st.held()).min(bytes.len());
        let take = self.sink.reserve(room);
        st.out[stream.index()].extend_from_slice(&bytes[..take]);
        let lost = bytes.len() - take;
        if lost > 0 {
            st.dropped += lost as u64;
            self.metrics.dropped(lost);
        }
        self.pump(&mut st, false);
    }

    fn push_value(self: &Arc<Self>, progress: f64, total: Option<f64>, message: Option<String>) {
        let mut st = lock(&self.state);
        if st.closed {
            return;
        }
        st.value = Some((progress, total, message));
        self.pump(&mut st, false);
    }

    fn finish(self: &Arc<Self>) {
        let mut st = lock(&self.state);
        if st.closed {
            return;
        }
        self.pump(&mut st, true);
        self.close(&mut st);
    }

    /// Drops whatever is still pending (counted) and sends nothing more.
    fn close(&self, st: &mut State) {
        let held = st.held();
        if held > 0 {
            self.metrics.dropped(held);
            self.sink.release(held);
        }
        st.out = Default::default();
        st.value = None;
        st.closed = true;
    }

    /// Sends the pending events that fit, unless the last batch was less than [`MIN_INTERVAL`]
    /// ago (then a timer sends them); `finishing` sends regardless of the interval.
    fn pump(self: &Arc<Self>, st: &mut State, finishing: bool) {
        let now = Instant::now();
        if !finishing
            && let Some(last) = st.last_sent
            && now < last + MIN_INTERVAL
        {
            self.arm(st, last + MIN_INTERVAL);
            return;
        }
        let mut sent = false;
        loop {
            let permit = match self.sink.tx.try_reserve() {
                Ok(permit) => permit,
                Err(mpsc::error::TrySendError::Full(())) => break,
                Err(mpsc::error::TrySendError::Closed(())) => {
                    // Nobody reads any more: stop collecting.
                    self.close(st);
                    return;
                }
            };
            let Some(update) = self.next_update(st, finishing) else {
                break;
            };
            st.seq += 1;
            let event = ProgressEvent {
                tool_use_id: Arc::clone(&self.tool_use_id),
                seq: st.seq,
                dropped_bytes: std::mem::take(&mut st.dropped),
                update,
            };
            let bytes = event.text_len();
            self.metrics.sent(bytes);
            tracing::debug!(
                parent: &self.span,
                gen_ai.tool.call.id = %self.tool_use_id,
                progress.seq = event.seq,
                progress.bytes = bytes,
                "progress"
            );
            permit.send(event);
            sent = true;
        }
        if sent {
            st.last_sent = Some(now);
        }
        if !finishing && (st.held() > 0 || st.value.is_some()) {
            // Held back by the channel, or an incomplete character: try again later.
            self.arm(st, now + MIN_INTERVAL);
        }
    }

    /// The next event's content out of the pending state, if any: the value first, then
    /// stdout, then stderr, each at most [`MAX_EVENT_TEXT`] bytes.
    fn next_update(&self, st: &mut State, finishing: bool) -> Option<ProgressUpdate> {
        if let Some((progress, total, message)) = st.value.take() {
            return Some(ProgressUpdate::Value {
                progress,
                total,
                message,
            });
        }
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let pending = &mut st.out[stream.index()];
            let end = cut(pending, finishing);
            if end == 0 {
                continue;
            }
            let chunk: Vec<u8> = pending.drain(..end).collect();
            self.sink.release(end);
            let text = match String::from_utf8(chunk) {
                Ok(text) => text,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            };
            return Some(ProgressUpdate::Output { stream, text });
        }
        None
    }

    /// A timer that pumps again at `at` (one per call at a time). Without a runtime (a tool's
    /// own thread) the pending output waits for the call's next output or its end.
    fn arm(self: &Arc<Self>, st: &mut State, at: Instant) {
        if st.timer {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        st.timer = true;
        let call = Arc::clone(self);
        runtime.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let mut st = lock(&call.state);
            st.timer = false;
            if !st.closed {
                call.pump(&mut st, false);
            }
        });
    }
}

/// How many bytes of `pending` the next event takes: all of it up to [`MAX_EVENT_TEXT`] —
/// cut after the last line end within the limit when there is more, else on a character
/// boundary — and, unless `finishing`, without an incomplete character at its end (it waits for
/// its other bytes).
fn cut(pending: &[u8], finishing: bool) -> usize {
    if pending.is_empty() {
        return 0;
    }
    if pending.len() > MAX_EVENT_TEXT {
        let window = &pending[..MAX_EVENT_TEXT];
        if let Some(nl) = memchr::memrchr(b'\n', window) {
            return nl + 1;
        }
        return MAX_EVENT_TEXT - incomplete_suffix(window);
    }
    if finishing {
        pending.len()
    } else {
        pending.len() - incomplete_suffix(pending)
    }
}

/// Length of an incomplete UTF-8 character at the end of `bytes`: the bytes from its lead byte
/// on, when fewer than the lead byte announces (0 when `bytes` ends on a whole character, or on
/// bytes that are no character at all, which the lossy decoding replaces).
fn incomplete_suffix(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        let len = match b {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if len > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests;
