//! `read_file`: reads a UTF-8 text file from the workspace, optionally only its first lines.
//!
//! It owns [`read_text`], the checked read that `edit_file` shares. The file's type is checked
//! before it is opened and again on the opened handle (so a swap in between is caught), and the
//! open uses `O_NONBLOCK | O_NOCTTY`: a FIFO, socket or device is refused at once
//! (`not a regular file: P`), never blocking a thread; a directory is `is a directory: P`.
//! Files larger than [`MAX_TEXT_BYTES`] are refused rather than loaded; a NUL byte anywhere means
//! `binary file: P`; invalid UTF-8 is reported with its byte offset, never replaced. A file with
//! more than one hard link is refused (`permission_denied`) unless the workspace allows them
//! ([`Workspace::allow_hard_links`]).
//!
//! As in the seed, the text is split into lines and joined with `\n` (so `\r\n` is shown as `\n`
//! and a final newline is dropped); `limit` keeps the first N lines and adds `... (K more lines)`.
//! The result is bounded by [`cap_output`]: at most [`OUTPUT_CAP`] bytes (head and tail), and
//! lines longer than 2,000 bytes clamped.

use std::io::Read;
use std::path::Path;

use cap_std::fs::{OpenOptions, OpenOptionsExt};
use serde_json::{Value, json};

use crate::file_state::Stamp;
use crate::tool::{Access, Handler, Mode, ToolContext, ToolError, ToolSpec, cap_output};
use crate::tools::str_arg;
use crate::workspace::Workspace;

/// Output cap of `read_file`, in bytes.
pub const OUTPUT_CAP: usize = 50_000;
/// Largest file `read_file` and `edit_file` will load, in bytes (64 MiB).
pub const MAX_TEXT_BYTES: u64 = 64 * 1024 * 1024;

/// The `read_file` spec: blocking, concurrency-safe; a call **reads its `path`** (see
/// [`access`]).
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "read_file",
        "Read a UTF-8 text file from the workspace. `limit` returns only the first N lines.",
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "limit": {"type": "integer", "minimum": 1, "description": "Return at most this many lines."}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
        Handler::blocking(|args, ctx| run(ctx.workspace()?, args, ctx)),
    )
    .path_subject("path")
    .concurrency_safe(true)
    .defer(crate::tool::Defer::Never)
    .effect(crate::tool::Effect::ReadOnly)
    .access(access)
    .output_cap(OUTPUT_CAP)
}

/// The access of a `read_file` call: a read of its `path`, normalised like the confinement.
pub fn access(args: &Value, ws: Option<&Workspace>) -> Result<Access, ToolError> {
    super::path_access(args, ws, "path", Mode::Read)
}

fn run(ws: &Workspace, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
    let path = str_arg(args, "path")?;
    let limit = match args.get("limit") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(ToolError::invalid(
                    "argument 'limit' must be an integer >= 1",
                ));
            }
        },
    };
    let rel = ws.relative(path)?;
    let (text, stamp) = read_text_stamped(ws, &rel, path)?;
    ctx.session.files().record(&rel, stamp);
    Ok(cap_output(render_lines(&text, limit), OUTPUT_CAP))
}

/// Reads the regular file at `rel` as UTF-8 text through the workspace handle. `shown` is the
/// model's path, used in error details.
pub fn read_text(ws: &Workspace, rel: &Path, shown: &str) -> Result<String, ToolError> {
    read_text_stamped(ws, rel, shown).map(|(text, _)| text)
}

/// [`read_text`], with the [`Stamp`] of the file it read (taken from the open handle).
pub fn read_text_stamped(
    ws: &Workspace,
    rel: &Path,
    shown: &str,
) -> Result<(String, Stamp), ToolError> {
    // Refuse special files before opening them (opening a device can have effects of its own)...
    let meta = ws
        .dir()
        .metadata(rel)
        .map_err(|e| Workspace::io_error(shown, &e))?;
    check_regular(&meta, shown)?;
    // ...and again on the opened handle, in case something was swapped in meanwhile; the open
    // itself never blocks (`O_NONBLOCK`) nor takes a terminal (`O_NOCTTY`).
    let mut options = OpenOptions::new();
    options
        .read(true)
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32);
    let file = ws
        .dir()
        .open_with(rel, &options)
        .map_err(|e| Workspace::io_error(shown, &e))?;
    let meta = file
        .metadata()
        .map_err(|e| Workspace::io_error(shown, &e))?;
    check_regular(&meta, shown)?;
    check_single_link(ws, &meta, shown)?;
    if meta.len() > MAX_TEXT_BYTES {
        return Err(ToolError::execution(format!(
            "file too large ({} bytes, limit {MAX_TEXT_BYTES}): {shown}",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // `take` bounds a file that grows while we read it.
    (&file)
        .take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Workspace::io_error(shown, &e))?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(ToolError::execution(format!(
            "file too large (over {MAX_TEXT_BYTES} bytes): {shown}"
        )));
    }
    Ok((decode_text(bytes, shown)?, Stamp::of(&meta)))
}

/// Refuses directories and anything that is not a regular file (FIFOs, sockets, devices).
fn check_regular(meta: &cap_std::fs::Metadata, shown: &str) -> Result<(), ToolError> {
    if meta.is_dir() {
        return Err(ToolError::execution(format!("is a directory: {shown}")));
    }
    if !meta.is_file() {
        return Err(ToolError::execution(format!("not a regular file: {shown}")));
    }
    Ok(())
}

/// Refuses a file with more than one hard link unless the workspace allows them: its other name
/// may be outside the workspace (see [`Workspace::allow_hard_links`]). Checked on the opened
/// handle, so the file read is the file checked.
fn check_single_link(
    ws: &Workspace,
    meta: &cap_std::fs::Metadata,
    shown: &str,
) -> Result<(), ToolError> {
    use cap_std::fs::MetadataExt;
    if meta.nlink() > 1 && !ws.hard_links_allowed() {
        return Err(ToolError::permission(format!(
            "hard-linked file: {shown} (it has {} names and another may be outside the workspace)",
            meta.nlink()
        )));
    }
    Ok(())
}

/// Checks for binary content and decodes UTF-8, naming the first bad byte offset.
fn decode_text(bytes: Vec<u8>, shown: &str) -> Result<String, ToolError> {
    if bytes.contains(&0) {
        return Err(ToolError::execution(format!("binary file: {shown}")));
    }
    String::from_utf8(bytes).map_err(|e| {
        ToolError::execution(format!(
            "file is not valid UTF-8 (byte offset {}): {shown}",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// The seed's rendering: lines joined by `\n`, cut to `limit` with a `... (K more lines)` line.
fn render_lines(text: &str, limit: Option<usize>) -> String {
    let lines: Vec<&str> = text.lines().collect();
    match limit {
        Some(limit) if limit < lines.len() => {
            let more = lines.len() - limit;
            let mut out = lines[..limit].join("\n");
            out.push_str(&format!("\n... ({more} more lines)"));
            out
        }
        _ => lines.join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_keeps_the_first_lines_and_counts_the_rest() {
        assert_eq!(
            render_lines("a\nb\nc\nd\n", Some(2)),
            "a\nb\n... (2 more lines)"
        );
        assert_eq!(render_lines("a\r\nb", Some(5)), "a\nb");
        assert_eq!(render_lines("", None), "");
    }

    #[test]
    fn invalid_utf8_names_the_byte_offset() {
        let err = decode_text(b"ok\xffno".to_vec(), "f").unwrap_err();
        assert_eq!(err.detail, "file is not valid UTF-8 (byte offset 2): f");
        let err = decode_text(b"a\0b".to_vec(), "f").unwrap_err();
        assert_eq!(err.detail, "binary file: f");
    }
}
