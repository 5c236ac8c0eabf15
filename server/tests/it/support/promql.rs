//! The PromQL of the deployment: every query of the Grafana dashboard (panel targets,
//! annotations, template variables) and every expression of the alert rules (the rule file and
//! the Kubernetes PrometheusRule), with the metric selectors inside each, read with
//! `promql-parser` (a maintained PromQL parser, GreptimeDB's).

#![allow(dead_code)] // Each test uses a different part.

use std::path::{Path, PathBuf};

use promql_parser::parser::{self, Expr, VectorSelector};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// One query or expression and where it is.
#[derive(Clone, Debug)]
pub struct Query {
    /// e.g. `panel "Commits by outcome"`, `alert VallumCommitFailures (deploy/k8s/...)`.
    pub place: String,
    /// The PromQL, as written (Grafana variables not substituted).
    pub expr: String,
}

/// `deploy/grafana/vallum.json`.
pub fn dashboard() -> Value {
    serde_json::from_str(&read("deploy/grafana/vallum.json")).expect("dashboard JSON")
}

/// Every panel target's `expr`.
pub fn panel_queries(d: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                place: format!("panel {} target {}", p["title"], t["refId"]),
                expr: t["expr"].as_str().unwrap_or_default().to_owned(),
            });
        }
    }
    out
}

/// Every annotation's `expr`.
pub fn annotation_queries(d: &Value) -> Vec<Query> {
    d["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| {
            Some(Query {
                place: format!("annotation {}", a["name"]),
                expr: a["expr"].as_str()?.to_owned(),
            })
        })
        .collect()
}

/// The template variables of type `query`: (name, metric, label) of each
/// `label_values(metric, label)` (the only form the dashboard uses; others panic).
pub fn label_values_variables(d: &Value) -> Vec<(String, String, String)> {
    d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let q = v["definition"].as_str()?;
            let name = v["name"].as_str().expect("variable name").to_owned();
            let (metric, label) = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|r| r.split_once(','))
                .unwrap_or_else(|| panic!("variable {name}: only label_values(metric, label)"));
            Some((name, metric.trim().to_owned(), label.trim().to_owned()))
        })
        .collect()
}

fn yaml(rel: &str) -> Value {
    serde_norway::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `deploy/prometheus/vallum-rules.yaml`, as JSON.
pub fn rule_file() -> Value {
    yaml("deploy/prometheus/vallum-rules.yaml")
}

/// The `spec` of `deploy/k8s/prometheusrule.yaml`, as JSON (a `groups:` document).
pub fn prometheus_rule_spec() -> Value {
    let text = read("deploy/k8s/prometheusrule.yaml");
    let doc: Value = serde_norway::from_str(&text).expect("prometheusrule.yaml");
    doc["spec"].clone()
}

/// Every alert expression of the rule file and of the PrometheusRule.
pub fn alert_queries() -> Vec<Query> {
    let mut out = Vec::new();
    for (file, doc) in [
        ("deploy/prometheus/vallum-rules.yaml", rule_file()),
        ("deploy/k8s/prometheusrule.yaml", prometheus_rule_spec()),
    ] {
        for g in doc["groups"].as_array().expect("groups") {
            for r in g["rules"].as_array().expect("rules") {
                out.push(Query {
                    place: format!("alert {} ({file})", r["alert"]),
                    expr: r["expr"].as_str().expect("expr").to_owned(),
                });
            }
        }
    }
    out
}

/// The vector selectors of `expr` (those inside range selectors too), or the parser's error.
pub fn selectors(expr: &str) -> Result<Vec<VectorSelector>, String> {
    struct Collect(Vec<VectorSelector>);
    impl ExprVisitor for Collect {
        type Error = String;
        fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
            match e {
                Expr::VectorSelector(vs) => self.0.push(vs.clone()),
                Expr::MatrixSelector(ms) => self.0.push(ms.vs.clone()),
                _ => {}
            }
            Ok(true)
        }
    }
    let ast = parser::parse(expr)?;
    let mut c = Collect(Vec::new());
    walk_expr(&mut c, &ast)?;
    Ok(c.0)
}

/// The metric names `expr` selects, sorted and deduplicated; panics with `place` when it
/// does not parse or a selector has no metric name.
pub fn metric_names(q: &Query) -> Vec<String> {
    let mut names: Vec<String> = selectors(&q.expr)
        .unwrap_or_else(|e| panic!("{}: does not parse: {e}\n{}", q.place, q.expr))
        .into_iter()
        .map(|s| {
            s.name
                .unwrap_or_else(|| panic!("{}: a selector without a metric name", q.place))
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The label names a selector matches on (besides the metric name).
pub fn matcher_labels(s: &VectorSelector) -> Vec<String> {
    s.matchers
        .matchers
        .iter()
        .chain(s.matchers.or_matchers.iter().flatten())
        .map(|m| m.name.clone())
        .filter(|n| n != "__name__")
        .collect()
}

/// `expr` with Grafana's variables replaced as Grafana does before sending it:
/// `$__rate_interval` by `rate_interval` (a PromQL duration) and `$NAME` / `${NAME}` by the
/// value of each of `vars`. Panics when a `$` is left (a variable this does not know).
pub fn substitute(q: &Query, rate_interval: &str, vars: &[(String, String)]) -> String {
    let mut e = q.expr.replace("$__rate_interval", rate_interval);
    for (name, value) in vars {
        e = e
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    assert!(!e.contains('$'), "{}: unknown variable in {e}", q.place);
    e
}

/// (function, metric) for every metric read by `rate`, `irate` or `increase` in `expr`: those
/// functions are for counters (and histogram buckets, which are counters).
pub fn counter_function_reads(expr: &str) -> Result<Vec<(String, String)>, String> {
    struct Collect(Vec<(String, String)>);
    impl ExprVisitor for Collect {
        type Error = String;
        fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
            if let Expr::Call(c) = e {
                if ["rate", "irate", "increase"].contains(&c.func.name) {
                    for a in &c.args.args {
                        for s in selectors(&a.to_string())? {
                            self.0
                                .push((c.func.name.to_owned(), s.name.unwrap_or_default()));
                        }
                    }
                }
            }
            Ok(true)
        }
    }
    let ast = parser::parse(expr)?;
    let mut c = Collect(Vec::new());
    walk_expr(&mut c, &ast)?;
    Ok(c.0)
}
