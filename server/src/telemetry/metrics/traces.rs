//! Traces: `tracing` spans for every gRPC call and every commit phase, exported as
//! OpenTelemetry spans over OTLP/gRPC to `--otlp-endpoint` (cargo feature `otlp`; without it
//! the spans exist only for the process log's subscriber and nothing is exported).
//!
//! The spans, what opens them and their attributes:
//! - `{rpc.method}` (e.g. `vallum.v1.RulesetService/Apply`), kind server: one per call, opened
//!   by [`super::GrpcMetricsLayer`] and closed when the response's trailers pass, as
//!   `rpc.server.call.duration` is measured (the OTel RPC span conventions): `rpc.system.name`
//!   `grpc`, `rpc.method`, `rpc.response.status_code` (`OK`, `INVALID_ARGUMENT`, ...) and
//!   `error.type` for the server's own failures. Its parent is the caller's span when the
//!   request carries a W3C `traceparent` (and `tracestate`) header, as gRPC metadata: the
//!   call joins the caller's trace.
//! - `commit` (`vallum.ruleset`, `vallum.revision`, `vallum.outcome`) inside the call that
//!   commits, with one child per phase of [`crate::control::pipeline`]: `validate`, `compile` (both on
//!   the commit's blocking thread; they overlap `persist`), `persist` (the store's durable
//!   transaction) and `publish` (swap, quiesce, carry counters), whose child `quiesce` is the
//!   wait for the cores that were mid-batch. The engine times `quiesce` inside its publish
//!   call; that span is placed from the engine's figures ([`record_interval`]: it ends where
//!   the counter carry began, `carry_ns` before the call returned).
//!
//! Export: a batch span processor (its own thread; `OTEL_BSP_SCHEDULE_DELAY` and the other
//! `OTEL_BSP_*` variables of the SDK apply, default one export every 5 s) with the OTLP/gRPC
//! span exporter; resource `service.name=vallumd`. Spans of the `vallum_server` target at
//! level INFO and above are exported, whatever `RUST_LOG` says for the log lines. The tonic
//! exporter runs on the tokio runtime that is current when [`Traces::new`] is called.

use std::time::SystemTime;

use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use super::{MetricsConfig, MetricsError};

/// The trace exporter of the process (none when `--otlp-endpoint` is not set).
#[derive(Debug)]
pub struct Traces {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Traces {
    /// The exporter to `config.otlp_endpoint`, if set; call inside the tokio runtime the
    /// process keeps running (the tonic channel lives on it).
    ///
    /// Errors: [`MetricsError::Exporter`] when the endpoint is not a URL the exporter takes;
    /// [`MetricsError::OtlpDisabled`] with an endpoint but without the `otlp` feature.
    pub fn new(config: &MetricsConfig) -> Result<Traces, MetricsError> {
        imp::new(config.otlp_endpoint.as_deref())
    }

    /// No exporter (tests, and `vallumd` before its configuration is read).
    pub fn none() -> Traces {
        Traces {
            #[cfg(feature = "otlp")]
            provider: None,
        }
    }

    /// The `tracing` layer that turns spans into OTel spans for the exporter, filtered to
    /// this crate's spans at INFO; `None` without an exporter.
    pub fn layer<S>(&self) -> Option<Box<dyn Layer<S> + Send + Sync + 'static>>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        imp::layer(self)
    }

    /// Exports the spans still queued and stops the exporter (at exit, before the runtime
    /// ends).
    pub fn shutdown(&self) -> Result<(), MetricsError> {
        imp::shutdown(self)
    }
}

/// Makes `span` (just created, not yet entered) a child of the caller's span named by the
/// W3C trace-context headers of `headers` (`traceparent`, `tracestate`); nothing when there
/// is none, it does not parse, or nothing exports.
pub fn set_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    imp::set_remote_parent(span, headers);
}

/// Records a finished child span of `parent` named `name` from `start` to `end`, measured by
/// someone else (the engine's quiesce wait inside its publish call); nothing when nothing
/// exports.
pub fn record_interval(
    parent: &tracing::Span,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
) {
    imp::record_interval(parent, name, start, end);
}

#[cfg(feature = "otlp")]
mod imp {
    use std::time::SystemTime;

    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
    use opentelemetry_otlp::{SpanExporter, WithExportConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::registry::LookupSpan;

    use super::{MetricsError, Traces};

    /// The instrumentation scope of our spans.
    const SCOPE: &str = "vallum";

    pub(super) fn new(endpoint: Option<&str>) -> Result<Traces, MetricsError> {
        let Some(endpoint) = endpoint else {
            return Ok(Traces::none());
        };
        let exporter = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| MetricsError::Exporter(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_resource(Resource::builder().with_service_name("vallumd").build())
            .with_batch_exporter(exporter)
            .build();
        // For `record_interval`, which builds spans with the OTel API directly.
        opentelemetry::global::set_tracer_provider(provider.clone());
        Ok(Traces {
            provider: Some(provider),
        })
    }

    pub(super) fn layer<S>(t: &Traces) -> Option<Box<dyn Layer<S> + Send + Sync + 'static>>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let provider = t.provider.as_ref()?;
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(SCOPE))
            .with_threads(false)
            .with_location(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target("vallum_server", tracing::Level::INFO));
        Some(Box::new(layer))
    }

    pub(super) fn shutdown(t: &Traces) -> Result<(), MetricsError> {
        match &t.provider {
            Some(p) => p
                .shutdown()
                .map_err(|e| MetricsError::Exporter(e.to_string())),
            None => Ok(()),
        }
    }

    /// `http::HeaderMap` as the propagator's carrier.
    struct Headers<'a>(&'a http::HeaderMap);

    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }

    pub(super) fn set_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
        if !headers.contains_key("traceparent") {
            return;
        }
        let cx = TraceContextPropagator::new().extract(&Headers(headers));
        // Fails only when no OTel layer sees the span (nothing exports): nothing to link.
        let _ = span.set_parent(cx);
    }

    pub(super) fn record_interval(
        parent: &tracing::Span,
        name: &'static str,
        start: SystemTime,
        end: SystemTime,
    ) {
        let cx = parent.context();
        let tracer = opentelemetry::global::tracer(SCOPE);
        let mut span = tracer
            .span_builder(name)
            .with_start_time(start)
            .start_with_context(&tracer, &cx);
        span.end_with_timestamp(end);
    }
}

#[cfg(not(feature = "otlp"))]
mod imp {
    use std::time::SystemTime;

    use tracing_subscriber::Layer;
    use tracing_subscriber::registry::LookupSpan;

    use super::{MetricsError, Traces};

    pub(super) fn new(endpoint: Option<&str>) -> Result<Traces, MetricsError> {
        match endpoint {
            None => Ok(Traces::none()),
            Some(_) => Err(MetricsError::OtlpDisabled),
        }
    }

    pub(super) fn layer<S>(_: &Traces) -> Option<Box<dyn Layer<S> + Send + Sync + 'static>>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        None
    }

    pub(super) fn shutdown(_: &Traces) -> Result<(), MetricsError> {
        Ok(())
    }

    pub(super) fn set_remote_parent(_: &tracing::Span, _: &http::HeaderMap) {}

    pub(super) fn record_interval(
        _: &tracing::Span,
        _: &'static str,
        _: SystemTime,
        _: SystemTime,
    ) {
    }
}
