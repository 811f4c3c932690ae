//! Switchboard: the tool-dispatch engine of an LLM agent harness.
//!
//! A model answers with `tool_use` blocks; Switchboard turns each into exactly one execution (or
//! a clear refusal) and hands back exactly one `tool_result` per call, in the order the model
//! asked — for thousands of sessions in one process. Every problem of a call (an unknown tool,
//! invalid arguments, a panicking handler, a path outside the workspace, a timeout) is a result
//! with a stable [`ErrorCode`]; only an engine fault ([`EngineError`]) fails a request. Building
//! an engine checks that its default bash sandbox can be enforced here (see `docs/sandbox.md`).
//!
//! ```no_run
//! use switchboard::{Engine, Handler, ToolCall, ToolSpec};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::builder()
//!     .tool(ToolSpec::new("echo", "Echo the text back.",
//!         serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}}),
//!         Handler::inline(|args, _ctx| Ok(args["text"].as_str().unwrap_or("").to_string()))))
//!     .build()?;
//! let results = engine
//!     .dispatch(vec![ToolCall::new("t1", "echo", serde_json::json!({"text": "hi"}))])
//!     .await?;
//! assert_eq!(results[0].content, "hi");
//! # Ok(()) }
//! ```
//!
//! # The pipeline
//!
//! ```text
//! provider turn ─► ToolCall[] ─► plan ─► call graph ─► workers ─► collector ─► tool_result[]
//!    (decode)       (protocol)   (snapshot of the registry;     (execute: policy, caps,
//!                                 admission; what each call      deadline, handler, output cap)
//!                                 reads and writes)
//! ```
//!
//! # Layers
//!
//! The layers, bottom to top: a module may import modules of its own row and of the rows listed
//! before it, never one listed after it. The `layering` test reads this table and every
//! `crate::` / `super::` path of `src/`, and fails on an import of a later row or a module missing
//! from the table. A module sits in the row of the longest prefix of its path listed here.
//!
//! | layer | modules | what lives there |
//! | --- | --- | --- |
//! | foundation | `protocol`, `validation`, `metrics`, `breaker`, `limiter`, `process_env`, `process_guard`, `process_tree`, `tls`, `locks` | wire formats, error codes, `ToolError`, the output cap, schemas, metric handles, small primitives |
//! | confinement | `workspace`, `file_state`, `sandbox` | the workspace directory handle, per-session file stamps, the OS sandbox |
//! | tool | `tool`, `typed` | `ToolSpec`, `Handler`, `ToolContext`, `SessionScope`, `Access`, `Subject` |
//! | built-in tools | `tools` | `bash`, `read_file`, `write_file`, `edit_file`, `glob` |
//! | registry | `policy::rules`, `registry` | permission rules and their per-tool index; the Registry actor and its snapshot |
//! | planning | `plan`, `observe`, `collector` | admission and the dependency graph; spans and metrics of a call; one slot per call |
//! | policy | `policy` | approvals, hooks, the audit log: the layer every call passes before it runs |
//! | execution | `execute`, `worker`, `scheduler`, `baseline`, `journal` | the per-call layer stack, the worker pool, the scheduler, the direct baseline; the durable call journal |
//! | MCP client | `mcp` | MCP servers' tools as registry entries, supervised |
//! | engine | `engine` | the `Engine`, its builder and sessions |
//! | conversation | `document`, `provider`, `providers`, `agent_loop` | one wire document in and out; model providers; the agent loop |
//! | front-end support | `exporter`, `testing`, `command`, `cluster` | the `/metrics` exporter, the workload tools, what subcommands share |
//! | front ends | `demo`, `run_cmd`, `serve`, `load`, `mcp::serve`, `mcp::list`, `mcp::command` | the subcommands: demo, run/chat, the HTTP sidecar, the load generator, `mcp-serve`, `mcp list` |
//! | CLI | `cli` | argument parsing and the dispatch of subcommands |
//!
//! A module's row is that of its file, wherever the public tree declares it: the public modules
//! are twelve (`agent`, `cli`, `journal`, `mcp`, `metrics`, `policy`, `protocol`, `sandbox`,
//! `serve`, `testing`, `tool`, `tools`), and some nest a file of another row — `protocol::document`
//! (conversation), `metrics::exporter` (front-end support), `sandbox::process_guard` and
//! `sandbox::process_tree` (foundation) — which the crate keeps reachable at its old path
//! (`crate::document`, …) for its own imports. `agent`, declared here, re-exports `agent_loop`,
//! `provider` and `providers`; `serve` re-exports what configures cluster mode from `cluster`.
//!
//! # Where to add things
//!
//! * A tool: a [`ToolSpec`] (best [`ToolSpec::typed`]) registered with
//!   [`EngineBuilder::tool`] or [`Engine::register`]; a built-in gets a file in `tools/`.
//! * A per-call layer (rate limits, …): a small function in `execute`, in the stack's order.
//! * A scheduling rule: `plan` — pure functions over the registry snapshot, unit-tested there.
//! * A model provider: an [`agent::Provider`] beside `providers/anthropic.rs`.
//! * A front end (an HTTP server, another CLI command): open sessions with
//!   [`Engine::session_in`] and answer documents with [`protocol::document::dispatch_document`]; it adds
//!   no second path through the engine.
//! * A metric: declared once in `metrics` with cached handles, recorded from `observe`.
//!
//! The user documentation is `README.md` and the pages of `docs/`.
//!
//! # `unsafe`
//!
//! Denied crate-wide, with one reviewed exception: `fork(2)` in the single-threaded sandbox
//! trampoline (`sandbox/fork.rs`, which says why it is sound). The `layering` test fails if
//! `unsafe` code is allowed anywhere else.

#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(unnameable_types)]

mod agent_loop;
#[cfg(feature = "testing")]
mod baseline;
mod breaker;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
mod cluster;
mod collector;
#[cfg(feature = "cli")]
mod command;
#[cfg(feature = "cli")]
mod demo;
mod engine;
mod execute;
mod file_state;
pub mod journal;
#[cfg(test)]
mod layering;
mod limiter;
#[cfg(feature = "cli")]
mod load;
mod locks;
pub mod mcp;
pub mod metrics;
mod observe;
mod plan;
pub mod policy;
mod process_env;
pub mod protocol;
mod provider;
mod providers;
mod registry;
#[cfg(feature = "cli")]
mod run_cmd;
pub mod sandbox;
mod scheduler;
#[cfg(feature = "cli")]
pub mod serve;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;
pub mod tool;
pub mod tools;
mod typed;
mod validation;
mod worker;
mod workspace;

/// The agent loop and the model providers it drives: [`AgentLoop`](agent::AgentLoop), the
/// [`Provider`](agent::Provider) trait, the Anthropic and OpenAI providers and a scripted one for
/// tests.
pub mod agent {
    pub use crate::agent_loop::*;
    pub use crate::provider::*;
    pub use crate::providers::*;
}

// Modules the public tree nests elsewhere keep their crate-internal paths (`crate::document`, …):
// their files stay where they are and their rows in the layer table are their own.
// (Without the command line, nothing inside the crate names the first two.)
#[cfg_attr(not(feature = "cli"), allow(unused_imports))]
pub(crate) use metrics::exporter;
#[cfg_attr(not(feature = "cli"), allow(unused_imports))]
pub(crate) use protocol::document;
pub(crate) use sandbox::{process_guard, process_tree};

/// The code examples of the README and of every page in `docs/`, compiled and run as doctests.
#[cfg(doctest)]
mod doc_examples {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/cli.md")]
    struct Cli;
    #[doc = include_str!("../docs/library.md")]
    struct Library;
    #[doc = include_str!("../docs/sidecar.md")]
    struct Sidecar;
    #[doc = include_str!("../docs/mcp.md")]
    struct Mcp;
    #[doc = include_str!("../docs/permissions.md")]
    struct Permissions;
    #[doc = include_str!("../docs/sandbox.md")]
    struct Sandbox;
    #[doc = include_str!("../docs/scheduling.md")]
    struct Scheduling;
    #[doc = include_str!("../docs/observability.md")]
    struct Observability;
    #[doc = include_str!("../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/decisions.md")]
    struct Decisions;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../docs/history.md")]
    struct History;
    #[doc = include_str!("../docs/retries.md")]
    struct Retries;
    #[doc = include_str!("../docs/idempotency.md")]
    struct Idempotency;
}

pub use engine::{
    DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_QUEUED, Engine, EngineBuilder, EngineError, Retention,
    Session, SessionError, SessionOptions,
};
pub use protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult, WireFormat};
pub use registry::{CatalogFormat, DeferralConfig, RegistryError};
pub use tool::{
    Access, Block, CommitGate, Defer, Effect, Handler, Image, Mode, Resource, SessionScope,
    Subject, ToolContext, ToolError, ToolOutcome, ToolOutput, ToolPolicy, ToolReference, ToolSpec,
};
pub use workspace::Workspace;
