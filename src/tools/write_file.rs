//! `write_file`: writes a whole file in the workspace, creating parent directories.
//!
//! The write itself is [`Workspace::write_atomic`]: the old content stays until the new content is
//! complete and synced, then a rename replaces it; the file's permissions are kept. A symlink leaf
//! is followed only to a target inside the workspace. A call cancelled (or timed out) before the
//! rename leaves the file as it was. The result is the seed's
//! `Wrote N bytes to PATH`, N counting UTF-8 bytes and PATH as the model gave it.

use serde_json::{Value, json};

use crate::file_state::{DirLock, Stamp};
use crate::tool::{Access, Handler, Mode, ToolContext, ToolError, ToolSpec};
use crate::tools::str_arg;
use crate::workspace::Workspace;

/// The `write_file` spec: blocking, not concurrency-safe (it never starts while the answer is
/// still streaming); a call **writes its `path`** (see [`access`]).
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "write_file",
        "Write a UTF-8 text file in the workspace, replacing it if it exists and creating parent directories.",
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "content": {"type": "string", "description": "The complete new file content."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        }),
        Handler::blocking(|args, ctx| run(super::writable_workspace(ctx)?, args, ctx)),
    )
    .path_subject("path")
    .concurrency_safe(false)
    .defer(crate::tool::Defer::Never)
    .effect(crate::tool::Effect::Idempotent)
    .access(access)
}

/// The access of a `write_file` call: a write of its `path`. The parent directories it may
/// create are ancestors of that path, and a path conflicts with its ancestors (a listing of `a/`
/// waits for a write of `a/b/c.txt`), so writing the path covers them.
pub fn access(args: &Value, ws: Option<&Workspace>) -> Result<Access, ToolError> {
    super::path_access(args, ws, "path", Mode::Write)
}

fn run(ws: &Workspace, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
    let path = str_arg(args, "path")?;
    let content = str_arg(args, "content")?;
    let rel = ws.relative(path)?;
    let _lock = DirLock::for_path(ws, &rel, path)?;
    ctx.session.files().check_unchanged(ws, &rel, path)?;
    ws.write_atomic_unless(&rel, content.as_bytes(), path, &|| ctx.begin_commit())?;
    if let Some(stamp) = Stamp::now(ws, &rel) {
        ctx.session.files().record(&rel, stamp);
    }
    Ok(format!("Wrote {} bytes to {path}", content.len()))
}
