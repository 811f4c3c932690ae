//! The Grafana dashboard names only metrics the code declares, and uses all of them.
//!
//! `dashboards/switchboard-dispatch.json` is parsed (not grepped); every panel, including panels
//! nested in collapsed rows, and every target `expr` is walked. Each `switchboard_*` identifier in
//! a query must be declared in [`switchboard::metrics::METRICS`] with a kind that fits its suffix
//! (`_bucket` / `_sum` / `_count` only on histograms, which are never queried bare). The dashboard
//! must stay importable as is: a `DS_PROMETHEUS` input, every data source reference through it,
//! an `instance` variable every query filters on, and a description on every panel.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;
use switchboard::metrics::{BUILD_INFO, Kind, METRICS, MetricDef, SANDBOX_INFO};

const DASHBOARD: &str = "dashboards/switchboard-dispatch.json";
const DS_UID: &str = "${DS_PROMETHEUS}";

fn load() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel, depth first, rows and the panels nested in them included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(nested) = p.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn title(panel: &Value) -> &str {
    panel["title"].as_str().unwrap_or("<untitled>")
}

/// The `switchboard_…` identifiers of a PromQL expression. Label values in quotes are skipped,
/// so a metric name that only appears inside a string does not count as used.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = expr.char_indices().peekable();
    let mut quote: Option<char> = None;
    let mut prev: Option<char> = None;
    while let Some((i, c)) = chars.next() {
        if let Some(q) = quote {
            if c == q && prev != Some('\\') {
                quote = None;
            }
            prev = Some(c);
            continue;
        }
        if c == '"' || c == '\'' || c == '`' {
            quote = Some(c);
            prev = Some(c);
            continue;
        }
        let boundary = !prev.is_some_and(|p| p.is_ascii_alphanumeric() || p == '_' || p == ':');
        if boundary && expr[i..].starts_with("switchboard_") {
            let end = expr[i..]
                .find(|ch: char| !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_'))
                .map_or(expr.len(), |n| i + n);
            names.push(expr[i..end].to_string());
            while chars.peek().is_some_and(|(j, _)| *j < end) {
                chars.next();
            }
            prev = expr[..end].chars().last();
            continue;
        }
        prev = Some(c);
    }
    names
}

/// The declaration a queried name refers to, or why it is not allowed.
fn declared(name: &str) -> Result<&'static MetricDef, String> {
    if let Some(def) = METRICS.iter().find(|m| m.name == name) {
        return match def.kind {
            Kind::Histogram => Err(format!(
                "{name} is a histogram: query its _bucket, _sum or _count series"
            )),
            _ => Ok(def),
        };
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && let Some(def) = METRICS.iter().find(|m| m.name == base)
        {
            return match def.kind {
                Kind::Histogram => Ok(def),
                kind => Err(format!(
                    "{name}: {base} is a {kind:?}, it has no {suffix} series"
                )),
            };
        }
    }
    Err(format!(
        "{name} is not declared in switchboard::metrics::METRICS"
    ))
}

#[test]
fn metric_name_extraction_finds_names_and_skips_strings() {
    assert_eq!(
        metric_names(
            r#"sum(rate(switchboard_a_total{x="switchboard_not_me"}[5m])) / switchboard_b_count"#
        ),
        ["switchboard_a_total", "switchboard_b_count"]
    );
    assert!(metric_names("rate(my_switchboard_x[1m])").is_empty());
    assert!(declared("switchboard_tool_calls_total").is_ok());
    assert!(declared("switchboard_tool_calls_total_count").is_err());
    assert!(declared("switchboard_turn_calls_bucket").is_ok());
    assert!(declared("switchboard_turn_calls").is_err());
    assert!(declared("switchboard_nope_total").is_err());
}

#[test]
fn every_query_names_a_declared_metric_and_every_metric_is_shown() {
    let dashboard = load();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    let mut queries = 0;
    for panel in panels(&dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else {
                problems.push(format!("panel {:?}: a target without expr", title(panel)));
                continue;
            };
            queries += 1;
            let names = metric_names(expr);
            if names.is_empty() {
                problems.push(format!(
                    "panel {:?}: query names no switchboard metric: {expr}",
                    title(panel)
                ));
            }
            for name in names {
                match declared(&name) {
                    Ok(def) => {
                        used.insert(def.name);
                    }
                    Err(e) => problems.push(format!("panel {:?}: {e}", title(panel))),
                }
            }
        }
    }
    assert!(queries > 0, "the dashboard has no queries");
    for m in METRICS {
        if m.name != BUILD_INFO && m.name != SANDBOX_INFO && !used.contains(m.name) {
            problems.push(format!("no panel shows {}", m.name));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn dashboard_is_importable_and_filtered_by_instance() {
    let dashboard = load();
    let mut problems = Vec::new();

    assert!(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 39),
        "schemaVersion must be at least 39"
    );
    let inputs = dashboard["__inputs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS"
            && i["type"] == "datasource"
            && i["pluginId"] == "prometheus"),
        "__inputs must declare DS_PROMETHEUS (type datasource, pluginId prometheus): {inputs:?}"
    );

    let variables = dashboard["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        variables
            .iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus data source variable is needed"
    );
    let instance = variables
        .iter()
        .find(|v| v["name"] == "instance")
        .expect("an `instance` variable");
    assert_eq!(instance["type"], "query");
    assert_eq!(instance["multi"], true, "instance is multi-value");
    assert_eq!(instance["includeAll"], true, "instance includes All");
    let definition = instance["definition"].as_str().unwrap_or_default();
    assert!(
        definition.contains("label_values(switchboard_build_info, instance)"),
        "instance lists the instances of switchboard_build_info: {definition:?}"
    );
    for name in metric_names(definition) {
        if let Err(e) = declared(&name) {
            problems.push(format!("variable instance: {e}"));
        }
    }
    if instance["datasource"]["uid"] != DS_UID {
        problems.push("variable instance: data source is not ${DS_PROMETHEUS}".into());
    }

    let all = panels(&dashboard);
    assert!(
        all.len() > 10,
        "expected a full dashboard, found {} panels",
        all.len()
    );
    let mut ids = BTreeSet::new();
    for panel in all {
        let t = title(panel);
        if !ids.insert(panel["id"].as_u64()) {
            problems.push(format!("panel {t:?}: duplicate or missing id"));
        }
        if panel["description"]
            .as_str()
            .is_none_or(|d| d.trim().is_empty())
        {
            problems.push(format!("panel {t:?}: no description"));
        }
        let is_row = panel["type"] == "row";
        if !is_row && panel["datasource"]["uid"] != DS_UID {
            problems.push(format!("panel {t:?}: data source is not {DS_UID}"));
        }
        if !is_row && panel["datasource"]["type"] != "prometheus" {
            problems.push(format!("panel {t:?}: data source type is not prometheus"));
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if !is_row && targets.is_empty() {
            problems.push(format!("panel {t:?}: no queries"));
        }
        for target in &targets {
            let r = target["refId"].as_str().unwrap_or("?");
            if target["datasource"] != serde_json::json!({"type": "prometheus", "uid": DS_UID}) {
                problems.push(format!(
                    "panel {t:?} query {r}: data source is not {DS_UID}"
                ));
            }
            let expr = target["expr"].as_str().unwrap_or_default();
            let selectors = expr.matches("switchboard_").count();
            let filtered = expr.matches(r#"instance=~"$instance""#).count();
            if filtered == 0 || filtered < selectors {
                problems.push(format!(
                    "panel {t:?} query {r}: every selector must filter on instance=~\"$instance\": {expr}"
                ));
            }
            if expr.matches('[').count() != expr.matches("[$__rate_interval]").count() {
                problems.push(format!(
                    "panel {t:?} query {r}: range windows must be [$__rate_interval]: {expr}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}
