//! The metric reference (`docs/metrics.md`), rendered from what the registry collects: every
//! family's scraped name, type, unit, label names and help text, sorted by name.
//!
//! A family appears once it has a series, so the test that keeps `docs/metrics.md` in step
//! (`metric_reference_is_docs_metrics_md`, below) feeds every instrument once. Regenerate the
//! file with `VALLUM_BLESS=1 cargo test -p vallum-server --lib metric_reference`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use opentelemetry_sdk::metrics::data::ResourceMetrics;

use super::exposition::{self, Family, Kind};

/// The Markdown reference of the families in `rm`, plus `extra` (families the registry does
/// not hold, with their unit: the barrier histogram).
pub(super) fn render(rm: &ResourceMetrics, extra: Vec<(Family, &'static str)>) -> String {
    let mut rows: Vec<(Family, String)> = Vec::new();
    // The resource's `target_info`.
    for f in exposition::from_otel(rm) {
        if f.name == "target_info" {
            rows.push((f, String::new()));
        }
    }
    for scope in rm.scope_metrics() {
        for m in scope.metrics() {
            if let Some(f) = exposition::family(m) {
                rows.push((f, m.unit().to_owned()));
            }
        }
    }
    rows.extend(extra.into_iter().map(|(f, u)| (f, u.to_owned())));
    rows.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    rows.dedup_by(|a, b| a.0.name == b.0.name);

    let mut out = String::from(
        "# Metric reference\n\
         \n\
         Every metric family `vallumd` serves on `/metrics` (Prometheus text format; the same \
         instruments are pushed over OTLP with `--otlp-endpoint`, under their OTel names: \
         `rpc.server.call.duration` is scraped as `rpc_server_call_duration_seconds`). \
         Generated from the code by the test `metrics::reference::tests::\
         metric_reference_is_docs_metrics_md`, which fails when this file differs; regenerate \
         it with\n\
         \n\
         ```sh no-run=build\n\
         VALLUM_BLESS=1 cargo test -p vallum-server --lib metric_reference\n\
         ```\n\
         \n\
         Histograms also have `_bucket{le}`, `_sum` and `_count` series. Where each metric \
         comes from: `server/src/telemetry/metrics.rs` (module docs) and docs/operations.md, \
         \"Observability\".\n\
         \n\
         | name | type | unit | labels | help |\n\
         |---|---|---|---|---|\n",
    );
    for (f, unit) in rows {
        let labels: BTreeSet<&str> = f
            .series
            .iter()
            .flat_map(|s| s.labels.iter().map(|(k, _)| k.as_str()))
            .collect();
        let labels: Vec<String> = labels.iter().map(|l| format!("`{l}`")).collect();
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let unit = if unit.is_empty() {
            String::new()
        } else {
            format!("`{unit}`")
        };
        // `write!` into a String cannot fail.
        let _ = writeln!(
            out,
            "| `{}` | {kind} | {unit} | {} | {} |",
            f.name,
            labels.join(", "),
            f.help.replace('|', "\\|")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    use vallum_engine::conntrack::ConntrackConfig;
    use vallum_engine::dataplane::BarrierStrategy;
    use vallum_engine::engine::{Change, Engine, EngineConfig};
    use vallum_engine::model::{Family, Hook};
    use vallum_engine::packet::PacketMeta;
    use vallum_engine::restore::{ParseOptions, parse_ruleset};
    use vallum_engine::sets::{NoSets, SetManager, SetSpec, SetType};
    use vallum_engine::snapshot::Verdict;

    use crate::control::outcome::Outcome;
    use crate::control::store::Phases;
    use crate::telemetry::events::Events;
    use crate::telemetry::metrics::{Metrics, MetricsConfig, Recording};

    struct Zero;

    impl vallum_engine::Clock for Zero {
        fn now_ns(&self) -> u64 {
            0
        }
    }

    /// Metrics with every instrument fed once (each family needs a series to be listed), and
    /// the directory that stands for `/proc` for the `vallum_nfqueue_*` families (one bound,
    /// fail-open queue 0), kept while the metrics are read.
    fn every_metric() -> (Metrics, tempfile::TempDir) {
        let metrics = Metrics::new(&MetricsConfig {
            metrics_rule_counters: true,
            ..MetricsConfig::default()
        })
        .unwrap();
        let engine = Arc::new(Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: Some(ConntrackConfig::default()),
            },
            Arc::new(Zero),
        ));
        let rules = "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                     -A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";
        let rs = parse_ruleset("web", rules, &ParseOptions::default()).unwrap();
        drop(
            engine
                .commit(Change::Put(rs.clone()), &NoSets)
                .unwrap()
                .retired,
        );
        // A shadow (of the same rules) so that `vallum_shadow_packets_total` has a series.
        engine
            .start_shadow(rs, 2, Default::default(), &NoSets)
            .unwrap();
        {
            let mut worker = engine.worker(0).unwrap();
            let mut packets = [PacketMeta {
                family: Family::Ipv4,
                hook: Hook::Input,
                src: Ipv4Addr::new(10, 0, 0, 1).into(),
                dst: Ipv4Addr::new(10, 0, 0, 2).into(),
                protocol: 6,
                sport: 40000,
                dport: 22,
                len: 60,
                ..PacketMeta::default()
            }];
            worker.process_batch(&mut packets, &mut [Verdict::Accept], 1);
        }
        metrics.observe_engine(engine.clone()).unwrap();
        metrics.observe_conntrack(engine);
        let sets = Arc::new(SetManager::new());
        sets.create("bans", SetSpec::new(SetType::HashNet, Family::Ipv4))
            .unwrap();
        metrics.observe_sets(sets).unwrap();
        metrics.observe_store(|| (2, 1));
        metrics.observe_events(Events::start(crate::clock::Clock::system()).unwrap());
        metrics.record_commit("web", Outcome::Committed, &Phases::default());
        metrics.record_retired(0, 0);
        metrics.set_active_revision("web", Some(1));
        metrics.set_rulesets_not_loaded(0);
        for code in [0, 13] {
            let histograms = metrics.grpc_layer(crate::clock::Clock::system()).histograms;
            Recording {
                start: histograms.clock.now(),
                histograms,
                service: "vallum.v1.RulesetService",
                method: "Apply",
                span: tracing::Span::none(),
            }
            .finish(code);
        }
        crate::control::fleet::agent::FleetStats::new(&metrics, crate::clock::Clock::system())
            .record_each_once();
        // NFQUEUE queue 0 as the kernel lists it (formats of nfnetlink_queue's and netlink's
        // seq_show), held by port id 4242.
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc.path().join("net/netfilter")).unwrap();
        std::fs::write(
            proc.path().join("net/netfilter/nfnetlink_queue"),
            "    0   4242     0 2   256     0     0        3  1\n",
        )
        .unwrap();
        std::fs::write(
            proc.path().join("net/netlink"),
            "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
             00000000ea56557b 12  4242       00000000 0        0        0     2        0        565\n",
        )
        .unwrap();
        metrics.observe_nfqueue_at(
            proc.path(),
            vec![Arc::new(crate::host::nfqueue_stats::QueueCounters::new(
                0,
                true,
                1024,
                1 << 20,
            ))],
        );
        let drift = crate::host::kernel_tables::DriftMap::default();
        drift.lock().unwrap().insert(
            (Family::Ipv4, vallum_engine::model::TableKind::Nat),
            crate::host::kernel_tables::TableDrift {
                family: Family::Ipv4,
                table: vallum_engine::model::TableKind::Nat,
                drift: false,
                detail: String::new(),
                checked_at: 0,
            },
        );
        crate::host::kernel_tables::observe_drift(&metrics, drift);
        (metrics, proc)
    }

    /// docs/metrics.md is the reference the code renders (VALLUM_BLESS=1 rewrites it).
    #[test]
    fn metric_reference_is_docs_metrics_md() {
        let (metrics, _proc) = every_metric();
        let text = metrics.reference().unwrap();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
        if std::env::var_os("VALLUM_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &text).unwrap();
            return;
        }
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            doc == text,
            "{} differs from the metrics the code registers; regenerate it with \
             `VALLUM_BLESS=1 cargo test -p vallum-server --lib metric_reference`.\n\
             The code renders:\n{text}",
            path.display()
        );
    }

    /// Every family the registry serves is in the reference, with its type and unit.
    #[test]
    fn metric_reference_lists_every_scraped_family() {
        let (m, _proc) = every_metric();
        let scrape = m.render().unwrap();
        let reference = m.reference().unwrap();
        for line in scrape.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    reference.contains(&format!("| `{name}` | {kind} |")),
                    "{name} {kind} missing in\n{reference}"
                );
            }
        }
        assert!(reference.contains("| `rpc_server_call_duration_seconds` | histogram | `s` |"));
        assert!(
            reference.contains("`error_type`, `rpc_method`"),
            "{reference}"
        );
    }
}
