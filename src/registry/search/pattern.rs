//! `regex:` patterns and the text they are matched against, with a bound on what one search
//! may cost, whatever the pattern.
//!
//! A pattern without metacharacters (the common `regex:github`) is a plain substring search:
//! SIMD `memmem` over the lower-cased text of every tool at once. Any other pattern is compiled
//! once into an NFA of at most [`NFA_SIZE_LIMIT`] bytes and run as a lazy DFA, one tool's line
//! at a time, with one cache of [`CACHE_CAPACITY`] bytes for the whole search. A DFA reads each
//! byte once; what can grow is the automaton itself (`\w{3}.{180}` has more DFA states than any
//! cache holds). The cache may be refilled [`MAX_CACHE_CLEARS`] times in one search; a pattern
//! that needs more is refused as too costly instead of falling back to a slower engine. So a
//! search costs at most one pass over the text plus that many cache fills, each bounded by the
//! size limits: no pattern can stall a worker.

use memchr::memmem::Finder;
use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::nfa::thompson;
use regex_automata::util::prefilter::Prefilter;
use regex_automata::util::syntax;
use regex_automata::{Input, MatchKind};

/// Longest `regex:` pattern, in characters.
pub const MAX_PATTERN: usize = 200;
/// Largest compiled pattern (its NFA), in bytes.
pub const NFA_SIZE_LIMIT: usize = 256 << 10;
/// The lazy DFA's cache of states, per search, in bytes.
pub const CACHE_CAPACITY: usize = 2 << 20;
/// How many times one search may refill the cache before the pattern is refused as too costly.
pub const MAX_CACHE_CLEARS: usize = 2;

/// What a search with a pattern could not do: the pattern needs more states than the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooCostly;

impl TooCostly {
    /// The message the model reads.
    pub fn message(self, pattern: &str) -> String {
        format!(
            "the regex pattern {pattern:?} is too costly to run over the deferred tools: its automaton \
             outgrew the search's budget ({MAX_CACHE_CLEARS} refills of a {} MB cache). Use a \
             simpler pattern (fewer or smaller counted repetitions such as .{{150}}, fewer \
             wildcards), a plain word, or keywords",
            CACHE_CAPACITY >> 20
        )
    }
}

/// A compiled `regex:` pattern.
#[derive(Debug)]
pub enum Pattern {
    /// The pattern, lower-cased (the text is lower-cased too).
    Literal(Box<Finder<'static>>),
    /// A case-insensitive lazy DFA.
    Dfa(Box<DFA>),
}

/// Compiles a `regex:` pattern: case-insensitive (ASCII), within the size limits.
pub fn compile(pattern: &str) -> Result<Pattern, String> {
    let chars = pattern.chars().count();
    if chars > MAX_PATTERN {
        return Err(format!(
            "the regex pattern has {chars} characters; at most {MAX_PATTERN} are accepted"
        ));
    }
    if pattern.is_empty() {
        return Err("`regex:` needs a pattern (regex:PATTERN)".into());
    }
    if regex::escape(pattern) == pattern {
        let lower = pattern.to_ascii_lowercase().into_bytes();
        return Ok(Pattern::Literal(Box::new(Finder::new(&lower).into_owned())));
    }
    // ASCII classes and case folding: tool text is nearly all ASCII, and Unicode classes make
    // far larger automata. A non-ASCII letter in the pattern still matches itself.
    let syntax = syntax::Config::new()
        .unicode(false)
        .utf8(false)
        .case_insensitive(true)
        .nest_limit(64);
    let hir = syntax::parse_with(pattern, &syntax)
        .map_err(|e| format!("the regex pattern does not compile: {e}"))?;
    let prefilter = Prefilter::from_hir_prefix(MatchKind::LeftmostFirst, &hir);
    DFA::builder()
        .syntax(syntax)
        .thompson(
            thompson::Config::new()
                .utf8(false)
                .shrink(false)
                .which_captures(thompson::WhichCaptures::None)
                .nfa_size_limit(Some(NFA_SIZE_LIMIT)),
        )
        .configure(
            DFA::config()
                .prefilter(prefilter)
                .cache_capacity(CACHE_CAPACITY)
                .skip_cache_capacity_check(false)
                .minimum_cache_clear_count(Some(MAX_CACHE_CLEARS))
                .minimum_bytes_per_state(None),
        )
        .build(pattern)
        .map(|dfa| Pattern::Dfa(Box::new(dfa)))
        .map_err(|e| format!("the regex pattern does not compile within the size limits: {e}"))
}

/// One search's matcher: the pattern and, for a DFA, its cache.
pub struct Matcher<'p> {
    pattern: &'p Pattern,
    cache: Option<Cache>,
}

impl<'p> Matcher<'p> {
    /// A matcher with a fresh cache.
    pub fn new(pattern: &'p Pattern) -> Self {
        let cache = match pattern {
            Pattern::Literal(_) => None,
            Pattern::Dfa(dfa) => Some(dfa.create_cache()),
        };
        Matcher { pattern, cache }
    }

    /// How many times this search refilled the cache so far.
    #[cfg(test)]
    pub fn cache_clears(&self) -> usize {
        self.cache.as_ref().map_or(0, Cache::clear_count)
    }

    /// Whether `line` (one tool's lower-cased text) matches.
    fn is_match(&mut self, line: &[u8]) -> Result<bool, TooCostly> {
        match (self.pattern, &mut self.cache) {
            (Pattern::Literal(f), _) => Ok(f.find(line).is_some()),
            (Pattern::Dfa(dfa), Some(cache)) => dfa
                .try_search_fwd(cache, &Input::new(line).earliest(true))
                .map(|m| m.is_some())
                .map_err(|_| TooCostly),
            (Pattern::Dfa(_), None) => unreachable!("a DFA matcher has a cache"),
        }
    }
}

/// One line of text per tool, in one buffer. ASCII letters are lower-cased (patterns fold ASCII
/// case; a literal is lower-cased to match).
#[derive(Debug, Default)]
pub struct Lines {
    text: String,
    /// Each tool's line: `[start, end)` in `text` (a `\n` follows each).
    spans: Vec<(usize, usize)>,
}

impl Lines {
    /// Appends the next tool's line: `parts` joined with spaces, line breaks made spaces.
    pub fn push<'a>(&mut self, parts: impl IntoIterator<Item = &'a str>) {
        let start = self.text.len();
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                self.text.push(' ');
            }
            self.text.extend(
                part.chars()
                    .map(|c| if c == '\n' || c == '\r' { ' ' } else { c }),
            );
        }
        self.text[start..].make_ascii_lowercase();
        self.spans.push((start, self.text.len()));
        self.text.push('\n');
    }

    /// Calls `found` with each tool whose line matches, in order, until it answers false.
    pub fn scan(
        &self,
        matcher: &mut Matcher<'_>,
        mut found: impl FnMut(u32) -> bool,
    ) -> Result<(), TooCostly> {
        let hay = self.text.as_bytes();
        if let Pattern::Literal(f) = matcher.pattern {
            // One pass over the whole buffer: a literal cannot span two lines (no `\n` in it).
            let mut at = 0usize;
            while at < hay.len() {
                let Some(i) = f.find(&hay[at..]) else {
                    return Ok(());
                };
                let line = self.spans.partition_point(|&(_, end)| end < at + i);
                if line >= self.spans.len() || !found(line as u32) {
                    return Ok(());
                }
                at = self.spans[line].1 + 1;
            }
            return Ok(());
        }
        for (line, &(start, end)) in self.spans.iter().enumerate() {
            if matcher.is_match(&hay[start..end])? && !found(line as u32) {
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` lines of plausible tool text, about 460 bytes each (the benchmark catalog's mean),
    /// none containing `zzzq`.
    fn text(n: usize) -> Lines {
        const WORDS: &[&str] = &[
            "create",
            "issue",
            "repository",
            "github",
            "list",
            "pull",
            "request",
            "the",
            "a",
            "file",
            "path",
            "string",
            "optional",
            "number",
            "returns",
            "of",
            "cluster",
            "page",
            "query",
            "database",
            "user",
            "id",
            "name",
            "description",
            "search",
            "results",
        ];
        let mut lines = Lines::default();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..n {
            let mut line = format!("mcp__server__tool_{i}");
            while line.len() < 460 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                line.push(' ');
                line.push_str(WORDS[(seed % WORDS.len() as u64) as usize]);
            }
            lines.push([line.as_str()]);
        }
        lines
    }

    fn matches(lines: &Lines, pattern: &str) -> (Result<Vec<u32>, TooCostly>, usize) {
        let pattern = compile(pattern).unwrap();
        let mut matcher = Matcher::new(&pattern);
        let mut found = Vec::new();
        let result = lines.scan(&mut matcher, |line| {
            found.push(line);
            true
        });
        (result.map(|()| found), matcher.cache_clears())
    }

    #[test]
    fn literals_and_regexes_find_the_same_lines() {
        let lines = text(300);
        let (literal, _) = matches(&lines, "tool_17 ");
        let (regex, _) = matches(&lines, "tool_1[7] ");
        assert_eq!(literal, Ok(vec![17]));
        assert_eq!(regex, Ok(vec![17]));
        let (upper, _) = matches(&lines, "TOOL_(17|18) ");
        assert_eq!(upper, Ok(vec![17, 18]));
    }

    #[test]
    fn a_match_never_spans_two_tools() {
        let mut lines = Lines::default();
        lines.push(["first ends with abc"]);
        lines.push(["def starts the second"]);
        assert_eq!(matches(&lines, r"abc\s+def").0, Ok(vec![]));
        assert_eq!(matches(&lines, "abc def").0, Ok(vec![]));
        assert_eq!(matches(&lines, r"^def").0, Ok(vec![1]));
    }

    #[test]
    fn patterns_that_blow_up_a_dfa_are_refused_within_the_cache_budget() {
        // The two patterns that took seconds with a backtracking fallback, and others of the
        // same kind, over 10,000 tools: each answers (found or too costly) after at most
        // MAX_CACHE_CLEARS refills of the cache.
        let lines = text(10_000);
        for pattern in [
            r"\w{3}.{180}zzzq",
            r"[a-z]{3}.{150}zzzq",
            r"(a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p|r|s|t|u).{120}zzzq",
            r".{20}x.{100}zzzq",
            r"\w{3}.{180}",
        ] {
            let (result, clears) = matches(&lines, pattern);
            assert!(clears <= MAX_CACHE_CLEARS, "{pattern}: {clears} clears");
            if let Ok(found) = result {
                assert!(found.iter().all(|&l| (l as usize) < 10_000), "{pattern}");
                assert!(!pattern.ends_with("zzzq") || found.is_empty(), "{pattern}");
            }
        }
        // A pattern of the same shape that fits its budget answers normally, with no refill.
        let (result, clears) = matches(&lines, r"\w{3}.{4}zzzq");
        assert_eq!((result, clears), (Ok(vec![]), 0));
    }

    #[test]
    fn oversized_patterns_are_refused_at_compile_time() {
        assert!(
            compile(r"(\w{1000}){1000}")
                .unwrap_err()
                .contains("size limits")
        );
        assert!(
            compile(&"a".repeat(201))
                .unwrap_err()
                .contains("at most 200")
        );
        assert!(compile("(").unwrap_err().contains("does not compile"));
        assert!(compile("").is_err());
    }
}
