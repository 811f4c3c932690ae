//! A server's tools: every page of its `tools/list`, within the server's [`ListLimits`].
//!
//! rmcp's own `list_all_tools` follows `nextCursor` for as long as the server hands one out,
//! keeping every page: a server that pages forever (or lists huge schemas) grows the engine's
//! memory until the start-up timeout, or until the machine kills it. Here the pages, the tools
//! and the bytes of their definitions (as JSON: names, descriptions, schemas, annotations) are
//! counted as they arrive, and the listing stops at the first bound passed, with a reason that
//! names it and the configuration key that raises it. Each page is itself bounded by the
//! transport's message limit, so at most one page beyond the bounds is ever held.

use rmcp::model::{PaginatedRequestParams, Tool};
use rmcp::{Peer, RoleClient, ServiceError};

use super::config::ListLimits;
use super::wire::{Unread, unreadable_cause};
use crate::sandbox::human_bytes;

/// Every tool of the server behind `peer`, with the tools its pages held that could not be read
/// (raw name and why, as the transport reported them to `unread`), or why the listing stopped.
pub(crate) async fn list_tools(
    peer: &Peer<RoleClient>,
    limits: ListLimits,
    unread: &Unread,
) -> Result<(Vec<Tool>, Vec<(String, String)>), String> {
    drop(unread.take());
    let mut tools = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = None;
    let mut page = 0usize;
    loop {
        page += 1;
        let params = PaginatedRequestParams::default().with_cursor(cursor);
        let result = peer.list_tools(Some(params)).await.map_err(|e| match &e {
            ServiceError::McpError(error) => match unreadable_cause(error) {
                Some(cause) => {
                    format!("tools/list failed: its response could not be read: {cause}")
                }
                None => format!("tools/list failed: {e}"),
            },
            _ => format!("tools/list failed: {e}"),
        })?;
        for tool in result.tools {
            bytes = bytes.saturating_add(json_len(&tool));
            if tools.len() >= limits.tools {
                return Err(format!(
                    "tools/list stopped: the server lists more than {} tools (max_tools)",
                    limits.tools
                ));
            }
            if bytes > limits.bytes {
                return Err(format!(
                    "tools/list stopped: the tool definitions pass {} (max_list_bytes)",
                    human_bytes(limits.bytes as u64)
                ));
            }
            tools.push(tool);
        }
        match result.next_cursor {
            None => return Ok((tools, unread.take())),
            Some(_) if page >= limits.pages => {
                return Err(format!(
                    "tools/list stopped: the server lists more than {} pages (max_list_pages)",
                    limits.pages
                ));
            }
            next => cursor = next,
        }
    }
}

/// The length of `tool` as JSON, counted without building the text.
fn json_len(tool: &Tool) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing into a counter cannot fail; a tool that could not be written counts as nothing.
    let _ = serde_json::to_writer(&mut count, tool);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_is_counted_as_the_json_it_serializes_to() {
        let tool: Tool = serde_json::from_value(serde_json::json!({
            "name": "t", "description": "d", "inputSchema": {"type": "object"}
        }))
        .unwrap();
        assert_eq!(json_len(&tool), serde_json::to_vec(&tool).unwrap().len());
    }
}
