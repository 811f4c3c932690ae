//! Pre-aggregated histograms: fixed buckets, per-thread shards, no upkeep.
//!
//! Every histogram Switchboard records (`_seconds` latencies, calls per turn and per stage) is
//! one [`ShardedHistogram`]: per shard, one counter per bucket (plus one past the last bound) and
//! the sum, each an `AtomicU64`, each shard starting on its own 128-byte line. A thread that
//! records takes a shard *of its own* the first time (a process-wide slot, given back when the
//! thread exits, so a later thread continues the same counts): as its only writer it adds with a
//! plain load and store, no locked instruction, and no two threads ever write the same cache line.
//! Threads beyond the owned shards (only when more threads record at once than there are shards)
//! share one more shard and add to it with atomic read-modify-writes. [`Histograms::render`] sums
//! the shards and writes Prometheus text (`_bucket{le=…}` cumulative, `+Inf`, `_sum`, `_count`),
//! exactly as `metrics-exporter-prometheus` renders a bucketed histogram.
//!
//! Memory is fixed when a series is registered and never grows with traffic: a series holds
//! `(shards + 1) × ⌈(buckets + 2) / 16⌉ × 128` bytes, i.e. 256 bytes per shard for the 20 duration
//! buckets and 128 bytes for the 11 count buckets, with `shards` = 2 × CPUs rounded up to a power
//! of two, between 4 and 64 (4 owned + 1 shared on a 2-CPU machine: 1,280 bytes per latency
//! series). Series are bounded by the labels (registered tools, routes, providers, MCP servers), so
//! the whole set is bounded too, with no upkeep task. A scrape that lands while a sample is being
//! added may see its bucket before its sum (never a lost or double count).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// Words (`u64`) per cache-line pair; a shard starts on its own line pair.
const LINE_WORDS: usize = 16;

/// 128 bytes: two cache lines, so the adjacent-line prefetcher does not pair two shards either.
#[repr(align(128))]
struct Line([AtomicU64; LINE_WORDS]);

impl Line {
    fn new() -> Self {
        Line(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// Shard slots owned by threads (the most any series has).
const MAX_OWNED: usize = 64;

/// A thread's slot before it recorded for the first time.
const UNASSIGNED: usize = usize::MAX;
/// The slot of a thread that owns no shard (all owned, or the thread is exiting).
const SHARED: usize = usize::MAX - 1;

/// Slots given back by threads that exited, and the next never-used slot.
static FREE_SLOTS: Mutex<(Vec<usize>, usize)> = Mutex::new((Vec::new(), 0));

thread_local! {
    /// This thread's shard slot: `UNASSIGNED`, `SHARED`, or the slot it owns.
    static SLOT: Cell<usize> = const { Cell::new(UNASSIGNED) };
    /// Gives the owned slot back when the thread exits.
    static SLOT_OWNER: SlotOwner = const { SlotOwner };
}

/// Owns nothing itself: its destructor (run when the thread exits) gives the thread's slot back.
struct SlotOwner;

impl Drop for SlotOwner {
    fn drop(&mut self) {
        // Whatever this thread records from now on (other destructors) goes to the shared shard.
        let slot = SLOT.try_with(|s| s.replace(SHARED)).unwrap_or(SHARED);
        if slot < MAX_OWNED {
            FREE_SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .0
                .push(slot);
        }
    }
}

/// This thread's slot: the one it owns, or `SHARED`.
#[inline]
fn thread_slot() -> usize {
    let slot = SLOT.try_with(Cell::get).unwrap_or(SHARED);
    if slot != UNASSIGNED {
        return slot;
    }
    take_slot()
}

#[cold]
fn take_slot() -> usize {
    // Registering the owner first: if the thread is already exiting this fails and it shares.
    if SLOT_OWNER.try_with(|_| ()).is_err() {
        return SHARED;
    }
    let slot = {
        let mut free = FREE_SLOTS.lock().unwrap_or_else(PoisonError::into_inner);
        match free.0.pop() {
            Some(slot) => slot,
            None if free.1 < MAX_OWNED => {
                free.1 += 1;
                free.1 - 1
            }
            None => SHARED,
        }
    };
    let _ = SLOT.try_with(|s| s.set(slot));
    slot
}

/// Shards per histogram on this machine: 2 × CPUs rounded up to a power of two, 4 to 64.
pub fn default_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cpus * 2).next_power_of_two().clamp(4, 64)
}

/// One histogram series: fixed bucket bounds, counts kept per shard.
pub struct ShardedHistogram {
    bounds: &'static [f64],
    /// Lines per shard.
    stride: usize,
    /// Shards owned by one thread each; shard `owned` is the shared one.
    owned: usize,
    lines: Box<[Line]>,
}

impl std::fmt::Debug for ShardedHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        f.debug_struct("ShardedHistogram")
            .field("count", &s.count)
            .field("sum", &s.sum)
            .finish()
    }
}

/// A histogram summed over its shards.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(le, cumulative count)` per bound, in order.
    pub buckets: Vec<(f64, u64)>,
    /// Samples recorded.
    pub count: u64,
    /// Sum of the samples.
    pub sum: f64,
}

impl ShardedHistogram {
    /// An empty histogram with these bounds (ascending), `shards` shards owned by one thread
    /// each (1 to 64) and one shared by every other thread.
    pub fn new(bounds: &'static [f64], shards: usize) -> Self {
        let owned = shards.clamp(1, MAX_OWNED);
        let words = bounds.len() + 2;
        let stride = words.div_ceil(LINE_WORDS);
        ShardedHistogram {
            bounds,
            stride,
            owned,
            lines: (0..(owned + 1) * stride).map(|_| Line::new()).collect(),
        }
    }

    #[inline]
    fn word(&self, shard: usize, i: usize) -> &AtomicU64 {
        &self.lines[shard * self.stride + i / LINE_WORDS].0[i % LINE_WORDS]
    }

    /// Adds `n` samples of `value` (NaN is ignored: it has no bucket).
    #[inline]
    pub fn add(&self, value: f64, n: u64) {
        if value.is_nan() || n == 0 {
            return;
        }
        // The first bound ≥ value (values above every bound go to the overflow counter): a
        // linear scan, since most samples (sub-millisecond calls, small turns) fall in the first
        // few buckets and its branch is predictable (a binary search cost 3× as much here).
        let bucket = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        let slot = thread_slot();
        let add = value * n as f64;
        if slot < self.owned {
            // This thread is the shard's only writer: a plain load and store is an exact add.
            let count = self.word(slot, bucket);
            count.store(count.load(Ordering::Relaxed) + n, Ordering::Relaxed);
            let sum = self.word(slot, self.bounds.len() + 1);
            let next = f64::from_bits(sum.load(Ordering::Relaxed)) + add;
            sum.store(next.to_bits(), Ordering::Relaxed);
            return;
        }
        let shard = self.owned;
        self.word(shard, bucket).fetch_add(n, Ordering::Relaxed);
        let sum = self.word(shard, self.bounds.len() + 1);
        let mut current = sum.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(current) + add).to_bits();
            match sum.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
    }

    /// The counts and sum over every shard.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut counts = vec![0u64; self.bounds.len() + 1];
        let mut sum = 0.0;
        for shard in 0..=self.owned {
            for (i, c) in counts.iter_mut().enumerate() {
                *c += self.word(shard, i).load(Ordering::Relaxed);
            }
            sum += f64::from_bits(
                self.word(shard, self.bounds.len() + 1)
                    .load(Ordering::Relaxed),
            );
        }
        let mut running = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&counts)
            .map(|(le, c)| {
                running += c;
                (*le, running)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            count: running + counts[self.bounds.len()],
            sum,
        }
    }

    /// Bytes this series holds (its shards' counters).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.lines)
    }
}

impl HistogramFn for ShardedHistogram {
    #[inline]
    fn record(&self, value: f64) {
        self.add(value, 1);
    }

    #[inline]
    fn record_many(&self, value: f64, count: usize) {
        self.add(value, count as u64);
    }
}

/// A series' labels (in the order given) and its histogram.
type LabelledSeries = (Vec<(String, String)>, Arc<ShardedHistogram>);

/// Every pre-aggregated histogram series of one recorder, with the HELP text of their names.
#[derive(Debug)]
pub struct Histograms {
    shards: usize,
    bounds: fn(&str) -> &'static [f64],
    series: Mutex<HashMap<Key, Arc<ShardedHistogram>>>,
    help: Mutex<HashMap<String, String>>,
}

impl Histograms {
    /// An empty set whose series take their bounds from `bounds(name)` and have `shards` shards.
    pub fn new(bounds: fn(&str) -> &'static [f64], shards: usize) -> Self {
        Histograms {
            shards,
            bounds,
            series: Mutex::default(),
            help: Mutex::default(),
        }
    }

    /// The series of `key`, made on first use.
    pub fn series(&self, key: &Key) -> Arc<ShardedHistogram> {
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = series.get(key) {
            return Arc::clone(h);
        }
        let h = Arc::new(ShardedHistogram::new(
            (self.bounds)(key.name()),
            self.shards,
        ));
        series.insert(key.clone(), Arc::clone(&h));
        h
    }

    /// Sets the HELP text of histogram `name`.
    pub fn describe(&self, name: &str, help: &str) {
        self.help
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), help.to_string());
    }

    /// Samples recorded in every series of histogram `name`.
    pub fn count(&self, name: &str) -> u64 {
        let series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series
            .iter()
            .filter(|(k, _)| k.name() == name)
            .map(|(_, h)| h.snapshot().count)
            .sum()
    }

    /// Bytes held by every series' counters.
    pub fn memory_bytes(&self) -> usize {
        let series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series.values().map(|h| h.memory_bytes()).sum()
    }

    /// Appends every series in the Prometheus text format (0.0.4), one family per name, names
    /// in order, each family followed by a blank line as the Prometheus exporter does.
    pub fn render_into(&self, out: &mut String) {
        let mut families: BTreeMap<String, Vec<LabelledSeries>> = BTreeMap::new();
        for (key, h) in self
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let labels = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            families
                .entry(key.name().to_string())
                .or_default()
                .push((labels, Arc::clone(h)));
        }
        let help = self.help.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, mut series) in families {
            series.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(text) = help.get(&name) {
                let _ = writeln!(out, "# HELP {name} {}", escape(text, false));
            }
            let _ = writeln!(out, "# TYPE {name} histogram");
            for (labels, h) in series {
                let s = h.snapshot();
                let mut base = String::new();
                for (k, v) in &labels {
                    let _ = write!(base, "{k}=\"{}\",", escape(v, true));
                }
                for (le, count) in &s.buckets {
                    let _ = writeln!(out, "{name}_bucket{{{base}le=\"{le}\"}} {count}");
                }
                let _ = writeln!(out, "{name}_bucket{{{base}le=\"+Inf\"}} {}", s.count);
                let plain = base.trim_end_matches(',');
                let braces = if plain.is_empty() {
                    String::new()
                } else {
                    format!("{{{plain}}}")
                };
                let _ = writeln!(out, "{name}_sum{braces} {}", s.sum);
                let _ = writeln!(out, "{name}_count{braces} {}", s.count);
            }
            out.push('\n');
        }
    }

    /// Every series in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out);
        out
    }
}

/// Escapes a label value (`\`, `"`, newline) or HELP text (`\`, newline).
fn escape(text: &str, quotes: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

/// A recorder that keeps every histogram in a [`Histograms`] set and hands counters and gauges
/// (and their descriptions) to `inner`.
#[derive(Debug)]
pub struct PreAggregated<R> {
    inner: R,
    histograms: Arc<Histograms>,
}

impl<R> PreAggregated<R> {
    /// Wraps `inner`; histograms go to `histograms`.
    pub fn new(inner: R, histograms: Arc<Histograms>) -> Self {
        PreAggregated { inner, histograms }
    }
}

impl<R: Recorder> Recorder for PreAggregated<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.histograms.describe(key.as_str(), &description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.histograms.series(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[f64] = &[0.5, 1.0, 2.5];

    fn bounds(_name: &str) -> &'static [f64] {
        BOUNDS
    }

    #[test]
    fn renders_cumulative_buckets_sum_and_count_in_prometheus_text() {
        let set = Histograms::new(bounds, 4);
        set.describe("demo_seconds", "Demo \\ help\nline.");
        let labelled = Key::from_parts("demo_seconds", vec![metrics::Label::new("tool", "a\"b")]);
        let bare = Key::from_name("demo_seconds");
        for v in [0.25, 0.5, 0.75, 3.0] {
            set.series(&labelled).record(v);
        }
        set.series(&bare).record_many(1.0, 3);
        set.series(&bare).record(f64::NAN);
        assert_eq!(
            set.render(),
            "# HELP demo_seconds Demo \\\\ help\\nline.\n\
             # TYPE demo_seconds histogram\n\
             demo_seconds_bucket{le=\"0.5\"} 0\n\
             demo_seconds_bucket{le=\"1\"} 3\n\
             demo_seconds_bucket{le=\"2.5\"} 3\n\
             demo_seconds_bucket{le=\"+Inf\"} 3\n\
             demo_seconds_sum 3\n\
             demo_seconds_count 3\n\
             demo_seconds_bucket{tool=\"a\\\"b\",le=\"0.5\"} 2\n\
             demo_seconds_bucket{tool=\"a\\\"b\",le=\"1\"} 3\n\
             demo_seconds_bucket{tool=\"a\\\"b\",le=\"2.5\"} 3\n\
             demo_seconds_bucket{tool=\"a\\\"b\",le=\"+Inf\"} 4\n\
             demo_seconds_sum{tool=\"a\\\"b\"} 4.5\n\
             demo_seconds_count{tool=\"a\\\"b\"} 4\n\
             \n"
        );
    }

    #[test]
    fn the_same_key_is_the_same_series() {
        let set = Histograms::new(bounds, 2);
        let key = Key::from_name("x");
        set.series(&key).record(1.0);
        set.series(&key).record(1.0);
        assert_eq!(set.series(&key).snapshot().count, 2);
        // Two owned shards and the shared one, one 128-byte line each for three bounds.
        assert_eq!(set.memory_bytes(), 3 * 128);
    }

    #[test]
    fn concurrent_adds_from_many_threads_sum_exactly() {
        const THREADS: usize = 8;
        const EACH: u64 = 20_000;
        // Fewer owned shards than threads, so some threads add to the shared shard at once.
        let h = Arc::new(ShardedHistogram::new(BOUNDS, 4));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let h = Arc::clone(&h);
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        // 0.25 (≤ 0.5), 1.0 (≤ 1) and 4.0 (overflow) in turn; all exact in f64.
                        let v = [0.25, 1.0, 4.0][((i + t as u64) % 3) as usize];
                        h.record(v);
                    }
                    h.record_many(2.0, 10);
                })
            })
            .collect();
        for t in threads {
            t.join().expect("recording thread");
        }
        let s = h.snapshot();
        let n = THREADS as u64 * EACH;
        assert_eq!(s.count, n + THREADS as u64 * 10);
        // Each value's share over all threads: thread t starts at phase t % 3.
        let mut per_value = [0u64; 3];
        for t in 0..THREADS as u64 {
            for i in 0..EACH {
                per_value[((i + t) % 3) as usize] += 1;
            }
        }
        assert_eq!(
            s.buckets,
            vec![
                (0.5, per_value[0]),
                (1.0, per_value[0] + per_value[1]),
                (2.5, per_value[0] + per_value[1] + THREADS as u64 * 10),
            ]
        );
        let want = 0.25 * per_value[0] as f64
            + 1.0 * per_value[1] as f64
            + 4.0 * per_value[2] as f64
            + 2.0 * 10.0 * THREADS as f64;
        assert_eq!(s.sum, want);
    }
}
