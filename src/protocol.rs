//! Wire formats: provider turns in, `tool_result`s out.
//!
//! This module owns the two shapes that cross the dispatch boundary: [`ToolCall`] (what the model
//! asked for, untrusted) and [`ToolDispatchResult`] (exactly one answer per call). It decodes calls
//! from Anthropic Messages and OpenAI Chat Completions payloads and encodes results back into them.
//! Nothing here runs a tool; decoding never fails on a single bad block — a block that cannot be
//! made into a valid call still becomes a call, which the scheduler answers with an error.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

mod cap;
// One wire document in, one out: the front ends' path through the engine. Its file is
// `src/document.rs`, in the conversation layer (it uses the engine); nested here for embedders.
mod content;
#[path = "document.rs"]
pub mod document;
mod raw;
mod tool_error;

pub use cap::cap_output;
#[cfg(test)]
pub(crate) use content::TINY_PNG;
pub use content::{Block, Image, ToolOutput, ToolReference, image_note};
pub use tool_error::ToolError;

/// Deepest nesting of a call's arguments that is decoded (serde_json's recursion limit: a
/// document nesting deeper cannot be parsed). Deeper arguments make their call malformed.
pub const MAX_ARGUMENT_DEPTH: usize = 127;

/// Stable error codes. They are an API: never rename one. `#[non_exhaustive]`: a new code may be
/// added (a `match` needs a wildcard arm), an existing one is never renamed or removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// No tool of that exact name is registered.
    UnknownTool,
    /// Input not an object, schema violation, bad or duplicate `tool_use_id`.
    InvalidArguments,
    /// Refused by policy: a path outside the workspace, a denied command.
    PermissionDenied,
    /// The handler ran and failed, or panicked.
    ExecutionError,
    /// The call outlived its deadline.
    Timeout,
    /// The session or turn was cancelled before or while the call ran.
    Cancelled,
    /// Refused by backpressure; nothing ran.
    Overloaded,
    /// The engine stopped (or its journal could not record the answer) while this call was
    /// running; it may or may not have taken effect (a retried side-effect call that had
    /// started, found in the journal with no result).
    OutcomeUnknown,
    /// Cluster mode: the session moved to a node where its workspace directory does not exist
    /// (the workspace root is not shared by every node); nothing ran.
    WorkspaceLost,
}

impl ErrorCode {
    /// Every code, in a fixed order (handy for tables and metrics).
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::UnknownTool,
        ErrorCode::InvalidArguments,
        ErrorCode::PermissionDenied,
        ErrorCode::ExecutionError,
        ErrorCode::Timeout,
        ErrorCode::Cancelled,
        ErrorCode::Overloaded,
        ErrorCode::OutcomeUnknown,
        ErrorCode::WorkspaceLost,
    ];

    /// The snake_case wire name, e.g. `invalid_arguments`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::ExecutionError => "execution_error",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::WorkspaceLost => "workspace_lost",
        }
    }

    /// Parses a wire name back into a code.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tool call as the model sent it. The arguments are untrusted JSON: the engine validates them
/// against the tool's schema before any handler sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The provider's call id (`tool_use.id` or `tool_calls[].id`). May be empty if the model sent
    /// none; such a call is answered `invalid_arguments`.
    pub id: Arc<str>,
    /// The tool name exactly as sent (no trimming, no case folding).
    pub name: Arc<str>,
    /// The arguments, untrusted. `Value::Null` when [`ToolCall::malformed`] is set.
    pub arguments: Value,
    /// Set when the arguments could not be decoded at all (e.g. an OpenAI `function.arguments`
    /// string that is not JSON). The call is answered `invalid_arguments` with this detail.
    pub malformed: Option<String>,
    /// The turn the client named this call's turn (the sidecar's `turn_id`), when it named one:
    /// then the call's identity in its session is the turn and the `tool_use_id` together — a
    /// retry re-sends the same turn id, and a new turn that reuses an old `tool_use_id` is a new
    /// call ([`ToolCall::in_turn`]; see `docs/retries.md`).
    pub turn: Option<Arc<str>>,
}

impl ToolCall {
    /// A call with decoded arguments.
    pub fn new(id: impl Into<Arc<str>>, name: impl Into<Arc<str>>, arguments: Value) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
            malformed: None,
            turn: None,
        }
    }

    /// The call as part of turn `turn` (its identity is then the turn and its id together).
    pub fn in_turn(mut self, turn: impl Into<Arc<str>>) -> Self {
        self.turn = Some(turn.into());
        self
    }

    /// A call whose arguments could not be decoded; it will be answered `invalid_arguments`.
    pub fn with_malformed_arguments(
        id: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        detail: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: Value::Null,
            malformed: Some(detail.into()),
            turn: None,
        }
    }
}

/// Time a call spent waiting and running.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// From the turn arriving at the scheduler to the handler starting (zero if it never ran).
    pub queued: Duration,
    /// The handler's own run time (zero if it never ran).
    pub run: Duration,
    /// True when a handler ran (false for calls answered without running: unknown tool,
    /// invalid arguments, refused, cancelled before starting).
    pub ran: bool,
}

impl Timing {
    /// The timing of a handler that started at `started`, for a turn that arrived at `arrived`,
    /// measured now that it has ended.
    pub fn measured(arrived: std::time::Instant, started: std::time::Instant) -> Timing {
        Timing {
            queued: started.saturating_duration_since(arrived),
            run: started.elapsed(),
            ran: true,
        }
    }
}

/// The one answer to one call.
///
/// It carries the call's identity (id and name) rather than the whole call: the arguments were
/// moved into the handler, never cloned.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDispatchResult {
    /// The `tool_use_id` this answers.
    pub tool_use_id: Arc<str>,
    /// The tool name as the model sent it.
    pub tool_name: Arc<str>,
    /// What the model reads, as text. On failure: `Error [<code>]: <detail>`. With an image,
    /// its text rendering (each image as a `[image: …, not shown]` note): what OpenAI tool
    /// messages carry.
    pub content: String,
    /// `Some` only for a successful result that carries an image or a tool reference: its text,
    /// image and reference blocks in order (what an Anthropic `tool_result` carries). `None` for
    /// every all-text result and every error. See [`ToolOutput`] for how images count against the output cap.
    pub blocks: Option<Box<[Block]>>,
    /// `None` on success; the typed code on failure.
    pub error: Option<ErrorCode>,
    /// Queue wait and run time.
    pub timing: Timing,
}

impl ToolDispatchResult {
    /// A successful result.
    pub fn ok(call_id: Arc<str>, name: Arc<str>, content: String, timing: Timing) -> Self {
        ToolDispatchResult {
            tool_use_id: call_id,
            tool_name: name,
            content,
            blocks: None,
            error: None,
            timing,
        }
    }

    /// A successful result from a handler's (already capped) output.
    pub fn from_output(
        call_id: Arc<str>,
        name: Arc<str>,
        output: ToolOutput,
        timing: Timing,
    ) -> Self {
        let (content, blocks) = output.into_parts();
        ToolDispatchResult {
            tool_use_id: call_id,
            tool_name: name,
            content,
            blocks,
            error: None,
            timing,
        }
    }

    /// A failed result; `content` becomes `Error [<code>]: <detail>`.
    pub fn error(
        call_id: Arc<str>,
        name: Arc<str>,
        code: ErrorCode,
        detail: &str,
        timing: Timing,
    ) -> Self {
        ToolDispatchResult {
            tool_use_id: call_id,
            tool_name: name,
            content: format!("Error [{}]: {}", code.as_str(), detail),
            blocks: None,
            error: Some(code),
            timing,
        }
    }

    /// The same failure for every call of `calls` (`(tool_use_id, tool name)`, in order): what
    /// a turn that never reached the engine is answered.
    pub fn all_failed(
        calls: impl IntoIterator<Item = (Arc<str>, Arc<str>)>,
        code: ErrorCode,
        detail: &str,
    ) -> Vec<ToolDispatchResult> {
        calls
            .into_iter()
            .map(|(id, name)| ToolDispatchResult::error(id, name, code, detail, Timing::default()))
            .collect()
    }

    /// True when the call succeeded.
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }

    /// The outcome label: `ok` or the error code.
    pub fn outcome(&self) -> &'static str {
        self.error.map_or("ok", ErrorCode::as_str)
    }

    /// Encodes as an Anthropic `tool_result` content block (`is_error` only on failure). Its
    /// `content` is the text as a string, or, when the result carries an image, an array of
    /// `text` and `image` blocks.
    pub fn to_anthropic_block(&self) -> Value {
        let mut block = Map::with_capacity(4);
        block.insert("type".into(), Value::from("tool_result"));
        block.insert("tool_use_id".into(), Value::from(&*self.tool_use_id));
        let content = match &self.blocks {
            None => Value::from(self.content.as_str()),
            Some(blocks) => blocks.iter().map(Block::to_anthropic).collect(),
        };
        block.insert("content".into(), content);
        if self.error.is_some() {
            block.insert("is_error".into(), Value::Bool(true));
        }
        Value::Object(block)
    }

    /// Encodes as an OpenAI Chat Completions `{"role":"tool"}` message: always text (tool
    /// messages carry no images; an image is its note).
    pub fn to_openai_message(&self) -> Value {
        json!({
            "role": "tool",
            "tool_call_id": &*self.tool_use_id,
            "content": self.content,
        })
    }
}

/// The two wire formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// Anthropic Messages (primary).
    #[default]
    Anthropic,
    /// OpenAI Chat Completions.
    OpenAi,
}

/// A payload that is not one of the accepted shapes. Only the whole document can be refused; a
/// bad individual block still becomes a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// Decodes tool calls from an Anthropic payload: an assistant message (`{"role":"assistant",
/// "content":[…]}`), a Messages API response (`{"type":"message","content":[…],
/// "stop_reason":…}`), or a bare array of content blocks. Blocks other than `tool_use` are skipped.
pub fn decode_anthropic(doc: &Value) -> Result<Vec<ToolCall>, DecodeError> {
    let blocks = match doc {
        Value::Array(blocks) => blocks,
        Value::Object(obj) => match obj.get("content") {
            Some(Value::Array(blocks)) => blocks,
            // A plain-text assistant message has no tool calls.
            Some(Value::String(_)) => return Ok(Vec::new()),
            Some(_) => {
                return Err(DecodeError(
                    "`content` must be an array of content blocks or a string".into(),
                ));
            }
            None => {
                return Err(DecodeError(
                    "expected an assistant message, a Messages API response or an array of content blocks (no `content` field)".into(),
                ));
            }
        },
        _ => {
            return Err(DecodeError(
                "expected a JSON object or array of content blocks".into(),
            ));
        }
    };
    Ok(blocks.iter().filter_map(anthropic_block_to_call).collect())
}

fn anthropic_block_to_call(block: &Value) -> Option<ToolCall> {
    let obj = block.as_object()?;
    if obj.get("type").and_then(Value::as_str) != Some("tool_use") {
        return None;
    }
    let id = str_field(obj, "id");
    let name = str_field(obj, "name");
    Some(match obj.get("input") {
        Some(input) if too_deep(input) => {
            ToolCall::with_malformed_arguments(id, name, deep_detail("tool_use input"))
        }
        Some(input) => ToolCall::new(id, name, input.clone()),
        None => ToolCall::with_malformed_arguments(id, name, "tool_use block has no `input`"),
    })
}

/// Decodes tool calls from an OpenAI Chat Completions payload: an assistant message with
/// `tool_calls`, a whole completion response (`choices[0].message`), or a bare `tool_calls` array.
/// `function.arguments` is a JSON *string*; one that does not parse gives a call marked malformed.
pub fn decode_openai(doc: &Value) -> Result<Vec<ToolCall>, DecodeError> {
    let message = match doc {
        Value::Object(obj) if obj.contains_key("choices") => obj
            .get("choices")
            .and_then(|c| c.get(0))
            .and_then(|c| c.get("message"))
            .ok_or_else(|| DecodeError("`choices[0].message` is missing".into()))?,
        other => other,
    };
    let tool_calls = match message {
        Value::Array(calls) => calls,
        Value::Object(obj) => match obj.get("tool_calls") {
            Some(Value::Array(calls)) => calls,
            None | Some(Value::Null) if obj.contains_key("role") || obj.contains_key("content") => {
                return Ok(Vec::new());
            }
            Some(_) => return Err(DecodeError("`tool_calls` must be an array".into())),
            None => {
                return Err(DecodeError(
                    "expected an assistant message with `tool_calls`, a chat completion or an array of tool calls".into(),
                ));
            }
        },
        _ => {
            return Err(DecodeError(
                "expected a JSON object or array of tool calls".into(),
            ));
        }
    };
    Ok(tool_calls.iter().filter_map(openai_call_to_call).collect())
}

fn openai_call_to_call(call: &Value) -> Option<ToolCall> {
    let obj = call.as_object()?;
    if let Some(kind) = obj.get("type").and_then(Value::as_str)
        && kind != "function"
    {
        return None;
    }
    let id = str_field(obj, "id");
    let Some(function) = obj.get("function").and_then(Value::as_object) else {
        return Some(ToolCall::with_malformed_arguments(
            id,
            "",
            "tool call has no `function` object",
        ));
    };
    let name = str_field(function, "name");
    Some(match function.get("arguments") {
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(args) => ToolCall::new(id, name, args),
            Err(e) => ToolCall::with_malformed_arguments(
                id,
                name,
                format!("function.arguments is not valid JSON: {e}"),
            ),
        },
        // Some servers send an already-decoded object; accept it as is.
        Some(args @ Value::Object(_)) if too_deep(args) => {
            ToolCall::with_malformed_arguments(id, name, deep_detail("function.arguments"))
        }
        Some(Value::Object(args)) => ToolCall::new(id, name, Value::Object(args.clone())),
        Some(_) => {
            ToolCall::with_malformed_arguments(id, name, "function.arguments must be a JSON string")
        }
        None => ToolCall::with_malformed_arguments(id, name, "function.arguments is missing"),
    })
}

/// True when `value` nests deeper than [`MAX_ARGUMENT_DEPTH`] (measured without recursion, so
/// any depth is safe to ask about).
fn too_deep(value: &Value) -> bool {
    let mut pending: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(members) => Box::new(members.values()),
            _ => continue,
        };
        if depth + 1 > MAX_ARGUMENT_DEPTH {
            return true;
        }
        pending.extend(children.map(|child| (child, depth + 1)));
    }
    false
}

fn deep_detail(what: &str) -> String {
    format!("{what} nests deeper than {MAX_ARGUMENT_DEPTH} levels")
}

fn str_field(obj: &Map<String, Value>, key: &str) -> Arc<str> {
    match obj.get(key) {
        Some(Value::String(s)) => Arc::from(s.as_str()),
        _ => Arc::from(""),
    }
}

/// Decodes the tool calls of a document given as JSON text, in either format: what `dispatch`
/// uses, and what a caller holding the raw bytes of a turn should use. Unlike parsing the text
/// into a `Value` first, a call whose arguments cannot be decoded (nesting deeper than
/// [`MAX_ARGUMENT_DEPTH`], a number beyond `f64` such as `1e309`) becomes a malformed call for
/// that call alone, answered `invalid_arguments`; the rest of the turn runs. Parts of the
/// document the decoder does not read (text blocks, unknown fields) may nest to any depth without
/// using stack. Errors name the whole document: `input is not valid JSON: …` or
/// `unexpected input shape: …`.
pub fn decode_json(format: WireFormat, text: &str) -> Result<Vec<ToolCall>, DecodeError> {
    raw::decode(format, text)
}

/// Decodes with the given format.
pub fn decode(format: WireFormat, doc: &Value) -> Result<Vec<ToolCall>, DecodeError> {
    match format {
        WireFormat::Anthropic => decode_anthropic(doc),
        WireFormat::OpenAi => decode_openai(doc),
    }
}

/// The Anthropic message to append after a turn: `{"role":"user","content":[tool_result…]}`, the
/// results in call order.
pub fn encode_anthropic(results: &[ToolDispatchResult]) -> Value {
    json!({
        "role": "user",
        "content": results.iter().map(ToolDispatchResult::to_anthropic_block).collect::<Vec<_>>(),
    })
}

/// The OpenAI messages to append after a turn: one `{"role":"tool"}` message per call, in order.
pub fn encode_openai(results: &[ToolDispatchResult]) -> Value {
    Value::Array(
        results
            .iter()
            .map(ToolDispatchResult::to_openai_message)
            .collect(),
    )
}

#[derive(serde::Serialize)]
struct AnthropicBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    tool_use_id: &'a str,
    content: content::WireContent<'a>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    is_error: bool,
}

#[derive(serde::Serialize)]
struct AnthropicMessage<'a> {
    role: &'static str,
    content: Vec<AnthropicBlock<'a>>,
}

#[derive(serde::Serialize)]
struct OpenAiMessage<'a> {
    role: &'static str,
    tool_call_id: &'a str,
    content: &'a str,
}

/// Writes the same JSON as [`encode`] straight to bytes, without building a `Value` (the fast
/// path for a harness that sends the bytes on; what `dispatch` prints).
pub fn write_json(
    format: WireFormat,
    results: &[ToolDispatchResult],
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    match format {
        WireFormat::Anthropic => serde_json::to_writer(
            out,
            &AnthropicMessage {
                role: "user",
                content: results
                    .iter()
                    .map(|r| AnthropicBlock {
                        kind: "tool_result",
                        tool_use_id: &r.tool_use_id,
                        content: content::WireContent::of(&r.content, r.blocks.as_deref()),
                        is_error: r.error.is_some(),
                    })
                    .collect(),
            },
        ),
        WireFormat::OpenAi => serde_json::to_writer(
            out,
            &results
                .iter()
                .map(|r| OpenAiMessage {
                    role: "tool",
                    tool_call_id: &r.tool_use_id,
                    content: &r.content,
                })
                .collect::<Vec<_>>(),
        ),
    }
}

/// Encodes with the given format.
pub fn encode(format: WireFormat, results: &[ToolDispatchResult]) -> Value {
    match format {
        WireFormat::Anthropic => encode_anthropic(results),
        WireFormat::OpenAi => encode_openai(results),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_message_yields_only_tool_use_blocks() {
        let doc = json!({"role":"assistant","content":[
            {"type":"text","text":"hi"},
            {"type":"tool_use","id":"a","name":"glob","input":{"pattern":"*"}},
            {"type":"thinking","thinking":"…"},
            {"type":"tool_use","id":"b","name":"bash","input":{"command":"ls"}}
        ]});
        let calls = decode_anthropic(&doc).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(&*calls[0].id, "a");
        assert_eq!(&*calls[1].name, "bash");
    }

    #[test]
    fn messages_response_and_bare_array_decode_alike() {
        let blocks = json!([{"type":"tool_use","id":"x","name":"t","input":{}}]);
        let response = json!({"type":"message","content": blocks.clone(),"stop_reason":"tool_use"});
        assert_eq!(
            decode_anthropic(&blocks).unwrap(),
            decode_anthropic(&response).unwrap()
        );
    }

    #[test]
    fn anthropic_shape_errors_are_refused_whole() {
        assert!(decode_anthropic(&json!(42)).is_err());
        assert!(decode_anthropic(&json!({"role":"assistant"})).is_err());
        assert!(decode_anthropic(&json!({"content": 3})).is_err());
        assert!(
            decode_anthropic(&json!({"role":"assistant","content":"just text"}))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn openai_arguments_that_are_not_json_mark_only_that_call() {
        let doc = json!({"role":"assistant","tool_calls":[
            {"id":"1","type":"function","function":{"name":"glob","arguments":"{\"pattern\":\"*\"}"}},
            {"id":"2","type":"function","function":{"name":"glob","arguments":"{not json"}}
        ]});
        let calls = decode_openai(&doc).unwrap();
        assert_eq!(calls[0].arguments, json!({"pattern":"*"}));
        assert!(calls[0].malformed.is_none());
        assert!(
            calls[1]
                .malformed
                .as_deref()
                .unwrap()
                .contains("not valid JSON")
        );
    }

    #[test]
    fn error_results_encode_with_is_error_and_code_prefix() {
        let r = ToolDispatchResult::error(
            "c1".into(),
            "nope".into(),
            ErrorCode::UnknownTool,
            "tool is not registered: nope",
            Timing::default(),
        );
        assert_eq!(
            r.to_anthropic_block(),
            json!({"type":"tool_result","tool_use_id":"c1","content":"Error [unknown_tool]: tool is not registered: nope","is_error":true})
        );
        let ok = ToolDispatchResult::ok("c2".into(), "t".into(), "fine".into(), Timing::default());
        assert_eq!(ok.to_anthropic_block().get("is_error"), None);
        assert_eq!(
            ok.to_openai_message(),
            json!({"role":"tool","tool_call_id":"c2","content":"fine"})
        );
    }

    #[test]
    fn fast_encoding_writes_the_same_json_as_the_value_encoding() {
        let results = vec![
            ToolDispatchResult::ok(
                "a".into(),
                "t".into(),
                "quote \" and \n".into(),
                Timing::default(),
            ),
            ToolDispatchResult::error(
                "b".into(),
                "t".into(),
                ErrorCode::Timeout,
                "slow",
                Timing::default(),
            ),
        ];
        for format in [WireFormat::Anthropic, WireFormat::OpenAi] {
            let mut bytes = Vec::new();
            write_json(format, &results, &mut bytes).unwrap();
            let parsed: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(parsed, encode(format, &results));
        }
    }

    fn with_image() -> ToolDispatchResult {
        let output = ToolOutput::blocks([
            Block::text("before"),
            Block::image("image/png", TINY_PNG),
            Block::text("after"),
        ]);
        ToolDispatchResult::from_output(
            "i".into(),
            "shot".into(),
            output.capped(50_000),
            Timing::default(),
        )
    }

    #[test]
    fn an_image_result_is_an_array_of_blocks_for_anthropic_and_a_note_for_openai() {
        let r = with_image();
        assert_eq!(
            r.to_anthropic_block(),
            json!({"type": "tool_result", "tool_use_id": "i", "content": [
                {"type": "text", "text": "before"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": TINY_PNG}},
                {"type": "text", "text": "after"}
            ]})
        );
        let note = format!(
            "[image: image/png, {} bytes base64, not shown]",
            TINY_PNG.len()
        );
        assert_eq!(
            r.to_openai_message(),
            json!({"role": "tool", "tool_call_id": "i", "content": format!("before\n{note}\nafter")})
        );
        let results = [
            r,
            ToolDispatchResult::ok("t".into(), "x".into(), "text".into(), Timing::default()),
        ];
        for format in [WireFormat::Anthropic, WireFormat::OpenAi] {
            let mut bytes = Vec::new();
            write_json(format, &results, &mut bytes).unwrap();
            let parsed: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(parsed, encode(format, &results));
        }
    }

    #[test]
    fn text_results_are_written_as_before_byte_for_byte() {
        let results = [
            ToolDispatchResult::ok("a".into(), "t".into(), "hi".into(), Timing::default()),
            ToolDispatchResult::error(
                "b".into(),
                "t".into(),
                ErrorCode::Timeout,
                "slow",
                Timing::default(),
            ),
        ];
        let mut bytes = Vec::new();
        write_json(WireFormat::Anthropic, &results, &mut bytes).unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"hi"},{"type":"tool_result","tool_use_id":"b","content":"Error [timeout]: slow","is_error":true}]}"#
        );
    }

    #[test]
    fn error_codes_round_trip_their_wire_names() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
    }
}
