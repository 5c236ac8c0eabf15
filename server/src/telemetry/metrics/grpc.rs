//! The gRPC layer of the RPC metrics: [`GrpcMetricsLayer`] times every call and opens its
//! span; made by [`Metrics::grpc_layer`](super::Metrics::grpc_layer).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Histogram;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::traces;
use crate::grpc::auth;

/// Around every gRPC call: records `rpc.server.call.duration` (seconds, from the request to
/// the end of the response body, i.e. the trailers) with `rpc.system.name=grpc`,
/// `rpc.method` (`vallum.v1.RulesetService/Apply`), `rpc.response.status_code` (the status
/// name, `OK`) and, for the server's own failures, `error.type` (the status name), as the OTel
/// RPC semantic conventions (release candidate, after 1.37) name them; the deprecated
/// `rpc.server.duration` with the attributes of conventions up to 1.37 (`rpc.system`,
/// `rpc.service`, `rpc.method` without the service, numeric `rpc.grpc.status_code`); and opens
/// the call's span, a child of the caller's span named by a `traceparent` header, which ends
/// with the call ([`traces`]). Paths that are not methods of our API, health or reflection are
/// recorded as `rpc.method=_OTHER` (and `rpc.service=_OTHER`) so that random paths cannot
/// create unbounded series.
#[derive(Clone, Debug)]
pub struct GrpcMetricsLayer {
    pub(super) histograms: RpcHistograms,
}

/// The two RPC duration instruments and the clock calls are timed on.
#[derive(Clone, Debug)]
pub(super) struct RpcHistograms {
    pub(super) call_duration: Histogram<f64>,
    pub(super) deprecated_duration: Histogram<f64>,
    pub(super) clock: crate::clock::Clock,
}

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> GrpcMetricsService<S> {
        GrpcMetricsService {
            inner,
            histograms: self.histograms.clone(),
        }
    }
}

/// The service made by [`GrpcMetricsLayer`].
#[derive(Clone, Debug)]
pub struct GrpcMetricsService<S> {
    inner: S,
    histograms: RpcHistograms,
}

/// One call being timed, with its span (closed when this is dropped).
pub(super) struct Recording {
    pub(super) start: Instant,
    pub(super) histograms: RpcHistograms,
    pub(super) service: &'static str,
    pub(super) method: &'static str,
    pub(super) span: tracing::Span,
}

impl Recording {
    pub(super) fn finish(self, code: i64) {
        let elapsed = self
            .histograms
            .clock
            .now()
            .saturating_duration_since(self.start)
            .as_secs_f64();
        let name = grpc_code_name(code);
        let full = match self.service {
            "_OTHER" => "_OTHER".to_owned(),
            service => format!("{service}/{}", self.method),
        };
        let mut attrs = vec![
            KeyValue::new("rpc.system.name", "grpc"),
            KeyValue::new("rpc.method", full),
            KeyValue::new("rpc.response.status_code", name),
        ];
        if is_server_error(code) {
            attrs.push(KeyValue::new("error.type", name));
        }
        self.histograms.call_duration.record(elapsed, &attrs);
        self.histograms.deprecated_duration.record(
            elapsed,
            &[
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", self.service),
                KeyValue::new("rpc.method", self.method),
                KeyValue::new("rpc.grpc.status_code", code),
            ],
        );
        self.span.record("rpc.response.status_code", name);
        if is_server_error(code) {
            self.span.record("error.type", name);
            self.span.record("otel.status_code", "error");
        }
    }
}

/// gRPC status code UNKNOWN, for bodies that fail.
const CODE_UNKNOWN: i64 = 2;
/// gRPC status code CANCELLED, for bodies dropped before their trailers (client went away).
const CODE_CANCELLED: i64 = 1;

/// The name of gRPC status `code` (`OK`, `INVALID_ARGUMENT`, ...), as
/// `rpc.response.status_code` wants it; `UNKNOWN` for a code gRPC does not define.
fn grpc_code_name(code: i64) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN")
}

/// Whether `code` is the server's failure rather than an answer about the request: the
/// codes the OTel gRPC conventions count as server-side errors (UNKNOWN, DEADLINE_EXCEEDED,
/// UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS).
fn is_server_error(code: i64) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

fn grpc_status(headers: &http::HeaderMap) -> Option<i64> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

impl<S, B, RB> Service<http::Request<B>> for GrpcMetricsService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Send + 'static,
{
    type Response = http::Response<MetricsBody<RB>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<MetricsBody<RB>>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        use tracing::Instrument as _;
        let (service, method) =
            auth::known_method(req.uri().path()).unwrap_or(("_OTHER", "_OTHER"));
        let full = match service {
            "_OTHER" => "_OTHER".to_owned(),
            _ => format!("{service}/{method}"),
        };
        let span = tracing::info_span!(
            "rpc",
            otel.name = %full,
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            rpc.system.name = "grpc",
            rpc.method = %full,
            rpc.response.status_code = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        traces::set_remote_parent(&span, req.headers());
        let rec = Recording {
            start: self.histograms.clock.now(),
            histograms: self.histograms.clone(),
            service,
            method,
            span: span.clone(),
        };
        // The handler's future is made and run inside the call's span, so the spans it
        // opens (the commit's) are its children.
        let fut = span.in_scope(|| self.inner.call(req));
        Box::pin(
            async move {
                match fut.await {
                    Ok(resp) => {
                        // Trailers-only responses (errors before any message) carry the status
                        // in the headers; others in the trailers at the end of the body.
                        let rec = match grpc_status(resp.headers()) {
                            Some(code) => {
                                rec.finish(code);
                                None
                            }
                            None => Some(rec),
                        };
                        Ok(resp.map(|inner| MetricsBody { inner, rec }))
                    }
                    Err(e) => {
                        rec.finish(CODE_UNKNOWN);
                        Err(e)
                    }
                }
            }
            .instrument(span),
        )
    }
}

pin_project! {
    /// A response body that records the call's duration when its trailers (or end, or an error)
    /// pass, or when it is dropped early.
    pub struct MetricsBody<B> {
        #[pin]
        inner: B,
        rec: Option<Recording>,
    }

    impl<B> PinnedDrop for MetricsBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(rec) = this.project().rec.take() {
                rec.finish(CODE_CANCELLED);
            }
        }
    }
}

impl<B: Default> Default for MetricsBody<B> {
    fn default() -> MetricsBody<B> {
        MetricsBody {
            inner: B::default(),
            rec: None,
        }
    }
}

impl<B: http_body::Body> http_body::Body for MetricsBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(code) = f.trailers_ref().and_then(grpc_status) {
                    if let Some(rec) = this.rec.take() {
                        rec.finish(code);
                    }
                }
            }
            Some(Err(_)) | None => {
                if let Some(rec) = this.rec.take() {
                    rec.finish(CODE_UNKNOWN);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
