//! Workloads: the tools registered only for load runs, and the turns every session sends.
//!
//! The workload tools take the schema of `../shared/bench/peers.md` (`{"text": string, "n":
//! integer ≥ 0}`, no other property) and come in a concurrency-safe and a serial variant each:
//! `noop`/`noop_serial` (inline, return `text`), `sleep`/`sleep_serial` (async, sleep `--sleep-ms`
//! first), `cpu`/`cpu_serial` (inline, FNV-1a over `text` repeated `n` times). `--tool builtin`
//! uses the five real tools instead, on a temporary workspace where every session has its own
//! subdirectory. A [`Workload`] says what a turn looks like; a [`SessionTurns`] builds one
//! session's turns from [`Templates`] made once (shared by all sessions, except for builtin runs
//! whose paths differ per session; a turn is a clone of K templates), choosing each call's variant — safe or serial, a valid call, an unknown tool or invalid arguments — with a
//! small seeded generator, so the engine and the direct baseline see exactly the same turns.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::protocol::ToolCall;
pub use crate::testing::{CPU_WORK_MAX, TEXT, load_tools, schema};
use crate::testing::{NAMES, WRITE_NAMES};
use crate::tool::{Handler, ToolSpec};

/// `--tool`: which tools the calls go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolKind {
    /// Inline, returns `text` (`noop`, or `noop_serial`).
    Noop,
    /// Async, sleeps `--sleep-ms` (`sleep`, or `sleep_serial`).
    Sleep,
    /// Inline, hashes `text` `--cpu-work` times (`cpu`, or `cpu_serial`).
    Cpu,
    /// Half noop, a quarter cpu, a quarter sleep.
    Mixed,
    /// Async writes of (simulated) files, sleeping `--sleep-ms`: `write` writes file N for call
    /// slot N (a turn's writes overlap); with `--serial-ratio 1` every call goes to
    /// `write_same_file` (one file: they run one after another).
    Write,
    /// The five built-in tools on a temporary workspace (write, read, edit, glob, bash per five calls).
    Builtin,
}

impl ToolKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            ToolKind::Noop => "noop",
            ToolKind::Sleep => "sleep",
            ToolKind::Cpu => "cpu",
            ToolKind::Mixed => "mixed",
            ToolKind::Write => "write",
            ToolKind::Builtin => "builtin",
        }
    }
}

/// The name used for unknown-tool calls.
pub const UNKNOWN_TOOL: &str = "no_such_tool";

/// The fault-injection tools (`--faults`): one panics, one hangs until its timeout.
const FAULT_NAMES: [&str; 2] = ["fault_panic", "fault_hang"];

/// The timeout of `fault_hang` (it never answers by itself).
pub const HANG_TIMEOUT: Duration = Duration::from_millis(200);

/// The panic message of `fault_panic` (a panic hook can recognise it).
pub const INJECTED_PANIC: &str = "switchboard load: injected fault";

/// Faults injected at given rates (`--faults panic=0.01,hang=0.01,cancel=0.01`): a share of calls
/// go to a tool that panics or one that hangs until its timeout, and a share of turns are
/// cancelled a moment after they start.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Share of calls that panic.
    pub panic: f64,
    /// Share of calls that hang until their timeout.
    pub hang: f64,
    /// Share of turns cancelled 0–2 ms after they start.
    pub cancel: f64,
}

impl Faults {
    /// True when any fault is injected.
    pub fn any(&self) -> bool {
        self.panic > 0.0 || self.hang > 0.0 || self.cancel > 0.0
    }
}

/// Parses `panic=0.01,hang=0.01,cancel=0.01` (any subset; each a share from 0 to 1).
pub fn parse_faults(text: &str) -> Result<Faults, String> {
    let mut faults = Faults::default();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("expected KIND=SHARE, got {part:?}"))?;
        let share: f64 = value
            .trim()
            .parse()
            .map_err(|_| format!("{value:?} is not a number"))?;
        if !(0.0..=1.0).contains(&share) {
            return Err(format!("{key}={value}: a share is from 0 to 1"));
        }
        match key.trim() {
            "panic" => faults.panic = share,
            "hang" => faults.hang = share,
            "cancel" => faults.cancel = share,
            other => return Err(format!("unknown fault {other:?} (panic, hang, cancel)")),
        }
    }
    if faults.panic + faults.hang > 1.0 {
        return Err("panic + hang must not exceed 1".into());
    }
    Ok(faults)
}

/// The fault-injection tools, registered only when `--faults` is given.
pub fn fault_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            FAULT_NAMES[0],
            "Panics (load fault injection).",
            schema(),
            Handler::inline::<_, String>(|_, _| panic!("{INJECTED_PANIC}")),
        )
        .concurrency_safe(true),
        ToolSpec::new(
            FAULT_NAMES[1],
            "Never answers; times out (load fault injection).",
            schema(),
            Handler::future(|_, _| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(String::new())
            }),
        )
        .concurrency_safe(true)
        .timeout(HANG_TIMEOUT),
    ]
}

/// The builtin tools a builtin turn cycles through, in slot order.
const BUILTIN_NAMES: [&str; 5] = ["write_file", "read_file", "edit_file", "glob", "bash"];

/// What one call slot of a turn is, when a workload fixes it instead of drawing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A call to a tool that is not registered.
    Unknown,
    /// A call whose arguments break the schema.
    Invalid,
}

/// What every turn of a run looks like.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Which tools the calls go to.
    pub tool: ToolKind,
    /// Calls in each turn.
    pub calls_per_turn: usize,
    /// How long `sleep` calls sleep.
    pub sleep: Duration,
    /// `n` of `cpu` calls (hash rounds).
    pub cpu_work: u64,
    /// Share of calls sent to the serial variant.
    pub serial_ratio: f64,
    /// Share of calls that are errors (half unknown tools, half invalid arguments).
    pub error_rate: f64,
    /// Fixed slots, repeated over the turn, instead of drawing (e.g. `[Unknown, Invalid]`).
    pub pattern: Option<Vec<Slot>>,
    /// Seed of the per-session generators.
    pub seed: u64,
    /// Injected faults.
    pub faults: Faults,
}

/// The directory of session `index` inside a builtin workspace.
pub fn session_dir(index: usize) -> String {
    format!("s{index}")
}

/// SplitMix64: a tiny, fast, seeded generator (quality is ample for picking call variants).
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One call before it gets its id: which tool (an index into the session's names) and the
/// arguments.
#[derive(Debug)]
struct Template {
    name: usize,
    args: Value,
}

/// The templates of one call slot.
#[derive(Debug)]
struct SlotTemplates {
    /// Valid calls: one per workload tool (in [`NAMES`] order), or the slot's one builtin call.
    valid: Vec<Template>,
    unknown: Template,
    invalid: Template,
    panic: Template,
    hang: Template,
}

/// The call templates of a run, one entry per call slot. Read-only: every session of a
/// workload-tool run shares one (cloning a `Value` only reads it, so sessions on different cores
/// do not contend); builtin runs build one per session, whose paths differ.
#[derive(Debug)]
pub struct Templates {
    slots: Vec<SlotTemplates>,
}

impl Templates {
    /// The templates of session `index` (the index matters only for builtin runs).
    fn new(workload: &Workload, index: usize) -> Templates {
        let bad_args = json!({"text": TEXT, "n": -1});
        let unknown = names_for(workload.tool).len() - 1;
        let slots = (0..workload.calls_per_turn)
            .map(|i| {
                let valid: Vec<Template> = if workload.tool == ToolKind::Builtin {
                    vec![builtin_call(index, i)]
                } else {
                    (0..base_names(workload.tool).len())
                        .map(|v| {
                            let n = if workload.tool != ToolKind::Write && v / 2 == 2 {
                                workload.cpu_work
                            } else {
                                i as u64
                            };
                            Template {
                                name: v,
                                args: json!({"text": TEXT, "n": n}),
                            }
                        })
                        .collect()
                };
                SlotTemplates {
                    panic: Template {
                        name: unknown - 2,
                        args: json!({"text": TEXT, "n": 0}),
                    },
                    hang: Template {
                        name: unknown - 1,
                        args: json!({"text": TEXT, "n": 0}),
                    },
                    unknown: Template {
                        name: unknown,
                        args: valid[0].args.clone(),
                    },
                    invalid: Template {
                        name: valid[0].name,
                        args: bad_args.clone(),
                    },
                    valid,
                }
            })
            .collect();
        Templates { slots }
    }

    /// Templates every session can share, or `None` when each session needs its own (builtin).
    pub fn shared(workload: &Workload) -> Option<Arc<Templates>> {
        (workload.tool != ToolKind::Builtin).then(|| Arc::new(Templates::new(workload, 0)))
    }
}

/// The tool names a session's calls use: the workload's, the two fault tools, the unknown one
/// last.
fn names_for(tool: ToolKind) -> Vec<Arc<str>> {
    base_names(tool)
        .iter()
        .chain(FAULT_NAMES.iter())
        .chain(std::iter::once(&UNKNOWN_TOOL))
        .map(|n| Arc::from(*n))
        .collect()
}

/// The workload tools a run's valid calls go to.
fn base_names(tool: ToolKind) -> &'static [&'static str] {
    match tool {
        ToolKind::Builtin => &BUILTIN_NAMES,
        ToolKind::Write => &WRITE_NAMES,
        _ => &NAMES,
    }
}

/// Which template a call slot uses this turn.
#[derive(Debug, Clone, Copy)]
enum Choice {
    Valid(usize),
    Unknown,
    Invalid,
    Panic,
    Hang,
}

/// Builds the turns of one session. Its ids and tool names are its own `Arc`s (a session's
/// refcounts are not shared with sessions on other cores); its templates may be shared.
#[derive(Debug)]
pub struct SessionTurns {
    workload: Arc<Workload>,
    ids: Vec<Arc<str>>,
    names: Vec<Arc<str>>,
    templates: Arc<Templates>,
    rng: SplitMix64,
    turn: u64,
    /// What every `tool_use_id` starts with (see [`SessionTurns::for_warm_up`]).
    id_prefix: &'static str,
}

impl SessionTurns {
    /// The turn builder of session `index`, on `shared` templates if given.
    pub fn new(workload: Arc<Workload>, shared: Option<&Arc<Templates>>, index: usize) -> Self {
        let ids = Vec::with_capacity(workload.calls_per_turn);
        let templates = match shared {
            Some(t) => Arc::clone(t),
            None => Arc::new(Templates::new(&workload, index)),
        };
        let seed = workload
            .seed
            .wrapping_mul(0x2545_f491_4f6c_dd1d)
            .wrapping_add(index as u64);
        SessionTurns {
            names: names_for(workload.tool),
            workload,
            ids,
            templates,
            rng: SplitMix64(seed),
            turn: 0,
            id_prefix: "toolu_",
        }
    }

    /// The same turns with ids of their own (`toolu_warmup_…`), for the warm-up before a
    /// measured phase on the same sessions: a session answers an id it has already answered from
    /// its stored answers (or refuses it once they are dropped), so a measured turn that reused a
    /// warm-up id would not run.
    pub fn for_warm_up(mut self) -> Self {
        self.id_prefix = "toolu_warmup_";
        self
    }

    /// The `tool_use_id`s of the last turn, in call order (each turn has its own, as a model's
    /// do: a session answers an id it has seen from its stored answers).
    pub fn ids(&self) -> &[Arc<str>] {
        &self.ids
    }

    /// Whether to cancel the next turn (`--faults cancel=…`), and how long after it starts.
    pub fn cancel_after(&mut self) -> Option<Duration> {
        let share = self.workload.faults.cancel;
        (share > 0.0 && self.rng.next_f64() < share)
            .then(|| Duration::from_micros(self.rng.next_u64() % 2_000))
    }

    /// The next turn's calls.
    pub fn next_turn(&mut self) -> Vec<ToolCall> {
        let k = self.workload.calls_per_turn;
        self.turn += 1;
        let turn = self.turn;
        self.ids.clear();
        let prefix = self.id_prefix;
        self.ids
            .extend((0..k).map(|i| Arc::from(format!("{prefix}{turn:x}_{i:02}"))));
        let mut calls = Vec::with_capacity(k);
        for i in 0..k {
            let choice = self.choose(i);
            let slot = &self.templates.slots[i];
            let template = match choice {
                Choice::Valid(v) => &slot.valid[v],
                Choice::Unknown => &slot.unknown,
                Choice::Invalid => &slot.invalid,
                Choice::Panic => &slot.panic,
                Choice::Hang => &slot.hang,
            };
            calls.push(ToolCall::new(
                Arc::clone(&self.ids[i]),
                Arc::clone(&self.names[template.name]),
                template.args.clone(),
            ));
        }
        calls
    }

    fn choose(&mut self, i: usize) -> Choice {
        let w = &*self.workload;
        if let Some(pattern) = &w.pattern
            && !pattern.is_empty()
        {
            return match pattern[i % pattern.len()] {
                Slot::Unknown => Choice::Unknown,
                Slot::Invalid => Choice::Invalid,
            };
        }
        let faults = w.faults;
        if faults.panic > 0.0 || faults.hang > 0.0 {
            let u = self.rng.next_f64();
            if u < faults.panic {
                return Choice::Panic;
            }
            if u < faults.panic + faults.hang {
                return Choice::Hang;
            }
        }
        if w.error_rate > 0.0 {
            let u = self.rng.next_f64();
            if u < w.error_rate / 2.0 {
                return Choice::Unknown;
            }
            if u < w.error_rate {
                return Choice::Invalid;
            }
        }
        let base = match w.tool {
            ToolKind::Builtin => return Choice::Valid(0),
            ToolKind::Write | ToolKind::Noop => 0,
            ToolKind::Sleep => 2,
            ToolKind::Cpu => 4,
            ToolKind::Mixed => match self.rng.next_f64() {
                x if x < 0.5 => 0,
                x if x < 0.75 => 4,
                _ => 2,
            },
        };
        let serial = w.serial_ratio > 0.0 && self.rng.next_f64() < w.serial_ratio;
        Choice::Valid(base + usize::from(serial))
    }
}

/// The builtin call of slot `slot` of session `session`: slots cycle through write, read, edit,
/// glob and bash ([`BUILTIN_NAMES`] order), each group of five on its own file, so every call of
/// a turn succeeds.
fn builtin_call(session: usize, slot: usize) -> Template {
    let dir = session_dir(session);
    let path = format!("{dir}/f{}.txt", slot / 5);
    let args = match slot % 5 {
        0 => json!({"path": path, "content": format!("alpha {session} {slot}\n{TEXT}\n")}),
        1 => json!({"path": path}),
        2 => json!({"path": path, "old_text": "alpha", "new_text": "beta"}),
        3 => json!({"pattern": format!("{dir}/*.txt")}),
        _ => json!({"command": if (slot / 5).is_multiple_of(2) { "true" } else { "echo hi" }}),
    };
    Template {
        name: slot % 5,
        args,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_tools_are_side_effect_tools_so_a_journal_records_every_call_twice() {
        // `load --compare-journal` measures intents and answers: a workload tool declaring
        // itself read-only would be journaled once, after it ran, and the figure would flatter.
        for spec in load_tools(Duration::ZERO) {
            assert_eq!(
                spec.effect,
                crate::tool::Effect::SideEffect,
                "{}",
                spec.name
            );
        }
    }

    fn workload(tool: ToolKind, k: usize) -> Workload {
        Workload {
            tool,
            calls_per_turn: k,
            sleep: Duration::from_millis(1),
            cpu_work: 10,
            serial_ratio: 0.0,
            error_rate: 0.0,
            pattern: None,
            seed: 1,
            faults: Faults::default(),
        }
    }

    #[test]
    fn faults_parse_and_refuse_nonsense() {
        let f = parse_faults("panic=0.01,hang=0.02,cancel=0.5").unwrap();
        assert_eq!((f.panic, f.hang, f.cancel), (0.01, 0.02, 0.5));
        assert!(parse_faults("panic=2").is_err());
        assert!(parse_faults("explode=0.1").is_err());
        assert!(parse_faults("panic").is_err());
    }

    #[test]
    fn fault_calls_go_to_the_fault_tools() {
        let mut w = workload(ToolKind::Noop, 4);
        w.faults = parse_faults("panic=0.5,hang=0.5").unwrap();
        let mut s = SessionTurns::new(Arc::new(w), None, 0);
        let turn = s.next_turn();
        assert!(turn.iter().all(|c| FAULT_NAMES.contains(&&*c.name)));
    }

    #[test]
    fn turns_have_k_calls_with_the_session_ids_in_order() {
        let mut s = SessionTurns::new(Arc::new(workload(ToolKind::Mixed, 8)), None, 3);
        let turn = s.next_turn();
        assert_eq!(turn.len(), 8);
        for (call, id) in turn.iter().zip(s.ids()) {
            assert_eq!(&call.id, id);
        }
    }

    #[test]
    fn warm_up_turns_never_reuse_the_ids_of_measured_turns() {
        let w = Arc::new(workload(ToolKind::Noop, 4));
        let mut warm = SessionTurns::new(Arc::clone(&w), None, 0).for_warm_up();
        let mut measured = SessionTurns::new(w, None, 0);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            warm.next_turn();
            measured.next_turn();
            for id in warm.ids().iter().chain(measured.ids()) {
                assert!(seen.insert(Arc::clone(id)), "{id} was used twice");
            }
        }
    }

    #[test]
    fn a_pattern_fixes_the_slots() {
        let mut w = workload(ToolKind::Noop, 2);
        w.pattern = Some(vec![Slot::Unknown, Slot::Invalid]);
        let turn = SessionTurns::new(Arc::new(w), None, 0).next_turn();
        assert_eq!(&*turn[0].name, UNKNOWN_TOOL);
        assert_eq!(turn[1].arguments["n"], -1);
    }

    #[test]
    fn error_and_serial_shares_follow_the_ratios() {
        let mut w = workload(ToolKind::Noop, 10);
        w.error_rate = 0.5;
        w.serial_ratio = 1.0;
        let w = Arc::new(w);
        let shared = Templates::shared(&w);
        assert!(shared.is_some());
        let mut s = SessionTurns::new(w, shared.as_ref(), 0);
        let (mut unknown, mut invalid, mut serial) = (0, 0, 0);
        for _ in 0..200 {
            for c in s.next_turn() {
                match &*c.name {
                    UNKNOWN_TOOL => unknown += 1,
                    "noop_serial" => serial += 1,
                    _ if c.arguments["n"] == -1 => invalid += 1,
                    _ => {}
                }
            }
        }
        assert!((400..600).contains(&unknown), "{unknown}");
        assert!((400..600).contains(&invalid), "{invalid}");
        assert_eq!(unknown + invalid + serial, 2000);
    }
}
