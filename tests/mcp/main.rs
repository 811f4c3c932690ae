//! MCP: the command line, misbehaving and third-party servers, bounded tool lists and schemas,
//! the idempotency key of a call, `mcp-serve` with the TypeScript client and with `--order
//! arrival`, and the overhead figure (ignored by default).
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../common/mod.rs"]
mod common;

mod mcp_calls_carry_their_idempotency_key;
mod mcp_cli;
mod mcp_misbehaving_servers;
mod mcp_overhead_figure;
mod mcp_registry_names_are_unique;
mod mcp_serve_answers_every_request;
mod mcp_serve_arrival_order;
mod mcp_serve_with_ts_client;
mod mcp_server_process_trees_end;
mod mcp_third_party_servers;
mod mcp_tool_lists_are_bounded;
mod mcp_tool_schemas_are_bounded;
mod mcp_tools_take_their_effect_from_annotations;
mod mcp_unreadable_responses;
