//! `tool_search` on the benchmark catalog of real tools (`benches/tool_search/`): `studies
//! tool-search` reports top-1, top-5 and MRR on the tuning queries and on the held-out ones (the
//! benchmark's other half, and the task queries), and none falls under its floor. The queries
//! were written from the tools' documentation or as user tasks, not from the search's output.

use std::process::{Command, Output};

use serde_json::Value;

fn studies(args: &[&str]) -> Output {
    // Run from elsewhere than the repository: the default catalog is found all the same.
    Command::new(env!("CARGO_BIN_EXE_studies"))
        .args(args)
        .current_dir(std::env::temp_dir())
        .output()
        .expect("the studies binary starts")
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn top5_recall_on_the_benchmark_catalog_is_at_least_90_percent() {
    // The latency phases are bounded by --max-time; this test reads the recall line.
    let out = studies(&["tool-search", "--max-time", "2s"]);
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let set = |name: &str| {
        lines
            .iter()
            .find(|l| l["workload"] == "tool_search_recall" && l["set"] == name)
            .unwrap_or_else(|| panic!("no recall line for {name}: {stdout}"))
    };
    let tuning = set("tuning");
    assert!(
        tuning["catalog_tools"].as_u64().unwrap() >= 1000,
        "{tuning}"
    );
    assert!(tuning["mcp_tools"].as_u64().unwrap() >= 200, "{tuning}");
    assert!(tuning["queries"].as_u64().unwrap() >= 100, "{tuning}");
    // The held-out sets: the benchmark's other half and the task queries, never tuned on.
    let benchmark = set("held_out_benchmark");
    let tasks = set("held_out_tasks");
    let held = set("held_out");
    assert!(tasks["queries"].as_u64().unwrap() >= 100, "{tasks}");
    assert_eq!(
        held["queries"].as_u64().unwrap(),
        benchmark["queries"].as_u64().unwrap() + tasks["queries"].as_u64().unwrap()
    );
    for (line, top5_floor) in [(tuning, 0.90), (benchmark, 0.90), (tasks, 0.65)] {
        let top1 = line["top1"].as_f64().unwrap();
        let top5 = line["top5"].as_f64().unwrap();
        let mrr = line["mrr"].as_f64().unwrap();
        eprintln!(
            "tool_search recall, {}: top-1 {top1}, top-5 {top5}, MRR {mrr}",
            line["set"]
        );
        assert!(
            top5 >= top5_floor,
            "top-5 recall {top5} is under {top5_floor}: {line}"
        );
        assert!(top1 <= mrr && mrr <= top5, "{line}");
    }
    // Every form was measured over 10,000 tools.
    let forms: Vec<&str> = lines
        .iter()
        .filter(|l| l["workload"] == "tool_search_latency")
        .map(|l| {
            assert_eq!(l["catalog_tools"], 10_000, "{l}");
            l["form"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        forms,
        [
            "keywords",
            "select",
            "regex",
            "regex_costly",
            "keywords_beside_costly_regex"
        ]
    );
}

/// A catalog or queries file that cannot be read, or a query expecting a tool the catalog lacks,
/// ends the study with a message naming the file and the flag, and exit 1.
#[test]
fn unreadable_or_inconsistent_inputs_are_refused_by_name() {
    let out = studies(&["tool-search", "--catalog", "/nonexistent/catalog.json"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/catalog.json") && stderr.contains("--catalog"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.json");
    std::fs::write(
        &catalog,
        r#"[{"id":"a","tool":"read_thing","description":"Reads a thing.","input_schema":{"type":"object"}}]"#,
    )
    .unwrap();
    let queries = dir.path().join("queries.jsonl");
    std::fs::write(&queries, "{\"query\":\"read\",\"expected\":[\"b\"]}\n").unwrap();
    let out = studies(&[
        "tool-search",
        "--catalog",
        catalog.to_str().unwrap(),
        "--queries",
        queries.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("expected tool b is not in the catalog"),
        "{stderr}"
    );

    let out = studies(&["tool-search", "--max-time", "0s"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}
