//! The seed's five built-in tools, each a [`ToolSpec`] built over one [`Workspace`].
//!
//! Each module owns one tool: its schema, its description, its policy and its handler. The file
//! tools reach the disk only through the workspace's capability handle (see
//! [`crate::workspace`]); `bash` runs with the workspace as its home and working directory.
//! Nothing here keeps state between calls beyond the `Workspace` each spec captures.

use serde_json::Value;

use crate::tool::{ToolError, ToolSpec};
use crate::workspace::Workspace;

pub mod bash;
mod bash_capture;
pub mod edit_file;
pub mod glob;
pub mod read_file;
pub mod write_file;

/// The five built-in tools, in the order bash, read_file, write_file, edit_file, glob.
pub fn builtin_tools(ws: &Workspace) -> Vec<ToolSpec> {
    vec![
        bash::spec(ws),
        read_file::spec(ws),
        write_file::spec(ws),
        edit_file::spec(ws),
        glob::spec(ws),
    ]
}

/// A required string argument. The schema already guarantees it, but handlers may be called
/// directly, so a missing one is `invalid_arguments`, never a panic.
pub(crate) fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::invalid(format!("argument '{name}' must be a string")))
}
