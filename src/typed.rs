//! Typed tools: a Rust struct is the tool's arguments and its input schema.
//!
//! [`ToolSpec::typed`] (async handler) and [`ToolSpec::typed_blocking`] take a handler over
//! `Args: Deserialize + JsonSchema`: the input schema is generated from the struct by `schemars`
//! (JSON Schema 2020-12; doc comments become descriptions), and the handler receives the
//! arguments already decoded. Decisions made for embedders:
//!
//! * the generated schema refuses unknown properties (`additionalProperties: false`) unless the
//!   struct says otherwise; its root `$schema`, `title` and `description` keys are dropped (the
//!   tool's description is what the model reads; the struct's doc comment documents the Rust type);
//! * the engine validates arguments against the schema before the handler runs, as for any tool;
//!   if serde still cannot decode them (a schema looser than the struct), the call is answered
//!   `invalid_arguments` and the handler does not run.

use std::future::Future;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::tool::{Handler, ToolContext, ToolError, ToolOutput, ToolSpec};

/// The input schema of `A`: an object schema, `additionalProperties: false` unless `A` sets it.
pub fn schema_for<A: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let mut schema = generator.into_root_schema_for::<A>().to_value();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        // The struct's own doc comment documents the Rust type; the tool has its description.
        object.remove("description");
        if object.get("type") == Some(&Value::from("object")) {
            object
                .entry("additionalProperties")
                .or_insert(Value::Bool(false));
        }
    }
    schema
}

/// Decodes validated arguments into `A`; a mismatch is `invalid_arguments`.
fn decode<A: DeserializeOwned>(args: Value) -> Result<A, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::invalid(format!("arguments do not fit the tool: {e}")))
}

impl ToolSpec {
    /// A tool whose arguments are the struct `A` and whose handler is async. The input schema is
    /// generated from `A` (see `typed.rs`).
    ///
    /// ```
    /// use schemars::JsonSchema;
    /// use serde::Deserialize;
    /// use switchboard::ToolSpec;
    ///
    /// /// Arguments of `lookup`.
    /// #[derive(Deserialize, JsonSchema)]
    /// struct Lookup {
    ///     /// The word to look up.
    ///     word: String,
    /// }
    ///
    /// let spec = ToolSpec::typed("lookup", "Look a word up.", |args: Lookup, _ctx| async move {
    ///     Ok(format!("{} is a word", args.word))
    /// });
    /// assert_eq!(spec.input_schema["required"][0], "word");
    /// assert_eq!(spec.input_schema["additionalProperties"], false);
    /// ```
    pub fn typed<A, F, Fut, O>(
        name: impl Into<String>,
        description: impl Into<String>,
        f: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
        O: Into<ToolOutput> + 'static,
    {
        let f = std::sync::Arc::new(f);
        let handler = Handler::future(move |args: Value, ctx: ToolContext| {
            let decoded = decode::<A>(args);
            let f = std::sync::Arc::clone(&f);
            async move { f(decoded?, ctx).await }
        });
        ToolSpec::new(name, description, schema_for::<A>(), handler)
    }

    /// [`ToolSpec::typed`] with a synchronous handler that may block (run on the blocking pool).
    pub fn typed_blocking<A, F, O>(
        name: impl Into<String>,
        description: impl Into<String>,
        f: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A, &ToolContext) -> Result<O, ToolError> + Send + Sync + 'static,
        O: Into<ToolOutput>,
    {
        let handler = Handler::blocking(move |args: &Value, ctx: &ToolContext| {
            f(decode::<A>(args.clone())?, ctx)
        });
        ToolSpec::new(name, description, schema_for::<A>(), handler)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    /// Arguments with an optional field.
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Args {
        /// A path.
        path: String,
        /// At most this many.
        #[schemars(range(min = 1))]
        limit: Option<u64>,
    }

    #[test]
    fn the_schema_is_an_object_schema_that_refuses_unknown_properties() {
        let schema = schema_for::<Args>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["path"]));
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["path"]["description"], "A path.");
        assert!(schema.get("$schema").is_none() && schema.get("title").is_none());
        crate::validation::compile(&schema).expect("the engine compiles it");
    }

    #[test]
    fn arguments_serde_cannot_decode_are_invalid_arguments() {
        let err = decode::<Args>(json!({"path": 3})).err().unwrap();
        assert_eq!(err.code, crate::ErrorCode::InvalidArguments);
    }
}
