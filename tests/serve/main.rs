//! `switchboard serve`: routes and errors, sessions, a turn's life, approvals, load over HTTP
//! and the real binary.
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../serve_common/mod.rs"]
mod serve_common;

mod serve_approvals;
mod serve_client_tool_schemas_are_bounded;
mod serve_client_tools;
mod serve_is_fair_and_bounded;
mod serve_launcher;
mod serve_load;
mod serve_process;
mod serve_progress;
mod serve_restart_keeps_sessions;
mod serve_retries;
mod serve_routes_and_errors;
mod serve_sessions;
mod serve_tool_search;
mod serve_turn_cancel;
mod serve_turn_lifecycle;
