//! The Collector: one result slot per call, filled exactly once, emitted in call order.
//!
//! Every path that answers a call — success, handler error, panic, timeout, cancellation, a lost
//! worker — goes through [`Collector::fill`], which is also the one place a call's timing and
//! outcome are recorded ([`crate::observe`]). A second answer for a slot (a late reply) is dropped.
//! [`Collector::finish`] answers any slot still empty, so a turn always yields exactly one result
//! per call, in the order the model asked.
//!
//! A turn may carry a [`ResultSink`]: each result is also sent to it the moment its slot is
//! filled (the seam `serve` streams results through); the ordered answer is unchanged.

use std::sync::Arc;

use crate::metrics::ToolMetrics;
use crate::observe;
use crate::protocol::{ErrorCode, Timing, ToolDispatchResult};
use crate::registry::Snapshot;

/// Receives `(index in the turn, result)` for each call of a turn as its slot is filled.
pub type ResultSink = tokio::sync::mpsc::UnboundedSender<(usize, ToolDispatchResult)>;

/// The slots of one turn.
#[derive(Debug)]
pub struct Collector {
    identities: Vec<(Arc<str>, Arc<str>)>,
    slots: Vec<Option<ToolDispatchResult>>,
    open: usize,
    snapshot: Arc<Snapshot>,
    sink: Option<ResultSink>,
}

impl Collector {
    /// One empty slot per call; `identities` are the calls' `(tool_use_id, name)` in model order.
    /// `snapshot` is the registry view the turn was planned with (it names the metric handles).
    pub fn new(identities: Vec<(Arc<str>, Arc<str>)>, snapshot: Arc<Snapshot>) -> Self {
        let n = identities.len();
        Collector {
            identities,
            slots: (0..n).map(|_| None).collect(),
            open: n,
            snapshot,
            sink: None,
        }
    }

    /// From now on, sends every result to `sink` as its slot is filled; the slots filled
    /// already are sent at once, in call order. A closed sink is ignored.
    pub fn attach_sink(&mut self, sink: ResultSink) {
        for (index, slot) in self.slots.iter().enumerate() {
            if let Some(result) = slot {
                let _ = sink.send((index, result.clone()));
            }
        }
        self.sink = Some(sink);
    }

    /// True when the turn's results are streamed (a sink is attached).
    pub fn streams(&self) -> bool {
        self.sink.is_some()
    }

    /// The registry view of this turn.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// How many calls the turn has.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True for a turn with no calls.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slots not answered yet.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Fills slot `index`, recording into the metric handles named by the result's tool. Returns
    /// false — and drops the result — if the slot was already answered or does not exist.
    pub fn fill(&mut self, index: usize, result: ToolDispatchResult) -> bool {
        let snapshot = Arc::clone(&self.snapshot);
        let metrics = match result.error {
            Some(ErrorCode::UnknownTool) => &snapshot.metrics.unknown,
            _ => snapshot.tool_metrics(&result.tool_name),
        };
        self.fill_with(index, result, metrics)
    }

    /// Like [`Collector::fill`], with the tool's metric handles already at hand (the hot path:
    /// no lookup by name).
    pub fn fill_with(
        &mut self,
        index: usize,
        result: ToolDispatchResult,
        metrics: &ToolMetrics,
    ) -> bool {
        match self.slots.get_mut(index) {
            Some(slot @ None) => {
                observe::call_answered(&result, metrics);
                if let Some(sink) = &self.sink {
                    let _ = sink.send((index, result.clone()));
                }
                *slot = Some(result);
                self.open -= 1;
                true
            }
            _ => {
                observe::late_reply_dropped(&result);
                false
            }
        }
    }

    /// Answers slot `index` with an error (id and name taken from the call).
    pub fn fill_error(&mut self, index: usize, code: ErrorCode, detail: &str) -> bool {
        let Some((id, name)) = self.identities.get(index) else {
            return false;
        };
        let result = ToolDispatchResult::error(
            Arc::clone(id),
            Arc::clone(name),
            code,
            detail,
            Timing::default(),
        );
        self.fill(index, result)
    }

    /// Answers every open slot with the same error.
    pub fn fill_open(&mut self, code: ErrorCode, detail: &str) {
        for index in 0..self.slots.len() {
            if self.slots[index].is_none() {
                self.fill_error(index, code, detail);
            }
        }
    }

    /// The results in call order. A slot nobody answered (an engine fault) is answered
    /// `execution_error` here, so the count always equals the number of calls.
    pub fn finish(mut self) -> Vec<ToolDispatchResult> {
        if self.open > 0 {
            self.fill_open(
                ErrorCode::ExecutionError,
                "the engine produced no result for this call",
            );
        }
        self.slots.into_iter().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<(Arc<str>, Arc<str>)> {
        (0..n)
            .map(|i| (Arc::from(format!("c{i}")), Arc::from("t")))
            .collect()
    }

    fn ok(i: usize) -> ToolDispatchResult {
        ToolDispatchResult::ok(
            format!("c{i}").into(),
            "t".into(),
            format!("r{i}"),
            Timing::default(),
        )
    }

    #[test]
    fn results_come_out_in_call_order_whatever_order_they_fill() {
        let mut c = Collector::new(ids(4), Arc::default());
        for i in [3, 1, 0, 2] {
            assert!(c.fill(i, ok(i)));
        }
        let out = c.finish();
        let got: Vec<_> = out.iter().map(|r| r.content.as_str()).collect();
        assert_eq!(got, ["r0", "r1", "r2", "r3"]);
    }

    #[test]
    fn a_slot_is_filled_once_and_late_replies_are_dropped() {
        let mut c = Collector::new(ids(1), Arc::default());
        assert!(c.fill_error(0, ErrorCode::Timeout, "late"));
        assert!(!c.fill(0, ok(0)));
        assert!(!c.fill(7, ok(7)));
        let out = c.finish();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].error, Some(ErrorCode::Timeout));
    }

    #[test]
    fn a_sink_sees_each_result_once_as_its_slot_fills() {
        let mut c = Collector::new(ids(3), Arc::default());
        c.fill(2, ok(2));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        c.attach_sink(tx);
        c.fill(0, ok(0));
        c.fill(0, ok(0));
        let out = c.finish();
        let mut seen = Vec::new();
        while let Ok((i, r)) = rx.try_recv() {
            seen.push((i, r.content));
        }
        assert_eq!(
            seen,
            [
                (2, "r2".to_string()),
                (0, "r0".into()),
                (1, out[1].content.clone())
            ]
        );
    }

    #[test]
    fn unanswered_slots_are_answered_at_finish() {
        let mut c = Collector::new(ids(3), Arc::default());
        c.fill(1, ok(1));
        let out = c.finish();
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].error, Some(ErrorCode::ExecutionError));
        assert_eq!(&*out[2].tool_use_id, "c2");
    }
}
