//! Model providers and the agent loop: scripted and HTTP providers, eager dispatch (and
//! its figure, ignored by default), and `run`/`chat`.
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../common/mod.rs"]
mod common;

mod agent_loop;
mod providers_eager;
mod providers_eager_figure;
mod providers_http;
mod providers_run_cmd;
mod run_command;
mod run_defers_tools;
mod streamed_turns_equal_whole_turns;
