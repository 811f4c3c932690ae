//! `switchboard demo`: N scripted agent sessions at once, offline, on a fresh temporary workspace.
//!
//! Each session is a realistic multi-turn task driven by the [`ScriptedProvider`] through the real
//! agent loop and engine, with the five built-in tools: it writes files and runs bash, reads two
//! files and globs in one concurrent batch, edits a file and reads it back in the same turn (the
//! read must see the edit), then makes three mistakes a model makes — an unknown tool, invalid
//! arguments, a path outside the workspace — and finishes. Each session works under its own
//! `sN/` folder. The report lists every dispatched call and ends with a summary table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::agent_loop::{AgentLoop, LoopConfig, LoopResult, default_system_prompt};
use crate::engine::Engine;
use crate::provider::{ModelResponse, ScriptedProvider};
use crate::tools::builtin_tools;
use crate::workspace::Workspace;

fn tool_use(id: String, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

/// The scripted model answers of session `s`.
pub fn script(s: usize) -> Vec<ModelResponse> {
    let dir = format!("s{s}");
    let id = |turn: usize, k: usize| format!("toolu_s{s}_t{turn}_{k}");
    let turns = vec![
        vec![
            text("Setting up the project."),
            tool_use(
                id(1, 1),
                "write_file",
                json!({"path": format!("{dir}/notes.md"), "content": "# Notes\nTODO: ship it\n"}),
            ),
            tool_use(
                id(1, 2),
                "write_file",
                json!({"path": format!("{dir}/src/main.rs"), "content": "fn main() {\n    println!(\"hi\");\n}\n"}),
            ),
            tool_use(
                id(1, 3),
                "bash",
                json!({"command": format!("ls -R {dir} && wc -l {dir}/notes.md")}),
            ),
        ],
        vec![
            text("Reading both files and listing the tree at once."),
            tool_use(
                id(2, 1),
                "read_file",
                json!({"path": format!("{dir}/notes.md")}),
            ),
            tool_use(
                id(2, 2),
                "read_file",
                json!({"path": format!("{dir}/src/main.rs"), "limit": 1}),
            ),
            tool_use(id(2, 3), "glob", json!({"pattern": format!("{dir}/**/*")})),
        ],
        vec![
            text("Marking the task done and checking the file."),
            tool_use(
                id(3, 1),
                "edit_file",
                json!({"path": format!("{dir}/notes.md"), "old_text": "TODO: ship it", "new_text": "DONE: shipped"}),
            ),
            tool_use(
                id(3, 2),
                "read_file",
                json!({"path": format!("{dir}/notes.md")}),
            ),
        ],
        vec![
            text("Trying a deploy."),
            tool_use(id(4, 1), "deploy", json!({"target": "prod"})),
            tool_use(id(4, 2), "read_file", json!({"path": 42})),
            tool_use(id(4, 3), "read_file", json!({"path": "../../etc/passwd"})),
        ],
        vec![text("Done: notes written, edited and verified.")],
    ];
    turns
        .into_iter()
        .enumerate()
        .map(|(i, content)| ModelResponse {
            content,
            stop_reason: Some(if i == 4 { "end_turn" } else { "tool_use" }.into()),
        })
        .collect()
}

struct SessionRun {
    result: Result<LoopResult, String>,
    wall: Duration,
    edit_seen: bool,
    in_order: bool,
}

/// The engine flags the demo shares with the other commands.
#[derive(Debug)]
pub struct EngineFlags<'a> {
    /// The sandbox of bash commands.
    pub sandbox: crate::sandbox::SandboxConfig,
    /// The permission policy and audit log.
    pub policy: &'a crate::command::PolicyArgs,
    /// MCP servers.
    pub mcp: &'a crate::mcp::command::McpArgs,
    /// The call journal.
    pub journal: &'a crate::command::JournalArgs,
}

/// Runs the demo and returns the report. `workspace` overrides the temporary directory;
/// `duration` keeps running rounds of `sessions` sessions until that much time has passed.
/// Cancelling `stop` (a signal) shuts the engine down at once: every call in flight is answered
/// `cancelled` and its processes are killed, no new round starts, and the report covers what ran.
pub async fn run(
    sessions: usize,
    workspace: Option<PathBuf>,
    duration: Option<Duration>,
    stop: CancellationToken,
    flags: EngineFlags<'_>,
) -> Result<String, String> {
    let EngineFlags {
        sandbox,
        policy,
        mcp,
        journal,
    } = flags;
    let temp = match &workspace {
        Some(_) => None,
        None => Some(tempfile::tempdir().map_err(|e| format!("cannot create a workspace: {e}"))?),
    };
    let root = workspace.unwrap_or_else(|| {
        temp.as_ref()
            .map(|t| t.path().to_path_buf())
            .unwrap_or_default()
    });
    let ws = Workspace::open(&root)
        .map_err(|e| format!("cannot open workspace {}: {e}", root.display()))?;
    crate::command::remove_stale_temps(&ws);
    let builder = Engine::builder()
        .tools(builtin_tools())
        .workspace(ws.clone())
        .sandbox(sandbox);
    let builder = journal.apply(builder);
    let builder = policy.apply(builder).map_err(|e| e.to_string())?;
    let engine = crate::mcp::command::start_engine(builder, mcp).await?;
    let on_stop = {
        let (engine, stop) = (engine.clone(), stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            engine.shutdown(Duration::ZERO).await;
        })
    };
    let started = Instant::now();
    let first = run_round(&engine, &ws, sessions).await?;
    let mut totals = Totals::default();
    totals.add(&first);
    while duration.is_some_and(|d| started.elapsed() < d) && !stop.is_cancelled() {
        totals.add(&run_round(&engine, &ws, sessions).await?);
    }
    let total = started.elapsed();
    on_stop.abort();
    engine.shutdown(Duration::from_secs(1)).await;
    Ok(report(&first, &totals, total, ws.root()))
}

/// Sums over every round.
#[derive(Default)]
struct Totals {
    rounds: usize,
    sessions: usize,
    verified: usize,
    outcomes: BTreeMap<&'static str, usize>,
}

impl Totals {
    fn add(&mut self, runs: &[SessionRun]) {
        self.rounds += 1;
        self.sessions += runs.len();
        self.verified += runs
            .iter()
            .filter(|r| r.result.is_ok() && r.edit_seen && r.in_order)
            .count();
        for r in runs.iter().filter_map(|r| r.result.as_ref().ok()) {
            for res in r.dispatches.iter().flatten() {
                *self.outcomes.entry(res.outcome()).or_default() += 1;
            }
        }
    }
}

async fn run_round(
    engine: &Engine,
    ws: &Workspace,
    sessions: usize,
) -> Result<Vec<SessionRun>, String> {
    let mut tasks = Vec::with_capacity(sessions);
    for s in 1..=sessions {
        let engine = engine.clone();
        let system = default_system_prompt(ws.root());
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let provider = Arc::new(ScriptedProvider::new(script(s)));
            let config = LoopConfig {
                system,
                ..LoopConfig::default()
            };
            let result = match AgentLoop::new(engine.session(), provider, config) {
                Ok(mut agent) => agent
                    .run("Write notes, mark them done, and verify.")
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let edit_seen = result.as_ref().is_ok_and(|r| {
                r.dispatches
                    .get(2)
                    .and_then(|d| d.get(1))
                    .is_some_and(|read| read.content.contains("DONE: shipped"))
            });
            let in_order = result.as_ref().is_ok_and(|r| {
                r.dispatches.iter().enumerate().all(|(t, results)| {
                    results.iter().enumerate().all(|(k, res)| {
                        *res.tool_use_id == *format!("toolu_s{s}_t{}_{}", t + 1, k + 1)
                    })
                })
            });
            SessionRun {
                result,
                wall: t0.elapsed(),
                edit_seen,
                in_order,
            }
        }));
    }
    let mut runs = Vec::with_capacity(sessions);
    for task in tasks {
        runs.push(
            task.await
                .map_err(|e| format!("a session task failed: {e}"))?,
        );
    }
    Ok(runs)
}

fn report(runs: &[SessionRun], totals: &Totals, total: Duration, root: &std::path::Path) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Switchboard demo: {} scripted sessions at once on {}\n",
        runs.len(),
        root.display()
    );
    for (i, run) in runs.iter().enumerate() {
        let _ = writeln!(out, "session {}", i + 1);
        match &run.result {
            Ok(r) => {
                for (t, results) in r.dispatches.iter().enumerate() {
                    for (k, res) in results.iter().enumerate() {
                        let turn = if k == 0 {
                            format!("turn {}", t + 1)
                        } else {
                            String::new()
                        };
                        let _ = writeln!(
                            out,
                            "  {turn:<7} {:<11} {:<18} {:>9.3} ms",
                            res.tool_name,
                            res.outcome(),
                            res.timing.run.as_secs_f64() * 1000.0
                        );
                    }
                }
                let _ = writeln!(
                    out,
                    "  stop: {} after {} turns, {} tool calls; read after edit saw the edit: {}\n",
                    r.stop_reason.as_str(),
                    r.turns,
                    r.tool_calls,
                    if run.edit_seen { "yes" } else { "NO" }
                );
            }
            Err(e) => {
                let _ = writeln!(out, "  failed: {e}\n");
            }
        }
    }
    let _ = writeln!(out, "Summary");
    let _ = writeln!(
        out,
        "  {:<8} {:>6} {:>6} {:>5} {:>7} {:>10}",
        "session", "turns", "calls", "ok", "errors", "wall ms"
    );
    for (i, run) in runs.iter().enumerate() {
        if let Ok(r) = &run.result {
            let ok = r.dispatches.iter().flatten().filter(|x| x.is_ok()).count();
            let _ = writeln!(
                out,
                "  {:<8} {:>6} {:>6} {:>5} {:>7} {:>10.2}",
                i + 1,
                r.turns,
                r.tool_calls,
                ok,
                r.tool_calls - ok,
                run.wall.as_secs_f64() * 1000.0
            );
        }
    }
    let calls: usize = totals.outcomes.values().sum();
    let outcome_list: Vec<String> = totals
        .outcomes
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let rounds = if totals.rounds > 1 {
        format!(" over {} rounds", totals.rounds)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "\n{calls} calls in {:.1} ms{rounds}: {}",
        total.as_secs_f64() * 1000.0,
        outcome_list.join(", ")
    );
    let _ = writeln!(
        out,
        "{} of {} sessions finished with every call answered once, in order",
        totals.verified, totals.sessions
    );
    out
}
