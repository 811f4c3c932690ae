//! The one place where a call's timing and outcome, a stage and a turn are recorded.
//!
//! The collector calls [`call_answered`] for every result it accepts; the scheduler calls
//! [`stages_started`] and [`turn_dispatched`]; the worker opens a [`call_span`] around every
//! handler. Each records into the cached metric handles of [`crate::metrics`] and into `tracing`
//! (spans and events named after the OpenTelemetry GenAI conventions: `gen_ai.operation.name =
//! "execute_tool"`, `gen_ai.tool.name`, `gen_ai.tool.call.id`, `error.type` on failure). Disabled
//! tracing levels cost a static check; metric handles cost an atomic add.
//!
//! Import note: telemetry depends on the planner's stage types ([`crate::plan`]), never on the
//! scheduler, so the scheduler can use it without a cycle.

use std::time::Duration;

use tracing::Span;

use crate::metrics::{EngineMetrics, ToolMetrics};
use crate::plan::StageMode;
use crate::protocol::{ToolCall, ToolDispatchResult};

/// A call has been answered (exactly once).
#[inline]
pub fn call_answered(result: &ToolDispatchResult, metrics: &ToolMetrics) {
    metrics.record(result);
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

/// The stages of a turn's plan (its calls grouped by depth in the dependency graph), recorded in
/// one go when the turn starts running.
#[inline]
pub fn stages_started(stages: &[crate::plan::Stage], metrics: &EngineMetrics) {
    let mut serial = 0;
    for stage in stages {
        match stage.mode {
            StageMode::Serial => serial += 1,
            StageMode::Concurrent => metrics.stage(true, stage.calls),
        }
    }
    metrics.serial_stages(serial);
    tracing::trace!(stages = stages.len(), "stages started");
}

/// A turn went in and its ordered results came out.
#[inline]
pub fn turn_dispatched(calls: usize, elapsed: Duration, metrics: &EngineMetrics) {
    metrics.turn(calls, elapsed);
    tracing::debug!(
        calls,
        elapsed_us = elapsed.as_micros() as u64,
        "turn dispatched"
    );
}

/// The span of one turn.
#[inline]
pub fn turn_span(calls: usize, session: &str) -> Span {
    tracing::info_span!(
        "dispatch_turn",
        gen_ai.operation.name = "dispatch_turn",
        session.id = session,
        calls
    )
}

/// The span of one call, a child of its turn's span; `error.type` is filled by [`call_finished`].
#[inline]
pub fn call_span(parent: &Span, call: &ToolCall) -> Span {
    tracing::info_span!(
        parent: parent,
        "execute_tool",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
        error.type = tracing::field::Empty,
    )
}

/// Marks a call's span with its outcome.
#[inline]
pub fn call_finished(span: &Span, result: &ToolDispatchResult) {
    if let Some(code) = result.error {
        span.record("error.type", code.as_str());
    }
}
