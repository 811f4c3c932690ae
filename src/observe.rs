//! The one place where a call's timing and outcome, a stage and a turn are recorded.
//!
//! The collector calls [`call_answered`] for every result it accepts; the scheduler calls
//! [`stage_started`] and [`turn_dispatched`]. Today these emit `tracing` events at `debug`/`trace`
//! level (nearly free when disabled); metrics plug in here and nowhere else.

use std::time::Duration;

use crate::protocol::ToolDispatchResult;
use crate::scheduler::StageMode;

/// A call has been answered (exactly once).
#[inline]
pub fn call_answered(result: &ToolDispatchResult) {
    tracing::trace!(
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %result.tool_name,
        gen_ai.tool.call.id = %result.tool_use_id,
        outcome = result.outcome(),
        queued_us = result.timing.queued.as_micros() as u64,
        run_us = result.timing.run.as_micros() as u64,
        "tool call answered"
    );
}

/// A second answer for an already-answered call was dropped.
#[inline]
pub fn late_reply_dropped(result: &ToolDispatchResult) {
    tracing::debug!(
        gen_ai.tool.call.id = %result.tool_use_id,
        outcome = result.outcome(),
        "late reply dropped"
    );
}

/// A stage is about to run.
#[inline]
pub fn stage_started(mode: StageMode, calls: usize) {
    tracing::trace!(mode = mode.as_str(), calls, "stage started");
}

/// A turn went in and its ordered results came out.
#[inline]
pub fn turn_dispatched(calls: usize, elapsed: Duration) {
    tracing::debug!(
        calls,
        elapsed_us = elapsed.as_micros() as u64,
        "turn dispatched"
    );
}
