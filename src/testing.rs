//! Test doubles for embedders' tests, benchmarks and load runs (feature `testing`, on with `cli`):
//! the six load-workload tools every figure in `docs/performance.md` is measured with — `noop`, `sleep`
//! and `cpu`, each concurrency-safe, plus a serial variant of each (`*_serial`) — all taking
//! `{"text": string, "n": integer ≥ 0}` and answering `text` (`cpu`: a hash of it). One
//! definition, used by `switchboard load`, `serve --with-load-tools` and `cargo bench`.
//!
//! Two more, for the resource-aware workloads ([`write_tools`]): `write` and `write_same_file`
//! simulate a file write that takes `sleep` — `write` writes file number `n`, `write_same_file`
//! always writes file 0. The "files" are named resources (`file:N`), not disk files, so the figures
//! measure scheduling alone.
//!
//! It also re-exports, for benchmarks and fuzzing, the direct baseline ([`DirectDispatcher`]),
//! the planner's graph ([`Graph`], [`stages`]) and the engine's schema validation
//! ([`validate`], [`compile_schema`]) with its bounds on a schema's patterns
//! ([`PATTERN_COMPILED_BYTES`] …); none of them is part of the engine's surface.

use std::time::Duration;

use serde_json::{Value, json};

use crate::tool::{Access, Handler, Resource, ToolSpec};

/// The direct in-process loop every figure is compared with: the same planner and per-call layer
/// stack as the engine, with no actors (see `docs/performance.md`).
pub use crate::baseline::DirectDispatcher;
/// The planner's dependency graph and stages, for fuzzing and property tests of the plan.
pub use crate::plan::{Graph, Stage, StageMode, stages};
/// The engine's bounds on compiling a schema's patterns (`docs/sidecar.md#client-tools`), for
/// tests that check a refusal names them.
pub use crate::validation::{
    MAX_CATALOG_PATTERNS, MAX_PATTERN_BYTES, PATTERN_BACKTRACK_LIMIT, PATTERN_COMPILED_BYTES,
    PATTERN_DFA_BYTES,
};
/// Why a schema does not compile, or the detail of an `invalid_arguments` result: the same text
/// the engine writes in a refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SchemaError(pub String);

/// Compiles a tool's input schema exactly as the engine does (bounds included), for fuzzing.
pub fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, SchemaError> {
    crate::validation::compile(schema).map_err(SchemaError)
}

/// Checks `args` against a compiled schema exactly as the engine does, for fuzzing.
pub fn validate(validator: &jsonschema::Validator, args: &Value) -> Result<(), SchemaError> {
    crate::validation::check(validator, args).map_err(SchemaError)
}

/// The 32 characters every workload call carries as `text`.
pub const TEXT: &str = "abcdefghijklmnopqrstuvwxyz012345";

/// Largest `n` the `cpu` tool honours (bigger values are clamped), so no call can run for long.
pub const CPU_WORK_MAX: u64 = 1_000_000;

/// The workload tools' names, in variant order: even indices are concurrency-safe, odd serial.
pub(crate) const NAMES: [&str; 6] = [
    "noop",
    "noop_serial",
    "sleep",
    "sleep_serial",
    "cpu",
    "cpu_serial",
];

/// The schema every workload tool takes.
pub fn schema() -> Value {
    json!({"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer","minimum":0}},
           "required":["text","n"],"additionalProperties":false})
}

/// The `text` argument, or an empty string.
pub fn text_of(args: &Value) -> String {
    args.get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// FNV-1a over `text`, `rounds` times: deterministic CPU work sized by `n`.
fn cpu_hash(text: &str, rounds: u64) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0..rounds.min(CPU_WORK_MAX) {
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= round;
    }
    format!("{h:016x}")
}

/// The six workload tools (see the module docs). `sleep` sleeps `sleep` per call.
pub fn load_tools(sleep: Duration) -> Vec<ToolSpec> {
    let mut specs = Vec::with_capacity(NAMES.len());
    for (i, name) in NAMES.iter().enumerate() {
        let safe = i.is_multiple_of(2);
        let handler = match i / 2 {
            0 => Handler::inline(|a, _| Ok(text_of(a))),
            1 => Handler::future(move |a: Value, _| async move {
                tokio::time::sleep(sleep).await;
                Ok(text_of(&a))
            }),
            _ => Handler::inline(|a, _| {
                let rounds = a.get("n").and_then(Value::as_u64).unwrap_or(0);
                Ok(cpu_hash(&text_of(a), rounds))
            }),
        };
        let description = match i / 2 {
            0 => "Returns `text` (load workload).",
            1 => "Sleeps, then returns `text` (load workload).",
            _ => "Hashes `text` `n` times (load workload).",
        };
        specs.push(ToolSpec::new(*name, description, schema(), handler).concurrency_safe(safe));
    }
    specs
}

/// The write workload tools' names: `write` (file `n`) and `write_same_file` (file 0).
pub(crate) const WRITE_NAMES: [&str; 2] = ["write", "write_same_file"];

/// The two write workload tools (see the module docs): async, each call sleeps `sleep`, then
/// answers `text`; not concurrency-safe (never started while an answer streams); each declares a
/// write of its file, so writes to different files overlap and writes to one file do not.
pub fn write_tools(sleep: Duration) -> Vec<ToolSpec> {
    WRITE_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let same = i == 1;
            ToolSpec::new(
                *name,
                "Writes a (simulated) file, taking `--sleep-ms` (load workload).",
                schema(),
                Handler::future(move |a: Value, _| async move {
                    tokio::time::sleep(sleep).await;
                    Ok(text_of(&a))
                }),
            )
            .access(move |a, _| {
                let n = if same {
                    0
                } else {
                    a.get("n").and_then(Value::as_u64).unwrap_or(0)
                };
                Ok(Access::write(Resource::named(format!("file:{n}"))))
            })
        })
        .collect()
}

/// `noop_async`: like `noop`, from a future (so its stage goes to a worker); concurrency-safe.
pub fn noop_async() -> ToolSpec {
    ToolSpec::new(
        "noop_async",
        "Returns `text` from a future (load workload).",
        schema(),
        Handler::future(|a: Value, _| async move { Ok(text_of(&a)) }),
    )
    .concurrency_safe(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_work_is_deterministic() {
        assert_eq!(cpu_hash(TEXT, 3), cpu_hash(TEXT, 3));
        assert_ne!(cpu_hash(TEXT, 3), cpu_hash(TEXT, 4));
    }

    #[test]
    fn there_are_six_workload_tools_safe_then_serial() {
        let tools = load_tools(Duration::ZERO);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, NAMES);
        for (i, t) in tools.iter().enumerate() {
            assert_eq!(t.policy.concurrency_safe, i % 2 == 0, "{}", t.name);
        }
    }
}
