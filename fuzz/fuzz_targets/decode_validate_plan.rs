//! Arbitrary bytes → JSON → both wire decoders → schema validation against the five built-in
//! tools → the dependency graph and stages of the surviving calls' safety flags (tools without
//! access declarations) → encoding of one result per call.
//!
//! Nothing may panic, and the invariants the engine relies on must hold for any input: every
//! call waits only for earlier calls, an unsafe call waits for the one before it, the stages cover
//! every runnable call exactly once (a serial stage is one unsafe call), and the encoded answer has one well-formed block per call.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use switchboard::protocol::{self, ErrorCode, Timing, ToolDispatchResult};
use switchboard::Access;
use switchboard::tools::builtin_tools;
use switchboard::testing::{Graph, StageMode, compile_schema, stages, validate};

/// The five built-in tools: name, compiled validator, concurrency safety.
struct Tool {
    name: String,
    validator: jsonschema::Validator,
    safe: bool,
}

fn tools() -> &'static [Tool] {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        // Only the specs' schemas and policies are used.
        builtin_tools()
            .into_iter()
            .map(|spec| Tool {
                validator: compile_schema(&spec.input_schema).expect("built-in schema"),
                safe: spec.policy.concurrency_safe,
                name: spec.name,
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for decoded in [protocol::decode_anthropic(&doc), protocol::decode_openai(&doc)] {
        let Ok(calls) = decoded else { continue };
        let mut safe = Vec::new();
        let mut results = Vec::with_capacity(calls.len());
        for call in &calls {
            let tool = tools().iter().find(|t| t.name == *call.name);
            let outcome = match (tool, &call.malformed) {
                (None, _) => Err((ErrorCode::UnknownTool, "unknown".to_string())),
                (Some(_), Some(detail)) => Err((ErrorCode::InvalidArguments, detail.clone())),
                (Some(tool), None) => match validate(&tool.validator, &call.arguments) {
                    Ok(()) => {
                        safe.push(tool.safe);
                        Ok(())
                    }
                    Err(error) => {
                        let detail = error.to_string();
                        assert!(!detail.is_empty());
                        Err((ErrorCode::InvalidArguments, detail))
                    }
                },
            };
            let id = Arc::clone(&call.id);
            let name = Arc::clone(&call.name);
            results.push(match outcome {
                Ok(()) => ToolDispatchResult::ok(id, name, "ran".into(), Timing::default()),
                Err((code, detail)) => {
                    ToolDispatchResult::error(id, name, code, &detail, Timing::default())
                }
            });
        }

        let accesses: Vec<Access> = safe
            .iter()
            .map(|&s| if s { Access::none() } else { Access::Exclusive })
            .collect();
        let graph = Graph::build(&accesses);
        for j in 0..safe.len() {
            let waits = graph.waits_for(j);
            assert!(waits.iter().all(|&i| (i as usize) < j), "only earlier calls");
            if j > 0 && !safe[j] {
                assert!(waits.contains(&(j as u32 - 1)), "an unsafe call waits for the one before it");
            }
        }
        let mut covered = 0;
        for stage in stages(&graph, &accesses) {
            assert!(stage.calls > 0);
            if stage.mode == StageMode::Serial {
                assert_eq!(stage.calls, 1, "a serial stage is one unsafe call");
            }
            covered += stage.calls;
        }
        assert_eq!(covered, safe.len(), "every runnable call is in a stage");

        for format in [protocol::WireFormat::Anthropic, protocol::WireFormat::OpenAi] {
            let encoded = protocol::encode(format, &results);
            let text = serde_json::to_string(&encoded).expect("encodes");
            let back: Value = serde_json::from_str(&text).expect("well-formed JSON");
            let items = match format {
                protocol::WireFormat::Anthropic => back["content"].as_array().cloned(),
                protocol::WireFormat::OpenAi => back.as_array().cloned(),
            }
            .expect("a list of answers");
            assert_eq!(items.len(), calls.len(), "one answer per call");
        }
    }
});
