//! `glob`: lists workspace paths matching a glob pattern, sorted, one per line.
//!
//! The walk goes through the workspace's capability handle and never follows a symlink: a symlink
//! is listed as an entry of its own when it matches, but never descended into, so nothing outside
//! the workspace is listed and link loops cannot trap the walk. Matching uses globset with
//! `literal_separator` (`*` stays inside one path segment, `**` crosses segments, `**/x` also
//! matches `x` at the top).
//!
//! Like the seed's Python `glob(recursive=True)`, wildcards do not match hidden names (starting
//! with `.`): hidden entries are neither listed nor descended into unless some segment of the
//! pattern itself starts with `.` (then hidden names are matched like any other). A trailing `/`
//! matches directories only. A pattern starting with `/` or with a `..` segment is
//! `permission_denied`. The walk stops after [`MAX_ENTRIES`] entries and says so on a last line.

use std::path::PathBuf;

use globset::{GlobBuilder, GlobMatcher};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::tool::{ToolError, ToolSpec, cap_output};
use crate::workspace::{MAX_PATH_BYTES, Workspace};

/// Output cap of `glob`, in bytes.
pub const OUTPUT_CAP: usize = 50_000;
/// Most directory entries one call visits before it stops.
pub const MAX_ENTRIES: usize = 100_000;

/// The arguments of `glob` (a typed tool: its input schema is generated from this struct).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct GlobArgs {
    /// Glob pattern, relative to the workspace.
    pub pattern: String,
}

/// The `glob` spec: blocking, concurrency-safe.
pub fn spec() -> ToolSpec {
    ToolSpec::typed_blocking(
        "glob",
        "Find workspace paths matching a glob pattern (`**` recurses), e.g. `src/**/*.rs`.",
        |args: GlobArgs, ctx| run(ctx.workspace()?, &args.pattern),
    )
    .concurrency_safe(true)
    .output_cap(OUTPUT_CAP)
}

/// A parsed pattern: its matcher and the two flags the walk needs.
struct Pattern {
    matcher: GlobMatcher,
    dirs_only: bool,
    hidden: bool,
}

fn parse(pattern: &str) -> Result<Pattern, ToolError> {
    if pattern.is_empty() || pattern.contains('\0') || pattern.len() > MAX_PATH_BYTES {
        return Err(ToolError::invalid(
            "pattern must be non-empty, without NUL, at most 4096 bytes",
        ));
    }
    let segments: Vec<&str> = pattern
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    if pattern.starts_with('/') || segments.contains(&"..") {
        return Err(ToolError::permission(format!(
            "path escapes workspace: {pattern}"
        )));
    }
    if segments.is_empty() {
        return Err(ToolError::invalid(format!(
            "pattern names no path: {pattern}"
        )));
    }
    let glob = GlobBuilder::new(&segments.join("/"))
        .literal_separator(true)
        .build()
        .map_err(|e| ToolError::invalid(format!("invalid glob pattern: {e}")))?;
    Ok(Pattern {
        matcher: glob.compile_matcher(),
        dirs_only: pattern.ends_with('/'),
        hidden: segments.iter().any(|s| s.starts_with('.')),
    })
}

fn run(ws: &Workspace, pattern: &str) -> Result<String, ToolError> {
    let parsed = parse(pattern)?;
    let (mut matches, complete) = walk(ws, &parsed)?;
    if matches.is_empty() && complete {
        return Ok("(no matches)".to_string());
    }
    matches.sort_unstable();
    let mut out = matches.join("\n");
    if !complete {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "(stopped after {MAX_ENTRIES} entries; narrow the pattern)"
        ));
    }
    Ok(cap_output(out, OUTPUT_CAP))
}

/// Walks the workspace depth-first without following symlinks. Returns the matching relative
/// paths and whether the walk finished (false when it hit [`MAX_ENTRIES`]). Subdirectories that
/// cannot be read are skipped; an unreadable root is an error.
fn walk(ws: &Workspace, pattern: &Pattern) -> Result<(Vec<String>, bool), ToolError> {
    let mut matches = Vec::new();
    let mut visited = 0usize;
    let mut pending: Vec<String> = vec![String::new()];
    while let Some(prefix) = pending.pop() {
        let entries = if prefix.is_empty() {
            ws.dir()
                .entries()
                .map_err(|e| Workspace::io_error(".", &e))?
        } else {
            match ws.dir().read_dir(PathBuf::from(&prefix)) {
                Ok(entries) => entries,
                Err(_) => continue,
            }
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            visited += 1;
            if visited > MAX_ENTRIES {
                return Ok((matches, false));
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && !pattern.hidden {
                continue;
            }
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            // `file_type` describes the entry itself: a symlink to a directory is not a directory.
            let is_dir = file_type.is_dir();
            let rel = if prefix.is_empty() {
                name.into_owned()
            } else {
                format!("{prefix}/{name}")
            };
            if (is_dir || !pattern.dirs_only) && pattern.matcher.is_match(&rel) {
                matches.push(rel.clone());
            }
            if is_dir {
                pending.push(rel);
            }
        }
    }
    Ok((matches, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_that_climb_or_start_at_the_root_are_refused() {
        for p in ["/etc/*", "../x", "a/../../b", "**/.."] {
            assert_eq!(
                parse(p).err().map(|e| e.code),
                Some(crate::protocol::ErrorCode::PermissionDenied),
                "{p}"
            );
        }
    }

    #[test]
    fn leading_dot_segments_are_dropped_and_hidden_names_need_a_dot_in_the_pattern() {
        let p = parse("./src/*.rs").unwrap();
        assert!(p.matcher.is_match("src/a.rs") && !p.hidden);
        assert!(parse("**/.env").unwrap().hidden);
    }
}
