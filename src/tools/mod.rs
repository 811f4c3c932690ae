//! The seed's five built-in tools, each a [`ToolSpec`] working in its call's session workspace.
//!
//! Each module owns one tool: its schema, its description, its policy and its handler. The file
//! tools reach the disk only through the workspace's capability handle (see
//! `crate::workspace`); `bash` runs with the workspace as its home and working directory.
//! The workspace comes with each call ([`crate::ToolContext::workspace`]); no spec captures one.

use serde_json::Value;

use crate::tool::{Access, Mode, Resource, ToolContext, ToolError, ToolSpec};
use crate::workspace::Workspace;

pub mod bash;
mod bash_capture;
pub mod edit_file;
pub mod glob;
pub mod read_file;
pub mod write_file;

/// The five built-in tools, in the order bash, read_file, write_file, edit_file, glob. Each call
/// works in the workspace of its session ([`crate::ToolContext::workspace`]), so one engine
/// serves sessions confined to different directories.
pub fn builtin_tools() -> Vec<ToolSpec> {
    vec![
        bash::spec(),
        read_file::spec(),
        write_file::spec(),
        edit_file::spec(),
        glob::spec(),
    ]
}

/// The access of a call that touches the one workspace path in its argument `arg` (`read_file`
/// reads it; `write_file` and `edit_file` write it). Without a workspace, or for a path the
/// confinement refuses, there is nothing to declare: the error makes the call exclusive, and the
/// call itself is then answered with the confinement's error.
pub(crate) fn path_access(
    args: &Value,
    ws: Option<&Workspace>,
    arg: &str,
    mode: Mode,
) -> Result<Access, ToolError> {
    let ws = ws.ok_or_else(|| ToolError::execution("no workspace"))?;
    let resource = Resource::path(ws, str_arg(args, arg)?)?;
    Ok(Access::Set(vec![(resource, mode)]))
}

/// A required string argument. The schema already guarantees it, but handlers may be called
/// directly, so a missing one is `invalid_arguments`, never a panic.
pub(crate) fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::invalid(format!("argument '{name}' must be a string")))
}

/// The call's workspace for a tool that writes it: `permission_denied` when the engine's sandbox
/// is `read-only` (the file tools keep their own confinement and also respect the mode).
pub(crate) fn writable_workspace(ctx: &ToolContext) -> Result<&Workspace, ToolError> {
    if ctx
        .session
        .sandbox()
        .is_some_and(|s| !s.workspace_writable())
    {
        return Err(ToolError::permission(
            "the workspace is read-only (sandbox mode read-only)",
        ));
    }
    ctx.workspace()
}
