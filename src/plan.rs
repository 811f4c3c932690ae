//! The planner: pure functions that decide, for one turn and one registry [`Snapshot`], which
//! calls run and which earlier calls each must wait for. No I/O of its own, no actors, no
//! metrics; the scheduler and the direct baseline both call [`plan`], so they cannot disagree on
//! what a turn means.
//!
//! Three steps, in this order:
//! 1. **Turn checks** ([`check_turn`]): a `tool_use_id` that occurs twice refuses the whole turn
//!    (every call `invalid_arguments`, nothing runs).
//! 2. **Admission** ([`admit`]), per call: a missing id, an unknown tool, a tool switched off by
//!    its breaker, undecodable arguments and schema violations answer the call at once.
//! 3. **Dependencies** ([`Graph::build`]) of the admitted calls, from each call's [`Access`]
//!    (its tool's access function, or the `concurrency_safe` fallback; see
//!    [`crate::tool::access_of`]): call *j* waits for every earlier call it conflicts with, and
//!    for nothing else. Read/read never conflicts; an exclusive call conflicts with everything.
//!    Running the calls this way gives the same outcome as running them one by one in model
//!    order: two calls that may be reordered or overlapped touch nothing in common that either
//!    writes.
//!
//! The plan's **stages** ([`stages`]) describe the graph for metrics: the calls at the same depth
//! of the graph (longest chain of waits before them) never conflict with each other. For tools
//! without declarations they are exactly the old partition — a run of consecutive
//! concurrency-safe calls is one concurrent stage, every other call a serial stage of its own.
//!
//! Import note: the planner depends on the registry's snapshot, the protocol's types and the
//! access types of [`crate::tool`] only; the scheduler, the baseline and telemetry depend on it
//! (the stage types live here so that telemetry does not import the scheduler).

use std::collections::HashSet;
use std::sync::Arc;

use crate::protocol::{ErrorCode, ToolCall};
use crate::registry::{RegisteredTool, Snapshot};
use crate::tool::{Access, access_of};
use crate::validation;
use crate::workspace::Workspace;

/// How a stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageMode {
    /// Calls that may run at the same time as each other (and as other calls they do not
    /// conflict with).
    Concurrent,
    /// A single exclusive call, which runs alone.
    Serial,
}

/// The admitted calls at one depth of the dependency graph: they never conflict with each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Concurrent, or serial for one exclusive call.
    pub mode: StageMode,
    /// How many calls.
    pub calls: usize,
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
    /// True when the call passes its turn's start gate right before it starts (its intent made
    /// durable first; the execution layer's `StartGate`). Set by the scheduler, false here.
    pub gated: bool,
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
    /// The call's arguments as sent (for the audit log).
    pub arguments: serde_json::Value,
}

/// What the planner decided for one turn.
#[derive(Debug, Default)]
pub struct Plan {
    /// Calls that run, in model order.
    pub admitted: Vec<Planned>,
    /// Calls answered without running, in model order.
    pub rejected: Vec<Rejected>,
    /// For each admitted call (by position in `admitted`), the earlier admitted calls it waits
    /// for.
    pub graph: Graph,
    /// The graph's stages, by depth (for metrics).
    pub stages: Vec<Stage>,
}

/// Plans one turn against a snapshot: turn checks, admission, dependencies. `workspace` is the
/// session's, handed to the tools' access functions.
pub fn plan(snapshot: &Snapshot, calls: Vec<ToolCall>, workspace: Option<&Workspace>) -> Plan {
    if let Err(detail) = check_turn(&calls) {
        let rejected = calls
            .into_iter()
            .enumerate()
            .map(|(index, call)| Rejected {
                index,
                code: ErrorCode::InvalidArguments,
                detail: detail.clone(),
                arguments: call.arguments,
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
                gated: false,
            }),
            Err((code, detail)) => plan.rejected.push(Rejected {
                index,
                code,
                detail,
                arguments: call.arguments,
            }),
        }
    }
    let accesses: Vec<Access> = plan
        .admitted
        .iter()
        .map(|p| access(&p.tool, &p.call, workspace))
        .collect();
    plan.graph = Graph::build(&accesses);
    plan.stages = stages(&plan.graph, &accesses);
    plan
}

/// The access of an admitted call (arguments already validated).
pub fn access(tool: &RegisteredTool, call: &ToolCall, workspace: Option<&Workspace>) -> Access {
    access_of(
        tool.access.as_ref(),
        tool.policy.concurrency_safe,
        &call.arguments,
        workspace,
    )
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

/// Which earlier calls each call of a turn waits for: the dependency graph of one turn.
///
/// Stored flat (one list of edges, one offset per call), and with no allocation at all when no
/// call waits for another (a turn of concurrency-safe calls, or a single call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    /// `starts[j]..starts[j + 1]` are call j's edges; empty when there are no edges at all.
    starts: Vec<u32>,
    /// Positions of the calls waited for, each call's list in descending order.
    edges: Vec<u32>,
    len: usize,
}

impl Graph {
    /// The graph of calls with these accesses, in model order: call j waits for every earlier
    /// call it conflicts with. Edges a wait already implies are left out in one common case: a
    /// call that waits for an exclusive call waits for nothing before it (the exclusive call
    /// itself waited for all of those).
    pub fn build(accesses: &[Access]) -> Graph {
        let n = accesses.len();
        let mut edges: Vec<u32> = Vec::new();
        let mut starts: Vec<u32> = Vec::new();
        for (j, aj) in accesses.iter().enumerate() {
            for i in (0..j).rev() {
                let ai = &accesses[i];
                if ai.conflicts(aj) {
                    edges.push(i as u32);
                    if ai.is_exclusive() {
                        break;
                    }
                }
            }
            if !edges.is_empty() {
                if starts.is_empty() {
                    // The first edge belongs to call j: every call up to j starts at offset 0.
                    starts.reserve(n + 1);
                    starts.resize(j + 1, 0);
                }
                starts.push(edges.len() as u32);
            }
        }
        Graph {
            starts,
            edges,
            len: n,
        }
    }

    /// The earlier calls call `j` waits for (descending).
    pub fn waits_for(&self, j: usize) -> &[u32] {
        if self.starts.is_empty() {
            return &[];
        }
        &self.edges[self.starts[j] as usize..self.starts[j + 1] as usize]
    }

    /// True when no call waits for another: every call may start at once.
    pub fn is_free(&self) -> bool {
        self.edges.is_empty()
    }

    /// How many calls.
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    /// True for a graph of no calls.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// For each call, how many earlier calls it waits for (the scheduler's countdown).
    pub fn pending_counts(&self) -> Vec<u32> {
        (0..self.len)
            .map(|j| self.waits_for(j).len() as u32)
            .collect()
    }

    /// For each call, the later calls that wait for it, flat: `(offsets, list)` where call i's
    /// dependants are `list[offsets[i]..offsets[i + 1]]`, ascending.
    pub fn dependants(&self) -> (Vec<u32>, Vec<u32>) {
        let mut offsets = vec![0u32; self.len + 1];
        for &i in &self.edges {
            offsets[i as usize + 1] += 1;
        }
        for k in 0..self.len {
            offsets[k + 1] += offsets[k];
        }
        let mut fill = offsets.clone();
        let mut list = vec![0u32; self.edges.len()];
        for j in 0..self.len {
            for &i in self.waits_for(j) {
                list[fill[i as usize] as usize] = j as u32;
                fill[i as usize] += 1;
            }
        }
        (offsets, list)
    }
}

/// The graph's stages: the calls grouped by depth (the longest chain of waits before them), in
/// depth order. Calls of one depth never conflict with each other. A stage is `Serial` when it is
/// one exclusive call, `Concurrent` otherwise.
pub fn stages(graph: &Graph, accesses: &[Access]) -> Vec<Stage> {
    let n = graph.len();
    if n == 0 {
        return Vec::new();
    }
    if graph.is_free() {
        let mode = if n == 1 && accesses[0].is_exclusive() {
            StageMode::Serial
        } else {
            StageMode::Concurrent
        };
        return vec![Stage { mode, calls: n }];
    }
    let mut depth = vec![0u32; n];
    let mut deepest = 0;
    for j in 0..n {
        let d = graph
            .waits_for(j)
            .iter()
            .map(|&i| depth[i as usize] + 1)
            .max()
            .unwrap_or(0);
        depth[j] = d;
        deepest = deepest.max(d);
    }
    let mut stages = vec![
        Stage {
            mode: StageMode::Concurrent,
            calls: 0
        };
        deepest as usize + 1
    ];
    for (j, &d) in depth.iter().enumerate() {
        let stage = &mut stages[d as usize];
        stage.calls += 1;
        if accesses[j].is_exclusive() {
            stage.mode = StageMode::Serial;
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
    use crate::tool::{Handler, Resource, ToolSpec};

    /// The pre-graph rule, kept here as the reference for undeclared tools: a maximal run of
    /// consecutive safe calls is one concurrent stage, every unsafe call a serial stage.
    fn old_partition(safe: &[bool]) -> Vec<Stage> {
        let mut stages = Vec::new();
        let mut i = 0;
        while i < safe.len() {
            let start = i;
            if safe[i] {
                while i < safe.len() && safe[i] {
                    i += 1;
                }
                stages.push(Stage {
                    mode: StageMode::Concurrent,
                    calls: i - start,
                });
            } else {
                stages.push(Stage {
                    mode: StageMode::Serial,
                    calls: 1,
                });
                i += 1;
            }
        }
        stages
    }

    fn fallback(safe: &[bool]) -> Vec<Access> {
        safe.iter()
            .map(|&s| access_of(None, s, &json!({}), None))
            .collect()
    }

    fn p(path: &str) -> Resource {
        Resource::Path(path.into())
    }

    #[test]
    fn undeclared_tools_get_exactly_the_old_stages() {
        for len in 0..=8 {
            for mask in 0u32..(1 << len) {
                let safe: Vec<bool> = (0..len).map(|i| mask & (1 << i) != 0).collect();
                let accesses = fallback(&safe);
                let graph = Graph::build(&accesses);
                assert_eq!(stages(&graph, &accesses), old_partition(&safe), "{safe:?}");
            }
        }
    }

    #[test]
    fn safe_calls_wait_only_for_the_exclusive_call_before_them() {
        let accesses = fallback(&[true, true, false, true, false, false]);
        let g = Graph::build(&accesses);
        let waits: Vec<&[u32]> = (0..6).map(|j| g.waits_for(j)).collect();
        assert_eq!(waits, [&[][..], &[], &[1, 0], &[2], &[3, 2], &[4]]);
    }

    #[test]
    fn a_turn_with_nothing_to_wait_for_allocates_no_graph() {
        let g = Graph::build(&fallback(&[true; 24]));
        assert!(g.is_free() && g.starts.capacity() == 0 && g.edges.capacity() == 0);
        assert!(Graph::build(&fallback(&[false])).is_free());
        assert_eq!(g.waits_for(23), &[] as &[u32]);
    }

    #[test]
    fn declared_calls_wait_for_every_earlier_conflicting_call_and_nothing_else() {
        let accesses = vec![
            Access::write(p("a.txt")),            // 0
            Access::write(p("b.txt")),            // 1
            Access::read(p("a.txt")),             // 2: after 0
            Access::read(p(".")),                 // 3: after 0, 1 (root overlaps both writes)
            Access::write(p("d/e.txt")),          // 4: after 3
            Access::read(p("d")),                 // 5: after 4
            Access::read(p("b.txt")),             // 6: after 1
            Access::write(Resource::named("db")), // 7
            Access::none(),                       // 8
            Access::Exclusive,                    // 9: after everything
            Access::read(p("a.txt")),             // 10: after 9 only
        ];
        let g = Graph::build(&accesses);
        let waits: Vec<Vec<u32>> = (0..accesses.len())
            .map(|j| g.waits_for(j).to_vec())
            .collect();
        let expected: Vec<Vec<u32>> = vec![
            vec![],
            vec![],
            vec![0],
            vec![1, 0],
            vec![3],
            vec![4],
            vec![1],
            vec![],
            vec![],
            vec![8, 7, 6, 5, 4, 3, 2, 1, 0],
            vec![9],
        ];
        assert_eq!(waits, expected);
        let (offsets, list) = g.dependants();
        let of = |i: usize| &list[offsets[i] as usize..offsets[i + 1] as usize];
        assert_eq!(of(0), &[2, 3, 9]);
        assert_eq!(of(9), &[10]);
        let st = stages(&g, &accesses);
        let shape: Vec<(StageMode, usize)> = st.iter().map(|s| (s.mode, s.calls)).collect();
        // depth 0: 0 1 7 8; depth 1: 2 3 6; depth 2: 4; depth 3: 5; depth 4: 9; depth 5: 10
        use StageMode::*;
        assert_eq!(
            shape,
            [
                (Concurrent, 4),
                (Concurrent, 3),
                (Concurrent, 1),
                (Concurrent, 1),
                (Serial, 1),
                (Concurrent, 1)
            ]
        );
        assert_eq!(
            g.pending_counts(),
            waits.iter().map(|w| w.len() as u32).collect::<Vec<_>>()
        );
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
    fn a_duplicate_id_rejects_every_call_of_the_turn() {
        let calls = vec![
            call("a", "safe", json!(1)),
            call("b", "safe", json!(1)),
            call("a", "serial", json!(1)),
        ];
        let plan = plan(&snapshot(), calls, None);
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
        let plan = plan(&snapshot(), calls, None);
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
