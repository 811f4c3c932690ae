#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent_loop;
pub mod baseline;
pub(crate) mod breaker;
#[cfg(feature = "cli")]
pub mod cli;
pub(crate) mod collector;
#[cfg(feature = "cli")]
pub mod command;
#[cfg(feature = "cli")]
pub mod demo;
pub mod document;
pub mod engine;
pub mod execute;
pub mod exporter;
pub mod file_state;
pub(crate) mod limiter;
#[cfg(feature = "cli")]
pub mod load;
pub mod mcp;
pub mod metrics;
pub(crate) mod observe;
pub mod plan;
pub mod policy;
pub mod process_guard;
pub mod protocol;
pub mod provider;
pub mod providers;
pub mod registry;
#[cfg(feature = "cli")]
pub mod run_cmd;
pub mod sandbox;
pub(crate) mod scheduler;
#[cfg(feature = "cli")]
pub mod serve;
pub mod session;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tool;
pub mod tools;
pub mod typed;
pub mod validation;
pub mod worker;
pub mod workspace;

pub use engine::{Engine, EngineBuilder, EngineError};
pub use protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult, WireFormat};
pub use registry::{CatalogFormat, RegistryError};
pub use session::Session;
pub use tool::{
    Access, Block, CommitGate, Handler, Image, Mode, Resource, SessionScope, ToolContext,
    ToolError, ToolOutcome, ToolOutput, ToolPolicy, ToolSpec,
};
pub use workspace::Workspace;
