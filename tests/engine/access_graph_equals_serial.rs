//! Property (issue #14): running a turn as a dependency graph — each call starting as soon as the
//! earlier calls it conflicts with have finished — gives the same outcome as running its calls
//! one by one in model order. Random turns of up to 24 calls over a handful of files and
//! directories (reads, writes, edits, globs, bash, and custom tools on a named resource), every
//! handler delayed by a random few milliseconds so completion order varies; every result's
//! content and code, the final workspace bytes and the named resource's final state must equal
//! those of the serial run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;

use proptest::prelude::*;
use serde_json::{Value, json};
use switchboard::tools::{bash, edit_file, glob, read_file, write_file};
use switchboard::{
    Access, Engine, Handler, Resource, ToolCall, ToolDispatchResult, ToolSpec, Workspace,
};

const PATHS: [&str; 6] = [
    "a.txt",
    "b.txt",
    "sub/c.txt",
    "sub/deeper/d.txt",
    "sub",
    "new/e.txt",
];
const PATTERNS: [&str; 6] = [
    "**/*.txt",
    "sub/**",
    "sub/*.txt",
    "*.txt",
    "new/*",
    "sub/deeper/*",
];
const COMMANDS: [&str; 3] = [
    "cat a.txt sub/c.txt 2>&1",
    "echo z >> sub/c.txt && ls -R",
    "mkdir -p new && echo made > new/e.txt",
];

#[derive(Debug, Clone)]
enum Kind {
    Read(usize),
    Write(usize, String),
    Edit(usize, String, String),
    Glob(usize),
    Bash(usize),
    TallyAdd(char),
    TallyGet,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        4 => (0..PATHS.len()).prop_map(Kind::Read),
        4 => (0..PATHS.len(), "[a-c]{0,6}").prop_map(|(p, c)| Kind::Write(p, c)),
        3 => (0..PATHS.len(), "[a-c]{1,2}", "[A-C]{0,2}").prop_map(|(p, o, n)| Kind::Edit(p, o, n)),
        2 => (0..PATTERNS.len()).prop_map(Kind::Glob),
        1 => (0..COMMANDS.len()).prop_map(Kind::Bash),
        2 => prop::char::range('a', 'e').prop_map(Kind::TallyAdd),
        2 => Just(Kind::TallyGet),
    ]
}

/// Per-call handler delays (ms, by call id) and the named resource's state.
#[derive(Clone, Default)]
struct Shared {
    delays: Arc<Mutex<HashMap<String, u64>>>,
    tally: Arc<Mutex<String>>,
}

impl Shared {
    fn delay(&self, id: &str) -> Duration {
        let ms = self.delays.lock().unwrap().get(id).copied().unwrap_or(0);
        Duration::from_micros(ms * 700)
    }
}

/// The spec with its handler delayed by the call's delay (the access is kept).
fn delayed(mut spec: ToolSpec, shared: &Shared) -> ToolSpec {
    let shared = shared.clone();
    spec.handler = match spec.handler.clone() {
        Handler::Blocking(f) => Handler::blocking(move |args, ctx| {
            std::thread::sleep(shared.delay(&ctx.call_id));
            f(args, ctx)
        }),
        Handler::Async(f) => Handler::future(move |args, ctx| {
            let f = Arc::clone(&f);
            let pause = shared.delay(&ctx.call_id);
            async move {
                tokio::time::sleep(pause).await;
                f(args, ctx).await
            }
        }),
        inline => inline,
    };
    spec
}

/// Two custom tools on one named resource: `tally_add` reads the tally, waits, then writes it
/// back with a character appended (an overlap of two adds would lose one); `tally_get` waits,
/// then reads it.
fn tally_tools(shared: &Shared) -> Vec<ToolSpec> {
    let (add, get) = (shared.clone(), shared.clone());
    vec![
        ToolSpec::new(
            "tally_add",
            "Appends a character to the tally.",
            json!({"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]}),
            Handler::future(move |args: Value, ctx| {
                let shared = add.clone();
                async move {
                    let before = shared.tally.lock().unwrap().clone();
                    tokio::time::sleep(shared.delay(&ctx.call_id)).await;
                    let after = format!("{before}{}", args["c"].as_str().unwrap_or("?"));
                    *shared.tally.lock().unwrap() = after.clone();
                    Ok(after)
                }
            }),
        )
        .access(|_, _| Ok(Access::write(Resource::named("tally")))),
        ToolSpec::new(
            "tally_get",
            "Reads the tally.",
            json!({"type": "object"}),
            Handler::future(move |_args: Value, ctx| {
                let shared = get.clone();
                async move {
                    tokio::time::sleep(shared.delay(&ctx.call_id)).await;
                    Ok(shared.tally.lock().unwrap().clone())
                }
            }),
        )
        .concurrency_safe(true)
        .access(|_, _| Ok(Access::read(Resource::named("tally")))),
    ]
}

fn engine(ws: &Workspace, shared: &Shared) -> Engine {
    let mut tools: Vec<ToolSpec> = [
        read_file::spec(),
        write_file::spec(),
        edit_file::spec(),
        glob::spec(),
        bash::spec(),
    ]
    .into_iter()
    .map(|s| delayed(s, shared))
    .collect();
    tools.extend(tally_tools(shared));
    Engine::builder()
        .tools(tools)
        .workspace(ws.clone())
        .workers(2)
        .build()
        .unwrap()
}

fn call(i: usize, kind: &Kind) -> ToolCall {
    let id = format!("c{i}");
    let (name, args) = match kind {
        Kind::Read(p) => ("read_file", json!({"path": PATHS[*p]})),
        Kind::Write(p, c) => ("write_file", json!({"path": PATHS[*p], "content": c})),
        Kind::Edit(p, o, n) => (
            "edit_file",
            json!({"path": PATHS[*p], "old_text": o, "new_text": n}),
        ),
        Kind::Glob(g) => ("glob", json!({"pattern": PATTERNS[*g]})),
        Kind::Bash(b) => ("bash", json!({"command": COMMANDS[*b]})),
        Kind::TallyAdd(c) => ("tally_add", json!({"c": c.to_string()})),
        Kind::TallyGet => ("tally_get", json!({})),
    };
    ToolCall::new(id, name, args)
}

fn fresh_workspace() -> (tempfile::TempDir, Workspace) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("a.txt"), "abc\n").unwrap();
    std::fs::write(root.join("sub/c.txt"), "cab\n").unwrap();
    std::fs::write(root.join("sub/deeper/d.txt"), "bca").unwrap();
    let ws = Workspace::open(root).unwrap();
    (tmp, ws)
}

/// Every entry under `dir`: relative path, and `dir` or the file's bytes.
fn tree(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, Option<Vec<u8>>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            if path.is_dir() {
                walk(&path, root, out);
                out.push((rel, None));
            } else {
                out.push((rel, Some(std::fs::read(&path).unwrap())));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

type Outcome = (
    Vec<(String, Option<switchboard::ErrorCode>)>,
    Vec<(String, Option<Vec<u8>>)>,
    String,
);

fn outcome(results: &[ToolDispatchResult], root: &Path, shared: &Shared) -> Outcome {
    (
        results
            .iter()
            .map(|r| (without_times(&r.content), r.error))
            .collect(),
        tree(root),
        shared.tally.lock().unwrap().clone(),
    )
}

/// The content with the time in a "modified since read at …" refusal cut off (the two runs read
/// at different moments; the refusal itself must match).
fn without_times(content: &str) -> String {
    match content.split_once(" read it at ") {
        Some((head, _)) => format!("{head} read it at <time>"),
        None => content.to_string(),
    }
}

/// Runs the turn as one dispatch (`together`) or call by call in model order.
fn run(kinds: &[Kind], delays: &[u64], together: bool) -> Outcome {
    let (tmp, ws) = fresh_workspace();
    let shared = Shared::default();
    *shared.delays.lock().unwrap() = delays
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("c{i}"), *d))
        .collect();
    let calls: Vec<ToolCall> = kinds.iter().enumerate().map(|(i, k)| call(i, k)).collect();
    let results = common::proptest_runtime().block_on(async {
        let engine = engine(&ws, &shared);
        let results = tokio::time::timeout(Duration::from_secs(60), async {
            if together {
                engine.dispatch(calls).await.unwrap()
            } else {
                let mut all = Vec::new();
                for c in calls {
                    all.extend(engine.dispatch(vec![c]).await.unwrap());
                }
                all
            }
        })
        .await
        .expect("the turn finishes");
        engine.shutdown(Duration::from_secs(2)).await;
        results
    });
    outcome(&results, tmp.path(), &shared)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_turn_run_as_a_graph_equals_its_calls_run_one_by_one_in_model_order(
        (kinds, delays) in prop::collection::vec(kind(), 1..=24)
            .prop_flat_map(|kinds| {
                let n = kinds.len();
                (Just(kinds), prop::collection::vec(0..6u64, n))
            })
    ) {
        let graph = run(&kinds, &delays, true);
        let serial = run(&kinds, &delays, false);
        prop_assert_eq!(&graph.0, &serial.0, "results differ");
        prop_assert_eq!(&graph.1, &serial.1, "workspace differs");
        prop_assert_eq!(&graph.2, &serial.2, "tally differs");
    }
}
