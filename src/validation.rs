//! Argument validation: the `jsonschema` crate, compiled once per tool at registration.
//!
//! A call's arguments must be a JSON object that satisfies the tool's input schema (full JSON
//! Schema, draft 2020-12 unless the schema says otherwise). No coercion: `"10"` is not `10`. Error
//! details name the JSON pointer of each offending value (`/limit: 0 is less than the minimum of
//! 1`; `(root)` for the arguments object itself) so a model can fix its call.

use jsonschema::Validator;
use serde_json::Value;

/// How many schema violations a detail lists before it says "and N more".
const MAX_REPORTED: usize = 8;

/// Compiles a tool's input schema. Refuses anything that is not an object schema (`"type":
/// "object"`) or that does not compile. Remote `$ref`s are not fetched.
pub fn compile(schema: &Value) -> Result<Validator, String> {
    let obj = schema
        .as_object()
        .ok_or_else(|| "input schema must be a JSON object".to_string())?;
    if obj.get("type").and_then(Value::as_str) != Some("object") {
        return Err("input schema must have \"type\": \"object\"".into());
    }
    jsonschema::validator_for(schema).map_err(|e| format!("input schema does not compile: {e}"))
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

    #[test]
    fn non_object_arguments_are_refused_before_the_schema() {
        let v = compile(&read_schema()).unwrap();
        assert_eq!(
            check(&v, &json!([1, 2])).unwrap_err(),
            "arguments must be an object, got array"
        );
    }
}
