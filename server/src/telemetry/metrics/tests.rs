use super::*;

#[cfg(not(feature = "otlp"))]
#[test]
fn otlp_endpoint_needs_the_feature() {
    let e = Metrics::new(&MetricsConfig {
        otlp_endpoint: Some("http://127.0.0.1:4317".to_owned()),
        ..MetricsConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.reason(), "OTLP_DISABLED");
}

#[cfg(feature = "otlp")]
#[tokio::test]
async fn otlp_reader_is_added() {
    let m = Metrics::new(&MetricsConfig {
        otlp_endpoint: Some("http://127.0.0.1:4317".to_owned()),
        ..MetricsConfig::default()
    })
    .unwrap();
    m.record_commit("web", Outcome::Committed, &Phases::default());
    assert!(m.render().unwrap().contains("vallum_commits_total"));
}

#[test]
fn barrier_family_of_an_idle_engine() {
    let engine = Engine::new(
        vallum_engine::engine::EngineConfig {
            cores: 1,
            barrier: vallum_engine::dataplane::BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(Zero),
    );
    let f = barrier_family(&engine);
    assert_eq!(f.name, "vallum_packet_barrier_seconds");
    let Value::Histogram { buckets, count, .. } = &f.series[0].value else {
        panic!("{f:?}");
    };
    assert_eq!((buckets.len(), *count), (18, 0));
}

struct Zero;

impl vallum_engine::Clock for Zero {
    fn now_ns(&self) -> u64 {
        0
    }
}
