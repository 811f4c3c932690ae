//! Decoding a provider turn from its JSON *text*, so that one call's arguments cannot refuse the
//! whole turn.
//!
//! Parsing a whole document into a `Value` fails as a whole when any part of it nests deeper than
//! serde_json's recursion limit (128) or holds a number outside `f64` (`1e309`), and so would a
//! turn whose one `tool_use.input` does. Here the document is read shallowly instead: each level
//! the decoder looks at (the message, `content`/`tool_calls`, one block, its `function`) is parsed
//! into a map or list of [`RawValue`]s, which serde_json skips over with an iterative scanner
//! (no recursion, no depth limit, so 100,000 nested arrays cost no stack). Only the fields the
//! decoder reads are parsed further, and each call's arguments are parsed on their own under the
//! usual recursion limit: arguments that cannot be decoded make *that* call malformed
//! (`invalid_arguments`) and the rest of the turn runs. Parts the decoder never reads (text
//! blocks, unknown fields) are syntax-checked and otherwise ignored, however deep.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;

use super::{DecodeError, ToolCall, WireFormat};

/// One level of a document: an object or array whose members are still unparsed, or a scalar.
enum Level<'a> {
    Object(HashMap<String, &'a RawValue>),
    Array(Vec<&'a RawValue>),
    String(String),
    Other,
}

/// Parses one level of `text`. Members are syntax-checked but not decoded.
fn level(text: &str) -> Result<Level<'_>, serde_json::Error> {
    match text.trim_start().as_bytes().first() {
        Some(b'{') => serde_json::from_str(text).map(Level::Object),
        Some(b'[') => serde_json::from_str(text).map(Level::Array),
        Some(b'"') => serde_json::from_str(text).map(Level::String),
        // A scalar: check it is one JSON value (`1e309` is refused here like anywhere else).
        _ => serde_json::from_str::<&RawValue>(text).map(|_| Level::Other),
    }
}

/// The level of a member that is already known to be valid JSON syntax; a member that still
/// fails (a number out of range) counts as a scalar of no use.
fn member(raw: &RawValue) -> Level<'_> {
    level(raw.get()).unwrap_or(Level::Other)
}

/// A string field, or `""` when absent or not a string.
fn str_field(obj: &HashMap<String, &RawValue>, key: &str) -> Arc<str> {
    match obj.get(key).map(|raw| member(raw)) {
        Some(Level::String(s)) => Arc::from(s),
        _ => Arc::from(""),
    }
}

/// Decodes a call's arguments on their own, under serde_json's recursion limit.
fn arguments(raw: &RawValue) -> Result<Value, String> {
    serde_json::from_str(raw.get()).map_err(|e| e.to_string())
}

/// Decodes the tool calls of a document given as text (see [`super::decode_json`]).
pub(super) fn decode(format: WireFormat, text: &str) -> Result<Vec<ToolCall>, DecodeError> {
    let doc = level(text).map_err(|e| DecodeError(format!("input is not valid JSON: {e}")))?;
    let shape = |detail: &str| DecodeError(format!("unexpected input shape: {detail}"));
    match format {
        WireFormat::Anthropic => anthropic(doc).map_err(|e| shape(&e)),
        WireFormat::OpenAi => openai(doc).map_err(|e| shape(&e)),
    }
}

fn anthropic(doc: Level<'_>) -> Result<Vec<ToolCall>, String> {
    let blocks = match doc {
        Level::Array(blocks) => blocks,
        Level::Object(obj) => match obj.get("content").map(|raw| member(raw)) {
            Some(Level::Array(blocks)) => blocks,
            Some(Level::String(_)) => return Ok(Vec::new()),
            Some(_) => {
                return Err("`content` must be an array of content blocks or a string".into());
            }
            None => {
                return Err("expected an assistant message, a Messages API response or an array of content blocks (no `content` field)".into());
            }
        },
        _ => return Err("expected a JSON object or array of content blocks".into()),
    };
    Ok(blocks.into_iter().filter_map(anthropic_block).collect())
}

fn anthropic_block(raw: &RawValue) -> Option<ToolCall> {
    let Level::Object(obj) = member(raw) else {
        return None;
    };
    if !matches!(obj.get("type").map(|t| member(t)), Some(Level::String(t)) if t == "tool_use") {
        return None;
    }
    let (id, name) = (str_field(&obj, "id"), str_field(&obj, "name"));
    Some(match obj.get("input") {
        Some(input) => match arguments(input) {
            Ok(args) => ToolCall::new(id, name, args),
            Err(e) => ToolCall::with_malformed_arguments(
                id,
                name,
                format!("tool_use input cannot be decoded: {e}"),
            ),
        },
        None => ToolCall::with_malformed_arguments(id, name, "tool_use block has no `input`"),
    })
}

fn openai(doc: Level<'_>) -> Result<Vec<ToolCall>, String> {
    let message = match doc {
        Level::Object(obj) if obj.contains_key("choices") => {
            let first = match obj.get("choices").map(|raw| member(raw)) {
                Some(Level::Array(choices)) => choices.first().map(|c| member(c)),
                _ => None,
            };
            match first {
                Some(Level::Object(choice)) => match choice.get("message") {
                    Some(message) => member(message),
                    None => return Err("`choices[0].message` is missing".into()),
                },
                _ => return Err("`choices[0].message` is missing".into()),
            }
        }
        other => other,
    };
    let calls = match message {
        Level::Array(calls) => calls,
        Level::Object(obj) => match obj.get("tool_calls").map(|raw| (raw, member(raw))) {
            Some((_, Level::Array(calls))) => calls,
            Some((raw, _)) if raw.get().trim() == "null" && is_message(&obj) => Vec::new(),
            None if is_message(&obj) => Vec::new(),
            Some(_) => return Err("`tool_calls` must be an array".into()),
            None => {
                return Err("expected an assistant message with `tool_calls`, a chat completion or an array of tool calls".into());
            }
        },
        _ => return Err("expected a JSON object or array of tool calls".into()),
    };
    Ok(calls.into_iter().filter_map(openai_call).collect())
}

/// An object that looks like a chat message (it has `role` or `content`).
fn is_message(obj: &HashMap<String, &RawValue>) -> bool {
    obj.contains_key("role") || obj.contains_key("content")
}

fn openai_call(raw: &RawValue) -> Option<ToolCall> {
    let Level::Object(obj) = member(raw) else {
        return None;
    };
    match obj.get("type").map(|t| member(t)) {
        Some(Level::String(kind)) if kind != "function" => return None,
        _ => {}
    }
    let id = str_field(&obj, "id");
    let Some(Level::Object(function)) = obj.get("function").map(|f| member(f)) else {
        return Some(ToolCall::with_malformed_arguments(
            id,
            "",
            "tool call has no `function` object",
        ));
    };
    let name = str_field(&function, "name");
    let Some(raw_args) = function.get("arguments") else {
        return Some(ToolCall::with_malformed_arguments(
            id,
            name,
            "function.arguments is missing",
        ));
    };
    Some(match member(raw_args) {
        Level::String(text) => match serde_json::from_str::<Value>(&text) {
            Ok(args) => ToolCall::new(id, name, args),
            Err(e) => ToolCall::with_malformed_arguments(
                id,
                name,
                format!("function.arguments is not valid JSON: {e}"),
            ),
        },
        // Some servers send an already-decoded object; accept it as is.
        Level::Object(_) => match arguments(raw_args) {
            Ok(args) => ToolCall::new(id, name, args),
            Err(e) => ToolCall::with_malformed_arguments(
                id,
                name,
                format!("function.arguments cannot be decoded: {e}"),
            ),
        },
        _ => {
            ToolCall::with_malformed_arguments(id, name, "function.arguments must be a JSON string")
        }
    })
}
