//! `studies tool-search`: how well and how fast `tool_search` finds deferred tools.
//!
//! * **Recall** — the benchmark catalog (`--catalog`, real tool definitions: the
//!   `tools/list` of real MCP servers, padded with other real definitions) registered as
//!   deferred tools of one engine, and every query of `--queries` (natural-language
//!   requests, each with the tools a person would expect) sent as a `tool_search` call with
//!   `max_results` 5: top-1 is the share of queries whose first result is an expected tool,
//!   top-5 the share with an expected tool among the five, MRR the mean of 1/rank of the first
//!   expected tool (0 when none is among the five). Reported per set: **tuning** (the queries
//!   of `--queries` whose [`split`] is even: the only ones the ranking may be tuned on),
//!   **held-out benchmark** (the others), **held-out tasks** (`tasks.jsonl` beside the queries:
//!   queries written as user tasks, never used for tuning) and **held-out** (both).
//! * **Latency** — the same catalog repeated to 10,000 tools (each copy renamed), and
//!   `tool_search` calls of each query form (the queries as keywords; `select:` of two names;
//!   `regex:` of a word of the query) dispatched one at a time through a session: p50/p99 per
//!   search, the whole call included (validation, search, encoding), in wall time and in the
//!   process's CPU time (nothing else runs meanwhile), which a busy machine inflates far less;
//!   then `regex:` patterns built to be costly (long counted repetitions, a word that never
//!   occurs), and keyword searches of one session while another runs those patterns
//!   back to back (what a costly pattern does to other sessions).
//!
//! One JSON line each; the files are the repository's `benches/tool_search/` by default.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use switchboard::protocol::Block;
use switchboard::{Defer, Engine, Handler, Session, ToolCall, ToolSpec};

use crate::samples::{Samples, round};

/// The held-out task queries, read from beside the queries when the file exists.
pub const TASKS_FILE: &str = "tasks.jsonl";
/// `regex:` patterns built to be costly over the latency catalog: long counted repetitions of
/// classes, and a word that never occurs so that nothing stops the scan early.
const COSTLY_PATTERNS: &[&str] = &[
    r"\w{3}.{180}zzqxj",
    r"[a-z]{3}.{150}zzqxj",
    r"\w{3}.{180}",
    r"(get|list|create|delete).{120}zzqxj",
    r"[a-z]+_[a-z]+.{60}\d{3}zzqxj",
    r"(\w+\s+){20}zzqxj",
    r".*.*.*.*.*=.*.*.*.*zzqxj",
    r"zzqxj|\w{2}.{90}\bqqq",
];
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

/// Which set a benchmark query belongs to: `true` for tuning. FNV-1a (64-bit) of the query's
/// text, even for tuning, odd for held-out: fixed, independent of the file's order, and about
/// half and half (170 and 134 of the 304 queries).
pub fn split(query: &str) -> bool {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in query.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash.is_multiple_of(2)
}

/// Top-1, top-5 and MRR of a set of queries.
#[derive(Default)]
struct Recall {
    queries: usize,
    top1: usize,
    top5: usize,
    reciprocal: f64,
}

impl Recall {
    fn add(&mut self, rank: Option<usize>) {
        self.queries += 1;
        if let Some(rank) = rank {
            self.top1 += usize::from(rank == 1);
            self.top5 += usize::from(rank <= 5);
            self.reciprocal += 1.0 / rank as f64;
        }
    }

    fn line(&self, set: &str, catalog: usize, mcp: usize, misses: Option<&[Value]>) -> String {
        let n = self.queries.max(1) as f64;
        let mut line = json!({
            "workload": "tool_search_recall",
            "set": set,
            "catalog_tools": catalog,
            "mcp_tools": mcp,
            "queries": self.queries,
            "top1": round(self.top1 as f64 / n, 3),
            "top5": round(self.top5 as f64 / n, 3),
            "mrr": round(self.reciprocal / n, 3),
        });
        if let Some(misses) = misses {
            line["misses_shown"] = json!(misses);
        }
        line.to_string()
    }
}

/// Runs the set; returns its JSON lines.
pub async fn run(
    catalog: &Path,
    queries: &Path,
    max_time: Duration,
) -> Result<Vec<String>, String> {
    let entries = read_catalog(catalog)?;
    let tasks_path = queries.with_file_name(TASKS_FILE);
    let queries = read_queries(queries, &entries)?;
    let tasks = if tasks_path.exists() {
        read_queries(&tasks_path, &entries)?
    } else {
        Vec::new()
    };
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
    let (mut tuning, mut held_benchmark, mut held_tasks, mut held) = (
        Recall::default(),
        Recall::default(),
        Recall::default(),
        Recall::default(),
    );
    let mut misses = Vec::new();
    let sets = queries
        .iter()
        .map(|q| (q, split(&q.query)))
        .chain(tasks.iter().map(|q| (q, false)));
    for (i, (q, is_tuning)) in sets.enumerate() {
        let found = search(&session, i, &q.query, 5, false).await?;
        let rank = found
            .iter()
            .filter_map(|n| by_name.get(n.as_str()).copied())
            .position(|id| q.expected.iter().any(|e| e == id))
            .map(|p| p + 1);
        if is_tuning {
            tuning.add(rank);
            // Only tuning misses are shown: the held-out ones are not for reading.
            if rank.is_none() && misses.len() < 10 {
                let ids: Vec<&str> = found
                    .iter()
                    .filter_map(|n| by_name.get(n.as_str()).copied())
                    .collect();
                misses.push(json!({"query": q.query, "expected": q.expected, "got": ids}));
            }
        } else {
            held.add(rank);
            if i < queries.len() {
                held_benchmark.add(rank);
            } else {
                held_tasks.add(rank);
            }
        }
    }
    let (n, m) = (entries.len(), mcp);
    let mut lines = vec![
        tuning.line("tuning", n, m, Some(&misses)),
        held.line("held_out", n, m, None),
        held_benchmark.line("held_out_benchmark", n, m, None),
    ];
    if held_tasks.queries > 0 {
        lines.push(held_tasks.line("held_out_tasks", n, m, None));
    }
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
            search(&session, i, &query_of(i), 5, false).await?;
        }
        let mut h = Samples::default();
        let mut cpu = Samples::default();
        let mut done = 0usize;
        for i in 0..SEARCHES_PER_FORM {
            if Instant::now() >= deadline {
                break;
            }
            let query = query_of(i);
            let started = Instant::now();
            let cpu_started = process_cpu();
            search(&session, i, &query, 5, false).await?;
            cpu.record_ns(process_cpu().saturating_sub(cpu_started));
            h.record(started.elapsed());
            done += 1;
        }
        lines.push(h.with_latency(json!({
            "workload": "tool_search_latency",
            "catalog_tools": names.len(),
            "form": form,
            "searches": done,
            "cpu_p50_us": round(cpu.us(0.5), 2),
            "cpu_p99_us": round(cpu.us(0.99), 2),
        })));
    }
    lines.push(costly_regex(&session, deadline).await?);
    lines.push(beside_costly(&engine, &queries, deadline).await?);
    drop(session);
    engine.shutdown(Duration::from_secs(1)).await;
    Ok(lines)
}

/// p50/p99 of `regex:` patterns built to be costly, and how many the search refused.
async fn costly_regex(session: &Session, deadline: Instant) -> Result<String, String> {
    let mut h = Samples::default();
    let (mut done, mut refused) = (0usize, 0usize);
    let mut per_pattern: Vec<(u64, bool)> = vec![(0, false); COSTLY_PATTERNS.len()];
    for i in 0..COSTLY_PATTERNS.len() * 40 {
        if Instant::now() >= deadline && done >= COSTLY_PATTERNS.len() {
            break;
        }
        let k = i % COSTLY_PATTERNS.len();
        let query = format!("regex:{}", COSTLY_PATTERNS[k]);
        let started = Instant::now();
        let answer = search(session, i, &query, 5, true).await?;
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        h.record_ns(ns);
        let too_costly = answer.first().is_some_and(|a| a.contains("too costly"));
        refused += usize::from(too_costly);
        per_pattern[k] = (per_pattern[k].0.max(ns), too_costly);
        done += 1;
    }
    let patterns: Vec<Value> = COSTLY_PATTERNS
        .iter()
        .zip(&per_pattern)
        .map(|(pattern, (max, too_costly))| {
            json!({"pattern": pattern, "max_ms": round(*max as f64 / 1e6, 2), "too_costly": too_costly})
        })
        .collect();
    Ok(h.with_latency(json!({
        "workload": "tool_search_latency",
        "catalog_tools": LATENCY_TOOLS,
        "form": "regex_costly",
        "searches": done,
        "refused_too_costly": refused,
        "patterns": patterns,
    })))
}

/// p50/p99 of one session's keyword searches while another session runs costly `regex:`
/// patterns back to back.
async fn beside_costly(
    engine: &Engine,
    queries: &[Query],
    deadline: Instant,
) -> Result<String, String> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = engine.session();
    let stop_other = std::sync::Arc::clone(&stop);
    let busy = tokio::spawn(async move {
        let mut i = 0usize;
        while !stop_other.load(std::sync::atomic::Ordering::Relaxed) {
            let query = format!("regex:{}", COSTLY_PATTERNS[i % COSTLY_PATTERNS.len()]);
            if search(&other, i, &query, 5, true).await.is_err() {
                break;
            }
            i += 1;
        }
        i
    });
    let session = engine.session();
    let mut h = Samples::default();
    let mut done = 0usize;
    for i in 0..SEARCHES_PER_FORM {
        if Instant::now() >= deadline && done >= 100 {
            break;
        }
        let query = &queries[i % queries.len()].query;
        let started = Instant::now();
        search(&session, i, query, 5, false).await?;
        h.record(started.elapsed());
        done += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let costly = busy.await.unwrap_or(0);
    Ok(h.with_latency(json!({
        "workload": "tool_search_latency",
        "catalog_tools": LATENCY_TOOLS,
        "form": "keywords_beside_costly_regex",
        "searches": done,
        "costly_searches_meanwhile": costly,
    })))
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
    switchboard::metrics::detached(|| Engine::builder().tools(specs).build())
        .map_err(|e| format!("cannot build the benchmark engine: {e}"))
}

/// One `tool_search` call; the names it returned, best first. With `refusal`, an error result
/// is an answer (its text, alone) rather than a failure of the benchmark.
async fn search(
    session: &Session,
    i: usize,
    query: &str,
    max: usize,
    refusal: bool,
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
        if refusal {
            return Ok(vec![r.content.to_string()]);
        }
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
            "cannot read the search catalog {} (--catalog): {e}",
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
            .zip(switchboard::mcp::registry_names(server, &raw))
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
        // Tools of no server are registered under their own name, which must be one.
        let name = match names[i].take() {
            Some(name) => name,
            None => {
                let name = item["tool"].as_str().unwrap_or(id);
                if !valid_name(name) {
                    return Err(format!(
                        "{}: entry {id}'s tool name {name:?} is not a registry name (1–64 of [A-Za-z0-9_-])",
                        path.display()
                    ));
                }
                name.to_string()
            }
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
            "cannot read the search queries {} (--queries): {e}",
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

/// A registry name: 1–64 of `[A-Za-z0-9_-]`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
