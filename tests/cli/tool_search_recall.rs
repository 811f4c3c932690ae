//! `tool_search` on the benchmark catalog of real tools (`benches/tool_search/`): `switchboard
//! load --workload-set tool-search` reports its recall, and top-5 recall meets the 90 % target.
//! The queries were written from the tools' documentation, not from the search's output.

use crate::common;

use std::path::Path;

use common::cli::{describe, run};
use serde_json::Value;

#[test]
fn top5_recall_on_the_benchmark_catalog_is_at_least_90_percent() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The latency phases are bounded by --max-time; this test reads the recall line.
    let out = run(
        root,
        &["load", "--workload-set", "tool-search", "--max-time", "2s"],
        "",
    );
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let recall = &lines[0];
    assert_eq!(recall["workload"], "tool_search_recall");
    assert!(
        recall["catalog_tools"].as_u64().unwrap() >= 1000,
        "{recall}"
    );
    assert!(recall["mcp_tools"].as_u64().unwrap() >= 200, "{recall}");
    assert!(recall["queries"].as_u64().unwrap() >= 200, "{recall}");
    let top1 = recall["top1"].as_f64().unwrap();
    let top5 = recall["top5"].as_f64().unwrap();
    eprintln!("tool_search recall: top-1 {top1}, top-5 {top5}");
    assert!(top5 >= 0.90, "top-5 recall {top5} is under 0.90: {recall}");
    assert!(top1 <= top5);
    // Every form was measured over 10,000 tools.
    let forms: Vec<&str> = lines[1..]
        .iter()
        .map(|l| {
            assert_eq!(l["catalog_tools"], 10_000, "{l}");
            l["form"].as_str().unwrap()
        })
        .collect();
    assert_eq!(forms, ["keywords", "select", "regex"]);
}
