//! The engine's dispatch invariants: one ordered answer per call, overlap and ordering of
//! calls, deadlines, backpressure, validation, the registry, streamed results and bad input.
//!
//! One test binary for the area; each module is one suite (filter with `<module>::`).

#[path = "../common/mod.rs"]
mod common;

mod a_failing_journal_runs_nothing_it_cannot_record;
mod access_graph_equals_serial;
mod backpressure_and_supervision;
mod bad_protocol_input;
mod conflicting_calls_never_overlap;
mod deadlines_and_cancellation;
mod deep_arguments_affect_only_their_call;
mod deferred_tools;
mod every_call_answered_once;
mod inline_turns_run_where_dispatched;
mod intents_are_written_as_each_call_starts;
mod many_sessions;
mod random_turns_proptest;
mod registry_is_single_source;
mod results_tell_the_truth;
mod retried_turns_run_nothing_twice;
mod safe_calls_overlap;
mod streamed_results_arrive_as_each_call_finishes;
mod tool_results_carry_images;
mod validation_before_handler;
mod writes_see_prior_effects;
