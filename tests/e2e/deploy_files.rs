//! The dashboard and alert rules users import (`deploy/`): every metric
//! they name must be one the guard, the service or the retry client
//! exports, so a renamed metric cannot leave a panel or an alert silently
//! empty.
//!
//! Exported names are read from the code: the string literals of
//! `guard/src`, `service/src` and `client/src` that name an
//! `idempotency_*` metric (the constants passed to `metrics::counter!`
//! and friends). The files' names
//! are read from every PromQL expression (`expr`) in them; recorded series
//! (`level:metric:operation`, with colons) are left out, and a histogram's
//! `_bucket`, `_count` and `_sum` series count as the histogram.
//! `promtool check rules` and `promtool test rules` check the rules
//! themselves (`.ci/run`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Every `"idempotency_..."` string literal of the guard's, the
/// service's and the retry client's source.
fn exported() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&root().join("guard/src"), &mut files);
    rust_files(&root().join("service/src"), &mut files);
    rust_files(&root().join("client/src"), &mut files);
    let mut names = BTreeSet::new();
    for file in files {
        let source = text(&file);
        for literal in source.split('"').skip(1).step_by(2) {
            if literal.starts_with("idempotency_")
                && literal
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                names.insert(literal.to_owned());
            }
        }
    }
    names
}

/// The metric names in one PromQL expression, recorded series left out.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    for token in expr.split(|c: char| !is_name(c)) {
        if token.starts_with("idempotency_") && !token.contains(':') {
            names.insert(token.to_owned());
        }
    }
    names
}

fn json_exprs(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (name, value) in map {
                match (name.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => found.push(expr.clone()),
                    _ => json_exprs(value, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_exprs(v, found)),
        _ => {}
    }
}

fn yaml_exprs(value: &yaml_serde::Value, found: &mut Vec<String>) {
    match value {
        yaml_serde::Value::Mapping(map) => {
            for (name, value) in map {
                match (name.as_str(), value) {
                    (Some("expr"), yaml_serde::Value::String(expr)) => found.push(expr.clone()),
                    _ => yaml_exprs(value, found),
                }
            }
        }
        yaml_serde::Value::Sequence(items) => items.iter().for_each(|v| yaml_exprs(v, found)),
        _ => {}
    }
}

/// The names `expressions` use that nothing exports.
fn unknown(expressions: &[String], exported: &BTreeSet<String>) -> Vec<String> {
    let mut missing = Vec::new();
    for expr in expressions {
        for name in metric_names(expr) {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| exported.contains(*base))
                .unwrap_or(&name);
            if !exported.contains(base) {
                missing.push(format!("{name} (in `{}`)", expr.trim()));
            }
        }
    }
    missing
}

#[test]
fn every_metric_the_dashboard_and_the_rules_name_is_exported() {
    let exported = exported();
    for core in [
        "idempotency_requests_total",
        "idempotency_store_duration_seconds",
        "idempotency_status_key_states_total",
        "idempotency_admin_actions_total",
    ] {
        assert!(exported.contains(core), "the code exports {core}");
    }

    let dashboard: serde_json::Value =
        serde_json::from_str(&text(&root().join("deploy/grafana/idempotency.json")))
            .expect("the dashboard is valid JSON");
    let mut dashboard_exprs = Vec::new();
    json_exprs(&dashboard, &mut dashboard_exprs);
    assert!(dashboard_exprs.len() >= 10, "the dashboard has its panels");

    let rules: yaml_serde::Value =
        yaml_serde::from_str(&text(&root().join("deploy/prometheus/alerts.yml")))
            .expect("the rules are valid YAML");
    let mut rule_exprs = Vec::new();
    yaml_exprs(&rules, &mut rule_exprs);
    assert!(rule_exprs.len() >= 10, "the rules have their expressions");

    let used: BTreeSet<String> = dashboard_exprs
        .iter()
        .chain(&rule_exprs)
        .flat_map(|e| metric_names(e))
        .collect();
    for needed in [
        "idempotency_requests_total",
        "idempotency_store_duration_seconds_bucket",
        "idempotency_status_key_states_total",
    ] {
        assert!(used.contains(needed), "the files use {needed}");
    }
    assert_eq!(unknown(&dashboard_exprs, &exported), Vec::<String>::new());
    assert_eq!(unknown(&rule_exprs, &exported), Vec::<String>::new());

    // The check has teeth: a misspelt metric, or a histogram suffix on a
    // name that is not exported, is caught.
    let typo = vec![
        "sum(rate(idempotency_request_total[5m]))".to_owned(),
        "rate(idempotency_nothing_bucket[5m])".to_owned(),
        "route:idempotency_retries:rate5m > 0".to_owned(),
    ];
    assert_eq!(unknown(&typo, &exported).len(), 2);
}
