//! What compiling one schema may cost: the engine's bounds on the regular expressions of a schema
//! (`pattern`, the keys of `patternProperties`), per pattern and per catalog.
//!
//! A pattern is a few bytes of text and can compile to megabytes: `[^x]{3000}y` is 11 bytes and,
//! under the regex engine's own default limit (10 MiB), about 3 MB of automata; a hundred of them
//! in a 5 KB request took a sidecar to a gigabyte. So every pattern is at most [`MAX_PATTERN_BYTES`] of
//! text and compiles to at most [`PATTERN_COMPILED_BYTES`] (the regex engine's size limit, checked
//! while it compiles, so a refusal costs no more than the limit), its lazy DFA cache is at most
//! [`PATTERN_DFA_BYTES`], and one catalog — a session's client tools, one MCP server's listing,
//! one registration of Rust tools — compiles at most [`MAX_CATALOG_PATTERNS`] patterns: its
//! compiled patterns are bounded by the product (16 MiB), whatever the catalog's text.
//!
//! `format` compiles nothing: each format is a fixed check, linear in the argument (`format:
//! regex` parses the argument's text, it never compiles it), so formats need no bound of their
//! own. A [`Budget`] is what one catalog may still compile; [`super::compile_in`] takes from it.

use jsonschema::PatternOptions;
use jsonschema::error::{ValidationError, ValidationErrorKind};
use serde_json::Value;

/// Longest pattern the engine compiles, in bytes of text: sixteen times the longest one in the
/// tool-search benchmark's catalog of 1,417 real tools (256 bytes, an ISO date-time). It bounds
/// the parsing; what the pattern compiles to is [`PATTERN_COMPILED_BYTES`]'s (a literal of text
/// costs about 32 bytes a character, so an unanchored literal past about 2,000 characters is
/// refused by that one).
pub const MAX_PATTERN_BYTES: usize = 4 * 1024;
/// Largest compiled pattern, in bytes: the regex engine's size limit (its compiled automaton, for
/// each piece a pattern with look-around is split into). The benchmark catalog's largest pattern
/// needs 5 KB; `\w{500}` 48 KB; `[^x]{3000}y` 3 MB.
pub const PATTERN_COMPILED_BYTES: usize = 64 * 1024;
/// Largest lazy DFA cache of one compiled pattern, in bytes (the regex engine's default is 2 MiB;
/// a smaller cache only makes a match of a large pattern slower, never wrong).
pub const PATTERN_DFA_BYTES: usize = 64 * 1024;
/// Backtracking steps of one match of a pattern that backtracks (look-around, back-references):
/// past it the match is an error, and the arguments are invalid.
pub const PATTERN_BACKTRACK_LIMIT: usize = 1_000_000;
/// Most patterns one catalog compiles. The benchmark catalog has 96 in all, 54 in its largest
/// server (mongodb); a session may declare 256 client tools.
pub const MAX_CATALOG_PATTERNS: usize = 256;

/// What one catalog may still compile: made for each catalog, taken from by each schema compiled
/// into it. A schema that is refused takes nothing.
#[derive(Debug)]
pub struct Budget {
    patterns: usize,
}

impl Budget {
    /// The budget of a whole catalog that comes from outside the process: a session's client
    /// tools, one MCP server's listing.
    pub fn catalog() -> Budget {
        Budget {
            patterns: MAX_CATALOG_PATTERNS,
        }
    }

    /// The budget of the embedder's own Rust tools: each pattern is bounded as any other, their
    /// number is not (the embedder's code, not a peer's; a catalog of 10,000 tools is theirs to
    /// register).
    pub fn embedder() -> Budget {
        Budget {
            patterns: usize::MAX,
        }
    }
}

/// The patterns of a schema, and the paths that lead to them.
#[derive(Debug)]
pub(super) struct Patterns<'a> {
    /// Every step walked: (its parent's index, the step); the root's parent is `usize::MAX`.
    steps: Vec<(usize, Step<'a>)>,
    found: Vec<Found<'a>>,
}

/// A pattern found in a schema: where (the step that leads to it), under which keyword, and its
/// text.
#[derive(Debug)]
struct Found<'a> {
    step: usize,
    /// `pattern` or `patternProperties`.
    keyword: &'static str,
    pattern: &'a str,
}

/// One step of a path from the schema's root: a key, or an index of an array.
#[derive(Debug, Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

impl Patterns<'_> {
    /// The JSON Pointer of `found` in the schema (made only for the pattern a refusal names).
    fn pointer(&self, found: &Found<'_>) -> String {
        let mut path = Vec::new();
        let mut i = found.step;
        while i != usize::MAX {
            path.push(self.steps[i].1);
            i = self.steps[i].0;
        }
        let mut text = String::new();
        for s in path.into_iter().rev() {
            text.push('/');
            match s {
                Step::Key(key) => text.push_str(&escape(key)),
                Step::Index(n) => text.push_str(&n.to_string()),
            }
        }
        text
    }
}

/// The regex options every schema is compiled with.
pub(super) fn pattern_options() -> PatternOptions<jsonschema::FancyRegex> {
    PatternOptions::fancy_regex()
        .size_limit(PATTERN_COMPILED_BYTES)
        .dfa_size_limit(PATTERN_DFA_BYTES)
        .backtrack_limit(PATTERN_BACKTRACK_LIMIT)
}

/// Checks the patterns of `schema` against the bounds before anything compiles: their length,
/// and their number against what `budget` has left. `Ok` holds them (for [`explain`] and
/// [`take`]).
pub(super) fn check<'a>(schema: &'a Value, budget: &Budget) -> Result<Patterns<'a>, String> {
    let found = patterns(schema);
    if let Some(long) = found
        .found
        .iter()
        .find(|f| f.pattern.len() > MAX_PATTERN_BYTES)
    {
        return Err(format!(
            "`{}` at {} is {} bytes; the engine compiles patterns of at most {MAX_PATTERN_BYTES} \
             bytes",
            long.keyword,
            found.pointer(long),
            long.pattern.len()
        ));
    }
    if found.found.len() > budget.patterns {
        let used = MAX_CATALOG_PATTERNS - budget.patterns;
        return Err(format!(
            "its schema has {} patterns (`pattern`, `patternProperties`); one catalog compiles at \
             most {MAX_CATALOG_PATTERNS}{}",
            found.found.len(),
            if used > 0 {
                format!(" and the tools before it have {used}")
            } else {
                String::new()
            }
        ));
    }
    Ok(found)
}

/// Takes what a compiled schema's patterns cost from `budget`.
pub(super) fn take(budget: &mut Budget, found: &Patterns<'_>) {
    budget.patterns = budget.patterns.saturating_sub(found.found.len());
}

/// The detail of a schema that did not compile: a pattern that is a regular expression but passed
/// the compiled-size limit is named with the limit; anything else is the validator's own words.
pub(super) fn explain(error: &ValidationError<'_>, found: &Patterns<'_>) -> String {
    let pattern = match (error.kind(), error.instance().as_ref()) {
        (ValidationErrorKind::Format { format }, Value::String(p)) if format == "regex" => p,
        _ => return format!("input schema does not compile: {error}"),
    };
    let Some(at) = found.found.iter().find(|f| f.pattern == pattern) else {
        return format!("input schema does not compile: {error}");
    };
    if is_regex(pattern) {
        format!(
            "`{}` at {} ({}) compiles to more than {PATTERN_COMPILED_BYTES} bytes, the engine's \
             limit for one pattern",
            at.keyword,
            found.pointer(at),
            shown(pattern)
        )
    } else {
        format!(
            "`{}` at {} ({}) is not a regular expression",
            at.keyword,
            found.pointer(at),
            shown(pattern)
        )
    }
}

/// Whether `text` is an ECMA-262 regular expression, by syntax alone (nothing is compiled).
fn is_regex(text: &str) -> bool {
    jsonschema::options()
        .should_validate_formats(true)
        .build(&serde_json::json!({"format": "regex"}))
        .is_ok_and(|syntax| syntax.is_valid(&Value::String(text.to_owned())))
}

/// A pattern as a refusal quotes it: JSON-quoted, its first 80 characters.
fn shown(pattern: &str) -> String {
    match pattern.char_indices().nth(80) {
        None => Value::String(pattern.to_owned()).to_string(),
        Some((end, _)) => format!("{}…", Value::String(pattern[..end].to_owned())),
    }
}

/// The keywords whose value is data, never a schema: nothing under them compiles.
const DATA_KEYWORDS: [&str; 4] = ["const", "default", "enum", "examples"];
/// The keywords whose value maps names to schemas.
const SCHEMA_MAPS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Every pattern of `schema` (a schema's own before those of its subschemas). Iterative, with each
/// path kept as a link to its parent's: a deep schema costs no stack, and no pointer is spelled
/// out until a refusal names one. A keyword it does not know is walked as a schema (it may count
/// a pattern the validator ignores, never miss one it compiles).
fn patterns(schema: &Value) -> Patterns<'_> {
    let mut steps: Vec<(usize, Step<'_>)> = Vec::new();
    let mut found: Vec<Found<'_>> = Vec::new();
    let mut stack: Vec<(&Value, usize)> = vec![(schema, usize::MAX)];
    while let Some((value, at)) = stack.pop() {
        let before = stack.len();
        match value {
            Value::Object(fields) => {
                for (key, v) in fields {
                    if DATA_KEYWORDS.contains(&key.as_str()) {
                        continue;
                    }
                    let here = step(&mut steps, at, Step::Key(key));
                    match (key.as_str(), v) {
                        ("pattern", Value::String(p)) => found.push(Found {
                            step: here,
                            keyword: "pattern",
                            pattern: p,
                        }),
                        (map, Value::Object(entries)) if SCHEMA_MAPS.contains(&map) => {
                            for (name, sub) in entries {
                                let there = step(&mut steps, here, Step::Key(name));
                                if map == "patternProperties" {
                                    found.push(Found {
                                        step: there,
                                        keyword: "patternProperties",
                                        pattern: name,
                                    });
                                }
                                stack.push((sub, there));
                            }
                        }
                        _ => stack.push((v, here)),
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    let here = step(&mut steps, at, Step::Index(i));
                    stack.push((v, here));
                }
            }
            _ => {}
        }
        // Reversed, so that siblings are walked in document order.
        stack[before..].reverse();
    }
    Patterns { steps, found }
}

/// Adds a step below `parent`; its index.
fn step<'a>(steps: &mut Vec<(usize, Step<'a>)>, parent: usize, s: Step<'a>) -> usize {
    steps.push((parent, s));
    steps.len() - 1
}

/// One JSON Pointer token (RFC 6901: `~` is `~0`, `/` is `~1`).
fn escape(token: &str) -> std::borrow::Cow<'_, str> {
    if token.contains(['~', '/']) {
        token.replace('~', "~0").replace('/', "~1").into()
    } else {
        token.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns_are_found_with_their_pointer_and_keyword_but_not_in_data() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": {"type": "string", "pattern": "^a$"},
                "pattern": {"type": "string"},
                "b/c": {"items": [{"pattern": "^b$"}]},
                "d": {"enum": [{"pattern": "not a schema"}], "default": {"pattern": "nor this"}},
            },
            "patternProperties": {"^x-": {"pattern": "^y$"}},
        });
        let walked = patterns(&schema);
        let mut found: Vec<(String, &str, &str)> = walked
            .found
            .iter()
            .map(|f| (walked.pointer(f), f.keyword, f.pattern))
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                (
                    "/patternProperties/^x-".to_string(),
                    "patternProperties",
                    "^x-"
                ),
                ("/patternProperties/^x-/pattern".into(), "pattern", "^y$"),
                ("/properties/a/pattern".into(), "pattern", "^a$"),
                ("/properties/b~1c/items/0/pattern".into(), "pattern", "^b$"),
            ]
        );
    }

    #[test]
    fn a_deep_schema_is_walked_without_recursion() {
        let mut schema = json!({"type": "string", "pattern": "^deep$"});
        for _ in 0..2_000 {
            schema = json!({"items": schema});
        }
        let walked = patterns(&schema);
        assert_eq!(walked.found.len(), 1);
        let pointer = walked.pointer(&walked.found[0]);
        assert_eq!(pointer.len(), "/items".len() * 2_000 + "/pattern".len());
    }

    #[test]
    fn quoted_patterns_are_cut_at_a_character_boundary() {
        assert_eq!(shown("^a$"), "\"^a$\"");
        let long = "é".repeat(100);
        assert_eq!(shown(&long), format!("\"{}\"…", "é".repeat(80)));
    }
}
