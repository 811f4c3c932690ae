//! The index `tool_search` answers from: the deferrable tools of a registry view (or of a
//! session's own tools), built once when the view is made and never changed after, so a turn in
//! flight keeps searching the index of the view it was planned with.
//!
//! Three query forms ([`Query::parse`]):
//!
//! * `select:name1,name2` — exact registry names, in the order given.
//! * `regex:PATTERN` — at most [`MAX_PATTERN`] characters, case-insensitive, over each tool's
//!   name, description and parameter names and descriptions. Rust's `regex` matches in linear
//!   time, and the pattern is compiled under size limits, so no pattern can hang a search; a
//!   pattern that does not compile within them is refused.
//! * keywords — BM25 (k1 = 1.2, b = 0.75) over fields of different weight: the tool name split
//!   into words (×3), its MCP server (×2), its description (×1), its parameter names (×1) and
//!   descriptions (×0.5). Words are split at non-alphanumerics and camelCase humps, lower-cased,
//!   stop words dropped, Snowball-stemmed. `+term` makes a term required.
//!
//! One search may span several parts (a registry view's and a session's own tools): their
//! statistics are summed at query time, so the scores are those of one index over both.

use std::collections::HashMap;
use std::sync::Arc;

use regex::bytes::{Regex, RegexBuilder};
use rust_stemmers::{Algorithm, Stemmer};
use serde_json::Value;

use super::RegisteredTool;

/// Longest `regex:` pattern, in characters.
pub const MAX_PATTERN: usize = 200;
/// Largest compiled regex program (and lazy DFA cache), in bytes.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// How deep parameter schemas are read for names and descriptions.
const PARAM_DEPTH: usize = 3;
/// Most `+term` requirements honoured (a bit each).
const MAX_REQUIRED: usize = 64;

const K1: f32 = 1.2;
const B: f32 = 0.75;

const W_NAME: f32 = 3.0;
const W_SERVER: f32 = 2.0;
const W_DESCRIPTION: f32 = 1.0;
const W_PARAM_NAME: f32 = 1.0;
const W_PARAM_DESCRIPTION: f32 = 0.5;

/// Words too common in tool descriptions to tell tools apart.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "has", "have",
    "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or", "please",
    "some", "that", "the", "this", "to", "tool", "tools", "use", "used", "using", "want", "was",
    "we", "what", "when", "which", "will", "with", "you", "your",
];

/// A parsed query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// `select:a,b`: exact names.
    Select(Vec<String>),
    /// `regex:PATTERN`.
    Regex(String),
    /// Keywords; each `(stemmed word, required)`.
    Keywords(Vec<(String, bool)>),
}

impl Query {
    /// Parses the `query` argument. Only a `select:` without names is refused here; a bad
    /// pattern is refused when it is compiled ([`Part::regex`]).
    pub fn parse(query: &str) -> Result<Query, String> {
        let query = query.trim();
        if let Some(rest) = query.strip_prefix("select:") {
            let names: Vec<String> = rest
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect();
            if names.is_empty() {
                return Err("`select:` needs at least one tool name (select:name1,name2)".into());
            }
            return Ok(Query::Select(names));
        }
        if let Some(pattern) = query.strip_prefix("regex:") {
            return Ok(Query::Regex(pattern.to_string()));
        }
        let mut terms: Vec<(String, bool)> = Vec::new();
        for token in query.split_whitespace() {
            let (required, token) = match token.strip_prefix('+') {
                Some(rest) => (true, rest),
                None => (false, token),
            };
            let mut words = Vec::new();
            tokens(token, &mut words);
            for word in words {
                match terms.iter_mut().find(|(w, _)| *w == word) {
                    Some(existing) => existing.1 |= required,
                    None => terms.push((word, required)),
                }
            }
        }
        Ok(Query::Keywords(terms))
    }

    /// The form's metric label: `select`, `regex` or `keywords`.
    pub fn form(&self) -> &'static str {
        match self {
            Query::Select(_) => "select",
            Query::Regex(_) => "regex",
            Query::Keywords(_) => "keywords",
        }
    }
}

/// A compiled `regex:` pattern. A pattern without metacharacters (the common `regex:github`) is a
/// plain substring search (SIMD `memmem` over the lower-cased text); any other is a regex.
#[derive(Debug)]
pub enum Pattern {
    /// The pattern, lower-cased.
    Literal(Box<memchr::memmem::Finder<'static>>),
    /// A case-insensitive regex.
    Regex(Regex),
}

impl Pattern {
    /// The first match at or after `at`: `(start, end)`.
    fn find_at(&self, hay: &[u8], at: usize) -> Option<(usize, usize)> {
        match self {
            Pattern::Literal(f) => f
                .find(&hay[at..])
                .map(|i| (at + i, at + i + f.needle().len())),
            Pattern::Regex(re) => re.find_at(hay, at).map(|m| (m.start(), m.end())),
        }
    }

    fn is_match(&self, hay: &[u8]) -> bool {
        match self {
            Pattern::Literal(f) => f.find(hay).is_some(),
            Pattern::Regex(re) => re.is_match(hay),
        }
    }
}

/// Compiles a `regex:` pattern: case-insensitive (ASCII), within the size limits.
pub fn compile(pattern: &str) -> Result<Pattern, String> {
    if pattern.chars().count() > MAX_PATTERN {
        return Err(format!(
            "the regex pattern has {} characters; at most {MAX_PATTERN} are accepted",
            pattern.chars().count()
        ));
    }
    if pattern.is_empty() {
        return Err("`regex:` needs a pattern (regex:PATTERN)".into());
    }
    if regex::escape(pattern) == pattern {
        let lower = pattern.to_ascii_lowercase().into_bytes();
        return Ok(Pattern::Literal(Box::new(
            memchr::memmem::Finder::new(&lower).into_owned(),
        )));
    }
    // ASCII classes and case folding: tool text is nearly all ASCII, and Unicode case folding
    // (`k` also matching the Kelvin sign) keeps the literal prefilters from applying. A
    // non-ASCII letter in the pattern still matches itself.
    RegexBuilder::new(pattern)
        .unicode(false)
        .case_insensitive(true)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .nest_limit(64)
        .build()
        .map(Pattern::Regex)
        .map_err(|e| format!("the regex pattern does not compile: {e}"))
}

/// One indexed tool.
#[derive(Debug)]
struct Doc {
    tool: Arc<RegisteredTool>,
    /// Weighted length (sum of field weights of its words).
    len: f32,
}

/// One line of text per tool, in one buffer, for `regex:`: a whole-buffer scan is far faster than
/// a match per tool. ASCII letters are lower-cased (the patterns fold ASCII case; a literal is
/// lower-cased to match).
#[derive(Debug, Default)]
struct Lines {
    text: String,
    /// Each tool's line: `[start, end)` in `text` (a `\n` follows each).
    spans: Vec<(usize, usize)>,
}

impl Lines {
    /// Appends the next tool's line: `parts` joined with spaces, line breaks made spaces.
    fn push<'a>(&mut self, parts: impl IntoIterator<Item = &'a str>) {
        let start = self.text.len();
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                self.text.push(' ');
            }
            push_line(&mut self.text, part);
        }
        self.text[start..].make_ascii_lowercase();
        self.spans.push((start, self.text.len()));
        self.text.push('\n');
    }

    /// Calls `found` with each tool whose line `re` matches, in order, until it answers false.
    fn scan(&self, re: &Pattern, mut found: impl FnMut(u32) -> bool) {
        let hay = self.text.as_bytes();
        let mut at = 0usize;
        while at < hay.len() {
            let Some((m_start, m_end)) = re.find_at(hay, at) else {
                return;
            };
            let line = self
                .spans
                .partition_point(|&(_, end)| end < m_start)
                .min(self.spans.len().saturating_sub(1));
            let (start, end) = self.spans[line];
            // A match that runs past its line could span two tools: check this one alone.
            let matched = (m_start >= start && m_end <= end) || re.is_match(&hay[start..end]);
            if matched && !found(line as u32) {
                return;
            }
            at = end + 1;
        }
    }
}

/// The index of one set of tools.
#[derive(Debug, Default)]
pub struct Part {
    docs: Vec<Doc>,
    by_name: HashMap<Arc<str>, u32>,
    postings: HashMap<Box<str>, Vec<(u32, f32)>>,
    total_len: f32,
    /// Each tool's name, for `regex:`'s first pass.
    names: Lines,
    /// Each tool's name, description and parameters, for `regex:`.
    text: Lines,
}

/// A scored tool of a part.
#[derive(Debug, Clone, Copy)]
struct Hit {
    score: f32,
    part: usize,
    doc: u32,
}

impl Part {
    /// Indexes `tools` (in order; their order breaks ties).
    pub fn build<'a>(tools: impl IntoIterator<Item = &'a Arc<RegisteredTool>>) -> Part {
        let stemmer = Stemmer::create(Algorithm::English);
        let mut part = Part::default();
        let mut words = Vec::new();
        for tool in tools {
            let id = part.docs.len() as u32;
            let mut tf: HashMap<String, f32> = HashMap::new();
            let mut len = 0.0;
            let (server, tool_part) = split_name(&tool.name);
            let mut add = |text: &str, weight: f32, words: &mut Vec<String>| {
                words.clear();
                tokens_with(&stemmer, text, words);
                for w in words.drain(..) {
                    *tf.entry(w).or_default() += weight;
                    len += weight;
                }
            };
            add(tool_part, W_NAME, &mut words);
            if let Some(server) = server {
                add(server, W_SERVER, &mut words);
            }
            add(&tool.description, W_DESCRIPTION, &mut words);
            let mut params = Vec::new();
            parameters(&tool.input_schema, PARAM_DEPTH, &mut params);
            for (name, description) in &params {
                add(name, W_PARAM_NAME, &mut words);
                if let Some(d) = description {
                    add(d, W_PARAM_DESCRIPTION, &mut words);
                }
            }
            for (word, f) in tf {
                part.postings.entry(word.into()).or_default().push((id, f));
            }
            part.names.push([&*tool.name]);
            part.text
                .push([&*tool.name, tool.description.as_str()].into_iter().chain(
                    params.iter().flat_map(|(name, description)| {
                        std::iter::once(name.as_str()).chain(description.as_deref())
                    }),
                ));
            part.total_len += len;
            part.by_name.insert(Arc::clone(&tool.name), id);
            part.docs.push(Doc {
                tool: Arc::clone(tool),
                len,
            });
        }
        part
    }

    /// How many tools.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// The tool of exactly this name, if indexed here.
    pub fn get(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.by_name.get(name).map(|&i| &self.docs[i as usize].tool)
    }
}

/// The parts one search spans, and which of their tools may be returned.
pub struct Searcher<'a> {
    /// The parts, in catalog order.
    pub parts: &'a [Arc<Part>],
    /// Whether a tool of part `i` may be returned (deferred in the view, not shadowed).
    pub eligible: &'a dyn Fn(usize, &RegisteredTool) -> bool,
}

/// What a search found.
#[derive(Debug, Default)]
pub struct Found {
    /// The tools to return, best first.
    pub tools: Vec<Arc<RegisteredTool>>,
    /// `select:` names that are tools in the view but not deferred (already loaded).
    pub loaded: Vec<String>,
    /// `select:` names of no tool.
    pub unknown: Vec<String>,
}

impl Searcher<'_> {
    /// Runs `query` for at most `max` tools. `view_has` tells whether a name is a tool of the
    /// view at all (for `select:` of tools that are not deferred). Errs only for a bad pattern.
    pub fn search(
        &self,
        query: &Query,
        max: usize,
        view_has: &dyn Fn(&str) -> bool,
    ) -> Result<Found, String> {
        let mut found = Found::default();
        match query {
            Query::Select(names) => {
                for name in names {
                    let hit = self.parts.iter().enumerate().rev().find_map(|(i, p)| {
                        p.get(name)
                            .filter(|t| (self.eligible)(i, t))
                            .map(Arc::clone)
                    });
                    match hit {
                        Some(tool) if found.tools.len() < max => {
                            if !found.tools.iter().any(|t| t.name == tool.name) {
                                found.tools.push(tool);
                            }
                        }
                        Some(_) => {}
                        None if view_has(name) => found.loaded.push(name.clone()),
                        None => found.unknown.push(name.clone()),
                    }
                }
            }
            Query::Regex(pattern) => {
                let re = compile(pattern)?;
                // Tools whose name matches first (a pass over the names alone), then the others
                // in index order, stopping as soon as there are enough.
                let mut taken: Vec<Vec<bool>> =
                    self.parts.iter().map(|p| vec![false; p.len()]).collect();
                for (i, part) in self.parts.iter().enumerate() {
                    part.names.scan(&re, |doc| {
                        let tool = &part.docs[doc as usize].tool;
                        if (self.eligible)(i, tool) {
                            taken[i][doc as usize] = true;
                            found.tools.push(Arc::clone(tool));
                        }
                        found.tools.len() < max
                    });
                    if found.tools.len() == max {
                        return Ok(found);
                    }
                }
                for (i, part) in self.parts.iter().enumerate() {
                    part.text.scan(&re, |doc| {
                        let tool = &part.docs[doc as usize].tool;
                        if !taken[i][doc as usize] && (self.eligible)(i, tool) {
                            found.tools.push(Arc::clone(tool));
                        }
                        found.tools.len() < max
                    });
                    if found.tools.len() == max {
                        break;
                    }
                }
            }
            Query::Keywords(terms) => {
                for hit in self.bm25(terms, max) {
                    let tool = &self.parts[hit.part].docs[hit.doc as usize].tool;
                    found.tools.push(Arc::clone(tool));
                }
            }
        }
        Ok(found)
    }

    /// The `max` best eligible tools with a positive score (and every required term), best
    /// first; ties in index order.
    fn bm25(&self, terms: &[(String, bool)], max: usize) -> Vec<Hit> {
        let n: usize = self.parts.iter().map(|p| p.docs.len()).sum();
        if n == 0 || terms.is_empty() {
            return Vec::new();
        }
        let total: f32 = self.parts.iter().map(|p| p.total_len).sum();
        let avg = (total / n as f32).max(1.0);
        let required: Vec<usize> = terms
            .iter()
            .enumerate()
            .filter(|(_, (_, r))| *r)
            .map(|(i, _)| i)
            .take(MAX_REQUIRED)
            .collect();
        let need: u64 = if required.len() == 64 {
            u64::MAX
        } else {
            (1u64 << required.len()) - 1
        };
        let mut scores: Vec<Vec<f32>> = self.parts.iter().map(|p| vec![0.0; p.len()]).collect();
        let mut masks: Vec<Vec<u64>> = self
            .parts
            .iter()
            .map(|p| {
                if need == 0 {
                    Vec::new()
                } else {
                    vec![0; p.len()]
                }
            })
            .collect();
        for (t, (term, _)) in terms.iter().enumerate() {
            let df: usize = self
                .parts
                .iter()
                .map(|p| p.postings.get(term.as_str()).map_or(0, Vec::len))
                .sum();
            if df == 0 {
                continue;
            }
            let idf = (1.0 + (n as f32 - df as f32 + 0.5) / (df as f32 + 0.5)).ln();
            let bit = required.iter().position(|&r| r == t).map(|i| 1u64 << i);
            for (i, part) in self.parts.iter().enumerate() {
                let Some(list) = part.postings.get(term.as_str()) else {
                    continue;
                };
                for &(doc, tf) in list {
                    let len = part.docs[doc as usize].len;
                    let norm = tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avg));
                    scores[i][doc as usize] += idf * norm;
                    if let Some(bit) = bit {
                        masks[i][doc as usize] |= bit;
                    }
                }
            }
        }
        let mut hits = Vec::new();
        for (i, part_scores) in scores.iter().enumerate() {
            for (doc, &score) in part_scores.iter().enumerate() {
                if score > 0.0
                    && (need == 0 || masks[i][doc] == need)
                    && (self.eligible)(i, &self.parts[i].docs[doc].tool)
                {
                    hits.push(Hit {
                        score,
                        part: i,
                        doc: doc as u32,
                    });
                }
            }
        }
        let order = |a: &Hit, b: &Hit| {
            b.score
                .total_cmp(&a.score)
                .then(a.part.cmp(&b.part))
                .then(a.doc.cmp(&b.doc))
        };
        if hits.len() > max {
            hits.select_nth_unstable_by(max, order);
            hits.truncate(max);
        }
        hits.sort_by(order);
        hits
    }
}

/// `mcp__<server>__<tool>` → (`Some(server)`, `tool`); any other name → (`None`, name).
fn split_name(name: &str) -> (Option<&str>, &str) {
    if let Some(rest) = name.strip_prefix("mcp__")
        && let Some((server, tool)) = rest.split_once("__")
    {
        return (Some(server), tool);
    }
    (None, name)
}

/// Parameter names and descriptions of an object schema, `depth` levels of `properties` deep
/// (also through `items` of arrays).
fn parameters(schema: &Value, depth: usize, out: &mut Vec<(String, Option<String>)>) {
    if depth == 0 {
        return;
    }
    if let Some(Value::Object(props)) = schema.get("properties") {
        for (name, prop) in props {
            let description = prop
                .get("description")
                .and_then(Value::as_str)
                .map(String::from);
            out.push((name.clone(), description));
            parameters(prop, depth - 1, out);
            if let Some(items) = prop.get("items") {
                parameters(items, depth - 1, out);
            }
        }
    }
}

/// Appends `text` with line breaks as spaces (each tool is one line of the regex text).
fn push_line(out: &mut String, text: &str) {
    out.extend(
        text.chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c }),
    );
}

/// The index words of `text`.
pub fn tokens(text: &str, out: &mut Vec<String>) {
    let stemmer = Stemmer::create(Algorithm::English);
    tokens_with(&stemmer, text, out);
}

fn tokens_with(stemmer: &Stemmer, text: &str, out: &mut Vec<String>) {
    let mut push = |word: &str| {
        let lower = word.to_lowercase();
        if lower.len() < 2 && !lower.chars().all(|c| c.is_ascii_digit()) {
            return;
        }
        if STOP_WORDS.binary_search(&lower.as_str()).is_ok() {
            return;
        }
        out.push(stemmer.stem(&lower).into_owned());
    };
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        // A camelCase word counts whole and by its humps: `GitHub` → github, git, hub;
        // `createIssue` → createissue, create, issue.
        let mut start = 0;
        let mut humps = Vec::new();
        let mut prev: Option<char> = None;
        for (i, c) in word.char_indices() {
            if let Some(p) = prev
                && c.is_uppercase()
                && p.is_lowercase()
            {
                humps.push(&word[start..i]);
                start = i;
            }
            prev = Some(c);
        }
        push(word);
        if !humps.is_empty() {
            humps.push(&word[start..]);
            for hump in humps {
                push(hump);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{Handler, ToolSpec};
    use serde_json::json;

    fn tool(name: &str, description: &str, schema: Value) -> Arc<RegisteredTool> {
        Arc::new(
            crate::registry::prepare(ToolSpec::new(
                name,
                description,
                schema,
                Handler::inline(|_, _| Ok(String::new())),
            ))
            .unwrap(),
        )
    }

    fn catalog() -> Vec<Arc<RegisteredTool>> {
        vec![
            tool(
                "mcp__github__create_issue",
                "Create a new issue in a GitHub repository.",
                json!({"type":"object","properties":{"owner":{"type":"string"},"repo":{"type":"string"},"title":{"type":"string","description":"Issue title"}}}),
            ),
            tool(
                "mcp__github__list_pull_requests",
                "List pull requests of a repository.",
                json!({"type":"object","properties":{"state":{"type":"string","description":"open, closed or all"}}}),
            ),
            tool(
                "mcp__slack__post_message",
                "Post a message to a Slack channel.",
                json!({"type":"object","properties":{"channel_id":{"type":"string"},"text":{"type":"string"}}}),
            ),
            tool(
                "getWeatherForecast",
                "Weather forecast for a city, by day.",
                json!({"type":"object","properties":{"city":{"type":"string"}}}),
            ),
        ]
    }

    fn run(query: &str, max: usize) -> Result<Vec<String>, String> {
        let part = Arc::new(Part::build(&catalog()));
        let parts = [part];
        let searcher = Searcher {
            parts: &parts,
            eligible: &|_, _| true,
        };
        let found = searcher.search(&Query::parse(query)?, max, &|_| false)?;
        Ok(found.tools.iter().map(|t| t.name.to_string()).collect())
    }

    #[test]
    fn the_stop_words_are_sorted_for_binary_search() {
        let mut sorted = STOP_WORDS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, STOP_WORDS);
    }

    #[test]
    fn words_split_at_humps_and_underscores_and_are_stemmed() {
        let mut out = Vec::new();
        tokens(
            "getWeatherForecast list_pull_requests Creates the issues",
            &mut out,
        );
        assert_eq!(
            out,
            [
                "getweatherforecast",
                "get",
                "weather",
                "forecast",
                "list",
                "pull",
                "request",
                "creat",
                "issu"
            ]
        );
    }

    #[test]
    fn keywords_rank_the_tool_whose_name_says_it_first() {
        assert_eq!(
            run("open an issue on github", 5).unwrap()[0],
            "mcp__github__create_issue"
        );
        assert_eq!(
            run("send a slack message", 5).unwrap(),
            ["mcp__slack__post_message"]
        );
        assert_eq!(
            run("weather in Paris tomorrow", 1).unwrap(),
            ["getWeatherForecast"]
        );
        assert!(run("kubernetes pods", 5).unwrap().is_empty());
    }

    #[test]
    fn a_required_term_filters() {
        assert_eq!(
            run("github +pull", 5).unwrap(),
            ["mcp__github__list_pull_requests"]
        );
        assert!(run("github +kubernetes", 5).unwrap().is_empty());
    }

    #[test]
    fn select_finds_exact_names_in_the_order_given() {
        assert_eq!(
            run("select:getWeatherForecast, mcp__slack__post_message", 5).unwrap(),
            ["getWeatherForecast", "mcp__slack__post_message"]
        );
        assert!(Query::parse("select: ,").is_err());
    }

    #[test]
    fn regex_puts_name_matches_first_and_refuses_bad_patterns() {
        assert_eq!(
            run("regex:repo", 5).unwrap(),
            [
                "mcp__github__create_issue",
                "mcp__github__list_pull_requests"
            ]
        );
        assert_eq!(
            run("regex:issue|message", 5).unwrap(),
            ["mcp__github__create_issue", "mcp__slack__post_message"]
        );
        assert!(run("regex:(", 5).unwrap_err().contains("does not compile"));
        assert!(
            run(&format!("regex:{}", "a".repeat(201)), 5)
                .unwrap_err()
                .contains("at most 200")
        );
        // Too large a program is refused, not compiled for seconds.
        assert!(run("regex:(\\w{1000}){1000}", 5).is_err());
    }

    #[test]
    fn two_parts_score_as_one_index() {
        let tools = catalog();
        let one = Arc::new(Part::build(&tools));
        let a = Arc::new(Part::build(&tools[..2]));
        let b = Arc::new(Part::build(&tools[2..]));
        let query = Query::parse("message in a repository channel").unwrap();
        let whole = [one];
        let split = [a, b];
        let names = |parts: &[Arc<Part>]| -> Vec<String> {
            Searcher {
                parts,
                eligible: &|_, _| true,
            }
            .search(&query, 5, &|_| false)
            .unwrap()
            .tools
            .iter()
            .map(|t| t.name.to_string())
            .collect()
        };
        assert_eq!(names(&whole), names(&split));
        assert_eq!(
            Searcher {
                parts: &split,
                eligible: &|i, _| i == 1,
            }
            .search(&query, 5, &|_| false)
            .unwrap()
            .tools
            .len(),
            1
        );
    }
}
