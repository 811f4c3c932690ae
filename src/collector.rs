//! The Collector: one result slot per call, filled exactly once, emitted in call order.
//!
//! Every path that answers a call — success, handler error, panic, timeout, cancellation, a lost
//! worker — goes through [`Collector::fill_with`], which is also the one place a call's timing and
//! outcome are recorded ([`crate::observe`]). A second answer for a slot (a late reply) is dropped.
//! [`Collector::finish`] answers any slot still empty, so a turn always yields exactly one result
//! per call, in the order the model asked.
//!
//! Import note: the collector knows metric handles, not the registry. Whoever fills a slot hands
//! it the handles of the call's tool (the scheduler holds the turn's registry snapshot), so the
//! collector never looks a tool up.
//!
//! A turn may carry a [`ResultSink`]: each result is also sent to it the moment its slot is
//! filled (the seam `serve` streams results through); the ordered answer is unchanged.

use std::sync::Arc;

use crate::metrics::ToolMetrics;
use crate::observe;
use crate::protocol::{ErrorCode, Timing, ToolDispatchResult};

/// Receives `(index in the turn, result)` for each call of a turn as its slot is filled.
pub type ResultSink = tokio::sync::mpsc::UnboundedSender<(usize, ToolDispatchResult)>;

/// The slots of one turn.
#[derive(Debug)]
pub struct Collector {
    identities: Vec<(Arc<str>, Arc<str>)>,
    slots: Vec<Option<ToolDispatchResult>>,
    open: usize,
    sink: Option<ResultSink>,
}

impl Collector {
    /// One empty slot per call; `identities` are the calls' `(tool_use_id, name)` in model order.
    pub fn new(identities: Vec<(Arc<str>, Arc<str>)>) -> Self {
        let n = identities.len();
        Collector {
            identities,
            slots: (0..n).map(|_| None).collect(),
            open: n,
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

    /// How many calls the turn has.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The `tool_use_id` and tool name of call `index`, as the model sent them.
    pub fn identity(&self, index: usize) -> (&str, &str) {
        self.identities
            .get(index)
            .map_or(("", ""), |(id, name)| (&**id, &**name))
    }

    /// The tool name of call `index`, as the model spelled it.
    pub fn name(&self, index: usize) -> Option<Arc<str>> {
        self.identities.get(index).map(|(_, name)| Arc::clone(name))
    }

    /// Fills slot `index`, recording into `metrics` (the handles of the result's tool, which the
    /// caller holds: the collector never looks a tool up). Returns false — and drops the result —
    /// if the slot was already answered or does not exist.
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
    pub fn fill_error(
        &mut self,
        index: usize,
        code: ErrorCode,
        detail: &str,
        metrics: &ToolMetrics,
    ) -> bool {
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
        self.fill_with(index, result, metrics)
    }

    /// Answers every open slot with the same error; `metrics_for` gives each call's handles by
    /// tool name.
    pub fn fill_open<'m>(
        &mut self,
        code: ErrorCode,
        detail: &str,
        metrics_for: impl Fn(&str) -> &'m ToolMetrics,
    ) {
        for index in 0..self.slots.len() {
            if self.slots[index].is_none() {
                let metrics = metrics_for(&self.identities[index].1);
                self.fill_error(index, code, detail, metrics);
            }
        }
    }

    /// The results in call order. A slot nobody answered (an engine fault) is answered
    /// `execution_error` here, so the count always equals the number of calls.
    pub fn finish<'m>(
        mut self,
        metrics_for: impl Fn(&str) -> &'m ToolMetrics,
    ) -> Vec<ToolDispatchResult> {
        if self.open > 0 {
            self.fill_open(
                ErrorCode::ExecutionError,
                "the engine produced no result for this call",
                metrics_for,
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

    fn handles() -> &'static ToolMetrics {
        static HANDLES: std::sync::OnceLock<ToolMetrics> = std::sync::OnceLock::new();
        HANDLES.get_or_init(|| crate::metrics::detached(|| ToolMetrics::new("t")))
    }

    #[test]
    fn results_come_out_in_call_order_whatever_order_they_fill() {
        let mut c = Collector::new(ids(4));
        for i in [3, 1, 0, 2] {
            assert!(c.fill_with(i, ok(i), handles()));
        }
        let out = c.finish(|_| handles());
        let got: Vec<_> = out.iter().map(|r| r.content.as_str()).collect();
        assert_eq!(got, ["r0", "r1", "r2", "r3"]);
    }

    #[test]
    fn a_slot_is_filled_once_and_late_replies_are_dropped() {
        let mut c = Collector::new(ids(1));
        assert!(c.fill_error(0, ErrorCode::Timeout, "late", handles()));
        assert!(!c.fill_with(0, ok(0), handles()));
        assert!(!c.fill_with(7, ok(7), handles()));
        let out = c.finish(|_| handles());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].error, Some(ErrorCode::Timeout));
    }

    #[test]
    fn a_sink_sees_each_result_once_as_its_slot_fills() {
        let mut c = Collector::new(ids(3));
        c.fill_with(2, ok(2), handles());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        c.attach_sink(tx);
        c.fill_with(0, ok(0), handles());
        c.fill_with(0, ok(0), handles());
        let out = c.finish(|_| handles());
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
        let mut c = Collector::new(ids(3));
        c.fill_with(1, ok(1), handles());
        let out = c.finish(|_| handles());
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].error, Some(ErrorCode::ExecutionError));
        assert_eq!(&*out[2].tool_use_id, "c2");
    }
}
