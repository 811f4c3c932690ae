//! The index `tool_search` answers from: the deferrable tools of a registry view (or of a
//! session's own tools), built once when the view is made and never changed after, so a turn in
//! flight keeps searching the index of the view it was planned with.
//!
//! Three query forms ([`Query::parse`]):
//!
//! * `select:name1,name2` — exact registry names, in the order given.
//! * `regex:PATTERN` — at most 200 characters, case-insensitive, over each tool's name,
//!   description and parameter names and descriptions; compiled and run under limits that bound
//!   what one search costs (`pattern.rs`): a pattern that would pass them is refused.
//! * keywords — BM25F (k1 = 1.2) over fields of different weight, each normalised by its own
//!   length: the tool name split into words (×5), its MCP server (×2), its description (×1,
//!   b = 0.9), its parameter names (×1) and descriptions (×0.5) (b = 0.75 but for the
//!   description). A tool whose server a query word names scores double. Words are split at
//!   non-alphanumerics and camelCase humps, lower-cased, stop words dropped, Snowball-stemmed.
//!   Each query word also finds its synonyms ([`SYNONYMS`], at ×0.35). `+term` makes a term
//!   required (its synonyms do not satisfy it).
//!
//! One search may span several parts (a registry view's and a session's own tools): their
//! statistics are summed at query time, so the scores are those of one index over both.

use std::collections::HashMap;
use std::sync::Arc;

use rust_stemmers::{Algorithm, Stemmer};
use serde_json::Value;

use super::RegisteredTool;

mod pattern;

use pattern::{Lines, Matcher, TooCostly, compile};
/// How deep parameter schemas are read for names and descriptions.
const PARAM_DEPTH: usize = 3;
/// Most `+term` requirements honoured (a bit each).
const MAX_REQUIRED: usize = 64;

const K1: f32 = 1.2;

/// The fields of a tool, in the order of [`WEIGHTS`] and [`FIELD_B`].
const NAME: usize = 0;
const SERVER: usize = 1;
const DESCRIPTION: usize = 2;
const PARAM_NAME: usize = 3;
const PARAM_DESCRIPTION: usize = 4;
const FIELDS: usize = 5;

/// Field weights: name, server, description, parameter names, parameter descriptions. The
/// name's (5) was chosen on the tuning queries only (3, 4, 5, 6 and 8 tried; docs/tool-search.md);
/// the others were kept, as changing them did not pay there.
const WEIGHTS: [f32; FIELDS] = [5.0, 2.0, 1.0, 1.0, 0.5];
/// BM25F's length normalisation per field (each field against its own average length): 0.9 for
/// the description, 0.75 elsewhere (chosen on the tuning queries: 0.3, 0.5, 0.75, 0.9 and 1
/// tried for the description; 0.3–0.9 for the others did not pay).
const FIELD_B: [f32; FIELDS] = [0.75, 0.75, 0.9, 0.75, 0.75];
/// How much more a tool scores when a query word (not a synonym) is a word of its MCP server's
/// name: `1.0` doubles it (chosen on the tuning queries: 0.1–2 tried).
const SERVER_BOOST: f32 = 1.0;
/// How much a synonym of a query word counts, against the word itself (chosen on the tuning
/// queries: 0.2, 0.35 and 0.5 tried).
const W_SYNONYM: f32 = 0.35;

/// Groups of words a request and a tool use for the same thing: the verbs and nouns tool
/// descriptions use most, each with the words people use for it. A query word also finds the
/// other words of its groups, at [`W_SYNONYM`] of its weight.
const SYNONYMS: &[&[&str]] = &[
    &[
        "get", "fetch", "retrieve", "read", "show", "view", "display",
    ],
    &["list", "enumerate"],
    &["create", "add", "new", "make"],
    &["delete", "remove", "drop", "destroy", "erase"],
    &["update", "edit", "modify", "change", "alter"],
    &["send", "post", "message"],
    &["search", "find", "query", "lookup", "locate"],
    &["run", "execute", "trigger", "launch", "invoke"],
    &["stop", "cancel", "halt", "kill", "terminate"],
    &["error", "failure", "fail", "exception"],
    &["folder", "directory"],
    &["ticket", "issue"],
    &["page", "site", "website", "webpage"],
    &["copy", "clone", "duplicate"],
    &["comment", "reply"],
    &["user", "member"],
    &["docs", "documentation"],
    &["image", "picture", "screenshot"],
];

/// The synonym groups, stemmed: each stem and the other stems of its groups. Built once (a
/// constant table, the same for every index).
fn synonyms() -> &'static HashMap<String, Vec<String>> {
    static TABLE: std::sync::OnceLock<HashMap<String, Vec<String>>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let stemmer = Stemmer::create(Algorithm::English);
        let mut table: HashMap<String, Vec<String>> = HashMap::new();
        for group in SYNONYMS {
            let stems: Vec<String> = group.iter().map(|w| stemmer.stem(w).into_owned()).collect();
            for a in &stems {
                let entry = table.entry(a.clone()).or_default();
                for b in &stems {
                    if a != b && !entry.contains(b) {
                        entry.push(b.clone());
                    }
                }
            }
        }
        table
    })
}

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
    /// pattern is refused when it is compiled ([`pattern::compile`]).
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

    /// True for a `regex:` that is not a plain word (it runs as an automaton, not a substring
    /// search).
    pub fn is_regex(&self) -> bool {
        matches!(self, Query::Regex(p) if regex::escape(p) != *p)
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

/// One indexed tool.
#[derive(Debug)]
struct Doc {
    tool: Arc<RegisteredTool>,
    /// How many words each field has.
    field_len: [f32; FIELDS],
}

/// One tool having one word: how often, per field (saturating).
#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    tf: [u16; FIELDS],
}

/// The index of one set of tools.
#[derive(Debug, Default)]
pub struct Part {
    docs: Vec<Doc>,
    by_name: HashMap<Arc<str>, u32>,
    postings: HashMap<Box<str>, Vec<Posting>>,
    /// The sum of [`Doc::field_len`] over the tools.
    total_field_len: [f32; FIELDS],
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
            let mut tf: HashMap<String, [u16; FIELDS]> = HashMap::new();
            let mut field_len = [0.0; FIELDS];
            let (server, tool_part) = split_name(&tool.name);
            let mut add = |text: &str, field: usize, words: &mut Vec<String>| {
                words.clear();
                tokens_with(&stemmer, text, words);
                for w in words.drain(..) {
                    let count = &mut tf.entry(w).or_default()[field];
                    *count = count.saturating_add(1);
                    field_len[field] += 1.0;
                }
            };
            add(tool_part, NAME, &mut words);
            if let Some(server) = server {
                add(server, SERVER, &mut words);
            }
            add(&tool.description, DESCRIPTION, &mut words);
            let mut params = Vec::new();
            parameters(&tool.input_schema, PARAM_DEPTH, &mut params);
            for (name, description) in &params {
                add(name, PARAM_NAME, &mut words);
                if let Some(d) = description {
                    add(d, PARAM_DESCRIPTION, &mut words);
                }
            }
            for (word, tf) in tf {
                part.postings
                    .entry(word.into())
                    .or_default()
                    .push(Posting { doc: id, tf });
            }
            part.names.push([&*tool.name]);
            part.text
                .push([&*tool.name, tool.description.as_str()].into_iter().chain(
                    params.iter().flat_map(|(name, description)| {
                        std::iter::once(name.as_str()).chain(description.as_deref())
                    }),
                ));
            for (total, len) in part.total_field_len.iter_mut().zip(field_len) {
                *total += len;
            }
            part.by_name.insert(Arc::clone(&tool.name), id);
            part.docs.push(Doc {
                tool: Arc::clone(tool),
                field_len,
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
                let mut matcher = Matcher::new(&re);
                self.regex(&mut matcher, max, &mut found)
                    .map_err(|e| e.message(pattern))?;
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

    /// The eligible tools `matcher` matches, at most `max`: those whose name matches first (a
    /// pass over the names alone), then the others in index order, stopping once there are
    /// enough.
    fn regex(
        &self,
        matcher: &mut Matcher<'_>,
        max: usize,
        found: &mut Found,
    ) -> Result<(), TooCostly> {
        let mut taken: Vec<Vec<bool>> = self.parts.iter().map(|p| vec![false; p.len()]).collect();
        for (i, part) in self.parts.iter().enumerate() {
            part.names.scan(matcher, |doc| {
                let tool = &part.docs[doc as usize].tool;
                if (self.eligible)(i, tool) {
                    taken[i][doc as usize] = true;
                    found.tools.push(Arc::clone(tool));
                }
                found.tools.len() < max
            })?;
            if found.tools.len() == max {
                return Ok(());
            }
        }
        for (i, part) in self.parts.iter().enumerate() {
            part.text.scan(matcher, |doc| {
                let tool = &part.docs[doc as usize].tool;
                if !taken[i][doc as usize] && (self.eligible)(i, tool) {
                    found.tools.push(Arc::clone(tool));
                }
                found.tools.len() < max
            })?;
            if found.tools.len() == max {
                break;
            }
        }
        Ok(())
    }

    /// The `max` best eligible tools with a positive score (and every required term), best
    /// first; ties in index order.
    fn bm25(&self, terms: &[(String, bool)], max: usize) -> Vec<Hit> {
        let n: usize = self.parts.iter().map(|p| p.docs.len()).sum();
        if n == 0 || terms.is_empty() {
            return Vec::new();
        }
        // Each field's average length over all the parts.
        let mut avg = [0.0; FIELDS];
        for part in self.parts {
            for (a, total) in avg.iter_mut().zip(part.total_field_len) {
                *a += total;
            }
        }
        for a in &mut avg {
            *a = (*a / n as f32).max(1.0);
        }
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
        // Tools whose server a query word names.
        let mut boosted: Vec<Vec<bool>> = self.parts.iter().map(|p| vec![false; p.len()]).collect();
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
        // Each query word, then its synonyms (those not in the query themselves).
        let mut expanded: Vec<(usize, &str, f32, bool)> = Vec::new();
        let mut owned: Vec<(usize, String, f32)> = Vec::new();
        for (t, (term, _)) in terms.iter().enumerate() {
            expanded.push((t, term.as_str(), 1.0, true));
            if let Some(syns) = synonyms().get(term.as_str()) {
                for syn in syns {
                    if !terms.iter().any(|(w, _)| w == syn) {
                        owned.push((t, syn.clone(), W_SYNONYM));
                    }
                }
            }
        }
        expanded.extend(owned.iter().map(|(t, w, f)| (*t, w.as_str(), *f, false)));
        for &(t, term, weight, own) in &expanded {
            let df: usize = self
                .parts
                .iter()
                .map(|p| p.postings.get(term).map_or(0, Vec::len))
                .sum();
            if df == 0 {
                continue;
            }
            let idf = weight * (1.0 + (n as f32 - df as f32 + 0.5) / (df as f32 + 0.5)).ln();
            let bit = required
                .iter()
                .position(|&r| own && r == t)
                .map(|i| 1u64 << i);
            for (i, part) in self.parts.iter().enumerate() {
                let Some(list) = part.postings.get(term) else {
                    continue;
                };
                for &Posting { doc, tf } in list {
                    let field_len = &part.docs[doc as usize].field_len;
                    // BM25F: the fields' counts, each weighted and normalised by its length
                    // against the field's average, then saturated once.
                    let mut t = 0.0;
                    for f in 0..FIELDS {
                        if tf[f] > 0 {
                            t += WEIGHTS[f] * f32::from(tf[f])
                                / (1.0 - FIELD_B[f] + FIELD_B[f] * field_len[f] / avg[f]);
                        }
                    }
                    scores[i][doc as usize] += idf * t * (K1 + 1.0) / (t + K1);
                    if own && tf[SERVER] > 0 {
                        boosted[i][doc as usize] = true;
                    }
                    if let Some(bit) = bit {
                        masks[i][doc as usize] |= bit;
                    }
                }
            }
        }
        let mut hits = Vec::new();
        for (i, part_scores) in scores.iter().enumerate() {
            for (doc, &score) in part_scores.iter().enumerate() {
                let score = if boosted[i][doc] {
                    score * (1.0 + SERVER_BOOST)
                } else {
                    score
                };
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
    fn a_synonym_finds_a_tool_without_the_word_but_never_satisfies_a_required_one() {
        // "make" is in no tool; "create" is its synonym.
        assert_eq!(
            run("make something", 5).unwrap(),
            ["mcp__github__create_issue"]
        );
        assert!(run("+make issue", 5).unwrap().is_empty());
        assert_eq!(
            run("+create issue", 5).unwrap(),
            ["mcp__github__create_issue"]
        );
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
