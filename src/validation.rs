//! Argument validation: the `jsonschema` crate, compiled once per tool at registration.
//!
//! A call's arguments must be a JSON object that satisfies the tool's input schema (full JSON
//! Schema, draft 2020-12 unless the schema says otherwise). No coercion: `"10"` is not `10`. Error
//! details name the JSON pointer of each offending value (`/limit: 0 is less than the minimum of
//! 1`; `(root)` for the arguments object itself) so a model can fix its call.
//!
//! Every schema the engine compiles — Rust tools, MCP servers' tools, client tools — goes through
//! [`compile_in`] (or [`compile`], a catalog of one), within the bounds of `bounds`: what its
//! patterns may cost, per pattern and per catalog.

use jsonschema::Validator;
use serde_json::Value;

mod bounds;
pub use bounds::Budget;
// The bounds themselves: for `testing`'s callers and this crate's tests.
#[cfg(any(test, feature = "testing"))]
pub use bounds::{
    MAX_CATALOG_PATTERNS, MAX_PATTERN_BYTES, PATTERN_BACKTRACK_LIMIT, PATTERN_COMPILED_BYTES,
    PATTERN_DFA_BYTES,
};

/// How many schema violations a detail lists before it says "and N more".
const MAX_REPORTED: usize = 8;

/// Compiles a tool's input schema as a catalog of its own (`compile_in` with a fresh catalog
/// budget: see the module's bounds).
#[cfg(any(test, feature = "testing"))]
pub fn compile(schema: &Value) -> Result<Validator, String> {
    compile_in(schema, &mut Budget::catalog())
}

/// Compiles a tool's input schema into a catalog whose `budget` it takes from. Refuses anything
/// that is not an object schema (`"type": "object"`), that does not compile, or whose patterns
/// pass the engine's bounds (the detail names the keyword, where it is and the limit). Remote
/// `$ref`s are not fetched.
pub fn compile_in(schema: &Value, budget: &mut Budget) -> Result<Validator, String> {
    let obj = schema
        .as_object()
        .ok_or_else(|| "input schema must be a JSON object".to_string())?;
    if obj.get("type").and_then(Value::as_str) != Some("object") {
        return Err("input schema must have \"type\": \"object\"".into());
    }
    let found = bounds::check(schema, budget)?;
    let validator = jsonschema::options()
        .with_pattern_options(bounds::pattern_options())
        .build(schema)
        .map_err(|e| bounds::explain(&e, &found))?;
    bounds::take(budget, &found);
    Ok(validator)
}

/// Checks `args` against a compiled validator. `Err` holds the detail of an
/// `invalid_arguments` result.
pub fn check(validator: &Validator, args: &Value) -> Result<(), String> {
    if !args.is_object() {
        return Err(format!(
            "arguments must be an object, got {}",
            json_type_name(args)
        ));
    }
    if validator.is_valid(args) {
        return Ok(());
    }
    let mut details = Vec::new();
    let mut extra = 0usize;
    for error in validator.iter_errors(args) {
        if details.len() == MAX_REPORTED {
            extra += 1;
            continue;
        }
        let pointer = error.instance_path().as_str();
        let pointer = if pointer.is_empty() {
            "(root)"
        } else {
            pointer
        };
        details.push(format!("{pointer}: {}", truncate(&error.to_string(), 300)));
    }
    if details.is_empty() {
        details.push("(root): arguments do not match the input schema".into());
    }
    let mut text = details.join("; ");
    if extra > 0 {
        text.push_str(&format!("; and {extra} more"));
    }
    Err(text)
}

/// The JSON type name of a value, as JSON Schema spells it.
pub fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_schema() -> Value {
        json!({"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer","minimum":1}},
               "required":["path"],"additionalProperties":false})
    }

    #[test]
    fn non_object_schemas_are_refused() {
        assert!(compile(&json!({"type":"string"})).is_err());
        assert!(compile(&json!([1])).is_err());
        assert!(compile(&json!({"type":"object","properties":{"a":{"type":"nonsense"}}})).is_err());
    }

    #[test]
    fn errors_name_the_json_pointer_of_the_offending_value() {
        let v = compile(&read_schema()).unwrap();
        let err = check(&v, &json!({"path":"a","limit":0})).unwrap_err();
        assert!(err.starts_with("/limit: "), "{err}");
        let err = check(&v, &json!({})).unwrap_err();
        assert!(
            err.contains("(root)") && err.contains("\"path\" is a required property"),
            "{err}"
        );
        let err = check(&v, &json!({"path":"a","extra":1})).unwrap_err();
        assert!(err.contains("'extra' was unexpected"), "{err}");
    }

    #[test]
    fn no_coercion_of_strings_or_booleans() {
        let v = compile(&read_schema()).unwrap();
        assert!(check(&v, &json!({"path":"a","limit":"10"})).is_err());
        assert!(check(&v, &json!({"path":"a","limit":true})).is_err());
        assert!(check(&v, &json!({"path":"a","limit":10})).is_ok());
    }

    fn with_patterns(patterns: &[String]) -> Value {
        let properties: serde_json::Map<String, Value> = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("p{i}"), json!({"type": "string", "pattern": p})))
            .collect();
        json!({"type": "object", "properties": properties})
    }

    #[test]
    fn a_pattern_past_the_compiled_size_limit_is_refused_naming_keyword_place_and_limit() {
        let err = compile(&with_patterns(&["^a+$".into(), "[^x]{3000}y".into()])).unwrap_err();
        assert_eq!(
            err,
            format!(
                "`pattern` at /properties/p1/pattern (\"[^x]{{3000}}y\") compiles to more than \
                 {PATTERN_COMPILED_BYTES} bytes, the engine's limit for one pattern"
            )
        );
        let err = compile(&json!({"type": "object", "patternProperties": {"[^x]{3000}y": {}}}))
            .unwrap_err();
        assert!(
            err.starts_with("`patternProperties` at /patternProperties/[^x]{3000}y ")
                && err.contains(&PATTERN_COMPILED_BYTES.to_string()),
            "{err}"
        );
        // Not a regular expression at all: said so, not blamed on the limit.
        let err = compile(&with_patterns(&["(unclosed".into()])).unwrap_err();
        assert!(err.ends_with("is not a regular expression"), "{err}");
    }

    #[test]
    fn a_pattern_longer_than_the_limit_is_refused_before_it_compiles() {
        let long = "a".repeat(MAX_PATTERN_BYTES + 1);
        let err = compile(&with_patterns(&[long])).unwrap_err();
        assert_eq!(
            err,
            format!(
                "`pattern` at /properties/p0/pattern is {} bytes; the engine compiles patterns \
                 of at most {MAX_PATTERN_BYTES} bytes",
                MAX_PATTERN_BYTES + 1
            )
        );
        // At the limit, the length is no reason to refuse it (this one needs no regex engine).
        let exact = format!("^{}$", "a".repeat(MAX_PATTERN_BYTES - 2));
        assert!(compile(&with_patterns(&[exact])).is_ok());
    }

    #[test]
    fn a_catalog_compiles_a_bounded_number_of_patterns_and_refusals_take_none() {
        let mut budget = Budget::catalog();
        let half: Vec<String> = (0..MAX_CATALOG_PATTERNS / 2)
            .map(|i| format!("^p{i}-[a-z]+$"))
            .collect();
        compile_in(&with_patterns(&half), &mut budget).unwrap();
        // A refused schema takes nothing from the budget.
        assert!(compile_in(&with_patterns(&["[^x]{3000}y".into()]), &mut budget).is_err());
        compile_in(&with_patterns(&half), &mut budget).unwrap();
        let err = compile_in(&with_patterns(&["^one-more$".into()]), &mut budget).unwrap_err();
        assert_eq!(
            err,
            format!(
                "its schema has 1 patterns (`pattern`, `patternProperties`); one catalog \
                 compiles at most {MAX_CATALOG_PATTERNS} and the tools before it have \
                 {MAX_CATALOG_PATTERNS}"
            )
        );
        let all: Vec<String> = (0..=MAX_CATALOG_PATTERNS)
            .map(|i| format!("^{i}$"))
            .collect();
        assert!(compile(&with_patterns(&all)).is_err());
    }

    #[test]
    fn real_patterns_compile_and_match_within_the_bounds() {
        // The largest of the tool-search benchmark's catalog, and common generated ones.
        let datetime = r"^(?:(?:\d\d[2468][048]|\d\d[13579][26]|\d\d0[48]|[02468][048]00|[13579][26]00)-02-29|\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|(?:02)-(?:0[1-9]|1\d|2[0-8])))T(?:(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z))$";
        let email = r"^(?!\.)(?!.*\.\.)([A-Za-z0-9_'+\-\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\-]*\.)+[A-Za-z]{2,}$";
        let v = compile(&with_patterns(&[
            datetime.into(),
            email.into(),
            r"^[\p{L}\p{N}_-]{1,64}$".into(),
            r"\w{500}".into(),
        ]))
        .unwrap();
        assert!(
            check(
                &v,
                &json!({"p0": "2024-02-29T12:00:00Z", "p1": "a.b@example.org"})
            )
            .is_ok()
        );
        assert!(check(&v, &json!({"p0": "2023-02-29T12:00:00Z"})).is_err());
        assert!(check(&v, &json!({"p1": ".a@example.org"})).is_err());
    }

    #[test]
    fn the_tool_search_benchmark_catalog_compiles_within_the_bounds() {
        // 1,417 real tool definitions, as `load --search-set` registers them: one catalog.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/tool_search/catalog.json"
        );
        let catalog: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(catalog.len() > 1000);
        let mut budget = Budget::catalog();
        for tool in &catalog {
            if let Err(e) = compile_in(&tool["input_schema"], &mut budget) {
                panic!("{}: {e}", tool["id"]);
            }
        }
    }

    #[test]
    fn non_object_arguments_are_refused_before_the_schema() {
        let v = compile(&read_schema()).unwrap();
        assert_eq!(
            check(&v, &json!([1, 2])).unwrap_err(),
            "arguments must be an object, got array"
        );
    }
}
