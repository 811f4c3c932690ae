//! `--workload-set tool-search`: how well and how fast `tool_search` finds deferred tools.
//!
//! * **Recall** — the benchmark catalog (`--search-catalog`, real tool definitions: the
//!   `tools/list` of real MCP servers, padded with other real definitions) registered as
//!   deferred tools of one engine, and every query of `--search-queries` (natural-language
//!   requests, each with the tools a person would expect) sent as a `tool_search` call with
//!   `max_results` 5: top-1 is the share of queries whose first result is an expected tool,
//!   top-5 the share with an expected tool among the five.
//! * **Latency** — the same catalog repeated to 10,000 tools (each copy renamed), and
//!   `tool_search` calls of each query form (the queries as keywords; `select:` of two names;
//!   `regex:` of a word of the query) dispatched one at a time through a session: p50/p99 per
//!   search, the whole call included (validation, search, encoding), in wall time and in the
//!   process's CPU time (nothing else runs meanwhile), which a busy machine inflates far less.
//!
//! One JSON line each; the files are read from the current directory by default (the
//! repository's `benches/tool_search/`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::stats::{Percentiles, histogram, round_to};
use crate::engine::{Engine, Session};
use crate::protocol::{Block, ToolCall};
use crate::tool::{Defer, Handler, ToolSpec};

/// Default `--search-catalog`.
pub const DEFAULT_CATALOG: &str = "benches/tool_search/catalog.json";
/// Default `--search-queries`.
pub const DEFAULT_QUERIES: &str = "benches/tool_search/queries.jsonl";
/// Tools of the latency catalog.
const LATENCY_TOOLS: usize = 10_000;
/// Searches measured per query form (bounded by the time cap too).
const SEARCHES_PER_FORM: usize = 3_000;

/// The `i`-th query of a form.
type QueryOf<'a> = Box<dyn Fn(usize) -> String + 'a>;

/// One tool of the benchmark catalog, with its registry name.
struct Entry {
    id: String,
    name: String,
    description: String,
    schema: Value,
}

/// One query and the ids of the tools it expects.
struct Query {
    query: String,
    expected: Vec<String>,
}

/// Runs the set; returns its JSON lines.
pub async fn run(
    catalog: &Path,
    queries: &Path,
    max_time: Duration,
) -> Result<Vec<String>, String> {
    let entries = read_catalog(catalog)?;
    let queries = read_queries(queries, &entries)?;
    let mcp = entries
        .iter()
        .filter(|e| e.name.starts_with("mcp__"))
        .count();

    // Recall over the real catalog.
    let engine = engine_of(entries.iter().map(|e| spec(&e.name, e)))?;
    let session = engine.session();
    let by_name: HashMap<&str, &str> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.id.as_str()))
        .collect();
    let (mut top1, mut top5) = (0usize, 0usize);
    let mut misses = Vec::new();
    for (i, q) in queries.iter().enumerate() {
        let found = search(&session, i, &q.query, 5).await?;
        let ids: Vec<&str> = found
            .iter()
            .filter_map(|n| by_name.get(n.as_str()).copied())
            .collect();
        if ids
            .first()
            .is_some_and(|id| q.expected.iter().any(|e| e == id))
        {
            top1 += 1;
        }
        if ids.iter().any(|id| q.expected.iter().any(|e| e == id)) {
            top5 += 1;
        } else if misses.len() < 10 {
            misses.push(json!({"query": q.query, "expected": q.expected, "got": ids}));
        }
    }
    let n = queries.len().max(1) as f64;
    let mut lines = vec![
        json!({
            "workload": "tool_search_recall",
            "catalog_tools": entries.len(),
            "mcp_tools": mcp,
            "queries": queries.len(),
            "top1": round_to(top1 as f64 / n, 3),
            "top5": round_to(top5 as f64 / n, 3),
            "misses_shown": misses,
        })
        .to_string(),
    ];
    drop(session);
    engine.shutdown(Duration::from_secs(1)).await;

    // Latency over 10,000 tools.
    let copies = LATENCY_TOOLS.div_ceil(entries.len().max(1));
    let mut names = Vec::with_capacity(LATENCY_TOOLS);
    let mut specs = Vec::with_capacity(LATENCY_TOOLS);
    'fill: for copy in 0..copies {
        for e in &entries {
            if specs.len() == LATENCY_TOOLS {
                break 'fill;
            }
            let suffix = format!("_{copy}");
            let keep = e.name.len().min(64 - suffix.len());
            let name = format!("{}{suffix}", &e.name[..keep]);
            specs.push(spec(&name, e));
            names.push(name);
        }
    }
    let engine = engine_of(specs)?;
    let session = engine.session();
    let deadline = Instant::now() + max_time;
    let forms: [(&str, QueryOf); 3] = [
        (
            "keywords",
            Box::new(|i| queries[i % queries.len()].query.clone()),
        ),
        (
            "select",
            Box::new(|i| {
                let a = &names[(i * 7919) % names.len()];
                let b = &names[(i * 104_729 + 13) % names.len()];
                format!("select:{a},{b}")
            }),
        ),
        (
            "regex",
            Box::new(|i| {
                let q = &queries[i % queries.len()].query;
                let word = q
                    .split_whitespace()
                    .max_by_key(|w| w.len())
                    .unwrap_or("file")
                    .trim_matches(|c: char| !c.is_alphanumeric());
                format!("regex:{}", regex::escape(word))
            }),
        ),
    ];
    for (form, query_of) in &forms {
        // Warm-up, unmeasured.
        for i in 0..50 {
            search(&session, i, &query_of(i), 5).await?;
        }
        let mut h = histogram();
        let mut cpu = histogram();
        let mut done = 0usize;
        for i in 0..SEARCHES_PER_FORM {
            if Instant::now() >= deadline {
                break;
            }
            let query = query_of(i);
            let started = Instant::now();
            let cpu_started = process_cpu();
            search(&session, i, &query, 5).await?;
            let cpu_ns = process_cpu().saturating_sub(cpu_started);
            let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let _ = h.record(ns.max(1));
            let _ = cpu.record(cpu_ns.max(1));
            done += 1;
        }
        let p = Percentiles::of(&h);
        let c = Percentiles::of(&cpu);
        lines.push(
            json!({
                "workload": "tool_search_latency",
                "catalog_tools": names.len(),
                "form": form,
                "searches": done,
                "p50_us": super::stats::round2(p.p50),
                "p99_us": super::stats::round2(p.p99),
                "max_us": super::stats::round2(p.max),
                "cpu_p50_us": super::stats::round2(c.p50),
                "cpu_p99_us": super::stats::round2(c.p99),
            })
            .to_string(),
        );
    }
    drop(session);
    engine.shutdown(Duration::from_secs(1)).await;
    Ok(lines)
}

/// This process's CPU time in nanoseconds: what a search cost, whatever else the machine was
/// doing (nothing else runs in the process meanwhile; the turn is inline).
fn process_cpu() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// A deferred tool of the benchmark: the entry's description and schema, a handler answering
/// nothing (the benchmark never calls it).
fn spec(name: &str, e: &Entry) -> ToolSpec {
    ToolSpec::new(
        name,
        e.description.clone(),
        e.schema.clone(),
        Handler::inline(|_, _| Ok(String::new())),
    )
    .defer(Defer::Always)
}

fn engine_of(specs: impl IntoIterator<Item = ToolSpec>) -> Result<Engine, String> {
    crate::metrics::detached(|| Engine::builder().tools(specs).build())
        .map_err(|e| format!("cannot build the benchmark engine: {e}"))
}

/// One `tool_search` call; the names it returned, best first.
async fn search(
    session: &Session,
    i: usize,
    query: &str,
    max: usize,
) -> Result<Vec<String>, String> {
    // Every search has an id of its own (a session answers an id it has seen from memory).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let call = ToolCall::new(
        format!("s{i}_{n}"),
        "tool_search",
        json!({"query": query, "max_results": max}),
    );
    let results = session
        .dispatch(vec![call])
        .await
        .map_err(|e| format!("dispatch failed: {e}"))?;
    let r = &results[0];
    if r.error.is_some() {
        return Err(format!("tool_search {query:?} failed: {}", r.content));
    }
    Ok(r.blocks
        .iter()
        .flat_map(|b| b.iter())
        .filter_map(|b| match b {
            Block::ToolReference(t) => Some(t.tool_name.clone()),
            _ => None,
        })
        .collect())
}

fn read_catalog(path: &Path) -> Result<Vec<Entry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the search catalog {} (--search-catalog): {e}",
            path.display()
        )
    })?;
    let doc: Vec<Value> = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a JSON array: {e}", path.display()))?;
    // MCP tools take their registry names from the MCP naming rule, per server.
    let mut by_server: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, item) in doc.iter().enumerate() {
        if let Some(server) = item["server"].as_str() {
            match by_server.iter_mut().find(|(s, _)| s == server) {
                Some((_, idx)) => idx.push(i),
                None => by_server.push((server.to_string(), vec![i])),
            }
        }
    }
    let mut names: Vec<Option<String>> = vec![None; doc.len()];
    for (server, idx) in &by_server {
        let raw: Vec<&str> = idx
            .iter()
            .map(|&i| doc[i]["tool"].as_str().unwrap_or_default())
            .collect();
        for (&i, name) in idx
            .iter()
            .zip(crate::mcp::names::registry_names(server, &raw))
        {
            names[i] = name;
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut entries = Vec::with_capacity(doc.len());
    for (i, item) in doc.iter().enumerate() {
        let id = item["id"]
            .as_str()
            .ok_or_else(|| format!("{}: entry {i} has no string `id`", path.display()))?;
        let name = match names[i].take() {
            Some(name) => name,
            None => crate::mcp::names::sanitize(item["tool"].as_str().unwrap_or(id)),
        };
        if !seen.insert(name.clone()) {
            return Err(format!(
                "{}: two entries have the registry name {name}",
                path.display()
            ));
        }
        entries.push(Entry {
            id: id.to_string(),
            name,
            description: item["description"].as_str().unwrap_or_default().into(),
            schema: item["input_schema"].clone(),
        });
    }
    if entries.is_empty() {
        return Err(format!("{}: the catalog is empty", path.display()));
    }
    Ok(entries)
}

fn read_queries(path: &Path, entries: &[Entry]) -> Result<Vec<Query>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the search queries {} (--search-queries): {e}",
            path.display()
        )
    })?;
    let ids: std::collections::HashSet<&str> = entries.iter().map(|e| e.id.as_str()).collect();
    let mut queries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let doc: Value = serde_json::from_str(line)
            .map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), n + 1))?;
        let query = doc["query"]
            .as_str()
            .ok_or_else(|| format!("{}:{}: no string `query`", path.display(), n + 1))?;
        let expected: Vec<String> = doc["expected"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(missing) = expected.iter().find(|e| !ids.contains(e.as_str())) {
            return Err(format!(
                "{}:{}: expected tool {missing} is not in the catalog",
                path.display(),
                n + 1
            ));
        }
        if expected.is_empty() {
            return Err(format!(
                "{}:{}: `expected` names no tool",
                path.display(),
                n + 1
            ));
        }
        queries.push(Query {
            query: query.to_string(),
            expected,
        });
    }
    if queries.is_empty() {
        return Err(format!("{}: no queries", path.display()));
    }
    Ok(queries)
}

/// `--search-catalog` / `--search-queries` or their defaults.
pub fn paths(catalog: &Option<PathBuf>, queries: &Option<PathBuf>) -> (PathBuf, PathBuf) {
    (
        catalog
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CATALOG)),
        queries
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_QUERIES)),
    )
}
