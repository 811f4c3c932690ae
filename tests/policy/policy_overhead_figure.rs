//! The figure (a benchmark, not a test; ignored by default): what the policy layer costs.
//! 64 sessions × turns of 8 `noop` calls, five engines measured in alternating rounds in one
//! process so the machine's noise hits all of them: no policy, a 20-rule policy, one in-process
//! PreToolUse hook, one persistent external hook (python, JSON lines), one per-call external
//! hook (`true`, a process per call).
//!
//! ```sh
//! cargo test --release --test policy -- --ignored --nocapture policy_overhead_figure::
//! ```

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard::policy::{Hook, Policy, PreDecision};
use switchboard::testing::{TEXT, load_tools};
use switchboard::{Engine, ToolCall};

const SESSIONS: usize = 64;
const CALLS: usize = 8;
const ROUNDS: usize = 6;

fn twenty_rules() -> Value {
    json!({"permissions": {
        "deny": ["bash(rm:*)", "bash(sudo:*)", "bash(curl:*)", "read_file(**/.env)",
                 "read_file(**/*.pem)", "write_file(.git/**)", "edit_file(.git/**)",
                 "mcp__github__*", "mcp__slack__*", "cpu_serial"],
        "ask": ["write_file(src/**)", "edit_file(src/**)", "bash(git push:*)",
                "mcp__fs__write*", "sleep_serial"],
        "allow": ["noop", "noop_serial", "glob", "read_file(src/**)", "bash(git status)"],
        "default": "allow"
    }})
}

fn hooks(kind: &str, command: &str) -> Value {
    json!({"hooks": {"PreToolUse": [{"matcher": "noop",
        "hooks": [{"type": kind, "command": command, "timeout": 30}]}]}})
}

const PERSISTENT: &str = "import json, sys\n\
for line in sys.stdin:\n\
\x20   print(json.dumps({'id': json.loads(line)['id']}), flush=True)\n";

struct Config {
    name: &'static str,
    engine: Engine,
    turns: usize,
}

fn build(policy: Option<Policy>, hook: Option<Hook>) -> Engine {
    let mut b = Engine::builder().tools(load_tools(Duration::from_millis(10)));
    if let Some(p) = policy {
        b = b.policy(p);
    }
    if let Some(h) = hook {
        b = b.hook(h);
    }
    b.build().unwrap()
}

/// One round: every session runs `turns` turns; returns (calls/s, turn latencies).
async fn round(engine: &Engine, turns: usize) -> (f64, Vec<Duration>) {
    let sessions: Vec<_> = (0..SESSIONS).map(|_| engine.session()).collect();
    let started = Instant::now();
    let runs = sessions.iter().enumerate().map(|(s, session)| async move {
        let mut lat = Vec::with_capacity(turns);
        for t in 0..turns {
            let calls: Vec<ToolCall> = (0..CALLS)
                .map(|c| {
                    ToolCall::new(
                        format!("s{s}t{t}c{c}"),
                        "noop",
                        json!({"text": TEXT, "n": 0}),
                    )
                })
                .collect();
            let begun = Instant::now();
            let results = session.dispatch(calls).await.unwrap();
            lat.push(begun.elapsed());
            assert!(
                results.iter().all(|r| r.error.is_none()),
                "{:?}",
                results[0]
            );
        }
        lat
    });
    let lat: Vec<Duration> = futures::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect();
    let secs = started.elapsed().as_secs_f64();
    ((SESSIONS * turns * CALLS) as f64 / secs, lat)
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * 0.99).round() as usize]
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: run it with --ignored --nocapture (release build)"]
async fn what_rules_and_hooks_cost_per_call() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hook.py");
    std::fs::write(&script, PERSISTENT).unwrap();
    let persistent = hooks("persistent", &format!("python3 {}", script.display()));
    let configs = vec![
        Config {
            name: "no policy",
            engine: build(None, None),
            turns: 400,
        },
        Config {
            name: "20-rule policy",
            engine: build(Some(Policy::from_json(&twenty_rules()).unwrap()), None),
            turns: 400,
        },
        Config {
            name: "in-process PreToolUse hook",
            engine: build(
                None,
                Some(Hook::pre("figure", |ev| {
                    if ev.tool_name == "never" {
                        PreDecision::Deny("x".into())
                    } else {
                        PreDecision::Continue
                    }
                })),
            ),
            turns: 400,
        },
        Config {
            name: "persistent external hook",
            engine: build(Some(Policy::from_json(&persistent).unwrap()), None),
            turns: 60,
        },
        Config {
            name: "per-call external hook",
            engine: build(
                Some(Policy::from_json(&hooks("command", "true")).unwrap()),
                None,
            ),
            turns: 2,
        },
    ];
    let mut best: Vec<(f64, Vec<Duration>)> = vec![(0.0, Vec::new()); configs.len()];
    for r in 0..=ROUNDS {
        for (i, c) in configs.iter().enumerate() {
            let (rate, lat) = round(&c.engine, c.turns).await;
            if r > 0 && rate > best[i].0 {
                // Round 0 warms up (and starts the persistent hook); the best round counts.
                best[i] = (rate, lat);
            }
        }
    }
    let base = best[0].0;
    println!(
        "| configuration | calls/s | vs no policy | added µs per call (amortised) | turn p99 |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (c, (rate, lat)) in configs.iter().zip(best) {
        println!(
            "| {} | {:.0} | {:.3} | {:.1} | {:.2} ms |",
            c.name,
            rate,
            rate / base,
            (1.0 / rate - 1.0 / base) * 1e6,
            p99(lat).as_secs_f64() * 1e3
        );
    }
    // Latency of one call alone (1 session, 1 call per turn): what a hook adds to a call's wait.
    println!();
    println!("| configuration | one call alone, mean | added |");
    println!("| --- | ---: | ---: |");
    let mut alone = Vec::new();
    for c in &configs {
        let session = c.engine.session();
        let n = if c.name.starts_with("per-call") {
            50
        } else {
            2_000
        };
        let mut total = Duration::ZERO;
        for t in 0..n {
            let calls = vec![ToolCall::new(
                format!("a{t}"),
                "noop",
                json!({"text": TEXT, "n": 0}),
            )];
            let begun = Instant::now();
            let r = session.dispatch(calls).await.unwrap();
            total += begun.elapsed();
            assert!(r[0].error.is_none());
        }
        alone.push(total.as_secs_f64() * 1e6 / n as f64);
    }
    for (c, us) in configs.iter().zip(&alone) {
        println!("| {} | {:.1} µs | {:.1} µs |", c.name, us, us - alone[0]);
    }
    for c in configs {
        c.engine.shutdown(Duration::from_secs(5)).await;
    }
}

/// Mean µs of `n` runs of `f` (after `n`, at most 200, unmeasured ones).
async fn mean_us<F, Fut>(n: usize, mut f: F) -> f64
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let warm = n.min(200);
    for i in 0..warm {
        f(i).await;
    }
    let begun = Instant::now();
    for i in 0..n {
        f(warm + i).await;
    }
    begun.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The engine process's `write` system calls so far (Linux `/proc/self/io`).
fn writes_so_far() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("syscw: ")
                    .and_then(|n| n.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// Where a lone call's time goes with a persistent hook: the hook's round trip alone (the
/// engine's `External::run`, no dispatch), a call that takes the waiting stack without any
/// process (an `ask` answered at once by an in-process approver), and the whole call; then the
/// hook alone with 512 requests in flight (what 64 sessions × 8 calls put on it), per request:
/// wall time and the engine's `write` calls. With `jq` installed, the same for a hook in jq.
///
/// ```sh
/// cargo test --release --test policy policy_overhead_figure::where_a_persistent_hook_call_spends_its_time -- --ignored --nocapture
/// ```
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: run it with --ignored --nocapture (release build)"]
async fn where_a_persistent_hook_call_spends_its_time() {
    use futures::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hook.py");
    std::fs::write(&script, PERSISTENT).unwrap();
    let jq = std::process::Command::new("jq")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let mut commands = vec![("python", format!("python3 {}", script.display()))];
    if jq {
        commands.push(("jq", "jq --unbuffered -c '{id: .id}'".to_string()));
    }
    let none = build(None, None);
    let asking = build(
        Some(
            Policy::from_json(&json!({"permissions": {"ask": ["noop"]}}))
                .unwrap()
                .approver(std::sync::Arc::new(|_req| async { Ok(()) }.boxed())),
        ),
        None,
    );
    let lone = |engine: &Engine| {
        let session = engine.session();
        move |i: usize| {
            let session = session.clone();
            async move {
                let calls = vec![ToolCall::new(
                    format!("a{i}"),
                    "noop",
                    json!({"text": TEXT, "n": 0}),
                )];
                let r = session.dispatch(calls).await.unwrap();
                assert!(r[0].error.is_none(), "{}", r[0].content);
            }
        }
    };
    let input = json!({"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "noop",
        "tool_input": {"text": TEXT, "n": 0}, "tool_use_id": "a1", "cwd": null});
    let place = switchboard::policy::HookPlace { workspace: None };
    println!(
        "| hook | round | no policy | waiting stack (ask, approved in-process) | hook round trip alone | whole call with the hook | 512 in flight: µs per request | engine writes per request |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, command) in commands {
        let hooked = build(
            Some(Policy::from_json(&hooks("persistent", &command)).unwrap()),
            None,
        );
        let hook = &hooked.policy().unwrap().external_hooks().pre[0];
        for round in 0..3 {
            let a = mean_us(2_000, lone(&none)).await;
            let b = mean_us(2_000, lone(&asking)).await;
            let c = mean_us(2_000, |_| async {
                let d = hook.run(&input, place).await;
                assert_eq!(d, PreDecision::Continue);
            })
            .await;
            let d = mean_us(2_000, lone(&hooked)).await;
            let bursts = 20;
            let writes = writes_so_far();
            let e = mean_us(bursts, |_| async {
                let all = (0..SESSIONS * CALLS).map(|_| hook.run(&input, place));
                for d in futures::future::join_all(all).await {
                    assert_eq!(d, PreDecision::Continue);
                }
            })
            .await
                / (SESSIONS * CALLS) as f64;
            // The warm-up bursts count too.
            let per = (writes_so_far() - writes) as f64 / (2 * bursts * SESSIONS * CALLS) as f64;
            println!(
                "| {name} | {round} | {a:.1} µs | {b:.1} µs | {c:.1} µs | {d:.1} µs | {e:.1} µs | {per:.3} |"
            );
        }
        hooked.shutdown(Duration::from_secs(5)).await;
    }
    for e in [none, asking] {
        e.shutdown(Duration::from_secs(5)).await;
    }
}
