//! `switchboard load` through the built binary: counts, error mix, the direct baseline, the
//! builtin tools, the peers set, idle sessions, the report directory and bad flags. Every run is
//! short and bounded (a child that outlives its bound is killed and the test fails); nothing here
//! asserts on timing.

use crate::common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::cli::switchboard;
use serde_json::Value;

/// Longest any one run may take.
const BOUND: Duration = Duration::from_secs(60);

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn load(args: &[&str]) -> Output {
    let mut child = switchboard()
        .arg("load")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("switchboard load {args:?} ran longer than {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        code: status.code(),
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

fn load_json(args: &[&str]) -> Value {
    let out = load(args);
    assert_eq!(out.code, Some(0), "{args:?} failed: {}", out.stderr);
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON document ({e}): {}", out.stdout))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn every_call_of_a_counted_run_is_answered_once_in_order() {
    let doc = load_json(&[
        "--sessions",
        "4",
        "--turns",
        "50",
        "--calls-per-turn",
        "8",
        "--tool",
        "noop",
        "--json",
    ]);
    assert_eq!(u(&doc["calls"]), 1600);
    assert_eq!(u(&doc["violations"]), 0);
    let engine = &doc["engine"];
    assert_eq!(u(&engine["turns"]), 200);
    assert_eq!(u(&engine["ok"]), 1600);
    assert_eq!(engine["stopped_by"], "turns");
    assert!(engine["calls_per_s"].as_f64().unwrap() > 0.0);
    let latency = &engine["turn_latency_us"];
    assert_eq!(u(&latency["count"]), 200);
    assert!(latency["p50"].as_f64().unwrap() <= latency["max"].as_f64().unwrap());
    assert_eq!(u(&engine["queue_wait_us"]["count"]), 1600);
    assert!(doc["direct"].is_null());
}

#[test]
fn injected_panics_hangs_and_cancels_still_answer_every_call_once() {
    let doc = load_json(&[
        "--sessions",
        "8",
        "--turns",
        "25",
        "--calls-per-turn",
        "8",
        "--tool",
        "noop",
        "--faults",
        "panic=0.05,hang=0.01,cancel=0.2",
        "--seed",
        "7",
        "--json",
    ]);
    assert_eq!(u(&doc["calls"]), 8 * 25 * 8);
    assert_eq!(u(&doc["violations"]), 0);
    let engine = &doc["engine"];
    let errors = &engine["errors"];
    assert!(u(&errors["execution_error"]) > 0, "{errors}");
    assert!(u(&errors["timeout"]) > 0, "{errors}");
    let answered: u64 = u(&engine["ok"])
        + errors
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>();
    assert_eq!(answered, 8 * 25 * 8);
    assert_eq!(doc["config"]["faults"]["panic"], 0.05);
}

#[test]
fn faults_are_refused_with_the_direct_baseline() {
    let out = load(&["--faults", "panic=0.1", "--baseline", "direct"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
}

#[test]
fn an_error_rate_mixes_unknown_tools_and_invalid_arguments() {
    let doc = load_json(&[
        "--sessions",
        "2",
        "--turns",
        "100",
        "--calls-per-turn",
        "8",
        "--error-rate",
        "0.5",
        "--json",
        "--quiet",
    ]);
    let errors = &doc["engine"]["errors"];
    let (unknown, invalid) = (u(&errors["unknown_tool"]), u(&errors["invalid_arguments"]));
    assert!(unknown > 0 && invalid > 0, "{errors}");
    // 1600 calls, half of them errors: 800 expected, generous bounds.
    assert!((600..=1000).contains(&(unknown + invalid)), "{errors}");
    assert_eq!(u(&doc["engine"]["ok"]) + unknown + invalid, 1600);
    assert_eq!(u(&doc["violations"]), 0);
}

#[test]
fn the_direct_baseline_runs_the_same_turns_and_gives_a_ratio() {
    let doc = load_json(&[
        "--sessions",
        "2",
        "--turns",
        "200",
        "--calls-per-turn",
        "4",
        "--serial-ratio",
        "0.5",
        "--baseline",
        "direct",
        "--json",
    ]);
    assert_eq!(u(&doc["direct"]["calls"]), u(&doc["engine"]["calls"]));
    assert_eq!(u(&doc["direct"]["ok"]), 1600);
    assert!(doc["direct_ratio"].as_f64().unwrap() > 0.0, "{doc}");
    assert_eq!(u(&doc["violations"]), 0);
}

#[test]
fn the_builtin_tools_run_on_a_temporary_workspace() {
    let doc = load_json(&[
        "--sessions",
        "2",
        "--turns",
        "3",
        "--calls-per-turn",
        "5",
        "--tool",
        "builtin",
        "--json",
    ]);
    assert_eq!(u(&doc["calls"]), 30);
    assert_eq!(u(&doc["engine"]["ok"]), 30, "{doc}");
    assert_eq!(u(&doc["violations"]), 0);
}

#[test]
fn sleep_cpu_and_mixed_tools_and_a_timed_run() {
    for tool in ["sleep", "cpu", "mixed"] {
        let doc = load_json(&[
            "--sessions",
            "3",
            "--turns",
            "5",
            "--tool",
            tool,
            "--sleep-ms",
            "1",
            "--json",
        ]);
        assert_eq!(u(&doc["engine"]["ok"]), 120, "{tool}: {doc}");
    }
    let doc = load_json(&["--sessions", "2", "--duration", "200ms", "--json"]);
    assert_eq!(doc["engine"]["stopped_by"], "duration");
    assert!(u(&doc["calls"]) > 0);
    assert_eq!(u(&doc["violations"]), 0);
}

#[test]
fn the_peers_set_prints_eight_lines_with_their_ratios() {
    let out = load(&[
        "--workload-set",
        "peers",
        "--duration",
        "60ms",
        "--warmup",
        "0s",
        "--rounds",
        "2",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON document per line"))
        .collect();
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "single_call_noop",
            "batch8_concurrent_safe_noop",
            "batch8_serial_noop",
            "batch8_sleep10ms_wall_ms",
            "error_paths",
            "sessions64_batch8_noop",
            "batch8_writes_distinct_10ms",
            "batch8_writes_same_file_10ms",
        ]
    );
    for line in &lines {
        assert!(line["direct_ratio"].as_f64().unwrap() > 0.0, "{line}");
        if line["workload"] == "batch8_writes_same_file_10ms" {
            // Eight writes of one file never overlap, on either side.
            assert!(line["wall_ms"].as_f64().unwrap() >= 80.0, "{line}");
            assert!(line["direct_wall_ms"].as_f64().unwrap() >= 80.0, "{line}");
        } else if line.get("wall_ms").is_some() {
            assert!(line["wall_ms"].as_f64().unwrap() >= 10.0, "{line}");
            assert!(line["direct_wall_ms"].as_f64().unwrap() >= 10.0, "{line}");
        } else {
            assert!(line["calls_per_s"].as_f64().unwrap() > 0.0, "{line}");
        }
    }
}

#[test]
fn idle_sessions_report_their_memory_and_stay_under_4_kib() {
    let doc = load_json(&["--idle", "--sessions", "2000", "--json"]);
    assert_eq!(u(&doc["sessions"]), 2000);
    assert_eq!(u(&doc["warm_turn_failures"]), 0);
    // A loose bound on RSS (a reading of 2,000 sessions is noisy; the allocator's count is held
    // tightly by tests/idle_session_memory.rs): a session has no actor of its own (one cost
    // ~7.4 KB); ~0.9 KB per session and ~0.6 KB per kept answer measured.
    let bytes = doc["bytes_per_session"].as_f64().unwrap();
    assert!(bytes > 0.0 && bytes < 4096.0, "{doc}");
    let answer = doc["bytes_per_kept_answer"].as_f64().unwrap();
    assert!((0.0..4096.0).contains(&answer), "{doc}");
}

#[test]
fn a_report_directory_gets_the_json_and_a_latency_picture() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("report");
    let out = load(&[
        "--sessions",
        "2",
        "--turns",
        "100",
        "--baseline",
        "direct",
        "--quiet",
        "--report",
        target.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("calls/s") && out.stdout.contains("engine/direct"),
        "{}",
        out.stdout
    );
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(target.join("load.json")).unwrap()).unwrap();
    assert_eq!(u(&doc["calls"]), 1600);
    let svg = std::fs::read_to_string(target.join("latency.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("turn latency") && svg.contains("percentile"));
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    for args in [
        &["--calls-per-turn", "0"][..],
        &["--tool", "nope"],
        &["--error-rate", "1.5"],
        &["--serial-ratio", "x"],
        &["--sessions", "0"],
        &["--duration", "0s"],
        &["--duration", "soon"],
        &["--turns", "5", "--duration", "1s"],
        &["--idle", "--baseline", "direct"],
        &["--workload-set", "nope"],
        &["--rounds", "2"],
        &[
            "--tool",
            "builtin",
            "--sessions",
            "100000",
            "--calls-per-turn",
            "8",
        ],
    ] {
        let out = load(args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.trim().is_empty(), "{args:?} said nothing");
        assert!(!out.stderr.contains("panicked"), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn a_closed_stdout_ends_the_report_quietly_instead_of_panicking() {
    // `switchboard load … | head -1`: the reader goes away before the report is written.
    let mut child = switchboard()
        .args([
            "load",
            "--workload-set",
            "peers",
            "--duration",
            "50ms",
            "--quiet",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
}

#[test]
fn compare_metrics_runs_both_sides_and_reports_the_cost() {
    let doc = load_json(&[
        "--compare-metrics",
        "--sessions",
        "2",
        "--calls-per-turn",
        "4",
        "--turns",
        "100",
        "--rounds",
        "2",
        "--quiet",
        "--json",
    ]);
    assert_eq!(doc["mode"], "compare_metrics");
    assert_eq!(u(&doc["rounds"]), 2);
    assert_eq!(u(&doc["violations"]), 0);
    let on = u(&doc["metrics_on_calls_per_s"]);
    let off = u(&doc["metrics_off_calls_per_s"]);
    assert!(on > 0 && off > 0, "on {on}, off {off}");
    let cost = doc["metrics_cost"]
        .as_f64()
        .expect("metrics_cost is a number");
    let want = 1.0 - on as f64 / off as f64;
    assert!(
        (cost - want).abs() < 0.001,
        "metrics_cost {cost}, 1 − on/off = {want}"
    );
    for side in ["metrics_on", "metrics_off"] {
        assert_eq!(u(&doc[side]["calls"]), 2 * 4 * 100, "{side}");
        assert_eq!(u(&doc[side]["ok"]), 2 * 4 * 100, "{side}");
    }
    // The "on" engines really recorded: every turn of both rounds is in the histogram (no
    // warm-up in a counted run), and the buckets hold a fixed amount of memory.
    assert_eq!(u(&doc["recorded_turns"]), 2 * 2 * 100);
    assert!(u(&doc["histogram_bytes"]) > 0);
}

#[test]
fn compare_metrics_prints_a_table_and_refuses_other_modes() {
    let out = load(&[
        "--compare-metrics",
        "--sessions",
        "1",
        "--calls-per-turn",
        "1",
        "--turns",
        "50",
        "--quiet",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("metrics on") && out.stdout.contains("metrics off"));
    assert!(out.stdout.contains("metrics cost:"), "{}", out.stdout);
    for args in [
        &["--compare-metrics", "--baseline", "direct"][..],
        &["--compare-metrics", "--idle"],
        &["--compare-metrics", "--workload-set", "peers"],
    ] {
        let out = load(args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn a_policy_runs_the_engine_under_its_rules_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let deny = dir.path().join("deny.json");
    std::fs::write(
        &deny,
        r#"{"permissions": {"deny": ["noop"], "default": "allow"}}"#,
    )
    .unwrap();
    let p = deny.to_str().unwrap();
    let doc = load_json(&[
        "--sessions",
        "2",
        "--turns",
        "5",
        "--calls-per-turn",
        "4",
        "--tool",
        "noop",
        "--policy",
        p,
        "--json",
    ]);
    assert_eq!(u(&doc["violations"]), 0);
    assert_eq!(
        u(&doc["engine"]["ok"]),
        0,
        "every noop call is denied by the rule"
    );
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"permissions": {"deny": ["noop("]}}"#).unwrap();
    let out = load(&[
        "--sessions",
        "1",
        "--turns",
        "1",
        "--policy",
        bad.to_str().unwrap(),
    ]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("bad rule \"noop(\""), "{}", out.stderr);
}

fn f(doc: &Value, key: &str) -> f64 {
    doc[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {doc}"))
}

#[test]
fn compare_journal_runs_both_sides_and_counts_the_journal_flushes() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("jb");
    let doc = load_json(&[
        "--journal",
        dir.to_str().unwrap(),
        "--compare-journal",
        "--sessions",
        "4",
        "--calls-per-turn",
        "4",
        "--turns",
        "20",
        "--tool",
        "noop",
        "--quiet",
        "--json",
    ]);
    assert_eq!(doc["mode"], "compare_journal");
    assert_eq!(u(&doc["violations"]), 0);
    for key in [
        "journal_on_calls_per_s",
        "journal_off_calls_per_s",
        "flushes_per_s",
        "calls_per_flush",
        "single_call_p50_ms_on",
        "single_call_p50_ms_off",
        "single_call_p99_ms_on",
        "single_call_p99_ms_off",
    ] {
        assert!(f(&doc, key) > 0.0, "{key}: {doc}");
    }
    assert!(f(&doc, "calls_per_flush") >= 1.0, "{doc}");
    for side in ["on", "off"] {
        assert!(
            f(&doc, &format!("single_call_p50_ms_{side}"))
                <= f(&doc, &format!("single_call_p99_ms_{side}"))
        );
        assert_eq!(u(&doc[format!("single_call_turns_{side}")]), 20);
    }
    let (on, off) = (
        f(&doc, "journal_on_calls_per_s"),
        f(&doc, "journal_off_calls_per_s"),
    );
    let cost = f(&doc, "journal_cost");
    assert!((cost - (1.0 - on / off)).abs() < 0.001, "{cost} {on} {off}");
    for side in ["journal_on", "journal_off"] {
        assert_eq!(u(&doc[side]["calls"]), 4 * 4 * 20, "{side}");
        assert_eq!(u(&doc[side]["ok"]), 4 * 4 * 20, "{side}");
    }
    // Every noop call is a side-effect call: its intent and its answer are both journaled.
    let journal = &doc["journal_on"]["journal"];
    assert_eq!(u(&journal["records"]), 2 * 4 * 4 * 20, "{journal}");
    assert!(u(&journal["flushes"]) >= 2 * 20, "{journal}");
    assert!(doc["journal_off"]["journal"].is_null());
    // The run created the directory, and removed it with every journal it held.
    assert!(!dir.exists());
}

#[test]
fn a_plain_journal_run_journals_every_call_and_leaves_a_found_directory_empty() {
    let dir = tempfile::tempdir().unwrap();
    let doc = load_json(&[
        "--journal",
        dir.path().to_str().unwrap(),
        "--sessions",
        "2",
        "--turns",
        "5",
        "--calls-per-turn",
        "4",
        "--warmup",
        "100ms",
        "--json",
    ]);
    assert_eq!(u(&doc["engine"]["ok"]), 40);
    // An intent and an answer for every measured call: none was answered from the warm-up's
    // stored answers (the warm-up's turns have ids of their own), so every one ran.
    assert_eq!(u(&doc["engine"]["journal"]["records"]), 80);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn compare_journal_without_a_journal_directory_is_refused_naming_the_flag() {
    let out = load(&["--compare-journal", "--turns", "1"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--journal"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = load(&["--journal", file.path().to_str().unwrap(), "--turns", "1"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("not a directory"), "{}", out.stderr);
}
