//! Property: whatever a turn mixes — valid and invalid calls, unknown tools, duplicate ids,
//! panicking, slow and cancelled calls, paths that attack the workspace — every call gets exactly
//! one result, in call order, with a code from the stable set, and nothing outside the workspace
//! changes. Runs the real file tools on a temp workspace beside an `outside` sentinel directory.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::common;

use common::TURN_BOUND;

use common::workspace::Confined;
use proptest::prelude::*;
use serde_json::{Value, json};
use switchboard::tools::{edit_file, glob, read_file, write_file};
use switchboard::{Engine, ErrorCode, Handler, ToolCall, ToolDispatchResult, ToolSpec};

/// Paths a model may legitimately use.
const INSIDE_PATHS: [&str; 5] = [
    "a.txt",
    "sub/b.txt",
    "new.txt",
    "sub/deeper/c.txt",
    "~/t.txt",
];

/// Paths that try to leave the workspace (they must never succeed).
fn attack_paths(base: &Path) -> Vec<String> {
    vec![
        "../outside/secret.txt".into(),
        "sub/../../outside/secret.txt".into(),
        base.join("outside/secret.txt").display().to_string(),
        base.join("outside/new.txt").display().to_string(),
        base.join("ws-evil/x").display().to_string(),
        "out/secret.txt".into(),
        "out/new.txt".into(),
        "leak".into(),
        "dangling".into(),
        "proc/etc/hostname".into(),
        "/etc/hostname".into(),
    ]
}

#[derive(Debug, Clone)]
enum Kind {
    Read(usize),
    Write(usize, String),
    Edit(usize, String, String),
    Glob(usize),
    Attack(u8, usize),
    Invalid(usize),
    Unknown(String),
    Panic(bool),
    Slow(u64, bool),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (0..INSIDE_PATHS.len()).prop_map(Kind::Read),
        (0..INSIDE_PATHS.len(), "[a-z \n]{0,20}").prop_map(|(p, c)| Kind::Write(p, c)),
        (0..INSIDE_PATHS.len(), "[a-z]{1,3}", "[A-Z]{0,3}")
            .prop_map(|(p, o, n)| Kind::Edit(p, o, n)),
        (0..6usize).prop_map(Kind::Glob),
        (0..3u8, 0..11usize).prop_map(|(t, p)| Kind::Attack(t, p)),
        (0..6usize).prop_map(Kind::Invalid),
        "[a-zA-Z_é]{0,12}".prop_map(Kind::Unknown),
        any::<bool>().prop_map(Kind::Panic),
        (0..4u64, any::<bool>()).prop_map(|(ms, safe)| Kind::Slow(ms, safe)),
    ]
}

#[derive(Debug, Clone)]
struct Turn {
    kinds: Vec<Kind>,
    /// Give call `.1` the id of call `.0` (when both exist and differ).
    duplicate: Option<(usize, usize)>,
    /// Cancel the turn after this many microseconds.
    cancel_after_us: Option<u64>,
    /// Run on a session (cancelling the session) rather than the shared dispatch.
    on_session: bool,
}

fn turn() -> impl Strategy<Value = Turn> {
    (
        prop::collection::vec(kind(), 1..12),
        prop::option::weighted(0.15, (0..12usize, 0..12usize)),
        prop::option::weighted(0.3, 0..3_000u64),
        any::<bool>(),
    )
        .prop_map(|(kinds, duplicate, cancel_after_us, on_session)| Turn {
            kinds,
            duplicate,
            cancel_after_us,
            on_session,
        })
}

/// Everything under `dir`: relative path, kind, content or link target, mode.
fn snapshot(dir: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode();
            let what = if meta.is_symlink() {
                format!("link {:?}", std::fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                walk(&path, root, out);
                format!("dir {mode:o}")
            } else {
                format!("file {mode:o} {:?}", std::fs::read(&path).unwrap())
            };
            out.push((rel, what));
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The confinement layout with files on both sides and symlinks out of the workspace.
struct Fixture {
    dir: Confined,
}

impl Fixture {
    fn new() -> Self {
        let dir = Confined::new(
            &["ws/sub", "outside/nested"],
            &[
                ("outside/secret.txt", "secret abc\n"),
                ("outside/nested/deep.txt", "deep abc"),
                ("ws-evil/x", "evil abc"),
                ("ws/a.txt", "alpha abc\n"),
                ("ws/sub/b.txt", "beta abc\r\n"),
            ],
        );
        let base = &dir.base;
        dir.link(base.join("outside"), "out");
        dir.link("../outside/secret.txt", "leak");
        dir.link(base.join("outside/missing.txt"), "dangling");
        dir.link("/proc/self/root", "proc");
        Fixture { dir }
    }

    /// Everything outside the workspace (the sentinel and the sibling-prefix directory).
    fn outside(&self) -> Vec<(String, String)> {
        let mut all = snapshot(&self.dir.base.join("outside"));
        all.extend(snapshot(&self.dir.base.join("ws-evil")));
        all
    }

    fn engine(&self) -> Engine {
        let boom = |name: &str, kind: bool| {
            let handler = if kind {
                Handler::blocking::<_, String>(|_a, _c| panic!("boom"))
            } else {
                Handler::future::<_, _, String>(|_a: Value, _c| async move {
                    tokio::task::yield_now().await;
                    panic!("boom async")
                })
            };
            ToolSpec::new(name, "Panics.", json!({"type": "object"}), handler)
        };
        let slow = |name: &str, safe: bool| {
            ToolSpec::new(
                name,
                "Sleeps a few ms.",
                json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]}),
                Handler::future(|args: Value, _c| async move {
                    let ms = args["ms"].as_u64().unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(format!("slept {ms}"))
                }),
            )
            .concurrency_safe(safe)
        };
        Engine::builder()
            .tools([
                read_file::spec(),
                write_file::spec(),
                edit_file::spec(),
                glob::spec(),
                boom("boom", true),
                boom("boom_async", false),
                slow("slow", true),
                slow("slow_serial", false),
            ])
            .workspace(self.dir.ws.clone())
            .workers(2)
            .build()
            .unwrap()
    }

    /// The call for `kind`, and whether it attacks the workspace.
    fn call(&self, i: usize, kind: &Kind) -> (ToolCall, bool) {
        let id = format!("call-{i}");
        let attacks = attack_paths(&self.dir.base);
        let (name, args, attack): (String, Value, bool) = match kind {
            Kind::Read(p) => ("read_file".into(), json!({"path": INSIDE_PATHS[*p]}), false),
            Kind::Write(p, c) => (
                "write_file".into(),
                json!({"path": INSIDE_PATHS[*p], "content": c}),
                false,
            ),
            Kind::Edit(p, o, n) => (
                "edit_file".into(),
                json!({"path": INSIDE_PATHS[*p], "old_text": o, "new_text": n}),
                false,
            ),
            Kind::Glob(g) => {
                let pattern = ["**", "*.txt", "sub/**", "out/*", "**/secret*", "~/*"][*g];
                ("glob".into(), json!({"pattern": pattern}), false)
            }
            Kind::Attack(tool, p) => {
                let path = &attacks[*p];
                match tool {
                    0 => ("read_file".into(), json!({"path": path}), true),
                    1 => (
                        "write_file".into(),
                        json!({"path": path, "content": "pwned"}),
                        true,
                    ),
                    _ => (
                        "edit_file".into(),
                        json!({"path": path, "old_text": "abc", "new_text": "pwned"}),
                        true,
                    ),
                }
            }
            Kind::Invalid(v) => {
                let (name, args) = [
                    ("read_file", json!({"path": 5})),
                    ("read_file", json!({"path": "a.txt", "limit": 0})),
                    ("write_file", json!({"path": "a.txt"})),
                    (
                        "edit_file",
                        json!({"path": "a.txt", "old_text": "", "new_text": "x"}),
                    ),
                    ("glob", json!({"pattern": "*", "extra": true})),
                    ("write_file", json!("not an object")),
                ][*v]
                    .clone();
                (name.into(), args, false)
            }
            Kind::Unknown(n) => (format!("nope_{n}"), json!({}), false),
            Kind::Panic(blocking) => (
                if *blocking { "boom" } else { "boom_async" }.into(),
                json!({}),
                false,
            ),
            Kind::Slow(ms, safe) => (
                if *safe { "slow" } else { "slow_serial" }.into(),
                json!({"ms": ms}),
                false,
            ),
        };
        (ToolCall::new(id, name, args), attack)
    }
}

fn check_result(r: &ToolDispatchResult) -> Result<(), TestCaseError> {
    match r.error {
        Some(code) => {
            prop_assert!(ErrorCode::ALL.contains(&code));
            prop_assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let prefix = format!("Error [{}]: ", code.as_str());
            prop_assert!(r.content.starts_with(&prefix), "{}", r.content);
            prop_assert_eq!(r.to_anthropic_block()["is_error"].clone(), json!(true));
        }
        None => {
            prop_assert!(!r.content.starts_with("Error ["), "{}", r.content);
            prop_assert!(r.to_anthropic_block().get("is_error").is_none());
        }
    }
    Ok(())
}

fn run_turn(turn: &Turn) -> Result<(), TestCaseError> {
    let f = Fixture::new();
    let before = f.outside();
    let ws_before = snapshot(f.dir.ws.root());
    let mut calls = Vec::new();
    let mut attacks = Vec::new();
    for (i, kind) in turn.kinds.iter().enumerate() {
        let (call, attack) = f.call(i, kind);
        calls.push(call);
        attacks.push(attack);
    }
    let mut duplicated = false;
    if let Some((a, b)) = turn.duplicate
        && a < calls.len()
        && b < calls.len()
        && a != b
    {
        calls[b].id = calls[a].id.clone();
        duplicated = true;
    }
    let ids: Vec<String> = calls.iter().map(|c| c.id.to_string()).collect();

    let results = common::proptest_runtime().block_on(async {
        let engine = f.engine();
        let session = engine.session();
        let token = if turn.on_session {
            session.turn_token()
        } else {
            engine.turn_token()
        };
        if let Some(us) = turn.cancel_after_us {
            let (token, session, on_session) = (token.clone(), session.clone(), turn.on_session);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(us)).await;
                if on_session {
                    session.cancel();
                } else {
                    token.cancel();
                }
            });
        }
        let dispatch = async {
            if turn.on_session {
                session
                    .dispatch_with_cancel(calls, token)
                    .await
                    .expect("engine available")
            } else {
                engine
                    .dispatch_with_cancel(calls, token)
                    .await
                    .expect("engine available")
            }
        };
        let results = tokio::time::timeout(TURN_BOUND, dispatch).await;
        engine.shutdown(Duration::from_millis(100)).await;
        results
    });
    let results = results.map_err(|_| TestCaseError::fail("the turn was not answered in time"))?;

    prop_assert_eq!(results.len(), ids.len(), "one result per call");
    let got = common::ids(&results);
    prop_assert_eq!(&got, &ids, "results in call order");
    for (r, attack) in results.iter().zip(&attacks) {
        check_result(r)?;
        if *attack {
            prop_assert!(
                !r.is_ok(),
                "an attack succeeded: {} {}",
                r.tool_name,
                r.content
            );
            prop_assert!(!r.content.contains("secret abc"), "{}", r.content);
        }
        if turn.cancel_after_us.is_none() {
            prop_assert_ne!(r.error, Some(ErrorCode::Cancelled), "nothing cancelled it");
        }
    }
    if duplicated {
        prop_assert!(
            results
                .iter()
                .all(|r| r.error == Some(ErrorCode::InvalidArguments)),
            "a duplicate id refuses the whole turn"
        );
        prop_assert_eq!(snapshot(f.dir.ws.root()), ws_before, "nothing ran");
    }
    prop_assert_eq!(
        f.outside(),
        before,
        "something outside the workspace changed"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_turns_answer_every_call_once_in_order_and_never_touch_the_outside(t in turn()) {
        run_turn(&t)?;
    }
}
