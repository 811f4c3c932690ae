//! One wire document in, one wire document out: the whole of `switchboard dispatch` as a library
//! call, shared by the CLI and every front end (the sidecar server, the MCP server).
//!
//! [`dispatch_document`] parses the text as JSON, decodes its tool calls in the given
//! [`WireFormat`] (Anthropic: an assistant message, a Messages API response or a block array;
//! OpenAI: an assistant message, a chat completion or a `tool_calls` array), dispatches them on
//! an [`Engine`] or a [`Session`], and encodes what to append to the conversation. Tool failures
//! are inside the answer; a [`DocumentError`] means the document itself was refused (or the
//! engine failed) and nothing ran.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::engine::Session;
use crate::engine::{Engine, EngineError};
use crate::protocol::{self, ToolCall, ToolDispatchResult, WireFormat};

/// Why a document got no answer. Nothing of it ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// The text is not JSON, or not one of the accepted shapes.
    #[error("{0}")]
    Refused(String),
    /// The engine failed (shut down, an actor gone).
    #[error("the engine failed: {0}")]
    Engine(#[from] EngineError),
    /// The answer could not be encoded.
    #[error("cannot encode the results: {0}")]
    Encode(String),
}

/// What can dispatch a turn: an [`Engine`] (its shared schedulers) or a [`Session`].
pub trait Dispatcher {
    /// Dispatches one turn, cancellable with `cancel`.
    fn dispatch_turn(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<Vec<ToolDispatchResult>, EngineError>> + Send;
}

impl Dispatcher for Engine {
    fn dispatch_turn(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<Vec<ToolDispatchResult>, EngineError>> + Send {
        self.dispatch_with_cancel(calls, cancel)
    }
}

impl Dispatcher for Session {
    fn dispatch_turn(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<Vec<ToolDispatchResult>, EngineError>> + Send {
        self.dispatch_with_cancel(calls, cancel)
    }
}

/// Parses and decodes one document's tool calls, from the text, so that one call's arguments
/// that cannot be decoded (nested too deep, a number out of range) refuse only that call
/// ([`protocol::decode_json`]).
pub fn decode_document(format: WireFormat, text: &str) -> Result<Vec<ToolCall>, DocumentError> {
    protocol::decode_json(format, text).map_err(|e| DocumentError::Refused(e.to_string()))
}

/// Encodes a turn's results as the text to append to the conversation.
pub fn encode_document(
    format: WireFormat,
    results: &[ToolDispatchResult],
) -> Result<String, DocumentError> {
    let mut out = Vec::with_capacity(256);
    protocol::write_json(format, results, &mut out)
        .map_err(|e| DocumentError::Encode(e.to_string()))?;
    String::from_utf8(out).map_err(|e| DocumentError::Encode(e.to_string()))
}

/// Decodes one document, dispatches its calls on `target` (cancelled with `cancel`), and encodes
/// the answer: exactly what `switchboard dispatch` prints for it.
pub async fn dispatch_document(
    target: &impl Dispatcher,
    format: WireFormat,
    text: &str,
    cancel: CancellationToken,
) -> Result<String, DocumentError> {
    dispatch_document_with(format, text, |calls| target.dispatch_turn(calls, cancel)).await
}

/// [`dispatch_document`] with any way of dispatching the decoded calls (a streaming one: the
/// sidecar uses it). `dispatch` is called only when the document decoded.
pub async fn dispatch_document_with<F, Fut>(
    format: WireFormat,
    text: &str,
    dispatch: F,
) -> Result<String, DocumentError>
where
    F: FnOnce(Vec<ToolCall>) -> Fut,
    Fut: Future<Output = Result<Vec<ToolDispatchResult>, EngineError>>,
{
    let calls = decode_document(format, text)?;
    let results = dispatch(calls).await?;
    encode_document(format, &results)
}
