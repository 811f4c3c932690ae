//! `switchboard load --mcp-config FILE --mcp-call NAME [--mcp-args JSON]`: drives one MCP tool
//! through the engine — `--sessions` sessions, each sending turns of `--calls-per-turn` calls — and
//! with `--baseline direct` makes the same calls directly with an rmcp client in the same process
//! (its own connection to the same server configuration), then reports calls/s and turn latency
//! percentiles of each side.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use super::args::{Baseline, LoadArgs};
use crate::command::fail;
use crate::engine::Engine;
use crate::mcp::config::{McpConfig, Transport};
use crate::mcp::transport;
use crate::protocol::ToolCall;

/// What one side measured.
#[derive(Debug, Default)]
struct Side {
    turns: Vec<Duration>,
    calls: usize,
    errors: usize,
    misordered: usize,
    elapsed: Duration,
}

impl Side {
    fn json(&mut self) -> Value {
        self.turns.sort();
        let pct = |p: f64| {
            let t = &self.turns;
            t.get(((t.len().max(1) - 1) as f64 * p).round() as usize)
                .map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        json!({
            "calls": self.calls,
            "errors": self.errors,
            "turns_not_answered_once_in_order": self.misordered,
            "calls_per_second": self.calls as f64 / self.elapsed.as_secs_f64().max(1e-9),
            "turn_us": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "max": pct(1.0)},
        })
    }
}

/// When a side stops: after `turns` turns per session, or at `until`.
#[derive(Debug, Clone, Copy)]
struct Stop {
    turns: u64,
    until: Instant,
}

impl Stop {
    fn more(&self, done: u64) -> bool {
        done < self.turns && Instant::now() < self.until
    }
}

/// Runs the MCP load (see the module docs).
pub async fn run(args: &LoadArgs, name: &str) -> ExitCode {
    let config = match args.mcp.config() {
        Ok(c) => c,
        Err(e) => return fail(2, &e),
    };
    let tool_args: Value = match args.mcp_args.as_deref().map(serde_json::from_str) {
        None => json!({}),
        Some(Ok(v @ Value::Object(_))) => v,
        Some(_) => return fail(2, "--mcp-args must be a JSON object"),
    };
    let engine = match Engine::builder().mcp_config(config.clone()).start().await {
        Ok(e) => e,
        Err(e) => return fail(1, e.to_string()),
    };
    let found = engine.mcp_status().into_iter().find_map(|s| {
        s.tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| (s.name.clone(), t.raw_name.clone()))
    });
    let Some((server, raw)) = found else {
        engine.shutdown(Duration::from_secs(1)).await;
        return fail(
            2,
            format!(
                "--mcp-call {name}: no such tool on a server that is up (see `switchboard mcp list`)"
            ),
        );
    };
    let stop = || Stop {
        turns: args.turns.unwrap_or(u64::MAX),
        until: Instant::now() + args.duration.unwrap_or(Duration::from_secs(5)),
    };
    let (sessions, k) = (args.sessions as usize, args.calls_per_turn as usize);
    let mut engine_side = engine_load(&engine, name, &tool_args, sessions, k, stop()).await;
    engine.shutdown(Duration::from_secs(2)).await;
    let mut report = json!({"tool": name, "sessions": sessions, "calls_per_turn": k,
                            "engine": engine_side.json()});
    if args.baseline == Some(Baseline::Direct) {
        match direct_load(&config, &server, &raw, &tool_args, sessions, k, stop()).await {
            Ok(mut direct) => {
                report["direct"] = direct.json();
                let (e, d) = (&report["engine"]["turn_us"], &report["direct"]["turn_us"]);
                report["overhead_us"] = json!({
                    "p50": e["p50"].as_f64().unwrap_or(0.0) - d["p50"].as_f64().unwrap_or(0.0),
                    "p99": e["p99"].as_f64().unwrap_or(0.0) - d["p99"].as_f64().unwrap_or(0.0),
                });
            }
            Err(e) => return fail(1, format!("direct baseline: {e}")),
        }
    }
    let text = if args.json {
        report.to_string()
    } else {
        serde_json::to_string_pretty(&report).unwrap_or_default()
    };
    crate::command::out(&format!("{text}\n"));
    if engine_side.misordered > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn engine_load(
    engine: &Engine,
    name: &str,
    args: &Value,
    sessions: usize,
    k: usize,
    stop: Stop,
) -> Side {
    let started = Instant::now();
    let name: Arc<str> = Arc::from(name);
    let tasks = (0..sessions).map(|_| {
        let (session, name, args) = (engine.session(), name.clone(), args.clone());
        tokio::spawn(async move {
            let mut side = Side::default();
            let mut done = 0;
            while stop.more(done) {
                // Each turn has ids of its own, as a model's do.
                let calls: Vec<ToolCall> = (0..k)
                    .map(|i| {
                        ToolCall::new(format!("toolu_{done:x}_{i:02}"), name.clone(), args.clone())
                    })
                    .collect();
                let ids: Vec<Arc<str>> = calls.iter().map(|c| Arc::clone(&c.id)).collect();
                let t = Instant::now();
                // An engine fault answers nothing: counted below as not answered in order.
                let results = session.dispatch(calls).await.unwrap_or_default();
                side.turns.push(t.elapsed());
                side.calls += results.len();
                side.errors += results.iter().filter(|r| r.error.is_some()).count();
                if results.len() != ids.len()
                    || results
                        .iter()
                        .zip(ids.iter())
                        .any(|(r, id)| r.tool_use_id != *id)
                {
                    side.misordered += 1;
                }
                done += 1;
            }
            side
        })
    });
    merge(join_all(tasks).await, started)
}

async fn direct_load(
    config: &McpConfig,
    server: &str,
    raw: &str,
    args: &Value,
    sessions: usize,
    k: usize,
    stop: Stop,
) -> Result<Side, String> {
    let spec = config
        .servers
        .get(server)
        .ok_or_else(|| format!("no server {server}"))?;
    let client = match &spec.transport {
        t @ Transport::Stdio { .. } => {
            let containment = crate::sandbox::Containment::default();
            let (child, _) =
                transport::spawn_stdio(server, t, &containment).map_err(|e| e.to_string())?;
            ().serve(child).await.map_err(|e| e.to_string())?
        }
        t @ Transport::Http { .. } => {
            ().serve(transport::http(t)?)
                .await
                .map_err(|e| e.to_string())?
        }
    };
    let peer = client.peer().clone();
    let map = args.as_object().cloned().unwrap_or_default();
    let started = Instant::now();
    let tasks = (0..sessions).map(|_| {
        let (peer, raw, map) = (peer.clone(), raw.to_string(), map.clone());
        tokio::spawn(async move {
            let mut side = Side::default();
            let mut done = 0;
            while stop.more(done) {
                let t = Instant::now();
                let calls = (0..k).map(|_| {
                    peer.call_tool(
                        CallToolRequestParams::new(raw.clone()).with_arguments(map.clone()),
                    )
                });
                let results = join_all(calls).await;
                side.turns.push(t.elapsed());
                side.calls += results.len();
                side.errors += results
                    .iter()
                    .filter(|r| !matches!(r, Ok(r) if r.is_error != Some(true)))
                    .count();
                done += 1;
            }
            side
        })
    });
    let side = merge(join_all(tasks).await, started);
    let _ = client.cancel().await;
    Ok(side)
}

fn merge(parts: Vec<Result<Side, tokio::task::JoinError>>, started: Instant) -> Side {
    let mut all = Side::default();
    for part in parts.into_iter().flatten() {
        all.turns.extend(part.turns);
        all.calls += part.calls;
        all.errors += part.errors;
        all.misordered += part.misordered;
    }
    all.elapsed = started.elapsed();
    all
}
