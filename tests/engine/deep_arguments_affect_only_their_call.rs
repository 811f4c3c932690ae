//! A call whose arguments cannot be decoded — nested deeper than serde_json's recursion limit,
//! or holding a number beyond `f64` — is answered `invalid_arguments` on its own; the rest of
//! its turn runs. Through `switchboard dispatch` (both wire formats, `--lines`) and through the
//! library's decoders, including 100,000 nested arrays (which must not overflow the stack).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use switchboard::protocol::{self, MAX_ARGUMENT_DEPTH, WireFormat};

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

fn dispatch(ws: &Path, extra: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(BIN)
        .arg("dispatch")
        .arg("--workspace")
        .arg(ws)
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // Written from a thread: a large document must not deadlock against a full stdout pipe.
    let mut input = child.stdin.take().unwrap();
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
    let out = child.wait_with_output().expect("the binary finishes");
    writer.join().unwrap().unwrap();
    out
}

fn nested_arrays(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// An Anthropic turn as text: write a file, a call with `input` given as raw JSON text, read the
/// file back.
fn anthropic_turn(bad_input: &str) -> String {
    format!(
        r#"{{"role":"assistant","content":[
        {{"type":"tool_use","id":"w","name":"write_file","input":{{"path":"a.txt","content":"written"}}}},
        {{"type":"tool_use","id":"deep","name":"glob","input":{bad_input}}},
        {{"type":"tool_use","id":"r","name":"read_file","input":{{"path":"a.txt"}}}}
    ]}}"#
    )
}

fn blocks(out: &Output) -> Vec<Value> {
    let text = String::from_utf8_lossy(&out.stdout);
    let doc: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    doc["content"].as_array().unwrap().clone()
}

fn assert_only_the_bad_call_fails(out: &Output, ws: &Path) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = blocks(out);
    let ids: Vec<&str> = results
        .iter()
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["w", "deep", "r"]);
    assert_eq!(results[0].get("is_error"), None, "{results:?}");
    assert_eq!(results[1]["is_error"], true);
    let detail = results[1]["content"].as_str().unwrap();
    assert!(
        detail.starts_with("Error [invalid_arguments]: "),
        "{detail}"
    );
    assert_eq!(results[2]["content"], "written", "{results:?}");
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "written"
    );
}

#[test]
fn an_input_nesting_124_or_200_arrays_refuses_only_its_call() {
    // 124 arrays used to push the whole document past the parser's limit; now the input is
    // decoded on its own (and refused by the schema). 200 is past the limit even alone.
    for depth in [124, 200] {
        let ws = tempfile::tempdir().unwrap();
        let out = dispatch(ws.path(), &[], &anthropic_turn(&nested_arrays(depth)));
        assert_only_the_bad_call_fails(&out, ws.path());
        if depth > MAX_ARGUMENT_DEPTH {
            let detail = blocks(&out)[1]["content"].as_str().unwrap().to_string();
            assert!(detail.contains("recursion limit"), "{detail}");
        }
    }
}

#[test]
fn an_input_nesting_100000_arrays_refuses_only_its_call_without_overflowing_the_stack() {
    let ws = tempfile::tempdir().unwrap();
    let deep = format!(r#"{{"pattern":{}}}"#, nested_arrays(100_000));
    let out = dispatch(ws.path(), &[], &anthropic_turn(&deep));
    assert_only_the_bad_call_fails(&out, ws.path());
}

#[test]
fn a_number_beyond_f64_refuses_only_its_call() {
    let ws = tempfile::tempdir().unwrap();
    let out = dispatch(ws.path(), &[], &anthropic_turn(r#"{"pattern":1e309}"#));
    assert_only_the_bad_call_fails(&out, ws.path());
    let detail = blocks(&out)[1]["content"].as_str().unwrap().to_string();
    assert!(detail.contains("number out of range"), "{detail}");
}

#[test]
fn deep_parts_the_decoder_does_not_read_are_ignored() {
    let ws = tempfile::tempdir().unwrap();
    let turn = format!(
        r#"{{"role":"assistant","metadata":{deep},"content":[
            {{"type":"text","text":"x","extra":{deep}}},
            {{"type":"tool_use","id":"g","name":"glob","input":{{"pattern":"*"}},"cache":{deep}}}
        ]}}"#,
        deep = nested_arrays(100_000)
    );
    let out = dispatch(ws.path(), &[], &turn);
    assert_eq!(out.status.code(), Some(0));
    let results = blocks(&out);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["content"], "(no matches)");
}

#[test]
fn invalid_json_is_still_refused_whole() {
    let ws = tempfile::tempdir().unwrap();
    let out = dispatch(ws.path(), &[], &format!("{}x", anthropic_turn("{}")));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("input is not valid JSON"));
    assert!(out.stdout.is_empty());
}

#[test]
fn openai_object_arguments_too_deep_refuse_only_their_call_and_lines_keep_going() {
    let ws = tempfile::tempdir().unwrap();
    let turn = json!({"role": "assistant", "tool_calls": [
        {"id": "w", "type": "function", "function": {"name": "write_file",
            "arguments": "{\"path\":\"b.txt\",\"content\":\"bee\"}"}},
        {"id": "deep", "type": "function", "function": {"name": "glob", "arguments": "PLACEHOLDER"}},
        {"id": "r", "type": "function", "function": {"name": "read_file",
            "arguments": "{\"path\":\"b.txt\"}"}}
    ]})
    .to_string()
    .replace("\"PLACEHOLDER\"", &nested_arrays(100_000));
    let input = format!("{turn}\n{turn}\n");
    let out = dispatch(ws.path(), &["--format", "openai", "--lines"], &input);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    for line in lines {
        let messages: Value = serde_json::from_str(line).unwrap();
        let contents: Vec<&str> = messages
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap())
            .collect();
        assert_eq!(contents[0], "Wrote 3 bytes to b.txt");
        assert!(
            contents[1].starts_with("Error [invalid_arguments]: function.arguments"),
            "{}",
            contents[1]
        );
        assert_eq!(contents[2], "bee");
    }
}

#[test]
fn the_library_text_decoder_marks_only_the_deep_call() {
    let text = anthropic_turn(&nested_arrays(100_000));
    let calls = protocol::decode_json(WireFormat::Anthropic, &text).unwrap();
    assert_eq!(calls.len(), 3);
    assert!(calls[0].malformed.is_none() && calls[2].malformed.is_none());
    assert!(calls[1].malformed.is_some());
    assert_eq!(&*calls[1].id, "deep");
}

#[test]
fn the_library_value_decoders_mark_arguments_deeper_than_the_limit() {
    // A Value as deep as serde_json can parse decodes; one level more is malformed, as the text
    // decoder would make it.
    let fits: Value = serde_json::from_str(&nested_arrays(MAX_ARGUMENT_DEPTH)).unwrap();
    let mut too_deep = fits.clone();
    too_deep = Value::Array(vec![std::mem::take(&mut too_deep)]);
    for (input, malformed) in [(fits, false), (too_deep, true)] {
        let doc = json!([
            {"type": "tool_use", "id": "a", "name": "glob", "input": input.clone()},
            {"type": "tool_use", "id": "b", "name": "glob", "input": {"pattern": "*"}}
        ]);
        let calls = protocol::decode_anthropic(&doc).unwrap();
        assert_eq!(calls[0].malformed.is_some(), malformed);
        assert!(calls[1].malformed.is_none());
        let doc = json!([{"id": "a", "type": "function",
                          "function": {"name": "glob", "arguments": {"x": input}}}]);
        let calls = protocol::decode_openai(&doc).unwrap();
        // `{"x": …}` adds one level.
        assert!(calls[0].malformed.is_some());
    }
    for (depth, malformed) in [(MAX_ARGUMENT_DEPTH, false), (MAX_ARGUMENT_DEPTH + 1, true)] {
        let text = format!(
            r#"[{{"type":"tool_use","id":"a","name":"glob","input":{}}}]"#,
            nested_arrays(depth)
        );
        let calls = protocol::decode_json(WireFormat::Anthropic, &text).unwrap();
        assert_eq!(calls[0].malformed.is_some(), malformed, "depth {depth}");
    }
}

mod agreement {
    //! Wherever a document parses as a whole, reading it shallowly gives the same calls.

    use proptest::prelude::*;
    use serde_json::{Value, json};
    use switchboard::protocol::{self, WireFormat};

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[a-z_ ]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn block() -> impl Strategy<Value = Value> {
        prop_oneof![
            (json_value(), "[a-z0-9]{0,3}", "glob|read_file|nope")
                .prop_map(|(input, id, name)| json!({"type": "tool_use", "id": id, "name": name, "input": input})),
            json_value(),
            Just(json!({"type": "tool_use", "id": "x", "name": "glob"})),
            Just(json!({"type": "text", "text": "hi"})),
        ]
    }

    fn openai_call() -> impl Strategy<Value = Value> {
        prop_oneof![
            (json_value(), "[a-z0-9]{0,3}")
                .prop_map(|(args, id)| json!({"id": id, "type": "function",
                "function": {"name": "glob", "arguments": args.to_string()}})),
            (json_value(), "[a-z0-9]{0,3}")
                .prop_map(|(args, id)| json!({"id": id, "type": "function",
                "function": {"name": "glob", "arguments": args}})),
            json_value(),
        ]
    }

    proptest! {
        #[test]
        fn shallow_and_whole_decoding_agree(
            blocks in prop::collection::vec(block(), 0..5),
            calls in prop::collection::vec(openai_call(), 0..5),
            wrap in 0..3u8,
            other in json_value(),
        ) {
            let anthropic = match wrap {
                0 => Value::Array(blocks),
                1 => json!({"role": "assistant", "content": blocks}),
                _ => other.clone(),
            };
            let openai = match wrap {
                0 => Value::Array(calls),
                1 => json!({"choices": [{"message": {"role": "assistant", "tool_calls": calls}}]}),
                _ => other,
            };
            for (format, doc) in [(WireFormat::Anthropic, anthropic), (WireFormat::OpenAi, openai)] {
                let whole = protocol::decode(format, &doc);
                let shallow = protocol::decode_json(format, &doc.to_string());
                match (whole, shallow) {
                    (Ok(whole), Ok(shallow)) => prop_assert_eq!(whole, shallow),
                    (Err(_), Err(e)) => prop_assert!(e.0.starts_with("unexpected input shape: "), "{}", e.0),
                    (whole, shallow) => prop_assert!(false, "{:?} versus {:?}", whole, shallow),
                }
            }
        }
    }
}
