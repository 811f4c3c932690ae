//! Exact metric values for a known mix of calls, read from a `DebuggingRecorder`.
//!
//! This file is its own test binary, so it can own the process-wide recorder. The recorder is
//! installed once, before any engine is built (handles are cached at build and registration), and
//! everything runs in ONE test function: the recorder is global and its snapshots are destructive
//! (counters and gauges are swapped to 0, histograms drained), so every snapshot is folded into a
//! running [`Totals`] and the assertions read that.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use common::{TURN_BOUND, call, outcomes, text_schema};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;
use switchboard::metrics::{
    CALL_CONFLICT_WAIT_SECONDS, CALLS_IN_FLIGHT, REGISTRY_TOOLS, SESSIONS_ACTIVE, STAGE_CALLS,
    STAGES_TOTAL, TOOL_CALL_DURATION_SECONDS, TOOL_CALL_QUEUE_SECONDS, TOOL_CALLS_TOTAL,
    TURN_CALLS, TURN_DISPATCH_SECONDS, UNKNOWN_TOOL,
};
use switchboard::{Engine, ErrorCode, Handler, ToolCall, ToolError, ToolOutcome, ToolSpec};

/// The tools registered at build time.
const BUILT: [&str; 5] = ["echo", "fails", "panics", "slow", "waits"];

static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();

/// Installs the global debugging recorder (once per process) and returns its snapshotter.
fn recorder() -> &'static Snapshotter {
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder is installed in this test binary");
        snapshotter
    })
}

/// A series: metric name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    (name.to_string(), labels)
}

/// Everything recorded since the recorder was installed (or, for a delta, since the previous
/// snapshot). Gauges changed with `increment` (sessions, calls in flight) add up across snapshots;
/// gauges changed with `set` (registry tools) are read from the snapshot right after the `set`.
#[derive(Debug, Default)]
struct Totals {
    counters: BTreeMap<Series, u64>,
    gauges: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, Vec<f64>>,
}

impl Totals {
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        *self
            .counters
            .get(&series(name, labels))
            .unwrap_or_else(|| panic!("counter {name}{labels:?} was never registered"))
    }

    fn gauge(&self, name: &str) -> f64 {
        *self
            .gauges
            .get(&series(name, &[]))
            .unwrap_or_else(|| panic!("gauge {name} was never registered"))
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.histograms
            .get(&series(name, labels))
            .unwrap_or_else(|| panic!("histogram {name}{labels:?} was never registered"))
    }

    /// The label sets of every series of counter `name`.
    fn counter_series(&self, name: &str) -> Vec<&[(String, String)]> {
        self.counters
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, l)| l.as_slice())
            .collect()
    }

    fn merge(&mut self, delta: &Totals) {
        for (k, v) in &delta.counters {
            *self.counters.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &delta.gauges {
            *self.gauges.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &delta.histograms {
            self.histograms
                .entry(k.clone())
                .or_default()
                .extend_from_slice(v);
        }
    }
}

/// Takes a (destructive) snapshot, folds it into `totals` and returns it as a delta.
fn take(totals: &mut Totals) -> Totals {
    let mut delta = Totals::default();
    for (key, _unit, _help, value) in recorder().snapshot().into_vec() {
        let (_kind, key) = key.into_parts();
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let s = series(key.name(), &labels);
        match value {
            DebugValue::Counter(v) => {
                delta.counters.insert(s, v);
            }
            DebugValue::Gauge(v) => {
                delta.gauges.insert(s, v.into_inner());
            }
            DebugValue::Histogram(v) => {
                delta
                    .histograms
                    .insert(s, v.into_iter().map(|x| x.into_inner()).collect());
            }
        }
    }
    totals.merge(&delta);
    delta
}

fn explode() -> ToolOutcome {
    panic!("boom (expected by metrics_exact)")
}

fn tool(name: &str, handler: Handler) -> ToolSpec {
    ToolSpec::new(name, "A test tool.", json!({"type": "object"}), handler)
}

fn test_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            "echo",
            "Echoes its text.",
            text_schema(),
            Handler::inline(|args, _ctx| Ok(args["text"].as_str().unwrap_or_default().to_string())),
        )
        .concurrency_safe(true),
        tool(
            "fails",
            Handler::inline::<_, String>(|_args, _ctx| Err(ToolError::execution("it fails"))),
        )
        .concurrency_safe(true),
        tool("panics", Handler::inline(|_args, _ctx| explode())).concurrency_safe(true),
        tool(
            "slow",
            Handler::future(|_args, _ctx| async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok("too late")
            }),
        )
        .timeout(Duration::from_millis(50)),
        tool(
            "waits",
            Handler::future(|_args, _ctx| async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok("never")
            }),
        )
        .timeout(Duration::from_secs(60)),
    ]
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TURN_BOUND, f)
        .await
        .expect("answered within the bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_record_exactly_what_happened() {
    // Installed before the engine is built: the engine caches its handles at build.
    recorder();
    let mut totals = Totals::default();

    let engine: Engine = Engine::builder()
        .tools(test_tools())
        .build()
        .expect("engine builds");

    // ---- after build: every series exists, at zero; the registry gauge holds the tool count.
    let delta = take(&mut totals);
    assert_eq!(delta.gauge(REGISTRY_TOOLS), BUILT.len() as f64);
    assert_eq!(totals.gauge(SESSIONS_ACTIVE), 0.0);
    assert_eq!(totals.gauge(CALLS_IN_FLIGHT), 0.0);
    let outcomes_all: Vec<&str> = std::iter::once("ok")
        .chain(ErrorCode::ALL.iter().map(|c| c.as_str()))
        .collect();
    for t in BUILT.iter().chain([&UNKNOWN_TOOL]) {
        for o in &outcomes_all {
            assert_eq!(
                totals.counter(TOOL_CALLS_TOTAL, &[("tool", t), ("outcome", o)]),
                0
            );
        }
        assert!(
            totals
                .samples(TOOL_CALL_DURATION_SECONDS, &[("tool", t)])
                .is_empty()
        );
    }
    assert_eq!(
        totals.counter_series(TOOL_CALLS_TOTAL).len(),
        (BUILT.len() + 1) * outcomes_all.len()
    );

    // ---- sessions: three open.
    let s1 = engine.session();
    let s2 = engine.session();
    let s3 = engine.session();
    take(&mut totals);
    assert_eq!(totals.gauge(SESSIONS_ACTIVE), 3.0);

    // ---- the mix. Turn A (session-less, all inline and concurrency-safe): 3 ok, 2 unknown,
    // 2 invalid arguments, 1 execution error, 1 panic. The 5 calls that run form one concurrent
    // stage.
    let turn_a = vec![
        call("a1", "echo", json!({"text": "one"})),
        call("a2", "nope", json!({})),
        call("a3", "echo", json!({"text": "two"})),
        call("a4", "echo", json!({})),
        call("a5", "fails", json!({})),
        call("a6", "echo", json!({"text": 5})),
        call("a7", "panics", json!({})),
        call("a8", "also_nope", json!({})),
        call("a9", "echo", json!({"text": "three"})),
    ];
    let results = bounded(engine.dispatch(turn_a))
        .await
        .expect("engine available");
    assert_eq!(
        outcomes(&results),
        [
            "ok",
            "unknown_tool",
            "ok",
            "invalid_arguments",
            "execution_error",
            "invalid_arguments",
            "execution_error",
            "unknown_tool",
            "ok"
        ]
    );

    // Turn B: a call that outlives its 50 ms deadline (one serial stage).
    let results = bounded(engine.dispatch(vec![call("b1", "slow", json!({}))]))
        .await
        .expect("engine available");
    assert_eq!(outcomes(&results), ["timeout"]);

    // Turn C: a call cancelled while it runs, through its session (one serial stage).
    let waiting = {
        let s1 = s1.clone();
        tokio::spawn(async move {
            bounded(s1.dispatch(vec![call("c1", "waits", json!({}))]))
                .await
                .expect("engine available")
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    s1.cancel();
    let results = waiting.await.expect("the cancelled turn's task finished");
    assert_eq!(outcomes(&results), ["cancelled"]);

    drop(s2);
    drop(s3);
    let delta = take(&mut totals);
    assert_eq!(
        totals.gauge(SESSIONS_ACTIVE),
        1.0,
        "two of three sessions dropped"
    );
    assert_eq!(totals.gauge(CALLS_IN_FLIGHT), 0.0, "both async calls ended");

    let expected: BTreeMap<(&str, &str), u64> = [
        (("echo", "ok"), 3),
        ((UNKNOWN_TOOL, "unknown_tool"), 2),
        (("echo", "invalid_arguments"), 2),
        (("fails", "execution_error"), 1),
        (("panics", "execution_error"), 1),
        (("slow", "timeout"), 1),
        (("waits", "cancelled"), 1),
    ]
    .into_iter()
    .collect();
    for t in BUILT.iter().chain([&UNKNOWN_TOOL]) {
        for o in &outcomes_all {
            let want = expected.get(&(*t, *o)).copied().unwrap_or(0);
            assert_eq!(
                delta.counter(TOOL_CALLS_TOTAL, &[("tool", t), ("outcome", o)]),
                want,
                "{TOOL_CALLS_TOTAL}{{tool={t},outcome={o}}}"
            );
        }
    }

    // Run time and queue wait: one sample per call that ran (not for unknown or invalid calls).
    let ran: BTreeMap<&str, usize> = [
        ("echo", 3),
        ("fails", 1),
        ("panics", 1),
        ("slow", 1),
        ("waits", 1),
        (UNKNOWN_TOOL, 0),
    ]
    .into_iter()
    .collect();
    for (t, n) in &ran {
        for h in [TOOL_CALL_DURATION_SECONDS, TOOL_CALL_QUEUE_SECONDS] {
            assert_eq!(
                delta.samples(h, &[("tool", t)]).len(),
                *n,
                "{h}{{tool={t}}}"
            );
        }
    }
    // No call of these turns waited for a conflicting call (turn A's calls conflict with nothing,
    // B and C hold one call each).
    for t in ran.keys() {
        assert!(
            delta
                .samples(CALL_CONFLICT_WAIT_SECONDS, &[("tool", t)])
                .is_empty(),
            "{CALL_CONFLICT_WAIT_SECONDS}{{tool={t}}}"
        );
    }
    let slow = delta.samples(TOOL_CALL_DURATION_SECONDS, &[("tool", "slow")])[0];
    assert!(
        (0.05..2.0).contains(&slow),
        "the timed-out call ran about 50 ms, not {slow} s"
    );
    let waited = delta.samples(TOOL_CALL_DURATION_SECONDS, &[("tool", "waits")])[0];
    assert!(
        (0.1..5.0).contains(&waited),
        "the cancelled call ran about 200 ms, not {waited} s"
    );

    let mut per_turn = delta.samples(TURN_CALLS, &[]).to_vec();
    per_turn.sort_by(f64::total_cmp);
    assert_eq!(per_turn, [1.0, 1.0, 9.0], "{TURN_CALLS}");
    assert_eq!(delta.samples(TURN_DISPATCH_SECONDS, &[]).len(), 3);
    assert_eq!(delta.counter(STAGES_TOTAL, &[("mode", "concurrent")]), 1);
    assert_eq!(delta.counter(STAGES_TOTAL, &[("mode", "serial")]), 2);
    assert_eq!(
        delta.samples(STAGE_CALLS, &[("mode", "concurrent")]),
        [5.0],
        "the five runnable calls of turn A"
    );
    assert_eq!(
        delta.samples(STAGE_CALLS, &[("mode", "serial")]),
        [1.0, 1.0]
    );

    // ---- the last session goes: back to zero.
    drop(s1);
    take(&mut totals);
    assert_eq!(totals.gauge(SESSIONS_ACTIVE), 0.0, "every session dropped");

    // ---- registry size follows register / unregister.
    engine
        .register(tool("extra", Handler::inline(|_a, _c| Ok("x"))))
        .await
        .expect("extra registers");
    let delta = take(&mut totals);
    assert_eq!(delta.gauge(REGISTRY_TOOLS), (BUILT.len() + 1) as f64);
    assert!(engine.unregister("extra").await);
    let delta = take(&mut totals);
    assert_eq!(delta.gauge(REGISTRY_TOOLS), BUILT.len() as f64);

    // ---- 10,000 invented tool names: one `_unknown` series, no new label values.
    let series_before: BTreeSet<Vec<(String, String)>> = totals
        .counter_series(TOOL_CALLS_TOTAL)
        .into_iter()
        .map(<[_]>::to_vec)
        .collect();
    for turn in 0..100 {
        let calls: Vec<ToolCall> = (0..100)
            .map(|k| {
                let n = turn * 100 + k;
                call(&format!("u{n}"), &format!("invented_tool_{n}"), json!({}))
            })
            .collect();
        let results = bounded(engine.dispatch(calls))
            .await
            .expect("engine available");
        assert!(results.iter().all(|r| r.outcome() == "unknown_tool"));
    }
    let delta = take(&mut totals);
    let series_after: BTreeSet<Vec<(String, String)>> = totals
        .counter_series(TOOL_CALLS_TOTAL)
        .into_iter()
        .map(<[_]>::to_vec)
        .collect();
    assert_eq!(
        series_before, series_after,
        "invented names must not create series"
    );
    let tools: BTreeSet<&str> = series_after
        .iter()
        .flat_map(|l| {
            l.iter()
                .filter(|(k, _)| k == "tool")
                .map(|(_, v)| v.as_str())
        })
        .collect();
    let allowed: BTreeSet<&str> = BUILT
        .iter()
        .copied()
        .chain(["extra", UNKNOWN_TOOL])
        .collect();
    assert_eq!(tools, allowed, "tool label values");
    let unknown_series: Vec<_> = delta
        .counters
        .iter()
        .filter(|((name, labels), count)| {
            name == TOOL_CALLS_TOTAL
                && **count > 0
                && labels
                    .iter()
                    .any(|(k, v)| k == "outcome" && v == "unknown_tool")
        })
        .collect();
    assert_eq!(
        unknown_series.len(),
        1,
        "exactly one series counts unknown tools: {unknown_series:?}"
    );
    assert_eq!(
        delta.counter(
            TOOL_CALLS_TOTAL,
            &[("tool", UNKNOWN_TOOL), ("outcome", "unknown_tool")]
        ),
        10_000
    );
    assert_eq!(
        totals.counter(
            TOOL_CALLS_TOTAL,
            &[("tool", UNKNOWN_TOOL), ("outcome", "unknown_tool")]
        ),
        10_002
    );
    assert!(
        delta
            .samples(TOOL_CALL_DURATION_SECONDS, &[("tool", UNKNOWN_TOOL)])
            .is_empty(),
        "unknown calls never run"
    );
    assert_eq!(delta.samples(TURN_CALLS, &[]), [100.0; 100]);
    assert_eq!(delta.counter(STAGES_TOTAL, &[("mode", "concurrent")]), 0);
    assert_eq!(delta.counter(STAGES_TOTAL, &[("mode", "serial")]), 0);

    engine.shutdown(Duration::from_secs(1)).await;
}
