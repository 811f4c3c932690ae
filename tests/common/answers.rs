//! A turn through the real binary, as data: run `dispatch` on a workspace with a list of
//! `(tool, input)` calls and read back the answers in order (on top of [`super::cli`]).

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

/// One answered call: its id, whether it failed, its content.
#[derive(Debug, Clone)]
pub struct Answer {
    pub id: String,
    pub is_error: bool,
    pub content: String,
}

impl Answer {
    /// The error code of a failed answer (`Error [<code>]: …`), or `ok`.
    pub fn outcome(&self) -> String {
        if !self.is_error {
            return "ok".into();
        }
        self.content
            .strip_prefix("Error [")
            .and_then(|rest| rest.split(']').next())
            .unwrap_or("?")
            .to_string()
    }
}

/// An Anthropic assistant message with one `tool_use` per `(name, input)`, ids `c0`, `c1`, ….
pub fn turn(calls: &[(&str, Value)]) -> Value {
    let blocks: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, input))| {
            json!({"type": "tool_use", "id": format!("c{i}"), "name": name, "input": input})
        })
        .collect();
    json!({"role": "assistant", "content": blocks})
}

/// Runs `switchboard dispatch --workspace ws` on `doc` and waits for it.
pub fn dispatch_raw(ws: &Path, doc: &str) -> Output {
    super::cli::dispatch(ws, &[], doc)
}

/// The answers printed by `dispatch` (an Anthropic user message), in order.
pub fn answers(out: &Output) -> Vec<Answer> {
    let text = String::from_utf8_lossy(&out.stdout);
    let doc: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {text}\nstatus {:?}, stderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    doc["content"]
        .as_array()
        .expect("a user message with content")
        .iter()
        .map(|b| Answer {
            id: b["tool_use_id"].as_str().unwrap_or_default().to_string(),
            is_error: b["is_error"] == true,
            content: b["content"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

/// Dispatches `calls` on `ws`, checks the exit code is 0 and one answer per call came back in
/// order, and returns the answers.
pub fn dispatch(ws: &Path, calls: &[(&str, Value)]) -> Vec<Answer> {
    let out = dispatch_raw(ws, &turn(calls).to_string());
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers = answers(&out);
    let ids: Vec<String> = answers.iter().map(|a| a.id.clone()).collect();
    let expected: Vec<String> = (0..calls.len()).map(|i| format!("c{i}")).collect();
    assert_eq!(ids, expected, "one answer per call, in order");
    answers
}
