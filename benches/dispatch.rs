//! Dispatch benchmarks: the engine against the direct in-process baseline
//! ([`switchboard::testing::DirectDispatcher`]), side by side in one run.
//!
//! Workload names follow `../shared/bench/peers.md`. Every tool takes
//! `{"text": string, "n": integer ≥ 0}` (schema-validated); every call carries 32 characters of
//! text. Each iteration is one turn (or, in `sessions`, one turn per session) dispatched and
//! encoded to bytes with `protocol::write_json`; throughput is in calls. Like the binary, the
//! bench uses mimalloc. Timed loops run inside a task spawned
//! on a 2-worker multi-thread runtime (calling actors from `block_on` would cost ≈20×) and stop by
//! count, never by a timer.
//!
//! `cargo bench --bench dispatch` (≈2–3 minutes on 2 cores).

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use serde_json::json;
use switchboard::protocol::{WireFormat, write_json};
use switchboard::testing::{DirectDispatcher, TEXT, load_tools, noop_async, write_tools};
use switchboard::{Engine, ToolCall, ToolDispatchResult, ToolSpec};
use tokio::runtime::Runtime;

/// The load generator's workload tools (`sleep` sleeps 10 ms) plus `noop_async` and the write
/// workload tools (`write` writes file `n`, `write_same_file` file 0; 10 ms each).
fn tools() -> Vec<ToolSpec> {
    let mut tools = load_tools(Duration::from_millis(10));
    tools.push(noop_async());
    tools.extend(write_tools(Duration::from_millis(10)));
    tools
}

fn call(i: usize, name: &str) -> ToolCall {
    ToolCall::new(format!("toolu_{i:04}"), name, json!({"text": TEXT, "n": i}))
}

fn turn(name: &str, n: usize) -> Vec<ToolCall> {
    (0..n).map(|i| call(i, name)).collect()
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn engine(rt: &Runtime, workers: usize) -> Engine {
    rt.block_on(async {
        Engine::builder()
            .tools(tools())
            .workers(workers)
            .build()
            .expect("engine")
    })
}

fn direct() -> Arc<DirectDispatcher> {
    Arc::new(DirectDispatcher::new(tools()).expect("direct dispatcher"))
}

/// Something that dispatches a turn: the engine, one of its sessions, or the direct baseline.
trait Dispatch: Clone + Send + Sync + 'static {
    fn run(&self, calls: Vec<ToolCall>) -> impl Future<Output = Vec<ToolDispatchResult>> + Send;
}

impl Dispatch for Engine {
    async fn run(&self, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
        self.dispatch(calls).await.expect("engine available")
    }
}

impl Dispatch for switchboard::Session {
    async fn run(&self, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
        self.dispatch(calls).await.expect("engine available")
    }
}

impl Dispatch for Arc<DirectDispatcher> {
    fn run(&self, calls: Vec<ToolCall>) -> impl Future<Output = Vec<ToolDispatchResult>> + Send {
        self.dispatch(calls)
    }
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Anthropic user message of a turn's results, as bytes.
fn encode(results: &[ToolDispatchResult]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_json(WireFormat::Anthropic, results, &mut out).expect("encoding to a Vec");
    out
}

/// `iters` turns back to back in one spawned task; returns their total time.
async fn turns<D: Dispatch>(d: D, calls: Arc<Vec<ToolCall>>, iters: u64) -> Duration {
    tokio::spawn(async move {
        let started = Instant::now();
        for _ in 0..iters {
            let results = d.run(calls.to_vec()).await;
            debug_assert_eq!(results.len(), calls.len());
            black_box(encode(&results));
        }
        started.elapsed()
    })
    .await
    .expect("bench task")
}

/// `iters` turns per dispatcher, every dispatcher in its own task at once; returns the wall time.
async fn concurrent_turns<D: Dispatch>(
    ds: Vec<D>,
    calls: Arc<Vec<ToolCall>>,
    iters: u64,
) -> Duration {
    let started = Instant::now();
    let tasks: Vec<_> = ds
        .into_iter()
        .map(|d| {
            let calls = Arc::clone(&calls);
            tokio::spawn(async move {
                for _ in 0..iters {
                    let results = d.run(calls.to_vec()).await;
                    black_box(encode(&results));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("session task");
    }
    started.elapsed()
}

/// One engine-vs-direct pair of benchmark functions on the same turn.
fn pair(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    engine: &Engine,
    direct: &Arc<DirectDispatcher>,
    param: &str,
    calls: Vec<ToolCall>,
) {
    let calls = Arc::new(calls);
    group.throughput(Throughput::Elements(calls.len() as u64));
    group.bench_with_input(BenchmarkId::new("engine", param), &calls, |b, calls| {
        b.to_async(rt)
            .iter_custom(|iters| turns(engine.clone(), Arc::clone(calls), iters))
    });
    group.bench_with_input(BenchmarkId::new("direct", param), &calls, |b, calls| {
        b.to_async(rt)
            .iter_custom(|iters| turns(Arc::clone(direct), Arc::clone(calls), iters))
    });
}

fn bench_single_call(c: &mut Criterion) {
    let rt = runtime();
    let (engine, direct) = (engine(&rt, 2), direct());
    let mut group = c.benchmark_group("single_call_noop");
    pair(&mut group, &rt, &engine, &direct, "noop", turn("noop", 1));
    group.finish();
    rt.block_on(engine.shutdown(Duration::from_secs(1)));
}

fn bench_batch8(c: &mut Criterion) {
    let rt = runtime();
    let (engine, direct) = (engine(&rt, 2), direct());
    let mut group = c.benchmark_group("batch8");
    pair(
        &mut group,
        &rt,
        &engine,
        &direct,
        "concurrent_safe_noop",
        turn("noop", 8),
    );
    pair(
        &mut group,
        &rt,
        &engine,
        &direct,
        "serial_noop",
        turn("noop_serial", 8),
    );
    group.finish();
    rt.block_on(engine.shutdown(Duration::from_secs(1)));
}

fn bench_error_paths(c: &mut Criterion) {
    let rt = runtime();
    let (engine, direct) = (engine(&rt, 2), direct());
    let calls = vec![
        call(0, "no_such_tool"),
        ToolCall::new("toolu_0001", "noop", json!({"text": TEXT, "n": -1})),
    ];
    let mut group = c.benchmark_group("error_paths");
    pair(&mut group, &rt, &engine, &direct, "unknown+invalid", calls);
    group.finish();
    rt.block_on(engine.shutdown(Duration::from_secs(1)));
}

fn bench_sessions(c: &mut Criterion) {
    let rt = runtime();
    let (engine, direct) = (engine(&rt, 2), direct());
    let calls = Arc::new(turn("noop", 8));
    let mut group = c.benchmark_group("sessions");
    for n in [1usize, 8, 64] {
        // Sessions are made (and their registry snapshot fetched) before timing starts.
        let sessions: Vec<_> = rt.block_on(async {
            let sessions: Vec<_> = (0..n).map(|_| engine.session()).collect();
            for s in &sessions {
                s.dispatch(turn("noop", 1)).await.expect("engine available");
            }
            sessions
        });
        group.throughput(Throughput::Elements((n * calls.len()) as u64));
        group.bench_with_input(BenchmarkId::new("engine", n), &calls, |b, calls| {
            b.to_async(&rt)
                .iter_custom(|iters| concurrent_turns(sessions.clone(), Arc::clone(calls), iters))
        });
        group.bench_with_input(BenchmarkId::new("direct", n), &calls, |b, calls| {
            b.to_async(&rt).iter_custom(|iters| {
                concurrent_turns(vec![Arc::clone(&direct); n], Arc::clone(calls), iters)
            })
        });
    }
    group.finish();
    rt.block_on(engine.shutdown(Duration::from_secs(1)));
}

fn bench_workers(c: &mut Criterion) {
    let rt = runtime();
    let direct = direct();
    let calls = Arc::new(turn("noop_async", 8));
    let mut group = c.benchmark_group("workers");
    group.throughput(Throughput::Elements(calls.len() as u64));
    for workers in [1usize, 2, 4] {
        let engine = engine(&rt, workers);
        group.bench_with_input(BenchmarkId::new("engine", workers), &calls, |b, calls| {
            b.to_async(&rt)
                .iter_custom(|iters| turns(engine.clone(), Arc::clone(calls), iters))
        });
        rt.block_on(engine.shutdown(Duration::from_secs(1)));
    }
    group.bench_with_input(BenchmarkId::new("direct", "-"), &calls, |b, calls| {
        b.to_async(&rt)
            .iter_custom(|iters| turns(Arc::clone(&direct), Arc::clone(calls), iters))
    });
    group.finish();
}

fn bench_sleep_batch8(c: &mut Criterion) {
    let rt = runtime();
    let (engine, direct) = (engine(&rt, 2), direct());
    let mut group = c.benchmark_group("sleep_batch8");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    pair(&mut group, &rt, &engine, &direct, "sleep", turn("sleep", 8));
    group.finish();
    rt.block_on(engine.shutdown(Duration::from_secs(1)));
}

/// Issue #14: eight writes declaring eight different files overlap (like `sleep_batch8`); eight
/// writes of one file run one after another (≈ 80 ms).
fn bench_write_batch8(c: &mut Criterion) {
    let rt = runtime();
    let (engine, direct) = (engine(&rt, 2), direct());
    let mut group = c.benchmark_group("write_batch8");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    pair(
        &mut group,
        &rt,
        &engine,
        &direct,
        "writes_distinct_10ms",
        turn("write", 8),
    );
    pair(
        &mut group,
        &rt,
        &engine,
        &direct,
        "writes_same_file_10ms",
        turn("write_same_file", 8),
    );
    group.finish();
    rt.block_on(engine.shutdown(Duration::from_secs(1)));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = bench_single_call, bench_batch8, bench_error_paths, bench_sessions, bench_workers,
        bench_sleep_batch8, bench_write_batch8
}
criterion_main!(benches);
