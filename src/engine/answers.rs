//! A session's answers: every call it answered, by `tool_use_id`, so that a turn sent again (a
//! client's retry after a timeout or a broken stream) is answered from them — the same result,
//! byte for byte, and nothing runs twice.
//!
//! For each call of a turn, in order:
//!
//! * answered before with the same tool and arguments → the stored answer;
//! * still running (an earlier copy of the turn) → waits for that run's answer;
//! * used before with another tool or other arguments → `invalid_arguments`, nothing runs;
//! * answered so long ago that the answer was dropped (the session's retention, or the
//!   journal's: a tombstone) → `invalid_arguments` saying so, nothing runs;
//! * with a journal, unknown here but found in it → its stored answer, or, when only the intent
//!   is there, the rule for a call that *may have run* ([`may_run_again`]);
//! * a journal that cannot be read → `execution_error`, nothing runs (never taken for "new");
//! * otherwise a new call: it runs, and its answer is remembered (and journaled).
//!
//! **May have run.** A call whose first run may or may not have taken effect — its turn was
//! dropped by its caller, the engine stopped while it ran, or its answer could not be recorded —
//! runs again when a copy comes if its tool is read-only or idempotent, and is answered
//! `outcome_unknown` otherwise. One rule, here, for all three.
//!
//! A turn the engine refuses whole (a duplicate or empty `tool_use_id`) is not remembered.
//! Retention is per session, bounded by answers and bytes ([`Retention`]); without a journal the
//! ids of dropped answers are kept (as 64-bit hashes, up to [`FORGOTTEN_IDS`]) so a late retry is
//! refused rather than run again; with one, the journal answers for them.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};

use serde_json::Value;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use sha2::{Digest as _, Sha256};
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;

use crate::execute::StartGate;
use crate::journal::{CallRecord, Journal, JournalError, RecordState, StoredAnswer, Write};
use crate::protocol::{ErrorCode, Timing, ToolCall, ToolDispatchResult};
use crate::registry::Snapshot;
use crate::tool::Effect;

/// How many ids of dropped answers a session still recognises.
pub const FORGOTTEN_IDS: usize = 16_384;

/// How many answers a session keeps in memory for retries (the journal, when there is one, keeps
/// them for its own retention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// At most this many answers per session (default 1,024).
    pub answers: usize,
    /// At most this many bytes of answer content per session (default 8 MiB).
    pub bytes: usize,
    /// At most about this many bytes of answers over all sessions of the engine (default
    /// 512 MiB; each answer counts its content and 512 bytes): past it, a session that
    /// remembers a new answer lets its oldest go, down to 16 answers. Without a journal, the
    /// ids of answers let go are remembered as answered (a late retry is refused, never run);
    /// with one, the journal answers for them.
    pub engine_bytes: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            answers: 1024,
            bytes: 8 << 20,
            engine_bytes: 512 << 20,
        }
    }
}

/// What one remembered answer costs in memory beyond its content (its entry, key and order
/// slot), counted against [`Retention::engine_bytes`].
pub(crate) const ANSWER_OVERHEAD: usize = 512;
/// How many answers a session keeps while the engine is over its budget.
pub(crate) const SHED_FLOOR: usize = 16;
/// A session tells the engine-wide count of its answers' bytes once they moved by this much (so
/// the count is not one more shared write per answer).
const REPORT_EVERY: usize = 16 << 10;

/// A session's limits, shared by every session of an engine: the retention, and the count of
/// bytes all of them keep.
#[derive(Debug, Default)]
pub(crate) struct Limits {
    retention: Retention,
    used: AtomicUsize,
}

impl Limits {
    pub(crate) fn new(retention: Retention) -> Self {
        Limits {
            retention,
            used: AtomicUsize::new(0),
        }
    }

    /// Bytes of answers all sessions keep, as reported (each session's last
    /// [`REPORT_EVERY`] may be missing).
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.retention.engine_bytes
    }
}

/// What identifies a call's content: a fast hash (compared in memory), and with a journal the
/// SHA-256 the journal records (stable across processes and versions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest {
    fast: u64,
    sha: Option<[u8; 32]>,
}

impl Digest {
    /// The digest of `call`: its tool name and arguments (object keys in sorted order, so a
    /// client that reorders keys sends the same call); the SHA-256 only if `durable`.
    pub(crate) fn of(call: &ToolCall, durable: bool) -> Digest {
        let mut fast = foldhash::quality::FixedState::with_seed(0x5eed).build_hasher();
        feed_call(call, &mut fast, false);
        let sha = durable.then(|| {
            let mut sha = ShaHasher(Sha256::new());
            // The journal's form: numbers as their text (what every version recorded).
            feed_call(call, &mut sha, true);
            sha.0.finalize().into()
        });
        Digest {
            fast: fast.finish(),
            sha,
        }
    }

    /// The journal's form (hex SHA-256); empty without one.
    fn hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let Some(d) = self.sha else {
            return String::new();
        };
        // By table, not `format!` per byte: a journaled call makes this string once or twice,
        // and formatting it was a tenth of a no-op load's CPU with the journal on a tmpfs.
        let mut out = String::with_capacity(d.len() * 2);
        for b in d {
            out.push(DIGITS[usize::from(b >> 4)] as char);
            out.push(DIGITS[usize::from(b & 0xf)] as char);
        }
        out
    }
}

/// Feeds `call` to `h`; `stable`: numbers as their text (the journal's SHA-256, which must not
/// change between versions), else as their value's bits (no allocation; in memory only).
fn feed_call(call: &ToolCall, h: &mut impl Hasher, stable: bool) {
    h.write(call.name.as_bytes());
    h.write_u8(0xff);
    match &call.malformed {
        Some(detail) => {
            h.write_u8(1);
            h.write(detail.as_bytes());
        }
        None => {
            h.write_u8(0);
            feed_value(&call.arguments, h, stable);
        }
    }
}

fn feed_str(text: &str, h: &mut impl Hasher) {
    h.write_u64(text.len() as u64);
    h.write(text.as_bytes());
}

fn feed_value(value: &Value, h: &mut impl Hasher, stable: bool) {
    match value {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => {
            h.write_u8(1);
            h.write_u8(u8::from(*b));
        }
        Value::Number(n) => {
            h.write_u8(2);
            if stable {
                feed_str(&n.to_string(), h);
            } else if let Some(u) = n.as_u64() {
                h.write_u8(0);
                h.write_u64(u);
            } else if let Some(i) = n.as_i64() {
                h.write_u8(1);
                h.write_i64(i);
            } else {
                // `1.0` and `1` stay apart, as their texts do.
                h.write_u8(2);
                h.write_u64(n.as_f64().map_or(0, f64::to_bits));
            }
        }
        Value::String(text) => {
            h.write_u8(3);
            feed_str(text, h);
        }
        Value::Array(items) => {
            h.write_u8(4);
            h.write_u64(items.len() as u64);
            for item in items {
                feed_value(item, h, stable);
            }
        }
        Value::Object(map) => {
            h.write_u8(5);
            h.write_u64(map.len() as u64);
            if map.keys().is_sorted() {
                for (k, v) in map {
                    feed_str(k, h);
                    feed_value(v, h, stable);
                }
            } else {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (k, v) in entries {
                    feed_str(k, h);
                    feed_value(v, h, stable);
                }
            }
        }
    }
}

/// SHA-256 as a `Hasher` (only `write` is used; `finish` is never read).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// A call's entry; `fast`: its digest's in-memory hash ([`Digest`]).
#[derive(Debug)]
enum Entry {
    Running {
        fast: u64,
    },
    /// Its turn was dropped by its caller before the answer was known: it may have run.
    Abandoned {
        fast: u64,
    },
    Answered {
        fast: u64,
        result: Arc<ToolDispatchResult>,
    },
}

/// The hasher of call identities (the ids are the client's: seeded per process).
type Ids = foldhash::quality::RandomState;

/// The process's hasher of call identities (one seed for every session: a session need not
/// carry its own).
fn ids() -> &'static Ids {
    static IDS: OnceLock<Ids> = OnceLock::new();
    IDS.get_or_init(Ids::default)
}

/// A call's identity in its session ([`key_of`]) with its hash, computed once per call: every
/// look-up, insertion and eviction of the call's entry uses it.
#[derive(Debug, Clone)]
pub(crate) struct Key {
    hash: u64,
    id: Arc<str>,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.hash == other.hash && self.id == other.id
    }
}

impl Eq for Key {}

/// The hasher of maps whose keys are hashes already ([`Key`], the forgotten ids' hashes).
#[derive(Debug, Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn write(&mut self, bytes: &[u8]) {
        // Not used by `Key` or `u64`; a fold, should anything else ever be hashed with it.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Hashed = BuildHasherDefault<Prehashed>;

#[derive(Debug, Default)]
struct State {
    map: HashMap<Key, Entry, Hashed>,
    /// Answered calls, oldest first.
    order: VecDeque<Key>,
    bytes: usize,
    /// The hashes of the ids of dropped answers (without a journal), made at the first.
    forgotten: Option<Box<Forgotten>>,
    /// The bytes (content and overhead) of this session's answers last told to the engine's
    /// count ([`Limits`]).
    charged: usize,
}

/// The ids of dropped answers, as hashes, oldest first (at most [`FORGOTTEN_IDS`]).
#[derive(Debug, Default)]
struct Forgotten {
    set: HashSet<u64, Hashed>,
    order: VecDeque<u64>,
}

/// One session's answers.
#[derive(Debug)]
pub(crate) struct Answers {
    session: Arc<str>,
    /// Made at the first call: a session that has answered nothing keeps nothing.
    state: Mutex<Option<Box<State>>>,
    limits: Arc<Limits>,
    journal: Option<Journal>,
    /// Wakes the turns waiting for a running copy of their call (only when there are some).
    changed: tokio::sync::Notify,
    waiters: AtomicUsize,
}

/// What a call of a turn gets.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Runs now; its answer is finished with [`Answers::finish`].
    Run {
        digest: Digest,
        effect: Option<Effect>,
    },
    /// Answered already (stored, or refused now and not stored). Boxed, as in `Decided`: a
    /// turn's plans stay small to move.
    Answer(Box<ToolDispatchResult>, Hit),
    /// Decided now without running (`outcome_unknown`), remembered and journaled like a run.
    Decided {
        digest: Digest,
        effect: Option<Effect>,
        result: Box<ToolDispatchResult>,
    },
    /// Waits for an earlier copy of the call.
    Wait(Digest),
}

/// Whether an immediate answer was a stored one (a dedup hit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hit {
    Stored,
    Refused,
}

fn size_of(result: &ToolDispatchResult) -> usize {
    let blocks: usize = result.blocks.as_ref().map_or(0, |b| {
        b.iter()
            .map(|b| match b {
                crate::protocol::Block::Text(t) => t.len(),
                crate::protocol::Block::Image(i) => i.data.len() + i.media_type.len(),
                crate::protocol::Block::ToolReference(r) => r.definition.len() + r.tool_name.len(),
            })
            .sum()
    });
    result.content.len() + blocks + result.tool_use_id.len() + result.tool_name.len() + 64
}

fn refusal(call: &ToolCall, detail: String) -> ToolDispatchResult {
    ToolDispatchResult::error(
        Arc::clone(&call.id),
        Arc::clone(&call.name),
        ErrorCode::InvalidArguments,
        &detail,
        Timing::default(),
    )
}

/// A call's identity in its session: its `tool_use_id`, or — when the client named the turn —
/// the turn id, NUL, and the `tool_use_id` (turn ids hold no NUL: the first one separates). The
/// key of the session's memory and of the journal's record.
pub(crate) fn key_of(call: &ToolCall) -> Arc<str> {
    match &call.turn {
        None => Arc::clone(&call.id),
        Some(turn) => {
            let mut key = String::with_capacity(turn.len() + 1 + call.id.len());
            key.push_str(turn);
            key.push('\0');
            key.push_str(&call.id);
            Arc::from(key)
        }
    }
}

/// The `outcome_unknown` answer of a call whose run was interrupted.
pub(crate) fn outcome_unknown(call: &ToolCall, why: &str) -> ToolDispatchResult {
    outcome_unknown_of(&call.id, &call.name, why)
}

/// [`outcome_unknown`] of call `id` of tool `name`.
pub(crate) fn outcome_unknown_of(id: &Arc<str>, name: &Arc<str>, why: &str) -> ToolDispatchResult {
    ToolDispatchResult::error(
        Arc::clone(id),
        Arc::clone(name),
        ErrorCode::OutcomeUnknown,
        &format!(
            "{why} while this call was running; it may or may not have taken effect — check \
             before retrying it (with a new tool_use_id)"
        ),
        Timing::default(),
    )
}

impl Answers {
    pub(crate) fn new(session: Arc<str>, limits: Arc<Limits>, journal: Option<Journal>) -> Self {
        Answers {
            session,
            state: Mutex::new(None),
            limits,
            journal,
            changed: tokio::sync::Notify::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    fn lock(&self) -> Locked<'_> {
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.get_or_insert_with(Box::default);
        Locked(guard)
    }

    /// The identity of `call` in this session ([`key_of`]), hashed.
    pub(crate) fn key(&self, call: &ToolCall) -> Key {
        let id = key_of(call);
        Key {
            hash: ids().hash_one(&*id),
            id,
        }
    }

    /// True when the engine would answer the turn as a whole (a duplicate or empty id): such a
    /// turn is dispatched as it is and not remembered.
    pub(crate) fn refused_whole(calls: &[ToolCall]) -> bool {
        if calls.iter().any(|c| c.id.is_empty()) {
            return true;
        }
        match calls.len() {
            0 | 1 => false,
            // A turn is a handful of calls: comparing them is cheaper than hashing them.
            n if n <= 16 => (1..n).any(|i| calls[..i].iter().any(|c| c.id == calls[i].id)),
            n => {
                let mut seen = HashSet::with_capacity_and_hasher(n, Ids::default());
                !calls.iter().all(|c| seen.insert(&*c.id))
            }
        }
    }

    /// Decides what each call of a turn gets; calls that run are registered as running. With a
    /// journal, ids this session does not know are looked up there first — without holding the
    /// session's lock, and on the blocking pool when the file may hold them; a lookup that fails
    /// runs none of them.
    pub(crate) async fn plan(
        &self,
        calls: &[ToolCall],
        keys: &[Key],
        view: &Snapshot,
    ) -> Vec<Plan> {
        let durable = self.journal.is_some();
        let mut records: HashMap<usize, Option<CallRecord>> = HashMap::new();
        let mut unreadable: Option<String> = None;
        if let Some(journal) = &self.journal {
            let misses: Vec<usize> = {
                let state = self.lock();
                (0..calls.len())
                    .filter(|&i| !state.map.contains_key(&keys[i]))
                    .collect()
            };
            if !misses.is_empty() {
                let ids: Vec<&str> = misses.iter().map(|&i| &*keys[i].id).collect();
                match journal.lookup(&self.session, &ids).await {
                    Ok(found) => records = misses.into_iter().zip(found).collect(),
                    Err(e) => {
                        tracing::error!(error = %e, "journal lookup failed; the calls it was for are not run");
                        unreadable = Some(e.to_string());
                    }
                }
            }
        }
        let mut state = self.lock();
        calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let digest = Digest::of(call, durable);
                let effect = view.get(&call.name).map(|t| t.effect);
                let key = &keys[i];
                match state.map.get(key) {
                    Some(Entry::Answered { fast, result }) => {
                        if *fast == digest.fast {
                            Plan::Answer(Box::new((**result).clone()), Hit::Stored)
                        } else {
                            Plan::Answer(Box::new(other_arguments(call)), Hit::Refused)
                        }
                    }
                    Some(Entry::Running { fast }) => {
                        if *fast == digest.fast {
                            Plan::Wait(digest)
                        } else {
                            Plan::Answer(Box::new(other_arguments(call)), Hit::Refused)
                        }
                    }
                    Some(&Entry::Abandoned { fast }) => {
                        if fast == digest.fast {
                            state.map.insert(key.clone(), Entry::Running { fast });
                            // The one rule for a call that may have run: a read-only or
                            // idempotent call runs again, any other is `outcome_unknown`.
                            if may_run_again(effect) {
                                return Plan::Run { digest, effect };
                            }
                            Plan::Decided {
                                digest,
                                effect,
                                result: Box::new(outcome_unknown(call, ABANDONED)),
                            }
                        } else {
                            Plan::Answer(Box::new(other_arguments(call)), Hit::Refused)
                        }
                    }
                    None => {
                        if let Some(detail) = &unreadable {
                            let result = ToolDispatchResult::error(
                                Arc::clone(&call.id),
                                Arc::clone(&call.name),
                                ErrorCode::ExecutionError,
                                &format!(
                                    "not run: the journal cannot be read, so whether this call \
                                     ran before is not known ({detail})"
                                ),
                                Timing::default(),
                            );
                            return Plan::Answer(Box::new(result), Hit::Refused);
                        }
                        if let Some(record) = records.remove(&i).flatten() {
                            if record.digest != digest.hex() {
                                return Plan::Answer(Box::new(other_arguments(call)), Hit::Refused);
                            }
                            match record.state() {
                                RecordState::Answered(answer) => {
                                    let result = answer.to_result();
                                    state.remember(key, digest, Arc::new(result.clone()), self);
                                    return Plan::Answer(Box::new(result), Hit::Stored);
                                }
                                RecordState::Tombstone(_) => {
                                    return Plan::Answer(
                                        Box::new(no_longer_kept(call, "the journal's retention")),
                                        Hit::Refused,
                                    );
                                }
                                RecordState::Started => {
                                    let recorded = Effect::parse(&record.effect);
                                    if !may_run_again(recorded) {
                                        state.map.insert(
                                            key.clone(),
                                            Entry::Running { fast: digest.fast },
                                        );
                                        return Plan::Decided {
                                            digest,
                                            effect,
                                            result: Box::new(outcome_unknown(call, ENGINE_STOPPED)),
                                        };
                                    }
                                }
                            }
                        } else if state
                            .forgotten
                            .as_ref()
                            .is_some_and(|f| f.set.contains(&key.hash))
                        {
                            let kept = format!(
                                "a session keeps its last {} answers, {} MiB",
                                self.limits.retention.answers,
                                self.limits.retention.bytes >> 20
                            );
                            return Plan::Answer(
                                Box::new(no_longer_kept(call, &kept)),
                                Hit::Refused,
                            );
                        }
                        state
                            .map
                            .insert(key.clone(), Entry::Running { fast: digest.fast });
                        Plan::Run { digest, effect }
                    }
                }
            })
            .collect()
    }

    /// The start gate of the turn's calls that need an intent (idempotent and side-effect
    /// tools, with a journal): each one's intent is made durable right before it starts. `None`
    /// when no call of the turn needs one.
    pub(crate) fn intents(&self, calls: &[ToolCall], plans: &[Plan]) -> Option<Arc<Intents>> {
        let journal = self.journal.as_ref()?;
        let guarded: HashMap<Arc<str>, (String, Effect)> = calls
            .iter()
            .zip(plans)
            .filter_map(|(call, plan)| match plan {
                Plan::Run {
                    digest,
                    effect: Some(effect @ (Effect::Idempotent | Effect::SideEffect)),
                } => Some((Arc::clone(&call.id), (digest.hex(), *effect))),
                _ => None,
            })
            .collect();
        (!guarded.is_empty()).then(|| {
            Arc::new(Intents {
                journal: journal.clone(),
                session: Arc::clone(&self.session),
                guarded,
            })
        })
    }

    /// The journal record of `result`, the answer of a call planned with `digest` and `effect`.
    pub(crate) fn answer_record(
        &self,
        key: &Key,
        result: &ToolDispatchResult,
        digest: &Digest,
        effect: Option<Effect>,
    ) -> Write {
        Write::Call {
            session: Arc::clone(&self.session),
            id: Arc::clone(&key.id),
            record: Box::new(CallRecord {
                tool: result.tool_name.to_string(),
                digest: digest.hex(),
                effect: effect.unwrap_or_default().as_str().to_string(),
                at_ms: self.journal.as_ref().map_or(0, Journal::now_ms),
                answer: Some(StoredAnswer::of(result)),
                dropped: None,
            }),
        }
    }

    /// Remembers the answers of a turn's calls that ran (or were decided) — each with its
    /// identity and the digest it was planned with — under one lock, and wakes their waiters.
    pub(crate) fn finish<'a>(
        &self,
        answered: impl Iterator<Item = (&'a Key, Digest, &'a ToolDispatchResult)>,
    ) {
        {
            let mut state = self.lock();
            for (key, digest, result) in answered {
                state.remember(key, digest, Arc::new(result.clone()), self);
            }
        }
        self.wake();
    }

    /// Calls registered as running (by identity) that will get no answer from their turn: the
    /// engine refused it (nothing ran: forgotten), or its caller dropped it (they may have run:
    /// abandoned).
    pub(crate) fn unfinished(&self, ids: &[Key], ran: bool) {
        {
            let mut state = self.lock();
            for id in ids {
                if let Some(Entry::Running { fast }) = state.map.get(id) {
                    let fast = *fast;
                    if ran {
                        state.map.insert(id.clone(), Entry::Abandoned { fast });
                    } else {
                        state.map.remove(id);
                    }
                }
            }
        }
        self.wake();
    }

    fn wake(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.changed.notify_waiters();
        }
    }

    /// Waits for the answer of an earlier copy of `call` (planned with `digest`); `None` when
    /// it did not run (the engine refused its turn).
    pub(crate) async fn wait(
        &self,
        key: &Key,
        call: &ToolCall,
        digest: Digest,
    ) -> Option<ToolDispatchResult> {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let _count = Waiting(&self.waiters);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.lock().map.get(key) {
                Some(Entry::Answered { fast, result }) if *fast == digest.fast => {
                    return Some((**result).clone());
                }
                Some(Entry::Abandoned { .. }) => return Some(outcome_unknown(call, ABANDONED)),
                Some(Entry::Running { .. }) => {}
                // Forgotten (its turn was refused), or evicted and replaced.
                _ => return None,
            }
            notified.await;
        }
    }

    /// How many answers are kept now.
    pub(crate) fn len(&self) -> usize {
        let state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.as_ref().map_or(0, |s| s.order.len())
    }
}

const ABANDONED: &str = "the turn running it was abandoned by its caller";

/// A turn's start gate with a journal: the calls that need an intent, by id, with the digest and
/// effect their plan recorded. An intent on disk then means that its call started — after a crash
/// a call that never started has none, and runs on the retry.
#[derive(Debug)]
pub(crate) struct Intents {
    journal: Journal,
    session: Arc<str>,
    guarded: HashMap<Arc<str>, (String, Effect)>,
}

impl StartGate for Intents {
    fn guards(&self, call: &ToolCall) -> bool {
        self.guarded.contains_key(&call.id)
    }

    fn open<'a>(&'a self, call: &'a ToolCall) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let Some((digest, effect)) = self.guarded.get(&call.id) else {
                return Ok(());
            };
            let intent = Write::Call {
                session: Arc::clone(&self.session),
                id: key_of(call),
                record: Box::new(CallRecord {
                    tool: call.name.to_string(),
                    digest: digest.clone(),
                    effect: effect.as_str().to_string(),
                    at_ms: self.journal.now_ms(),
                    answer: None,
                    dropped: None,
                }),
            };
            // Made durable with every other write waiting now (the group commit): the calls
            // starting at this moment, in every session, share one flush.
            self.journal.write(vec![intent]).await.map_err(|e| match e {
                JournalError::Fenced { .. } => "another node owns the session now".to_string(),
                e => format!("the journal cannot record the call ({e})"),
            })
        })
    }
}

/// Why a call whose intent the journal holds, and no answer, is `outcome_unknown`: the engine
/// stopped while it ran, or its journal could not record the answer (then the answer given, and
/// the one a later copy reads from the journal's intent, are the same).
pub(crate) const ENGINE_STOPPED: &str =
    "the engine stopped, or its journal failed to record the answer,";

/// Whether a call that may have run (its turn was dropped, the engine stopped, its answer was
/// not recorded) runs again when a copy of it comes: only a read-only or idempotent one.
pub(crate) fn may_run_again(effect: Option<Effect>) -> bool {
    matches!(effect, Some(Effect::ReadOnly | Effect::Idempotent))
}

fn no_longer_kept(call: &ToolCall, why: &str) -> ToolDispatchResult {
    refusal(
        call,
        format!(
            "tool_use_id {} was answered earlier in this session and its answer is no longer \
             kept ({why}); it is not run again — send the call with a new tool_use_id",
            call.id
        ),
    )
}

struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn other_arguments(call: &ToolCall) -> ToolDispatchResult {
    refusal(
        call,
        format!(
            "tool_use_id {} was used with other arguments (or another tool) earlier in this \
             session; not run — a retry must send the same call, a new call a new tool_use_id",
            call.id
        ),
    )
}

/// The session's locked state, made if it was not yet ([`Answers::lock`]).
struct Locked<'a>(MutexGuard<'a, Option<Box<State>>>);

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        match &*self.0 {
            Some(state) => state,
            None => unreachable!("Answers::lock makes the state before handing it out"),
        }
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.0.get_or_insert_with(Box::default)
    }
}

impl State {
    fn remember(
        &mut self,
        key: &Key,
        digest: Digest,
        result: Arc<ToolDispatchResult>,
        answers: &Answers,
    ) {
        let size = size_of(&result);
        let fast = digest.fast;
        match self.map.entry(key.clone()) {
            MapEntry::Occupied(mut o) => {
                if let Entry::Answered { result: old, .. } = o.get() {
                    self.bytes -= size_of(old);
                    self.order.retain(|x| x != key);
                }
                o.insert(Entry::Answered { fast, result });
            }
            MapEntry::Vacant(v) => {
                v.insert(Entry::Answered { fast, result });
            }
        }
        if self.order.capacity() == 0 {
            // Most sessions answer a few calls: room for one, then doubling.
            self.order.reserve_exact(1);
        }
        self.order.push_back(key.clone());
        self.bytes += size;
        let retention = &answers.limits.retention;
        // Over the engine's budget (as last reported): this session, which grows, pays.
        let floor = if answers.limits.over() {
            SHED_FLOOR
        } else {
            usize::MAX
        };
        while self.order.len() > retention.answers
            || (self.bytes > retention.bytes && self.order.len() > 1)
            || self.order.len() > floor
        {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(Entry::Answered { result, .. }) = self.map.remove(&old) {
                self.bytes -= size_of(&result);
            }
            // With a journal the answer is still there; without, the id is remembered as
            // answered so a late retry is refused instead of run again.
            if answers.journal.is_none() {
                let forgotten = self.forgotten.get_or_insert_with(Box::default);
                if forgotten.set.insert(old.hash) {
                    forgotten.order.push_back(old.hash);
                }
                while forgotten.order.len() > FORGOTTEN_IDS {
                    if let Some(h) = forgotten.order.pop_front() {
                        forgotten.set.remove(&h);
                    }
                }
            }
        }
        self.report(&answers.limits);
    }

    /// Tells the engine's count what this session's answers cost now, if it moved by
    /// [`REPORT_EVERY`] since it last did.
    fn report(&mut self, limits: &Limits) {
        let cost = self.bytes + self.order.len() * ANSWER_OVERHEAD;
        if cost.abs_diff(self.charged) < REPORT_EVERY {
            return;
        }
        if cost > self.charged {
            limits
                .used
                .fetch_add(cost - self.charged, Ordering::Relaxed);
        } else {
            limits
                .used
                .fetch_sub(self.charged - cost, Ordering::Relaxed);
        }
        self.charged = cost;
    }
}

impl Drop for Answers {
    /// A session's answers leave the engine's count with it.
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(state) = state.as_ref() {
            self.limits.used.fetch_sub(state.charged, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, args: Value) -> ToolCall {
        ToolCall::new(id, "t", args)
    }

    #[test]
    fn the_in_memory_digest_tells_numbers_apart_as_their_text_does() {
        for durable in [false, true] {
            let of = |v: Value| Digest::of(&call("a", json!({ "n": v })), durable);
            assert_ne!(of(json!(1)), of(json!(1.0)), "1 and 1.0");
            assert_ne!(of(json!(1)), of(json!(-1)));
            assert_ne!(of(json!(-1)), of(json!(u64::MAX)));
            assert_ne!(of(json!(0.5)), of(json!(0.25)));
            assert_eq!(of(json!(7)), of(json!(7)));
            // Keys in another order are the same call.
            let a = Digest::of(&call("a", json!({"x": 1, "y": [1, 2.5]})), durable);
            let b = Digest::of(&call("a", json!({"y": [1, 2.5], "x": 1})), durable);
            assert_eq!(a, b);
        }
    }

    #[test]
    fn the_journal_digest_is_the_lowercase_hex_of_the_sha_256() {
        // What journals already written hold: two lowercase hex digits per byte, in order.
        let sha: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xa5);
        let d = Digest {
            fast: 0,
            sha: Some(sha),
        };
        let expected: String = sha.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(d.hex(), expected);
        assert_eq!(Digest { fast: 0, sha: None }.hex(), "");
    }

    #[test]
    fn a_turn_with_a_repeated_or_empty_id_is_refused_whole_at_any_size() {
        for n in [2, 3, 16, 17, 40] {
            let calls: Vec<ToolCall> = (0..n).map(|i| call(&format!("c{i}"), json!({}))).collect();
            assert!(!Answers::refused_whole(&calls), "{n} distinct ids");
            for (i, j) in [(0, n - 1), (n / 2, n / 2 - 1), (n - 2, n - 1)] {
                let mut twice = calls.clone();
                twice[i] = call(&format!("c{j}"), json!({}));
                if i != j {
                    assert!(Answers::refused_whole(&twice), "{n} calls, {i} repeats {j}");
                }
            }
            let mut empty = calls.clone();
            empty[n - 1] = call("", json!({}));
            assert!(Answers::refused_whole(&empty), "{n} calls, one empty id");
        }
        assert!(!Answers::refused_whole(&[call("a", json!({}))]));
    }

    #[test]
    fn a_session_that_answered_nothing_keeps_no_state() {
        let answers = Answers::new(Arc::from("s"), Arc::default(), None);
        assert!(answers.state.lock().unwrap().is_none());
        assert_eq!(answers.len(), 0);
        assert!(
            answers.state.lock().unwrap().is_none(),
            "len() makes nothing"
        );
    }
}
