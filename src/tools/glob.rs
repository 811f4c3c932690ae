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

use crate::tool::{Access, Resource, ToolError, ToolSpec, cap_output};
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

/// The `glob` spec: blocking, concurrency-safe; a call **reads the static prefix of its pattern**
/// (see [`access`]).
pub fn spec() -> ToolSpec {
    ToolSpec::typed_blocking(
        "glob",
        "Find workspace paths matching a glob pattern (`**` recurses), e.g. `src/**/*.rs`.",
        |args: GlobArgs, ctx| run(ctx.workspace()?, &args.pattern),
    )
    .concurrency_safe(true)
    .defer(crate::tool::Defer::Never)
    .effect(crate::tool::Effect::ReadOnly)
    .access(access)
    .output_cap(OUTPUT_CAP)
}

/// The access of a `glob` call: a read of the directory its pattern is confined to — the
/// segments before the first one holding a glob metacharacter (`*?[{\`): `src/**/*.rs` reads
/// `src`, `**/*.rs` or `*.md` reads the whole workspace, a pattern without metacharacters reads
/// exactly the path it names. `.` segments are dropped as the walk drops them; a pattern the tool
/// refuses (`..`, a leading `/`) makes the call exclusive (it is answered with the refusal).
pub fn access(args: &serde_json::Value, ws: Option<&Workspace>) -> Result<Access, ToolError> {
    let ws = ws.ok_or_else(|| ToolError::execution("no workspace"))?;
    let pattern = args
        .get("pattern")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| ToolError::invalid("argument 'pattern' must be a string"))?;
    Ok(Access::read(static_prefix(ws, pattern)?))
}

/// The directory a pattern's matches all lie in (the workspace root when the first segment
/// already holds a metacharacter).
fn static_prefix(ws: &Workspace, pattern: &str) -> Result<Resource, ToolError> {
    if pattern.starts_with('/') {
        return Err(ToolError::permission(format!(
            "path escapes workspace: {pattern}"
        )));
    }
    let literal: Vec<&str> = pattern
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .take_while(|s| !s.contains(['*', '?', '[', '{', '\\']))
        .collect();
    if literal.is_empty() {
        return Ok(Resource::root());
    }
    Resource::path(ws, &literal.join("/"))
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
    fn a_glob_reads_the_directory_before_its_first_metacharacter() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let prefix = |p: &str| {
            static_prefix(&ws, p).map(|r| match r {
                Resource::Path(p) => p.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            })
        };
        assert_eq!(prefix("src/**/*.rs").unwrap(), "src");
        assert_eq!(prefix("./src/a/*.rs").unwrap(), "src/a");
        assert_eq!(prefix("**/*.rs").unwrap(), ".");
        assert_eq!(prefix("*.md").unwrap(), ".");
        assert_eq!(prefix("src/main.rs").unwrap(), "src/main.rs");
        assert_eq!(prefix("src/{a,b}/x").unwrap(), "src");
        assert!(prefix("../x/*").is_err() && prefix("/etc/*").is_err());
    }

    #[test]
    fn leading_dot_segments_are_dropped_and_hidden_names_need_a_dot_in_the_pattern() {
        let p = parse("./src/*.rs").unwrap();
        assert!(p.matcher.is_match("src/a.rs") && !p.hidden);
        assert!(parse("**/.env").unwrap().hidden);
    }
}
