//! `switchboard mcp-serve`: the built-in tools as an MCP server over stdio.
//!
//! Every `tools/call` is one turn of one call through the engine (validation, timeout, output cap,
//! metrics), so the guarantees of a dispatched call hold. Tools that are concurrency-safe
//! (`read_file`, `glob`) carry `readOnlyHint: true`; the others (`write_file`, `edit_file`,
//! `bash`) carry `destructiveHint: true`. A result is one text block, or, when a tool returned an
//! image, its text and image blocks in order. A failed call is an `isError: true` result whose text is
//! the `Error [<code>]: <detail>` line. A client's `notifications/cancelled` cancels the call
//! (its processes are killed); per the protocol, no response is sent for it. A request that
//! cannot be read — over the 16 MiB message limit, not UTF-8 or not JSON, params that do not
//! decode (nested too deep included) — is answered with a JSON-RPC error carrying its id
//! (`super::wire`).
//!
//! Calls a client has in flight at once are separate turns. With [`Order::Concurrent`] (the
//! default) each starts as soon as it is handled, whatever it touches. With [`Order::Arrival`]
//! the [`ArrivalGate`] keeps the order of calls that conflict: as the read loop takes each
//! `tools/call` off stdin ([`Arrivals`], before rmcp hands it to a task of its own, whose start
//! order tokio does not keep), the call gets its place — its [`Access`] (the planner's
//! [`plan::access`]) and the end signals of every earlier call still in flight that it conflicts
//! with — and [`Served::call_tool`] waits for those before it dispatches. Its [`Ticket`] is
//! released when the call is answered, cancelled or dropped.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientRequest, ContentBlock,
    Implementation, JsonRpcMessage, JsonRpcRequest, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::wire::JsonLines;
use crate::engine::Engine;
use crate::plan;
use crate::protocol::{Block, ToolCall};
use crate::registry::Snapshot;
use crate::tool::{Access, Effect, ToolSpec};
use crate::validation;
use crate::workspace::Workspace;

/// How `mcp-serve` orders the `tools/call`s a client has in flight at once (each is a turn of its
/// own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Order {
    /// Each call starts as soon as it is handled: calls in flight together run concurrently,
    /// whatever they touch, and their order is not kept.
    #[default]
    Concurrent,
    /// A call waits for every call that arrived before it, is still in flight and conflicts with
    /// it (by the tools' access declarations, as between the calls of one turn); calls that do
    /// not conflict still overlap.
    Arrival,
}

/// The MCP view of some registered tools.
pub struct Served {
    engine: Engine,
    tools: Arc<Vec<Tool>>,
    /// The engine's workspace, for the tools' access functions.
    workspace: Option<Workspace>,
    /// The arrival gate ([`Order::Arrival`]), shared with the read loop's [`Arrivals`].
    gate: Option<Arc<ArrivalGate>>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("tools", &self.tools.len())
            .field("arrival_gate", &self.gate.is_some())
            .finish()
    }
}

/// The MCP tool entry of a spec: name, description, schema, and the hint its policy implies.
pub fn mcp_tool(spec: &ToolSpec) -> Tool {
    let schema = match &spec.input_schema {
        Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    let annotations = if spec.policy.concurrency_safe || spec.effect == Effect::ReadOnly {
        ToolAnnotations::new().read_only(true)
    } else {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(spec.effect == Effect::Idempotent)
    };
    let mut tool = Tool::new(spec.name.clone(), spec.description.clone(), schema);
    tool.annotations = Some(annotations);
    tool
}

impl Served {
    /// Serves `specs` (which must be registered in `engine`) through `engine`, in `order`.
    /// `workspace` is the engine's, handed to the tools' access functions.
    pub fn new(
        engine: Engine,
        specs: &[ToolSpec],
        order: Order,
        workspace: Option<Workspace>,
    ) -> Self {
        Served {
            engine,
            tools: Arc::new(specs.iter().map(mcp_tool).collect()),
            workspace,
            gate: (order == Order::Arrival).then(Arc::default),
        }
    }

    /// `transport` with this server's arrival gate on its reads (a plain pass-through without
    /// one).
    fn arrivals<T>(&self, transport: T) -> Arrivals<T> {
        Arrivals {
            inner: transport,
            gate: self.gate.clone(),
            engine: self.engine.clone(),
            workspace: self.workspace.clone(),
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
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Its place at the arrival gate, released when this future ends (answered, failed,
        // cancelled or dropped).
        let arrived = context.extensions.remove::<Arrived>();
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
        if let Some(arrived) = &arrived {
            // A call cancelled while it waits stops waiting; the engine answers it `cancelled`
            // without running it.
            tokio::select! {
                () = arrived.0.ready() => {}
                () = turn.cancelled() => {}
            }
        }
        let results = self.engine.dispatch_with_cancel(vec![call], turn).await;
        drop(arrived);
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
                Block::ToolReference(r) => ContentBlock::text(r.definition),
            })
            .collect(),
    }
}

/// The arrival gate of [`Order::Arrival`]: the calls that arrived and are not yet answered, in
/// arrival order, each with what it touches and the signal its end fires.
#[derive(Debug, Default)]
struct ArrivalGate {
    in_flight: Mutex<InFlight>,
}

#[derive(Debug, Default)]
struct InFlight {
    next: u64,
    calls: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    access: Access,
    done: CancellationToken,
}

/// One arrived call's place at the gate: the end signals of the earlier calls it waits for, and
/// its own, fired (and its entry removed) when the ticket is dropped.
#[derive(Debug)]
struct Ticket {
    gate: Arc<ArrivalGate>,
    seq: u64,
    done: CancellationToken,
    after: Vec<CancellationToken>,
}

/// A [`Ticket`] as a request extension (which must be `Clone`); the call's handler takes it.
#[derive(Debug, Clone)]
struct Arrived(Arc<Ticket>);

impl ArrivalGate {
    /// The place of a call that arrives now and touches `access`: after every call in flight it
    /// conflicts with.
    fn arrive(self: &Arc<Self>, access: Access) -> Ticket {
        let done = CancellationToken::new();
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let after = in_flight
            .calls
            .iter()
            .filter(|e| e.access.conflicts(&access))
            .map(|e| e.done.clone())
            .collect();
        let seq = in_flight.next;
        in_flight.next += 1;
        in_flight.calls.push(Entry {
            seq,
            access,
            done: done.clone(),
        });
        Ticket {
            gate: Arc::clone(self),
            seq,
            done,
            after,
        }
    }
}

impl Ticket {
    /// Resolves once every earlier conflicting call has ended.
    async fn ready(&self) {
        for earlier in &self.after {
            earlier.cancelled().await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .calls
            .retain(|e| e.seq != self.seq);
        self.done.cancel();
    }
}

/// What a `tools/call` touches, as the planner sees a call of a turn ([`plan::access`]): `None`
/// for a call the engine answers without running it (an unknown tool, arguments its schema
/// refuses), which neither waits nor is waited for. The arguments are lent, not copied.
fn access_at_arrival(
    snapshot: &Snapshot,
    workspace: Option<&Workspace>,
    params: &mut CallToolRequestParams,
) -> Option<Access> {
    let tool = snapshot.get(&params.name)?;
    let args = Value::Object(params.arguments.take().unwrap_or_default());
    let mut call = ToolCall::new("arrival", params.name.as_ref(), args);
    let access = validation::check(&tool.validator, &call.arguments)
        .is_ok()
        .then(|| plan::access(tool, &call, workspace));
    if let Value::Object(args) = std::mem::take(&mut call.arguments) {
        params.arguments = Some(args);
    }
    access
}

/// A server transport whose reads give each `tools/call` its place at the arrival gate, in the
/// order the calls are read: rmcp's read loop takes messages off the transport one at a time and
/// only then spawns a task per request, so this is the last point where arrival order is known.
/// Everything after the inner read is synchronous, so a read cancelled by the loop's `select!`
/// loses nothing.
struct Arrivals<T> {
    inner: T,
    gate: Option<Arc<ArrivalGate>>,
    engine: Engine,
    workspace: Option<Workspace>,
}

impl<T> Arrivals<T> {
    /// The place of a call read now (`None`: it does not take part, see [`access_at_arrival`]).
    fn ticket(
        &self,
        gate: &Arc<ArrivalGate>,
        params: &mut CallToolRequestParams,
    ) -> Option<Ticket> {
        // The engine's cached snapshot, ready at once unless the registry changed since the last
        // turn; then the call is taken as exclusive rather than waited for in the read loop.
        let access = match self.engine.snapshot().now_or_never() {
            Some(snapshot) => access_at_arrival(&snapshot, self.workspace.as_ref(), params)?,
            None => Access::Exclusive,
        };
        Some(gate.arrive(access))
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Arrivals<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let mut message = self.inner.receive().await?;
        if let (
            Some(gate),
            JsonRpcMessage::Request(JsonRpcRequest {
                request: ClientRequest::CallToolRequest(call),
                ..
            }),
        ) = (&self.gate, &mut message)
            && let Some(ticket) = self.ticket(gate, &mut call.params)
        {
            call.extensions.insert(Arrived(Arc::new(ticket)));
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// Serves `specs` through `engine` on stdin/stdout, in `order`, until the client closes stdin or
/// `stop` fires. `workspace` is the engine's (for the tools' access declarations).
pub async fn serve_stdio(
    engine: Engine,
    specs: &[ToolSpec],
    order: Order,
    workspace: Option<Workspace>,
    stop: CancellationToken,
) -> Result<(), String> {
    let served = Served::new(engine, specs, order, workspace);
    let (stdin, stdout) = rmcp::transport::io::stdio();
    let transport = served.arrivals(JsonLines::<RoleServer, _>::new(stdin, stdout));
    let running = served
        .serve_with_ct(transport, stop)
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
    use crate::tool::Resource;
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

    fn ready(ticket: &Ticket) -> bool {
        ticket.ready().now_or_never().is_some()
    }

    fn path(p: &str) -> Resource {
        Resource::Path(p.into())
    }

    #[test]
    fn a_call_waits_for_the_earlier_calls_in_flight_it_conflicts_with_until_they_end() {
        let gate = Arc::new(ArrivalGate::default());
        let edit = gate.arrive(Access::write(path("a.txt")));
        let read = gate.arrive(Access::read(path("a.txt")));
        let other = gate.arrive(Access::read(path("b.txt")));
        let listing = gate.arrive(Access::read(path(".")));
        let rewrite = gate.arrive(Access::write(path("a.txt")));
        let bash = gate.arrive(Access::Exclusive);
        assert!(ready(&edit) && ready(&other));
        assert!(!ready(&read) && !ready(&listing) && !ready(&rewrite) && !ready(&bash));
        drop(edit);
        assert!(ready(&read) && ready(&listing));
        assert!(
            !ready(&rewrite),
            "it also waits for the reads of a.txt that arrived before it"
        );
        drop(read);
        drop(listing);
        assert!(ready(&rewrite) && !ready(&bash));
        drop((other, rewrite));
        assert!(ready(&bash));
        let after = gate.arrive(Access::read(path("a.txt")));
        assert!(
            !ready(&after),
            "an exclusive call holds everything after it"
        );
        drop(bash);
        assert!(ready(&after));
        drop(after);
        let in_flight = gate.in_flight.lock().unwrap();
        assert!(in_flight.calls.is_empty(), "every ended call left the list");
    }

    #[test]
    fn unknown_tools_and_refused_arguments_take_no_place_and_arguments_are_given_back() {
        let ws_dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(ws_dir.path()).unwrap();
        let snapshot = Snapshot::from_specs(crate::tools::builtin_tools()).unwrap();
        let params = |name: &'static str, args: Value| {
            CallToolRequestParams::new(name).with_arguments(rmcp::model::object(args))
        };
        let mut read = params("read_file", json!({"path": "./a.txt", "limit": 3}));
        assert_eq!(
            access_at_arrival(&snapshot, Some(&ws), &mut read),
            Some(Access::read(path("a.txt")))
        );
        assert_eq!(
            read.arguments,
            Some(rmcp::model::object(json!({"path": "./a.txt", "limit": 3})))
        );
        let mut bash = params("bash", json!({"command": "true"}));
        assert_eq!(
            access_at_arrival(&snapshot, Some(&ws), &mut bash),
            Some(Access::Exclusive)
        );
        let mut unknown = params("no_such_tool", json!({}));
        assert_eq!(access_at_arrival(&snapshot, Some(&ws), &mut unknown), None);
        let mut refused = params("read_file", json!({"path": 7}));
        assert_eq!(access_at_arrival(&snapshot, Some(&ws), &mut refused), None);
        assert_eq!(
            refused.arguments,
            Some(rmcp::model::object(json!({"path": 7})))
        );
    }
}
