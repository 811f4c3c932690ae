//! Policy: permission rules, approvals and hooks, the audit log, `chat` asking on the
//! terminal, and the policy overhead figure (ignored by default).
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../common/mod.rs"]
mod common;

mod approvals_and_hooks;
mod audit_log_is_complete_and_never_blocks;
mod chat_asks_on_the_terminal;
mod claude_code_hook_matchers_reach_switchboard_tools;
mod command_rules_read_bash_syntax;
mod hooks_are_bounded_contained_and_quiet;
mod permission_rules_see_the_confined_path;
mod policy_overhead_figure;
mod session_rules_narrow_the_policy;
