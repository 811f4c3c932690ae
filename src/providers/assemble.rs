//! Argument assembly: a streamed tool call's argument fragments (`input_json_delta.partial_json`
//! for Anthropic, `tool_calls[].function.arguments` deltas for OpenAI) are concatenated as text
//! and parsed once, when the block is complete. A fragment may end anywhere — inside a string,
//! inside an escape such as `\"` or `\u00e9`, between the two halves of a surrogate pair — so
//! nothing is parsed before the end. Text that does not parse becomes a `tool_use` block marked
//! malformed, which the loop answers `invalid_arguments`.

use serde_json::{Map, Value, json};

use crate::provider::malformed_tool_use;

/// How much of bad argument text is quoted back in the error detail.
const QUOTE_CHARS: usize = 200;

/// One tool call's argument text, as it arrives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArgumentBuffer {
    text: String,
}

impl ArgumentBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one fragment.
    pub fn push(&mut self, fragment: &str) {
        self.text.push_str(fragment);
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Parses the whole text. Empty (or blank) text is `{}`: a call without arguments.
    pub fn parse(&self) -> Result<Value, String> {
        parse_arguments(&self.text)
    }
}

/// Parses complete argument text; `Err` is the `invalid_arguments` detail.
pub fn parse_arguments(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_str(text).map_err(|e| {
        let mut quoted: String = text.chars().take(QUOTE_CHARS).collect();
        if quoted.len() < text.len() {
            quoted.push('…');
        }
        format!("tool arguments are not valid JSON ({e}): {quoted}")
    })
}

/// A `tool_use` block from parsed (or unparseable) arguments.
pub fn tool_use_block(id: &str, name: &str, arguments: Result<Value, String>) -> Value {
    match arguments {
        Ok(input) => json!({"type": "tool_use", "id": id, "name": name, "input": input}),
        Err(detail) => malformed_tool_use(id, name, detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{MALFORMED_INPUT_KEY, tool_call_of};

    const ARGS: &str =
        r#"{"path":"caf\u00e9/\"quoted\"\\dir/naïve 😀 \ud83d\ude00","n":[1,2.5e3,true,null]}"#;

    #[test]
    fn fragments_split_at_every_char_boundary_assemble() {
        let expected: Value = serde_json::from_str(ARGS).unwrap();
        assert_eq!(expected["path"], "café/\"quoted\"\\dir/naïve 😀 😀");
        let cuts: Vec<usize> = ARGS.char_indices().map(|(i, _)| i).collect();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a) {
                let mut buf = ArgumentBuffer::new();
                buf.push(&ARGS[..a]);
                buf.push(&ARGS[a..b]);
                buf.push(&ARGS[b..]);
                assert_eq!(buf.parse().unwrap(), expected, "cuts {a} {b}");
            }
        }
    }

    #[test]
    fn one_char_per_fragment_assembles() {
        let mut buf = ArgumentBuffer::new();
        for c in ARGS.chars() {
            buf.push(&c.to_string());
        }
        assert_eq!(buf.as_str(), ARGS);
        assert!(buf.parse().is_ok());
    }

    #[test]
    fn empty_arguments_are_an_empty_object() {
        assert_eq!(ArgumentBuffer::new().parse().unwrap(), json!({}));
        assert_eq!(parse_arguments("  ").unwrap(), json!({}));
    }

    #[test]
    fn bad_json_becomes_a_malformed_block_answered_invalid() {
        let detail = parse_arguments(r#"{"path": "a"#).unwrap_err();
        assert!(
            detail.starts_with("tool arguments are not valid JSON ("),
            "{detail}"
        );
        assert!(detail.ends_with(r#"{"path": "a"#), "{detail}");
        let block = tool_use_block("t1", "read_file", Err(detail.clone()));
        assert_eq!(block["input"], json!({}));
        assert_eq!(block[MALFORMED_INPUT_KEY], detail);
        let call = tool_call_of(&block).unwrap();
        assert_eq!(call.malformed.as_deref(), Some(detail.as_str()));
        assert_eq!(&*call.id, "t1");
    }

    #[test]
    fn long_bad_text_is_quoted_short() {
        let text = format!("{{\"a\":\"{}", "x".repeat(1000));
        let detail = parse_arguments(&text).unwrap_err();
        assert!(detail.len() < 400);
        assert!(detail.ends_with('…'));
    }
}
