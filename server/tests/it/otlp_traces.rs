//! Spans over OTLP, end to end: a real OTLP/gRPC receiver in this process (the collector's
//! `opentelemetry.proto.collector.trace.v1.TraceService`, the tonic server code generated in
//! `opentelemetry-proto`), a real `vallumd --otlp-endpoint` pointing at it, and an Apply that
//! carries a W3C `traceparent` as gRPC metadata.
//!
//! Case: the call's span (`vallum.v1.RulesetService/Apply`, kind server, status `OK`) is a child
//! of the caller's span in the caller's trace; its `commit` child carries the new revision;
//! `validate`, `compile`, `persist` and `publish` are children of `commit`, `quiesce` of
//! `publish`, all in the caller's trace and inside the call's time.
//!
//! Needs the `otlp` feature, which `cargo test` turns on (server/Cargo.toml's dev-dependency on
//! this package).

#![cfg(feature = "otlp")]

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use support::{Daemon, text_source};
use tokio::sync::mpsc;
use vallum_proto::v1 as pb;

/// The receiver: hands every exported span to the test.
struct Receiver(mpsc::UnboundedSender<(String, Span)>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    let _ = self.0.send((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

const RULES: &str = "*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp --dport 22 -j ACCEPT
COMMIT
";

/// The caller's trace and span, as its `traceparent` names them (sampled).
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_spans_reach_the_otlp_receiver_in_the_callers_trace() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let receiver = support::served::serve(|incoming, shutdown| {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(tx)))
            .serve_with_incoming_shutdown(incoming, shutdown)
    })
    .await;
    let receiver_addr = receiver.addr;

    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://{receiver_addr}");
    // One export every 100 ms instead of the SDK's 5 s.
    let d = Daemon::start_env(
        &dir.path().join("v.db"),
        &["--otlp-endpoint", &endpoint],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    d.wait_serving().await;

    let mut request = tonic::Request::new(pb::ApplyRequest {
        ruleset: "web".into(),
        source: Some(text_source(RULES, false, "web.rules")),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{PARENT_ID}-01").parse().unwrap(),
    );
    let committed = d
        .rulesets()
        .await
        .apply(request)
        .await
        .unwrap()
        .into_inner();
    let revision = committed.revision.unwrap().number;

    // Every span of our trace, by name, until the whole tree is there (or 60 s passed).
    let wanted = [
        "vallum.v1.RulesetService/Apply",
        "commit",
        "validate",
        "compile",
        "persist",
        "publish",
        "quiesce",
    ];
    let mut spans: BTreeMap<String, Span> = BTreeMap::new();
    let mut services = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !wanted.iter().all(|w| spans.contains_key(*w)) {
        let got = tokio::time::timeout_at(deadline, rx.recv()).await;
        let Ok(Some((service, span))) = got else {
            panic!(
                "spans of trace {TRACE_ID} received: {:?} (want {wanted:?})",
                spans.keys().collect::<Vec<_>>()
            );
        };
        if hex(&span.trace_id) == TRACE_ID {
            services.push(service);
            spans.insert(span.name.clone(), span);
        }
    }
    assert!(
        services.iter().all(|s| s.contains("vallumd")),
        "resource service.name: {services:?}"
    );

    let rpc = &spans["vallum.v1.RulesetService/Apply"];
    assert_eq!(
        hex(&rpc.parent_span_id),
        PARENT_ID,
        "the caller's span is the parent"
    );
    assert_eq!(rpc.kind, SpanKind::Server as i32);
    assert_eq!(
        attr(rpc, "rpc.system.name"),
        Some(Value::StringValue("grpc".into()))
    );
    assert_eq!(
        attr(rpc, "rpc.response.status_code"),
        Some(Value::StringValue("OK".into()))
    );

    let commit = &spans["commit"];
    assert_eq!(commit.parent_span_id, rpc.span_id, "commit inside the call");
    assert_eq!(
        attr(commit, "vallum.revision"),
        Some(Value::IntValue(i64::try_from(revision).unwrap())),
        "{:?}",
        commit.attributes
    );
    assert_eq!(
        attr(commit, "vallum.ruleset"),
        Some(Value::StringValue("web".into()))
    );
    for phase in ["validate", "compile", "persist", "publish"] {
        assert_eq!(
            spans[phase].parent_span_id, commit.span_id,
            "{phase} is a child of commit"
        );
    }
    let quiesce = &spans["quiesce"];
    let publish = &spans["publish"];
    assert_eq!(quiesce.parent_span_id, publish.span_id);
    // Every span lies inside the call's span (quiesce inside publish too).
    for (name, s) in &spans {
        assert!(
            s.start_time_unix_nano >= rpc.start_time_unix_nano
                && s.end_time_unix_nano <= rpc.end_time_unix_nano
                && s.start_time_unix_nano <= s.end_time_unix_nano,
            "{name}: {}..{} outside the call's {}..{}",
            s.start_time_unix_nano,
            s.end_time_unix_nano,
            rpc.start_time_unix_nano,
            rpc.end_time_unix_nano
        );
    }
    assert!(
        quiesce.start_time_unix_nano >= publish.start_time_unix_nano
            && quiesce.end_time_unix_nano <= publish.end_time_unix_nano,
        "quiesce {quiesce:?} outside publish {publish:?}"
    );

    // vallumd first: the receiver's graceful stop waits for its exporter's connection.
    drop(d);
    receiver.stop().await;
}
