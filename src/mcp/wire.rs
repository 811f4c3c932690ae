//! JSON-RPC over a byte stream, one message a line — MCP's stdio transport — for both ends: the
//! engine's client of a stdio server, and `mcp-serve`.
//!
//! It stands in for rmcp's `AsyncRwTransport`, which drops what it cannot read without a word:
//! a line over 16 MiB, text that is not JSON or not UTF-8, a lone surrogate escape, nesting
//! deeper than serde_json's 128 levels, a message of the wrong shape. A request it dropped was
//! never answered (`mcp-serve`), a response it dropped left its call waiting for the full
//! timeout (the client). Here every line is accounted for:
//!
//! * **A request from the peer that cannot be read is answered** with a JSON-RPC error carrying
//!   its id when the line's outline shows one ([`super::lines`]): `-32700` (parse error: not
//!   UTF-8, not JSON), `-32600` (invalid request: over the message limit, not a request object,
//!   a bad `jsonrpc`, `id` or `method`), `-32602` (invalid params: a method this end knows whose
//!   params do not decode, too deep included), `-32601` (method not found). `mcp-serve` also
//!   answers a line with no id at all (without an id); the client leaves a server's stray lines
//!   unanswered, as before.
//! * **(client) A response to one of our requests that cannot be read answers that request at
//!   once** with an error marked as ours ([`unreadable`]) that names the cause — or, for a
//!   `tools/list` page or a `tools/call` result, with what can be kept ([`super::recover`]).
//! * Notifications and responses that cannot be read are logged at debug and skipped.
//!
//! What each end does with a line it read is in `sides` (the [`Side`] of the client and of
//! `mcp-serve`); this file holds the transport itself.
//!
//! Writes go through one writer task, in order — rmcp's messages and the answers above — and
//! each `send` resolves once its line is written. [`JsonLines::close`] ends the writer, which
//! closes the stream (for a child process: its stdin).

use std::collections::HashMap;
use std::io;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{ErrorCode, ErrorData, RequestId};
use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::lines::{Line, LineReader, MAX_MESSAGE, Outline};

mod sides;

/// The `data` key that marks an error as made here for a response that could not be read.
const UNREADABLE: &str = "switchboard/unreadable_response";
/// How long closing waits for the writer to drain before it is dropped.
const CLOSE_DRAIN: Duration = Duration::from_secs(3);
/// Messages waiting for the writer.
const QUEUE: usize = 32;

/// The error a request is answered with when its response could not be read: `cause` says why.
pub(crate) fn unreadable(cause: impl Into<String>) -> ErrorData {
    ErrorData::new(
        ErrorCode::INTERNAL_ERROR,
        cause.into(),
        Some(json!({ UNREADABLE: true })),
    )
}

/// The cause, when `error` was made by [`unreadable`].
pub(crate) fn unreadable_cause(error: &ErrorData) -> Option<&str> {
    let marked = error
        .data
        .as_ref()
        .is_some_and(|d| d.get(UNREADABLE) == Some(&Value::Bool(true)));
    marked.then_some(error.message.as_ref())
}

/// Tools a `tools/list` page held that could not be read (raw name, or `#N` of the page, and
/// why): filled by the transport as it reads a page, taken by the listing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Unread(Arc<Mutex<Vec<(String, String)>>>);

impl Unread {
    /// Everything reported so far (and forgets it).
    pub(crate) fn take(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn extend(&self, tools: Vec<(String, String)>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(tools);
    }
}

/// What a request of ours asked, as far as reading its response goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    ToolsList,
    ToolsCall,
    Other,
}

/// What the two ends share: the client's requests in flight, and where unreadable tools go.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    asked: Mutex<HashMap<RequestId, Asked>>,
    pub unread: Unread,
}

impl Ledger {
    fn note(&self, id: RequestId, asked: Asked) {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, asked);
    }

    fn take(&self, id: &RequestId) -> Option<Asked> {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id)
    }
}

/// What to do with one line read.
pub(crate) enum Read<R: ServiceRole> {
    /// Hand this message to rmcp.
    Deliver(RxJsonRpcMessage<R>),
    /// Write this error back to the peer.
    Answer(TxJsonRpcMessage<R>),
    /// Nothing (logged).
    Skip,
}

/// What differs between the two ends.
pub(crate) trait Side: ServiceRole + Sized {
    /// The request methods this end serves: a request for one whose params do not decode is
    /// answered `-32602`.
    const SERVES: &'static [&'static str];
    /// Whether a line with no id at all is answered (without an id).
    const ANSWERS_ANONYMOUS: bool;
    /// Notes a message about to be sent.
    fn sending(item: &TxJsonRpcMessage<Self>, ledger: &Ledger);
    /// Decides what a whole line (trimmed, not empty) is.
    fn read(text: &[u8], ledger: &Ledger) -> Read<Self>;
    /// Decides what an oversized line is.
    fn oversized(len: u64, outline: Outline, ledger: &Ledger) -> Read<Self>;
}

/// A JSON-lines transport over `R` (reads) and a writer task (writes).
pub(crate) struct JsonLines<Role: Side, R> {
    reader: LineReader<R>,
    out: Option<mpsc::Sender<Outgoing>>,
    writer: Option<JoinHandle<()>>,
    /// An answer waiting for room in the write queue (kept here so a cancelled `receive` loses
    /// nothing).
    answer: Option<Vec<u8>>,
    ledger: Arc<Ledger>,
    _role: PhantomData<fn() -> Role>,
}

type Outgoing = (Vec<u8>, Option<oneshot::Sender<io::Result<()>>>);

impl<Role: Side, R: AsyncRead + Unpin + Send> JsonLines<Role, R> {
    /// Reads messages from `read`, writes them to `write`. Must be called inside a tokio runtime.
    pub(crate) fn new<W: AsyncWrite + Unpin + Send + 'static>(read: R, write: W) -> Self {
        let (out, queue) = mpsc::channel(QUEUE);
        JsonLines {
            reader: LineReader::new(read, MAX_MESSAGE),
            out: Some(out),
            writer: Some(tokio::spawn(write_lines(write, queue))),
            answer: None,
            ledger: Arc::default(),
            _role: PhantomData,
        }
    }

    /// Where the tools of a `tools/list` page that could not be read are reported.
    pub(crate) fn unread(&self) -> Unread {
        self.ledger.unread.clone()
    }
}

async fn write_lines<W: AsyncWrite + Unpin>(mut write: W, mut queue: mpsc::Receiver<Outgoing>) {
    while let Some((line, done)) = queue.recv().await {
        let written = async {
            write.write_all(&line).await?;
            write.flush().await
        }
        .await;
        let failed = written.is_err();
        if let Some(done) = done {
            let _ = done.send(written);
        }
        if failed {
            return;
        }
    }
    let _ = write.shutdown().await;
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the transport is closed")
}

impl<Role: Side, R: AsyncRead + Unpin + Send + 'static> Transport<Role> for JsonLines<Role, R> {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<Role>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        Role::sending(&item, &self.ledger);
        let line = encode(&item);
        let out = self.out.clone();
        async move {
            let line = line?;
            let out = out.ok_or_else(closed)?;
            let (done, written) = oneshot::channel();
            out.send((line, Some(done))).await.map_err(|_| closed())?;
            written.await.map_err(|_| closed())?
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<Role>> {
        loop {
            if self.answer.is_some() {
                let permit = self.out.as_ref()?.reserve().await.ok()?;
                if let Some(answer) = self.answer.take() {
                    permit.send((answer, None));
                }
            }
            let read = match self.reader.next().await? {
                Line::Oversized { len, outline } => Role::oversized(len, outline, &self.ledger),
                Line::Whole(line) => {
                    let text = trim(&line);
                    if text.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    Role::read(text, &self.ledger)
                }
            };
            match read {
                Read::Deliver(message) => return Some(message),
                Read::Answer(message) => self.answer = encode(&message).ok(),
                Read::Skip => {}
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        drop(self.out.take());
        if let Some(mut writer) = self.writer.take()
            && tokio::time::timeout(CLOSE_DRAIN, &mut writer)
                .await
                .is_err()
        {
            writer.abort();
        }
        Ok(())
    }
}

fn encode<T: serde::Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    Ok(line)
}

/// A line without its `\r`, and without a leading byte order mark.
fn trim(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
}
