//! `switchboard mcp-serve`: the built-in tools as an MCP server over stdio.
//!
//! Every `tools/call` is one turn of one call through the engine (validation, timeout, output cap,
//! metrics), so the guarantees of a dispatched call hold. Tools that are concurrency-safe
//! (`read_file`, `glob`) carry `readOnlyHint: true`; the others (`write_file`, `edit_file`,
//! `bash`) carry `destructiveHint: true`. A result is one text block, or, when a tool returned an
//! image, its text and image blocks in order. A failed call is an `isError: true` result whose text is
//! the `Error [<code>]: <detail>` line. A client's `notifications/cancelled` cancels the call
//! (its processes are killed); per the protocol, no response is sent for it.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::engine::Engine;
use crate::protocol::{Block, ToolCall};
use crate::tool::ToolSpec;

/// The MCP view of some registered tools.
pub struct Served {
    engine: Engine,
    tools: Arc<Vec<Tool>>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("tools", &self.tools.len())
            .finish()
    }
}

/// The MCP tool entry of a spec: name, description, schema, and the hint its policy implies.
pub fn mcp_tool(spec: &ToolSpec) -> Tool {
    let schema = match &spec.input_schema {
        Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    let annotations = if spec.policy.concurrency_safe {
        ToolAnnotations::new().read_only(true)
    } else {
        ToolAnnotations::new().read_only(false).destructive(true)
    };
    let mut tool = Tool::new(spec.name.clone(), spec.description.clone(), schema);
    tool.annotations = Some(annotations);
    tool
}

impl Served {
    /// Serves `specs` (which must be registered in `engine`) through `engine`.
    pub fn new(engine: Engine, specs: &[ToolSpec]) -> Self {
        Served {
            engine,
            tools: Arc::new(specs.iter().map(mcp_tool).collect()),
        }
    }
}

impl ServerHandler for Served {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("switchboard", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.tools.iter().any(|t| t.name == request.name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool: {}", request.name),
                None,
            ));
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        // The request id as a tool_use_id the engine accepts (`^[a-zA-Z0-9_-]+$`).
        let id: String = format!("mcp_{}", context.id)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(200)
            .collect();
        let call = ToolCall::new(id, request.name.as_ref(), args);
        let turn = self.engine.turn_token();
        // The client's notifications/cancelled cancels rmcp's token for this request.
        let watcher = {
            let (turn, client) = (turn.clone(), context.ct.clone());
            tokio::spawn(async move {
                client.cancelled().await;
                turn.cancel();
            })
        };
        let results = self.engine.dispatch_with_cancel(vec![call], turn).await;
        watcher.abort();
        let mut results = results.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let result = results.pop().ok_or_else(|| {
            ErrorData::internal_error("the engine returned no result".to_string(), None)
        })?;
        let content = mcp_content(result.content, result.blocks);
        Ok(CallToolResponse::Complete(match result.error {
            None => CallToolResult::success(content),
            Some(_) => CallToolResult::error(content),
        }))
    }
}

/// A result's content as MCP content: its text as one text block, or, when it carries an image,
/// its text and image blocks in order.
fn mcp_content(text: String, blocks: Option<Box<[Block]>>) -> Vec<ContentBlock> {
    match blocks {
        None => vec![ContentBlock::text(text)],
        Some(blocks) => blocks
            .into_vec()
            .into_iter()
            .map(|block| match block {
                Block::Text(text) => ContentBlock::text(text),
                Block::Image(image) => ContentBlock::image(image.data, image.media_type),
            })
            .collect(),
    }
}

/// Serves `specs` through `engine` on stdin/stdout until the client closes stdin or `stop` fires.
pub async fn serve_stdio(
    engine: Engine,
    specs: &[ToolSpec],
    stop: tokio_util::sync::CancellationToken,
) -> Result<(), String> {
    let served = Served::new(engine, specs);
    let running = served
        .serve_with_ct(rmcp::transport::io::stdio(), stop)
        .await
        .map_err(|e| format!("MCP initialization failed: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("the MCP server task failed: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::TINY_PNG;
    use serde_json::json;

    #[test]
    fn text_stays_one_text_block_and_images_become_mcp_image_blocks() {
        let text = serde_json::to_value(mcp_content("plain".into(), None)).unwrap();
        assert_eq!(text, json!([{"type": "text", "text": "plain"}]));
        let blocks = vec![Block::text("look:"), Block::image("image/png", TINY_PNG)];
        let mixed = serde_json::to_value(mcp_content(
            "look:\n[image: …]".into(),
            Some(blocks.into_boxed_slice()),
        ))
        .unwrap();
        assert_eq!(
            mixed,
            json!([
                {"type": "text", "text": "look:"},
                {"type": "image", "data": TINY_PNG, "mimeType": "image/png"}
            ])
        );
    }
}
