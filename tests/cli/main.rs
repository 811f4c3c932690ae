//! The `switchboard` binary's commands: `dispatch`, `tools`, `demo`, `load`, observability,
//! signals, and the dashboard's metric names.
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../common/mod.rs"]
mod common;

mod an_early_signal_is_answered_or_ends_the_process_before_main;
mod cli_dispatch;
mod dashboards_use_declared_metrics;
mod flags_named_exist;
mod load_command;
mod observability_cli;
mod signals_answer_every_call;
