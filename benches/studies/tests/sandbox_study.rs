//! `studies sandbox`: a bare start, then `off`, `workspace-write` and `read-only`, at 1 and 16
//! sessions, each a JSON line with its latencies and rate; every call succeeded (the run fails
//! otherwise). Skipped where the default sandbox cannot be enforced, unless
//! SWITCHBOARD_REQUIRE_SANDBOX=1.

use std::process::Command;

use serde_json::Value;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn the_sandbox_study_prints_a_row_per_mode_and_session_count() {
    let out = Command::new(env!("CARGO_BIN_EXE_studies"))
        .args(["sandbox", "--turns", "3", "--quiet"])
        .output()
        .expect("the studies binary starts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() != Some(0) && stderr.contains("workspace-write:") {
        if std::env::var("SWITCHBOARD_REQUIRE_SANDBOX").as_deref() == Ok("1") {
            panic!("the sandbox study needs the sandbox here: {stderr}");
        }
        println!("SKIPPED: {stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON document per line"))
        .collect();
    let keys: Vec<(String, u64)> = rows
        .iter()
        .map(|r| (r["mode"].as_str().unwrap().to_string(), u(&r["sessions"])))
        .collect();
    let mut expected = Vec::new();
    for sessions in [1, 16] {
        for mode in ["bare", "off", "workspace-write", "read-only"] {
            expected.push((mode.to_string(), sessions));
        }
    }
    assert_eq!(keys, expected);
    for row in &rows {
        assert_eq!(u(&row["calls"]), 3 * u(&row["sessions"]), "{row}");
        let (p50, p99) = (
            row["p50_ms"].as_f64().unwrap(),
            row["p99_ms"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{row}");
        assert!(u(&row["calls_per_s"]) > 0, "{row}");
    }
    assert_eq!(rows[0]["vs_bare"], 1.0);
}
