#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent_loop;
pub mod baseline;
pub mod breaker;
pub mod cli;
pub mod collector;
pub mod demo;
pub mod engine;
pub mod exporter;
pub mod limiter;
pub mod load;
pub mod mcp;
pub mod metrics;
pub mod observe;
pub mod process_guard;
pub mod protocol;
pub mod provider;
pub mod providers;
pub mod registry;
pub mod run_cmd;
pub mod scheduler;
pub mod tool;
pub mod tools;
pub mod validation;
pub mod worker;
pub mod workspace;

pub use engine::{Engine, EngineBuilder, Session};
pub use protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult, WireFormat};
pub use tool::{Handler, ToolContext, ToolError, ToolOutcome, ToolPolicy, ToolSpec};
pub use workspace::Workspace;
