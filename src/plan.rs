//! The planner: pure functions that decide, for one turn and one registry [`Snapshot`], which
//! calls run and in which stages. No I/O, no actors, no metrics; the scheduler and the direct
//! baseline both call [`plan`], so they cannot disagree on what a turn means.
//!
//! Three steps, in this order:
//! 1. **Turn checks** ([`check_turn`]): a `tool_use_id` that occurs twice refuses the whole turn
//!    (every call `invalid_arguments`, nothing runs).
//! 2. **Admission** ([`admit`]), per call: a missing id, an unknown tool, a tool switched off by
//!    its breaker, undecodable arguments and schema violations answer the call at once.
//! 3. **Partition** ([`partition`]) of the admitted calls: a maximal run of consecutive
//!    concurrency-safe calls is one concurrent stage; every other call is a serial stage of its
//!    own; stages run in model order.
//!
//! Import note: the planner depends on the registry's snapshot and the protocol's types only;
//! the scheduler, the baseline and telemetry depend on it (the stage types live here so that
//! telemetry does not import the scheduler).

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use crate::protocol::{ErrorCode, ToolCall};
use crate::registry::{RegisteredTool, Snapshot};
use crate::validation;

/// How a stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageMode {
    /// Calls of the stage run at the same time.
    Concurrent,
    /// A single call that runs alone.
    Serial,
}

impl StageMode {
    /// `concurrent` or `serial`.
    pub fn as_str(self) -> &'static str {
        match self {
            StageMode::Concurrent => "concurrent",
            StageMode::Serial => "serial",
        }
    }
}

/// A contiguous slice of a turn's admitted calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Concurrent or serial.
    pub mode: StageMode,
    /// Positions in the admitted-call list.
    pub calls: Range<usize>,
}

/// A call that passed the turn checks and admission, ready to run.
#[derive(Debug)]
pub struct Planned {
    /// Position of the call in its turn.
    pub index: usize,
    /// The call (its arguments are moved into the handler).
    pub call: ToolCall,
    /// The resolved tool.
    pub tool: Arc<RegisteredTool>,
}

/// A call answered without running: its position, code and detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Position of the call in its turn.
    pub index: usize,
    /// The stable code.
    pub code: ErrorCode,
    /// The detail after `Error [<code>]: `.
    pub detail: String,
}

/// What the planner decided for one turn.
#[derive(Debug, Default)]
pub struct Plan {
    /// Calls that run, in model order.
    pub admitted: Vec<Planned>,
    /// Calls answered without running, in model order.
    pub rejected: Vec<Rejected>,
    /// How the admitted calls run, in order.
    pub stages: Vec<Stage>,
}

/// Plans one turn against a snapshot: turn checks, admission, partition.
pub fn plan(snapshot: &Snapshot, calls: Vec<ToolCall>) -> Plan {
    if let Err(detail) = check_turn(&calls) {
        let rejected = (0..calls.len())
            .map(|index| Rejected {
                index,
                code: ErrorCode::InvalidArguments,
                detail: detail.clone(),
            })
            .collect();
        return Plan {
            rejected,
            ..Plan::default()
        };
    }
    let mut plan = Plan {
        admitted: Vec::with_capacity(calls.len()),
        ..Plan::default()
    };
    for (index, call) in calls.into_iter().enumerate() {
        match admit(snapshot, &call) {
            Ok(tool) => plan.admitted.push(Planned {
                index,
                call,
                tool: Arc::clone(tool),
            }),
            Err((code, detail)) => plan.rejected.push(Rejected {
                index,
                code,
                detail,
            }),
        }
    }
    let safe: Vec<bool> = plan
        .admitted
        .iter()
        .map(|p| p.tool.policy.concurrency_safe)
        .collect();
    plan.stages = partition(&safe);
    plan
}

/// The turn-level check: `Err(detail)` when a `tool_use_id` occurs twice (empty ids are not
/// duplicates; admission answers them).
pub fn check_turn(calls: &[ToolCall]) -> Result<(), String> {
    match duplicate_id(calls) {
        Some(dup) => Err(format!(
            "duplicate tool_use_id in this turn: {dup}; no call of the turn was run"
        )),
        None => Ok(()),
    }
}

/// Admission of one call: the tool to run, or the code and detail answering the call at once.
/// Checked in this order: missing id, unknown tool, tripped breaker, undecodable arguments,
/// schema violations.
pub fn admit<'s>(
    snapshot: &'s Snapshot,
    call: &ToolCall,
) -> Result<&'s Arc<RegisteredTool>, (ErrorCode, String)> {
    if call.id.is_empty() {
        return Err((
            ErrorCode::InvalidArguments,
            "missing or empty tool_use_id".into(),
        ));
    }
    if let Err(detail) = check_id(&call.id) {
        return Err((ErrorCode::InvalidArguments, detail));
    }
    let Some(tool) = snapshot.get(&call.name) else {
        let shown = if call.name.is_empty() {
            "<empty>".to_string()
        } else {
            clamp(&call.name, 200)
        };
        return Err((
            ErrorCode::UnknownTool,
            format!("tool is not registered: {shown}"),
        ));
    };
    if let Some(left) = tool.breaker.tripped() {
        let (max, window) = tool.breaker.limit();
        return Err((
            ErrorCode::ExecutionError,
            format!(
                "tool {} is disabled: its handler panicked more than {max} times within {}s; \
                 it is retried in {}s",
                tool.name,
                window.as_secs(),
                left.as_secs().max(1)
            ),
        ));
    }
    if let Some(detail) = &call.malformed {
        return Err((ErrorCode::InvalidArguments, detail.clone()));
    }
    validation::check(&tool.validator, &call.arguments)
        .map_err(|detail| (ErrorCode::InvalidArguments, detail))?;
    Ok(tool)
}

/// Longest `tool_use_id` accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// A `tool_use_id` must be what the model APIs accept back: `^[a-zA-Z0-9_-]+$` and at most
/// [`MAX_ID_BYTES`] bytes. Anything else would make the provider reject the whole conversation
/// once the result is sent, so the call is answered `invalid_arguments` without running (its
/// result still carries the id as given, so the pairing stays visible).
pub fn check_id(id: &str) -> Result<(), String> {
    if id.len() > MAX_ID_BYTES {
        return Err(format!(
            "tool_use_id is {} bytes long; at most {MAX_ID_BYTES} are accepted",
            id.len()
        ));
    }
    match id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        Some(c) => Err(format!(
            "tool_use_id {} contains {c:?}; ids must match ^[a-zA-Z0-9_-]+$",
            clamp(id, 64)
        )),
        None => Ok(()),
    }
}

/// Splits calls into stages from their concurrency safety, in model order: a maximal run of
/// consecutive safe calls becomes one concurrent stage; every unsafe call is a serial stage of its
/// own. The order of stages is the order of the calls.
pub fn partition(safe: &[bool]) -> Vec<Stage> {
    let mut stages = Vec::new();
    let mut i = 0;
    while i < safe.len() {
        if safe[i] {
            let start = i;
            while i < safe.len() && safe[i] {
                i += 1;
            }
            stages.push(Stage {
                mode: StageMode::Concurrent,
                calls: start..i,
            });
        } else {
            stages.push(Stage {
                mode: StageMode::Serial,
                calls: i..i + 1,
            });
            i += 1;
        }
    }
    stages
}

/// The first `tool_use_id` that occurs twice in the turn (empty ids are not duplicates).
fn duplicate_id(calls: &[ToolCall]) -> Option<&str> {
    if calls.len() < 2 {
        return None;
    }
    if calls.len() <= 16 {
        for (i, a) in calls.iter().enumerate() {
            if !a.id.is_empty() && calls[i + 1..].iter().any(|b| b.id == a.id) {
                return Some(&a.id);
            }
        }
        return None;
    }
    let mut seen = HashSet::with_capacity(calls.len());
    calls
        .iter()
        .find(|c| !c.id.is_empty() && !seen.insert(&*c.id))
        .map(|c| &*c.id)
}

/// At most `max` bytes of `s` (on a character boundary), noting the full length when cut.
fn clamp(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tool::{Handler, ToolSpec};

    fn modes(safe: &[bool]) -> Vec<(StageMode, Range<usize>)> {
        partition(safe)
            .into_iter()
            .map(|s| (s.mode, s.calls))
            .collect()
    }

    fn snapshot() -> Arc<Snapshot> {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                            "required": ["n"], "additionalProperties": false});
        let tool = |name: &str, safe: bool| {
            ToolSpec::new(name, "t", schema.clone(), Handler::inline(|_, _| Ok("x")))
                .concurrency_safe(safe)
        };
        Snapshot::from_specs([tool("safe", true), tool("serial", false)]).unwrap()
    }

    fn call(id: &str, name: &str, n: serde_json::Value) -> ToolCall {
        ToolCall::new(id, name, json!({ "n": n }))
    }

    #[test]
    fn consecutive_safe_calls_form_one_concurrent_stage() {
        use StageMode::*;
        assert_eq!(modes(&[true, true, true]), vec![(Concurrent, 0..3)]);
        assert_eq!(
            modes(&[true, true, false, true]),
            vec![(Concurrent, 0..2), (Serial, 2..3), (Concurrent, 3..4)]
        );
    }

    #[test]
    fn every_unsafe_call_is_a_serial_stage_of_its_own() {
        use StageMode::*;
        assert_eq!(modes(&[false, false]), vec![(Serial, 0..1), (Serial, 1..2)]);
        assert!(partition(&[]).is_empty());
    }

    #[test]
    fn stages_cover_every_call_once_in_order() {
        for mask in 0u32..256 {
            let safe: Vec<bool> = (0..8).map(|i| mask & (1 << i) != 0).collect();
            let stages = partition(&safe);
            let mut next = 0;
            for s in &stages {
                assert_eq!(s.calls.start, next);
                assert!(!s.calls.is_empty());
                if s.mode == StageMode::Serial {
                    assert_eq!(s.calls.len(), 1);
                    assert!(!safe[s.calls.start]);
                } else {
                    assert!(safe[s.calls.clone()].iter().all(|&x| x));
                }
                next = s.calls.end;
            }
            assert_eq!(next, 8);
        }
    }

    #[test]
    fn a_duplicate_id_rejects_every_call_of_the_turn() {
        let calls = vec![
            call("a", "safe", json!(1)),
            call("b", "safe", json!(1)),
            call("a", "serial", json!(1)),
        ];
        let plan = plan(&snapshot(), calls);
        assert!(plan.admitted.is_empty() && plan.stages.is_empty());
        assert_eq!(plan.rejected.len(), 3);
        assert!(
            plan.rejected
                .iter()
                .all(|r| r.code == ErrorCode::InvalidArguments
                    && r.detail.contains("duplicate tool_use_id in this turn: a"))
        );
    }

    #[test]
    fn admission_answers_missing_ids_unknown_tools_and_invalid_arguments_in_place() {
        let calls = vec![
            call("", "safe", json!(1)),
            call("u", "Safe", json!(1)),
            call("i", "safe", json!("1")),
            call("ok1", "safe", json!(1)),
            call("ok2", "serial", json!(2)),
        ];
        let plan = plan(&snapshot(), calls);
        let rejected: Vec<_> = plan.rejected.iter().map(|r| (r.index, r.code)).collect();
        assert_eq!(
            rejected,
            [
                (0, ErrorCode::InvalidArguments),
                (1, ErrorCode::UnknownTool),
                (2, ErrorCode::InvalidArguments)
            ]
        );
        assert_eq!(plan.rejected[1].detail, "tool is not registered: Safe");
        let admitted: Vec<_> = plan.admitted.iter().map(|p| p.index).collect();
        assert_eq!(admitted, [3, 4]);
        assert_eq!(modes_of(&plan), [StageMode::Concurrent, StageMode::Serial]);
    }

    fn modes_of(plan: &Plan) -> Vec<StageMode> {
        plan.stages.iter().map(|s| s.mode).collect()
    }

    #[test]
    fn a_tripped_breaker_answers_without_running() {
        let snap = snapshot();
        let tool = snap.get("safe").unwrap();
        let (max, _) = tool.breaker.limit();
        for _ in 0..=max {
            tool.breaker.record_panic();
        }
        let err = admit(&snap, &call("x", "safe", json!(1))).unwrap_err();
        assert_eq!(err.0, ErrorCode::ExecutionError);
        assert!(err.1.starts_with("tool safe is disabled"), "{}", err.1);
    }

    #[test]
    fn ids_the_model_apis_would_reject_are_answered_without_running() {
        for bad in ["toolu ä/../x", "a.b", "x\n", &"a".repeat(MAX_ID_BYTES + 1)] {
            let err = admit(&snapshot(), &call(bad, "safe", json!(1))).unwrap_err();
            assert_eq!(err.0, ErrorCode::InvalidArguments, "{bad}");
            assert!(err.1.starts_with("tool_use_id "), "{}", err.1);
        }
        for good in ["toolu_01A-b", "call_9", &"a".repeat(MAX_ID_BYTES)] {
            assert!(
                admit(&snapshot(), &call(good, "safe", json!(1))).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn long_unknown_names_are_clamped_in_the_detail() {
        let name = "x".repeat(10_000);
        let err = admit(&snapshot(), &call("x", &name, json!(1))).unwrap_err();
        assert!(
            err.1.len() < 300 && err.1.ends_with("(10000 bytes)"),
            "{}",
            err.1
        );
    }
}
