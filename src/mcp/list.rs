//! `switchboard mcp list`: each configured server, its transport and status, and its tools with
//! their registry names and concurrency policy — as text or JSON.

use serde_json::{Value, json};

use super::server_conn::{ServerState, ServerStatus};

/// One line per server, then one indented line per tool.
pub fn render_text(statuses: &[ServerStatus]) -> String {
    let mut out = String::new();
    if statuses.is_empty() {
        out.push_str("no MCP servers configured\n");
    }
    for s in statuses {
        let state = match &s.state {
            ServerState::Disabled => "disabled".to_string(),
            ServerState::Starting => "starting".to_string(),
            ServerState::Up => format!("up, {} tools", s.tools.len()),
            ServerState::Restarting { reason } => format!("restarting ({reason})"),
            ServerState::Failed { reason } => format!("failed: {reason}"),
            ServerState::Stopped => "stopped".to_string(),
        };
        let restarts = match s.restarts {
            0 => String::new(),
            n => format!(", {n} restarts"),
        };
        out.push_str(&format!(
            "{} ({}): {state}{restarts}\n",
            s.name, s.transport
        ));
        let width = s.tools.iter().map(|t| t.name.len()).max().unwrap_or(0);
        for t in &s.tools {
            let policy = if t.concurrency_safe {
                "concurrent"
            } else {
                "serial"
            };
            out.push_str(&format!(
                "  {:width$}  {policy:10}  {}\n",
                t.name,
                t.raw_name,
                width = width
            ));
        }
        for (raw, why) in &s.skipped {
            out.push_str(&format!("  skipped {raw}: {why}\n"));
        }
    }
    out
}

/// `{"servers": [...]}`, each server as its [`ServerStatus`] (state flattened into it).
pub fn render_json(statuses: &[ServerStatus]) -> Value {
    json!({ "servers": statuses })
}

/// True when any enabled server is not up (the command then exits 1).
pub fn any_failed(statuses: &[ServerStatus]) -> bool {
    statuses
        .iter()
        .any(|s| !matches!(s.state, ServerState::Up | ServerState::Disabled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::server_conn::ToolEntry;

    #[test]
    fn text_shows_state_tools_and_policy() {
        let statuses = vec![
            ServerStatus {
                name: "fs".into(),
                transport: "stdio",
                state: ServerState::Up,
                restarts: 1,
                tools: vec![ToolEntry {
                    name: "mcp__fs__read".into(),
                    raw_name: "read".into(),
                    concurrency_safe: true,
                }],
                skipped: vec![],
            },
            ServerStatus {
                name: "web".into(),
                transport: "http",
                state: ServerState::Failed {
                    reason: "boom".into(),
                },
                restarts: 0,
                tools: vec![],
                skipped: vec![],
            },
        ];
        assert_eq!(
            render_text(&statuses),
            "fs (stdio): up, 1 tools, 1 restarts\n  mcp__fs__read  concurrent  read\n\
             web (http): failed: boom\n"
        );
        let j = render_json(&statuses);
        assert_eq!(j["servers"][0]["state"], "up");
        assert_eq!(j["servers"][1]["reason"], "boom");
        assert_eq!(j["servers"][0]["tools"][0]["concurrency_safe"], true);
        assert!(any_failed(&statuses));
    }
}
