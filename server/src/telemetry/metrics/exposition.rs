//! The Prometheus text exposition format (version 0.0.4, what `/metrics` serves): a small model
//! of metric families ([`Family`]), the conversion of the OpenTelemetry SDK's collected
//! [`ResourceMetrics`] into it ([`from_otel`]), and the encoder ([`render`]).
//!
//! Names and labels follow the OpenTelemetry -> Prometheus compatibility rules (the ones
//! `opentelemetry-prometheus` applies too):
//! - characters outside `[a-zA-Z0-9_:]` (metric names) or `[a-zA-Z0-9_]` (label names) become
//!   `_` (`rpc.server.duration` -> `rpc_server_duration`, `rpc.grpc.status_code` ->
//!   `rpc_grpc_status_code`); a leading digit gets a `_` before it;
//! - the unit is appended: `s` -> `_seconds`, `ms` -> `_milliseconds`, `By` -> `_bytes`
//!   (`1` and units in braces such as `{packet}` add nothing; other units are not used here
//!   and add nothing either);
//! - monotonic sums are counters and get `_total`; non-monotonic sums and gauges are gauges;
//!   explicit-bucket histograms are histograms (`_bucket{le}`, `_sum`, `_count`). No instrument
//!   of ours is an exponential histogram (no view selects that aggregation), so the SDK never
//!   produces one; one would be left out (a comment line says so in the output);
//! - the resource becomes `target_info{...} 1` (`service_name="vallumd"`, `telemetry_sdk_*`);
//!   instrumentation-scope labels are not added (there is one scope, `vallum`).
//!
//! Output is deterministic: families sorted by name, series by their sorted labels, `le` last.
//! Values print as Rust prints them (`{}`: shortest round-trip decimal, no exponent), integers
//! without a fraction, infinities as `+Inf`/`-Inf`, NaN as `NaN`, as Prometheus parses them.

use std::fmt::Write as _;

use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};

/// `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The type of a family (`# TYPE` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic; the name ends in `_total`.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Cumulative buckets, a sum and a count.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample value, kept in its own type so that large integer counters print exactly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    /// Unsigned integer.
    U64(u64),
    /// Signed integer.
    I64(i64),
    /// Float.
    F64(f64),
}

impl Number {
    fn write(self, out: &mut String) {
        // `write!` into a String cannot fail.
        let _ = match self {
            Number::U64(v) => write!(out, "{v}"),
            Number::I64(v) => write!(out, "{v}"),
            Number::F64(v) if v.is_nan() => write!(out, "NaN"),
            Number::F64(v) if v == f64::INFINITY => write!(out, "+Inf"),
            Number::F64(v) if v == f64::NEG_INFINITY => write!(out, "-Inf"),
            Number::F64(v) => write!(out, "{v}"),
        };
    }
}

/// The SDK's number types.
trait ToNumber: Copy {
    fn to_number(self) -> Number;
}

impl ToNumber for u64 {
    fn to_number(self) -> Number {
        Number::U64(self)
    }
}

impl ToNumber for i64 {
    fn to_number(self) -> Number {
        Number::I64(self)
    }
}

impl ToNumber for f64 {
    fn to_number(self) -> Number {
        Number::F64(self)
    }
}

/// The value of one series.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A counter or gauge sample.
    Single(Number),
    /// A histogram: `buckets` are (upper bound, cumulative count) in increasing bound order,
    /// without `+Inf` (which is `count`).
    Histogram {
        /// (upper bound, cumulative count).
        buckets: Vec<(f64, u64)>,
        /// Sum of the observations.
        sum: Number,
        /// Number of observations.
        count: u64,
    },
}

/// One series: its labels (any order; sorted when rendered) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// (label name, label value); names must already be valid Prometheus label names.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: Value,
}

/// A metric family: one `# HELP`, one `# TYPE`, its series.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The scraped name (a counter's ends in `_total`).
    pub name: String,
    /// The `# HELP` text.
    pub help: String,
    /// The `# TYPE`.
    pub kind: Kind,
    /// The series; a family without series is not rendered.
    pub series: Vec<Series>,
}

// === conversion from the SDK ===

/// The families of everything the SDK collected, plus `target_info` from the resource.
pub fn from_otel(rm: &ResourceMetrics) -> Vec<Family> {
    let mut out = Vec::new();
    let target: Vec<(String, String)> = rm
        .resource()
        .iter()
        .map(|(k, v)| (label_name(k.as_str()), v.as_str().into_owned()))
        .collect();
    if !target.is_empty() {
        out.push(Family {
            name: "target_info".to_owned(),
            help: "Target metadata".to_owned(),
            kind: Kind::Gauge,
            series: vec![Series {
                labels: target,
                value: Value::Single(Number::U64(1)),
            }],
        });
    }
    for scope in rm.scope_metrics() {
        for m in scope.metrics() {
            if let Some(f) = family(m) {
                out.push(f);
            }
        }
    }
    out
}

/// The family of one collected instrument (`None` for an exponential histogram).
pub(crate) fn family(m: &Metric) -> Option<Family> {
    match m.data() {
        AggregatedMetrics::U64(d) => family_of(m, d),
        AggregatedMetrics::I64(d) => family_of(m, d),
        AggregatedMetrics::F64(d) => family_of(m, d),
    }
}

fn family_of<T: ToNumber>(m: &Metric, data: &MetricData<T>) -> Option<Family> {
    let base = with_unit(&metric_name(m.name()), m.unit());
    let (name, kind, series) = match data {
        MetricData::Gauge(g) => (
            base,
            Kind::Gauge,
            g.data_points()
                .map(|p| series(p.attributes(), Value::Single(p.value().to_number())))
                .collect(),
        ),
        MetricData::Sum(s) => {
            let series = s
                .data_points()
                .map(|p| series(p.attributes(), Value::Single(p.value().to_number())))
                .collect();
            if s.is_monotonic() {
                let name = if base.ends_with("_total") {
                    base
                } else {
                    base + "_total"
                };
                (name, Kind::Counter, series)
            } else {
                (base, Kind::Gauge, series)
            }
        }
        MetricData::Histogram(h) => (
            base,
            Kind::Histogram,
            h.data_points()
                .map(|p| {
                    let mut cumulative = 0u64;
                    let buckets = p
                        .bounds()
                        .zip(p.bucket_counts())
                        .map(|(le, n)| {
                            cumulative += n;
                            (le, cumulative)
                        })
                        .collect();
                    series(
                        p.attributes(),
                        Value::Histogram {
                            buckets,
                            sum: p.sum().to_number(),
                            count: p.count(),
                        },
                    )
                })
                .collect(),
        ),
        MetricData::ExponentialHistogram(_) => return None,
    };
    Some(Family {
        name,
        help: m.description().to_owned(),
        kind,
        series,
    })
}

fn series<'a>(attrs: impl Iterator<Item = &'a KeyValue>, value: Value) -> Series {
    Series {
        labels: attrs
            .map(|kv| (label_name(kv.key.as_str()), kv.value.as_str().into_owned()))
            .collect(),
        value,
    }
}

/// `name` with invalid characters replaced (see the module docs).
fn metric_name(name: &str) -> String {
    sanitize(name, |c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A label name with invalid characters replaced (see the module docs).
fn label_name(name: &str) -> String {
    sanitize(name, |c| c.is_ascii_alphanumeric() || c == '_')
}

fn sanitize(name: &str, valid: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) || name.is_empty() {
        out.push('_');
    }
    out.extend(name.chars().map(|c| if valid(c) { c } else { '_' }));
    out
}

/// Appends the unit's suffix (see the module docs) unless the name already ends with it.
fn with_unit(name: &str, unit: &str) -> String {
    let suffix = match unit {
        "s" => "_seconds",
        "ms" => "_milliseconds",
        "By" => "_bytes",
        _ => "",
    };
    if name.ends_with(suffix) {
        name.to_owned()
    } else {
        format!("{name}{suffix}")
    }
}

// === encoder ===

/// Renders `families` in the text format, sorted (see the module docs). Families without
/// series are left out; two families of one name are merged under the first one's HELP/TYPE.
pub fn render(mut families: Vec<Family>) -> String {
    families.retain(|f| !f.series.is_empty());
    // Stable: of two families with one name, the first keeps its place.
    families.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    let mut families = families.into_iter().peekable();
    while let Some(f) = families.next() {
        let mut series = f.series;
        while let Some(same) = families.next_if(|g| g.name == f.name) {
            series.extend(same.series);
        }
        for s in &mut series {
            s.labels.sort();
        }
        series.sort_by(|a, b| a.labels.cmp(&b.labels));
        out.push_str("# HELP ");
        out.push_str(&f.name);
        out.push(' ');
        escape_help(&f.help, &mut out);
        out.push_str("\n# TYPE ");
        out.push_str(&f.name);
        out.push(' ');
        out.push_str(f.kind.as_str());
        out.push('\n');
        for s in &series {
            match &s.value {
                Value::Single(v) => sample(&mut out, &f.name, "", &s.labels, None, *v),
                Value::Histogram {
                    buckets,
                    sum,
                    count,
                } => {
                    let mut le = String::new();
                    for (bound, n) in buckets {
                        le.clear();
                        Number::F64(*bound).write(&mut le);
                        sample(
                            &mut out,
                            &f.name,
                            "_bucket",
                            &s.labels,
                            Some(&le),
                            Number::U64(*n),
                        );
                    }
                    let count = Number::U64(*count);
                    sample(&mut out, &f.name, "_bucket", &s.labels, Some("+Inf"), count);
                    sample(&mut out, &f.name, "_sum", &s.labels, None, *sum);
                    sample(&mut out, &f.name, "_count", &s.labels, None, count);
                }
            }
        }
    }
    out
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(String, String)],
    le: Option<&str>,
    v: Number,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let le = le.map(|le| ("le", le));
        let all = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(le);
        for (n, (k, v)) in all.enumerate() {
            if n > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape_label(v, out);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    v.write(out);
    out.push('\n');
}

/// As the format: `\` and line feeds escaped in HELP text.
fn escape_help(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// As the format: `\`, `"` and line feeds escaped in label values.
fn escape_label(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_units_and_escapes() {
        assert_eq!(
            with_unit(&metric_name("rpc.server.duration"), "s"),
            "rpc_server_duration_seconds"
        );
        assert_eq!(with_unit("x_seconds", "s"), "x_seconds");
        assert_eq!(with_unit("x", "{packet}"), "x");
        assert_eq!(label_name("rpc.grpc.status_code"), "rpc_grpc_status_code");
        assert_eq!(label_name("1x"), "_1x");
        let text = render(vec![
            Family {
                name: "b".to_owned(),
                help: "two\nlines \\".to_owned(),
                kind: Kind::Gauge,
                series: vec![
                    Series {
                        labels: vec![("z".into(), "1".into()), ("a".into(), "q\"\\\n".into())],
                        value: Value::Single(Number::F64(f64::INFINITY)),
                    },
                    Series {
                        labels: vec![("a".into(), "".into())],
                        value: Value::Single(Number::F64(0.25)),
                    },
                ],
            },
            Family {
                name: "a".to_owned(),
                help: String::new(),
                kind: Kind::Histogram,
                series: vec![Series {
                    labels: vec![],
                    value: Value::Histogram {
                        buckets: vec![(1e-6, 1), (0.5, 2)],
                        sum: Number::U64(u64::MAX),
                        count: 3,
                    },
                }],
            },
            Family {
                name: "empty".to_owned(),
                help: String::new(),
                kind: Kind::Counter,
                series: vec![],
            },
        ]);
        assert_eq!(
            text,
            "# HELP a \n# TYPE a histogram\n\
             a_bucket{le=\"0.000001\"} 1\na_bucket{le=\"0.5\"} 2\na_bucket{le=\"+Inf\"} 3\n\
             a_sum 18446744073709551615\na_count 3\n\
             # HELP b two\\nlines \\\\\n# TYPE b gauge\n\
             b{a=\"\"} 0.25\nb{a=\"q\\\"\\\\\\n\",z=\"1\"} +Inf\n"
        );
    }

    #[test]
    fn families_of_one_name_merge_under_the_first() {
        let gauge = |help: &str, v: u64| Family {
            name: "g".to_owned(),
            help: help.to_owned(),
            kind: Kind::Gauge,
            series: vec![Series {
                labels: vec![("k".into(), v.to_string())],
                value: Value::Single(Number::U64(v)),
            }],
        };
        assert_eq!(
            render(vec![gauge("first", 2), gauge("second", 1)]),
            "# HELP g first\n# TYPE g gauge\ng{k=\"1\"} 1\ng{k=\"2\"} 2\n"
        );
    }
}
