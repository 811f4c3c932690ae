//! `edit_file`: replaces the first exact occurrence of a text in a workspace file.
//!
//! As in the seed, only the FIRST occurrence is replaced, even when the text appears more than
//! once. The file is read with the same checks as `read_file` ([`read_text`]) and written back with
//! [`Workspace::write_atomic`]; every byte outside the replaced span is kept as it was (CRLF line
//! ends, a BOM, a missing final newline). Text not found is an `execution_error`
//! (`text not found in PATH`); an empty `old_text` is `invalid_arguments`.

use serde_json::{Value, json};

use crate::file_state::{DirLock, Stamp};
use crate::tool::{Access, Handler, Mode, ToolContext, ToolError, ToolSpec};
use crate::tools::read_file::read_text;
use crate::tools::str_arg;
use crate::workspace::Workspace;

/// The `edit_file` spec: blocking, not concurrency-safe; a call **writes its `path`** (it reads
/// it too, which a write covers; see [`access`]).
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "edit_file",
        "Replace the FIRST exact occurrence of old_text with new_text in a workspace file. Only \
         that first match changes, even when old_text occurs several times: include enough \
         surrounding text to pick the one you mean. Every other byte (line endings, a BOM, a \
         missing final newline) is kept; the file is replaced atomically.",
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "old_text": {"type": "string", "description": "Exact text to find (first occurrence is replaced)."},
                "new_text": {"type": "string", "description": "Replacement text."}
            },
            "required": ["path", "old_text", "new_text"],
            "additionalProperties": false
        }),
        Handler::blocking(|args, ctx| run(super::writable_workspace(ctx)?, args, ctx)),
    )
    .path_subject("path")
    .concurrency_safe(false)
    .defer(crate::tool::Defer::Never)
    .access(access)
}

/// The access of an `edit_file` call: a write of its `path` (as `write_file`).
pub fn access(args: &Value, ws: Option<&Workspace>) -> Result<Access, ToolError> {
    super::path_access(args, ws, "path", Mode::Write)
}

fn run(ws: &Workspace, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
    let path = str_arg(args, "path")?;
    let old_text = str_arg(args, "old_text")?;
    let new_text = str_arg(args, "new_text")?;
    if old_text.is_empty() {
        return Err(ToolError::invalid("argument 'old_text' must not be empty"));
    }
    let rel = ws.relative(path)?;
    // Check, read, modify and rename under the directory's lock: no other edit interleaves.
    let _lock = DirLock::for_path(ws, &rel, path)?;
    ctx.session.files().check_unchanged(ws, &rel, path)?;
    let text = read_text(ws, &rel, path)?;
    let edited = replace_first(&text, old_text, new_text)
        .ok_or_else(|| ToolError::execution(format!("text not found in {path}")))?;
    ws.write_atomic_unless(&rel, edited.as_bytes(), path, &|| ctx.begin_commit())?;
    if let Some(stamp) = Stamp::now(ws, &rel) {
        ctx.session.files().record(&rel, stamp);
    }
    Ok(format!("Edited {path}"))
}

/// `text` with the first `old` replaced by `new`, or `None` when `old` does not occur.
fn replace_first(text: &str, old: &str, new: &str) -> Option<String> {
    let at = text.find(old)?;
    let mut out = String::with_capacity(text.len() - old.len() + new.len());
    out.push_str(&text[..at]);
    out.push_str(new);
    out.push_str(&text[at + old.len()..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_occurrence_is_replaced() {
        assert_eq!(replace_first("a-a-a", "a", "b").as_deref(), Some("b-a-a"));
        assert_eq!(replace_first("abc", "x", "y"), None);
    }
}
