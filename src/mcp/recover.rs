//! What can be kept of a server's response that does not decode as a whole (the client side of
//! [`super::wire`]):
//!
//! * **A `tools/list` page**: each tool is decoded on its own; the ones that do not decode — an
//!   input schema nested deeper than serde_json's 128 levels, an `inputSchema` that is not an
//!   object, a lone surrogate in a description — are left out with why, and the page keeps the
//!   rest (the listing reports them as skipped).
//! * **A `tools/call` result**: a content block of a kind this version does not know is replaced
//!   by a note (`[content of unknown type "hologram", not shown]`) and the known blocks are kept.
//!   A block of a known kind that does not decode fails the result, with its cause.
//!
//! Everything is read through raw slices of the line (`RawValue`), which skip any nesting and
//! any escape, so one bad part never hides the others.

use rmcp::model::{CallToolResult, ContentBlock, ListToolsResult, Tool};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A serde_json error's message without its position.
pub(crate) fn cause(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The content block kinds rmcp decodes (`type`).
const KNOWN_BLOCKS: [&str; 5] = ["text", "image", "audio", "resource", "resource_link"];

/// The `result` of a response line.
fn result(text: &[u8]) -> Result<&RawValue, String> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        result: Option<&'a RawValue>,
    }
    let envelope: Envelope = serde_json::from_slice(text).map_err(|e| {
        if std::str::from_utf8(text).is_err() {
            "the response is not valid UTF-8".to_string()
        } else {
            format!("the response is not valid JSON: {}", cause(&e))
        }
    })?;
    envelope
        .result
        .ok_or_else(|| "the response has no result".to_string())
}

/// A `tools/list` page with the tools that decode, and those that do not (raw name, or `#N` of
/// the page, and why).
pub(crate) fn tools_page(text: &[u8]) -> Result<(ListToolsResult, Vec<(String, String)>), String> {
    #[derive(Deserialize)]
    struct Page<'a> {
        #[serde(borrow)]
        tools: Vec<&'a RawValue>,
        #[serde(rename = "nextCursor")]
        next_cursor: Option<String>,
    }
    let page: Page = serde_json::from_str(result(text)?.get())
        .map_err(|e| format!("the tools/list result cannot be read: {}", cause(&e)))?;
    let mut tools = Vec::with_capacity(page.tools.len());
    let mut unread = Vec::new();
    for (i, raw) in page.tools.into_iter().enumerate() {
        match serde_json::from_str::<Tool>(raw.get()) {
            Ok(tool) => tools.push(tool),
            Err(e) => unread.push((
                tool_name(raw).unwrap_or_else(|| format!("#{}", i + 1)),
                why(raw, &e),
            )),
        }
    }
    let mut result = ListToolsResult::with_all_items(tools);
    result.next_cursor = page.next_cursor;
    Ok((result, unread))
}

/// The `name` of a tool that does not decode, when it has a readable one.
fn tool_name(raw: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Named {
        name: String,
    }
    serde_json::from_str::<Named>(raw.get())
        .ok()
        .map(|n| n.name)
}

/// Why a tool's definition does not decode, in words.
fn why(raw: &RawValue, error: &serde_json::Error) -> String {
    #[derive(Deserialize)]
    struct Schema<'a> {
        #[serde(rename = "inputSchema", borrow)]
        input_schema: Option<&'a RawValue>,
    }
    let schema = serde_json::from_str::<Schema>(raw.get())
        .ok()
        .and_then(|s| s.input_schema);
    if let Some(schema) = schema
        && !schema.get().starts_with('{')
    {
        return "its inputSchema is not a JSON object".into();
    }
    let text = cause(error);
    if text.starts_with("recursion limit exceeded") {
        return "its definition is nested deeper than 128 levels".into();
    }
    format!("its definition cannot be read: {text}")
}

/// A `tools/call` result with its blocks of unknown kinds replaced by notes; `Err` (the cause)
/// when it has none to replace, or when something else in it does not decode.
pub(crate) fn call_result(text: &[u8]) -> Result<CallToolResult, String> {
    let raw = result(text)?;
    let strict = match serde_json::from_str::<CallToolResult>(raw.get()) {
        Ok(result) => return Ok(result),
        Err(e) => cause(&e),
    };
    let mut members = Map::new();
    let parts: std::collections::BTreeMap<String, &RawValue> = serde_json::from_str(raw.get())
        .map_err(|e| format!("the tools/call result cannot be read: {}", cause(&e)))?;
    let mut replaced = false;
    for (key, value) in parts {
        let value = if key == "content" {
            let blocks: Vec<&RawValue> = serde_json::from_str(value.get())
                .map_err(|e| format!("its content cannot be read: {}", cause(&e)))?;
            let mut kept = Vec::with_capacity(blocks.len());
            for block in blocks {
                kept.push(match content_block(block)? {
                    Some(block) => block,
                    None => {
                        replaced = true;
                        unknown_note(block)
                    }
                });
            }
            Value::Array(kept)
        } else {
            serde_json::from_str(value.get())
                .map_err(|e| format!("its {key:?} cannot be read: {}", cause(&e)))?
        };
        members.insert(key, value);
    }
    if !replaced {
        return Err(format!("the tools/call result cannot be read: {strict}"));
    }
    serde_json::from_value(Value::Object(members))
        .map_err(|e| format!("the tools/call result cannot be read: {}", cause(&e)))
}

/// A block of a known kind as JSON (`Some`), `None` for an unknown kind; `Err` when a block of a
/// known kind does not decode.
fn content_block(block: &RawValue) -> Result<Option<Value>, String> {
    let kind = block_kind(block);
    if !kind.as_deref().is_some_and(|k| KNOWN_BLOCKS.contains(&k)) {
        return Ok(None);
    }
    let kind = kind.unwrap_or_default();
    let decoded: ContentBlock = serde_json::from_str(block.get())
        .map_err(|e| format!("a {kind} block cannot be read: {}", cause(&e)))?;
    serde_json::to_value(decoded)
        .map(Some)
        .map_err(|e| e.to_string())
}

fn block_kind(block: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Kind>(block.get())
        .ok()
        .map(|k| k.kind)
}

/// The note that stands for a block of an unknown kind.
fn unknown_note(block: &RawValue) -> Value {
    let note = match block_kind(block) {
        Some(kind) => format!("[content of unknown type {kind:?}, not shown]"),
        None => "[content block without a type, not shown]".to_string(),
    };
    serde_json::json!({"type": "text", "text": note})
}

#[cfg(test)]
mod tests {
    use super::*;
    fn line(result: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#).into_bytes()
    }

    #[test]
    fn a_page_keeps_the_tools_that_decode_and_names_the_others() {
        // serde_json refuses to build the deep schema as a Value; write its text by hand.
        let deep_text = {
            let mut t = String::from(r#"{"type":"string"}"#);
            for _ in 0..70 {
                t = format!(r#"{{"type":"object","properties":{{"a":{t}}}}}"#);
            }
            t
        };
        let result = format!(
            r#"{{"tools":[{{"name":"ok","inputSchema":{{"type":"object"}}}},
                {{"name":"deep","inputSchema":{deep_text}}},
                {{"name":"flat","inputSchema":"string"}},
                {{"name":"odd","description":"a\ud800b","inputSchema":{{}}}},
                {{"inputSchema":7}}],"nextCursor":"p2"}}"#
        );
        let (page, unread) = tools_page(&line(&result)).unwrap();
        assert_eq!(page.tools.len(), 1);
        assert_eq!(page.tools[0].name, "ok");
        assert_eq!(page.next_cursor.as_deref(), Some("p2"));
        assert_eq!(
            unread,
            [
                (
                    "deep".to_string(),
                    "its definition is nested deeper than 128 levels".to_string()
                ),
                ("flat".into(), "its inputSchema is not a JSON object".into()),
                (
                    "odd".into(),
                    "its definition cannot be read: unexpected end of hex escape".into()
                ),
                ("#5".into(), "its inputSchema is not a JSON object".into()),
            ]
        );
    }

    #[test]
    fn unknown_blocks_become_notes_and_known_ones_stay() {
        let r = call_result(&line(
            r#"{"content":[{"type":"text","text":"before"},{"type":"hologram","data":"3d"},
                {"text":"no type"},{"type":"text","text":"after"}],"isError":false}"#,
        ))
        .unwrap();
        let texts: Vec<String> = r
            .content
            .iter()
            .map(|b| b.as_text().map(|t| t.text.clone()).unwrap_or_default())
            .collect();
        assert_eq!(
            texts,
            [
                "before",
                "[content of unknown type \"hologram\", not shown]",
                "[content block without a type, not shown]",
                "after"
            ]
        );
        assert_eq!(r.is_error, Some(false));
    }

    #[test]
    fn a_known_block_that_does_not_decode_fails_the_result_with_its_cause() {
        let e = call_result(&line(
            r#"{"content":[{"type":"text","text":"a\ud800b"},{"type":"hologram"}]}"#,
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "a text block cannot be read: unexpected end of hex escape"
        );
        // Alone (no unknown block to replace), the same cause.
        let e =
            call_result(&line(r#"{"content":[{"type":"text","text":"a\ud800"}]}"#)).unwrap_err();
        assert_eq!(
            e,
            "a text block cannot be read: unexpected end of hex escape"
        );
        let e = call_result(b"{\"id\":1,\"result\":{\"content\":[\"\xff\"]}}").unwrap_err();
        assert_eq!(e, "the response is not valid UTF-8");
    }
}
