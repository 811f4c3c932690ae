//! Deferred loading: which tools of a registry view the catalog leaves out of the model's context,
//! and the built-in `tool_search` that finds them.
//!
//! A tool is deferred in a view when its mark ([`Defer`]) is `always`, or `auto` and the view's
//! catalog is large ([`DeferralConfig`]). A view with a deferred tool has a `tool_search` tool
//! (typed, read-only, concurrency-safe) whose handler searches that view's index; a view
//! without one has none. Deferral changes what the catalog shows, never what the boundary
//! accepts: a deferred tool is validated and run like any other, searched or not.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::search::{Found, Part, Query, Searcher};
use super::{CatalogFormat, RegisteredTool, catalog_entry};
use crate::metrics::EngineMetrics;
use crate::protocol::{Block, ToolReference};
use crate::tool::{Defer, Handler, ToolContext, ToolError, ToolOutput, ToolSpec};

/// The name of the built-in search tool.
pub const TOOL_SEARCH: &str = "tool_search";
/// Default of [`DeferralConfig::auto_above`].
pub const DEFAULT_AUTO_ABOVE: usize = 30;
/// Default of [`DeferralConfig::context_budget`], in tokens.
pub const DEFAULT_CONTEXT_BUDGET: usize = 200_000;
/// The share of the context budget a catalog may take before `auto` tools are deferred: 10 %.
pub const BUDGET_SHARE_PERCENT: usize = 10;
/// Bytes of JSON per estimated token (a common rule of thumb for English and JSON).
pub const BYTES_PER_TOKEN: usize = 4;
/// Most results one search returns.
pub const MAX_RESULTS: u64 = 20;
/// Results when `max_results` is not given.
pub const DEFAULT_RESULTS: u64 = 5;
/// Most bytes of one search's answer in its text rendering (its line and the definitions of
/// the tools found): what the deferral lets a whole catalog take of a default context (10 % of
/// 200,000 tokens at 4 bytes a token). Tools past it are left out, never cut.
pub const ANSWER_CAP: usize = 80_000;

/// When `auto` tools are deferred: when the catalog has more than `auto_above` tools, or its
/// definitions take more than 10 % of `context_budget` estimated tokens (4 bytes of JSON each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferralConfig {
    /// Most tools a catalog shows in full before its `auto` tools are deferred.
    pub auto_above: usize,
    /// The model's context, in tokens.
    pub context_budget: usize,
}

impl Default for DeferralConfig {
    fn default() -> Self {
        DeferralConfig {
            auto_above: DEFAULT_AUTO_ABOVE,
            context_budget: DEFAULT_CONTEXT_BUDGET,
        }
    }
}

impl DeferralConfig {
    /// True when a catalog of `tools` tools and `bytes` bytes of definitions is large.
    pub fn is_large(&self, tools: usize, bytes: usize) -> bool {
        tools > self.auto_above
            || bytes / BYTES_PER_TOKEN
                > self.context_budget.saturating_mul(BUDGET_SHARE_PERCENT) / 100
    }
}

/// The deferral of one registry view: whether its catalog is large, its search index (one part
/// for the engine's tools, one more for a session's own), and the engine tools a session's own
/// shadow.
#[derive(Debug)]
pub struct Deferral {
    large: bool,
    parts: Vec<Arc<Part>>,
    shadowed: HashSet<Arc<str>>,
}

impl Deferral {
    /// The deferral of a view whose catalog is `tools` (in order), with `parts` indexing its
    /// deferrable tools and `shadowed` naming tools of part 0 that a later part replaces. `None`
    /// when nothing of the view is deferred.
    pub fn of(
        config: &DeferralConfig,
        tools: &[Arc<RegisteredTool>],
        parts: Vec<Arc<Part>>,
        shadowed: HashSet<Arc<str>>,
    ) -> Option<Deferral> {
        let bytes = tools.iter().map(|t| t.catalog_bytes).sum();
        let large = config.is_large(tools.len(), bytes);
        let deferral = Deferral {
            large,
            parts,
            shadowed,
        };
        tools
            .iter()
            .any(|t| deferral.is_deferred(t))
            .then_some(deferral)
    }

    /// True when the view's catalog leaves `tool` out of the model's context until it is found.
    #[inline]
    pub fn is_deferred(&self, tool: &RegisteredTool) -> bool {
        match tool.defer {
            Defer::Never => false,
            Defer::Always => true,
            Defer::Auto => self.large,
        }
    }

    /// Runs `query` over the view's deferred tools.
    fn search(
        &self,
        query: &Query,
        max: usize,
        view_has: &dyn Fn(&str) -> bool,
    ) -> Result<Found, String> {
        let eligible = |part: usize, tool: &RegisteredTool| {
            self.is_deferred(tool)
                && !(part == 0 && !self.shadowed.is_empty() && self.shadowed.contains(&tool.name))
        };
        Searcher {
            parts: &self.parts,
            eligible: &eligible,
        }
        .search(query, max, view_has)
    }
}

/// The `tool_search` tool of a view: its handler searches `deferral`; `names` are every tool
/// name of the view (to tell a `select:` of a tool that is not deferred from an unknown name).
pub fn tool_search(
    deferral: Arc<Deferral>,
    names: Arc<HashSet<Arc<str>>>,
    metrics: Arc<EngineMetrics>,
) -> ToolSpec {
    let schema = json!({
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1000,
                "description": "Keywords describing the tool you need (prefix a word with + to require it); or select:name1,name2 for exact tool names; or regex:PATTERN (case-insensitive, at most 200 characters) over names, descriptions and parameters.",
            },
            "max_results": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_RESULTS,
                "description": "How many tools to return (default 5).",
            },
        },
        "required": ["query"],
        "additionalProperties": false,
    });
    let handler = Handler::future(move |args: Value, ctx: ToolContext| {
        let deferral = Arc::clone(&deferral);
        let names = Arc::clone(&names);
        let metrics = Arc::clone(&metrics);
        async move {
            let text = args["query"].as_str().unwrap_or_default().to_string();
            let max = args
                .get("max_results")
                .and_then(Value::as_u64)
                .unwrap_or(DEFAULT_RESULTS)
                .clamp(1, MAX_RESULTS) as usize;
            let query = Query::parse(&text).map_err(ToolError::invalid)?;
            metrics.tool_search(query.form());
            // Keywords, `select:` and plain words take microseconds and run here; a regex
            // runs on the blocking pool (bounded too, but up to milliseconds over a large
            // catalog), so it never holds an async worker other sessions are waiting for.
            let found = if query.is_regex() {
                let deferral = Arc::clone(&deferral);
                let names = Arc::clone(&names);
                tokio::task::spawn_blocking(move || {
                    deferral.search(&query, max, &|name| names.contains(name))
                })
                .await
                .map_err(|e| ToolError::execution(format!("the search failed: {e}")))?
            } else {
                deferral.search(&query, max, &|name| names.contains(name))
            }
            .map_err(ToolError::invalid)?;
            let answer = Answer::within(found, &text, ANSWER_CAP);
            let names: Vec<Arc<str>> = answer.tools.iter().map(|t| Arc::clone(&t.name)).collect();
            ctx.session.reveal_found(&names);
            Ok(answer.output(&text))
        }
    });
    ToolSpec::new(
        TOOL_SEARCH,
        "Search the tools that are not loaded yet (deferred) by what they do, and load the ones found: they can be called right after. Use it when no loaded tool fits the task.",
        schema,
        handler,
    )
    .concurrency_safe(true)
    .defer(Defer::Never)
    .effect(crate::tool::Effect::ReadOnly)
    .output_cap(ANSWER_CAP)
}

/// What a search answers: the tools found whose definitions fit the answer's cap, in order.
struct Answer {
    tools: Vec<Arc<RegisteredTool>>,
    /// Each kept tool's definition (`{"name","description","input_schema"}` as JSON).
    definitions: Vec<String>,
    /// Tools found but left out: their definitions would have passed the cap.
    left_out: Vec<Arc<str>>,
    loaded: Vec<String>,
    unknown: Vec<String>,
}

impl Answer {
    /// Keeps the found tools, best first, while the answer's text rendering (its line and every
    /// kept definition, one per line) stays within `cap` bytes; a tool whose definition would
    /// pass it is left out (and named), never cut.
    fn within(found: Found, query: &str, cap: usize) -> Answer {
        let definitions: Vec<String> = found
            .tools
            .iter()
            .map(|t| catalog_entry(t, CatalogFormat::Anthropic).to_string())
            .collect();
        // The line names every tool found at most once and says what was left out: room for
        // the longest it can be.
        let names: usize = found.tools.iter().map(|t| t.name.len() + 2).sum();
        // The query appears quoted (escaped) in the line.
        let quoted = format!("{query:?}").len();
        let mut used = 400
            + quoted
            + 2 * names
            + found
                .loaded
                .iter()
                .chain(&found.unknown)
                .map(|n| n.len() + 2)
                .sum::<usize>();
        let mut answer = Answer {
            tools: Vec::with_capacity(found.tools.len()),
            definitions: Vec::with_capacity(found.tools.len()),
            left_out: Vec::new(),
            loaded: found.loaded,
            unknown: found.unknown,
        };
        for (tool, definition) in found.tools.into_iter().zip(definitions) {
            if used + 1 + definition.len() <= cap {
                used += 1 + definition.len();
                answer.tools.push(tool);
                answer.definitions.push(definition);
            } else {
                answer.left_out.push(Arc::clone(&tool.name));
            }
        }
        answer
    }

    /// A line saying what was found, then one reference per tool.
    fn output(self, query: &str) -> ToolOutput {
        let mut line = if self.tools.is_empty() {
            if self.left_out.is_empty() {
                format!("No deferred tool matches {query:?}.")
            } else {
                format!("Found no tool for {query:?} that fits this answer.")
            }
        } else {
            let names: Vec<&str> = self.tools.iter().map(|t| &*t.name).collect();
            format!(
                "Found {} tool{} for {query:?}, now loaded: {}.",
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                names.join(", ")
            )
        };
        if !self.left_out.is_empty() {
            let names: Vec<&str> = self.left_out.iter().map(|n| &**n).collect();
            line.push_str(&format!(
                " {} more tool{} matched but {} left out to keep this answer within {ANSWER_CAP} \
                 bytes (definitions are never cut); select one at a time to load it: {}.",
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                if names.len() == 1 { "was" } else { "were" },
                names.join(", ")
            ));
        }
        if !self.loaded.is_empty() {
            line.push_str(&format!(
                " Already loaded (call directly): {}.",
                self.loaded.join(", ")
            ));
        }
        if !self.unknown.is_empty() {
            line.push_str(&format!(" No tool named: {}.", self.unknown.join(", ")));
        }
        let mut blocks = Vec::with_capacity(self.tools.len() + 1);
        blocks.push(Block::text(line));
        for (tool, definition) in self.tools.iter().zip(self.definitions) {
            blocks.push(Block::ToolReference(ToolReference {
                tool_name: tool.name.to_string(),
                definition,
            }));
        }
        ToolOutput::blocks(blocks)
    }
}
