//! The eager-dispatch measurement (not a test: it asserts nothing about time). Run it with
//!
//! ```text
//! cargo test --release --test providers -- --ignored --nocapture providers_eager_figure::
//! ```
//!
//! Each scenario streams one scripted answer whose blocks arrive `gap` apart, then runs its
//! calls (async tools that sleep), with and without eager dispatch. The figure is the time from
//! the first model request to the second (the answer's stream plus its tool calls), median of 5.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use switchboard::Engine;
use switchboard::agent::{AgentLoop, StreamOptions};
use switchboard::agent::{
    EventSink, ModelRequest, ModelResponse, Provider, ProviderError, ScriptedProvider,
};

/// Records when each model call starts.
struct Timed(ScriptedProvider, Mutex<Vec<Instant>>);

impl Provider for Timed {
    fn name(&self) -> &str {
        "timed"
    }
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        self.1.lock().unwrap().push(Instant::now());
        self.0.complete(request)
    }
    fn complete_streaming<'a>(
        &'a self,
        request: &'a ModelRequest,
        events: EventSink,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        self.1.lock().unwrap().push(Instant::now());
        self.0.complete_streaming(request, events)
    }
}

struct Scenario {
    name: &'static str,
    /// (tool, ms) per call.
    calls: Vec<(&'static str, u64)>,
    gap: u64,
    tail: u64,
}

async fn once(engine: &Engine, s: &Scenario, eager: bool) -> Duration {
    let blocks: Vec<Value> = s
        .calls
        .iter()
        .enumerate()
        .map(|(i, (tool, ms))| common::model::tool_use(&format!("c{i}"), tool, json!({"ms": ms})))
        .collect();
    let scripted = ScriptedProvider::new([
        common::model::answer(blocks, "tool_use"),
        common::model::answer(vec![common::model::text("done")], "end_turn"),
    ])
    .with_stream_delays(Duration::from_millis(s.gap), Duration::from_millis(s.tail));
    let provider = Arc::new(Timed(scripted, Mutex::default()));
    let mut agent = AgentLoop::new(engine.session(), provider.clone(), common::model::config(4))
        .unwrap()
        .with_stream(StreamOptions {
            stream: true,
            eager,
        });
    let r = agent.run("go").await.unwrap();
    assert!(r.dispatches[0].iter().all(|x| x.is_ok()));
    let t = provider.1.lock().unwrap();
    t[1] - t[0]
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn eager_dispatch_savings() {
    let engine = Engine::builder()
        .tool(common::sleeping_tool("safe", true))
        .tool(common::sleeping_tool("serial", false))
        .build()
        .unwrap();
    let scenarios = [
        Scenario {
            name: "3 safe x 100 ms, blocks 100 ms apart, stream ends with the last block",
            calls: vec![("safe", 100), ("safe", 100), ("safe", 100)],
            gap: 100,
            tail: 0,
        },
        Scenario {
            name: "3 safe x 100 ms, blocks 100 ms apart, stream ends 100 ms after the last block",
            calls: vec![("safe", 100), ("safe", 100), ("safe", 100)],
            gap: 100,
            tail: 100,
        },
        Scenario {
            name: "2 safe x 100 ms + 1 serial 100 ms, blocks 100 ms apart",
            calls: vec![("safe", 100), ("safe", 100), ("serial", 100)],
            gap: 100,
            tail: 0,
        },
        Scenario {
            name: "3 safe of 300/200/100 ms, blocks 100 ms apart",
            calls: vec![("safe", 300), ("safe", 200), ("safe", 100)],
            gap: 100,
            tail: 0,
        },
    ];
    println!("\n| scenario | without eager (ms) | eager (ms) | saved |");
    println!("|---|---:|---:|---:|");
    for s in &scenarios {
        let mut off = Vec::new();
        let mut on = Vec::new();
        for _ in 0..5 {
            off.push(once(&engine, s, false).await);
            on.push(once(&engine, s, true).await);
        }
        let (off, on) = (median(off), median(on));
        let saved = if (off - on).abs() < 0.5 {
            0.0
        } else {
            off - on
        };
        println!(
            "| {} | {off:.0} | {on:.0} | {saved:.0} ms ({:.0}%) |",
            s.name,
            saved / off * 100.0
        );
    }
}
