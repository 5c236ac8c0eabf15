//! The auth and request-limit layers in a real tonic server (the gRPC health service): roles,
//! the caller in request extensions, and oversized requests answered RESOURCE_EXHAUSTED.

use crate::support::served;

use std::convert::Infallible;
use std::net::SocketAddr;

use tonic::Code;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;
use tower::ServiceExt;
use vallum_server::grpc::auth::{AuthLayer, Caller, Role, TokenSet};
use vallum_server::grpc::limits::RequestLimitLayer;

use served::Served;

const ADMIN: &str = "admin-token-0123456789";
const READER: &str = "reader-token-0123456789";

fn tokens() -> TokenSet {
    let mut t = TokenSet::new();
    t.add_text(
        &format!("admin {ADMIN} alice\nread-only {READER} bob\n"),
        None,
        "tokens",
    )
    .unwrap();
    t
}

#[tokio::test]
async fn caller_reaches_the_handler() {
    let inner = tower::service_fn(|req: http::Request<()>| async move {
        let who = req
            .extensions()
            .get::<Caller>()
            .map(|c| format!("{} {}", c.name, c.role))
            .unwrap_or_default();
        Ok::<_, Infallible>(http::Response::new(who))
    });
    let svc = tower::Layer::layer(&AuthLayer::new(tokens()), inner);
    let req = |path: &str, token: &str| {
        http::Request::builder()
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .body(())
            .unwrap()
    };
    let resp = svc
        .clone()
        .oneshot(req("/vallum.v1.RulesetService/ListRulesets", READER))
        .await
        .unwrap();
    assert_eq!(resp.body(), "bob read-only");
    let resp = svc
        .clone()
        .oneshot(req("/vallum.v1.RulesetService/Apply", ADMIN))
        .await
        .unwrap();
    assert_eq!(resp.body(), "alice admin");
    // Refused: the inner service is not called (empty body), the status is in the headers.
    let resp = svc
        .oneshot(req("/vallum.v1.RulesetService/Apply", READER))
        .await
        .unwrap();
    assert_eq!(resp.body(), "");
    let status = tonic::Status::from_header_map(resp.headers()).unwrap();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.get_details_error_info().unwrap().reason,
        "ADMIN_REQUIRED"
    );
    assert_eq!(Role::Admin.as_str(), "admin");
}

async fn start(max: usize) -> Served {
    let (_reporter, health) = tonic_health::server::health_reporter();
    served::serve(|incoming, shutdown| {
        Server::builder()
            .layer(RequestLimitLayer::new(max))
            .layer(AuthLayer::new(tokens()))
            .add_service(health.max_decoding_message_size(max))
            .serve_with_incoming_shutdown(incoming, shutdown)
    })
    .await
}

async fn client_channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn roles_and_request_size_over_grpc() {
    let server = start(64).await;
    let addr = server.addr;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let call = |token: Option<&str>, service: String| {
        let mut req = tonic::Request::new(HealthCheckRequest { service });
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        req
    };

    // Health is public: Kubernetes' gRPC probes send no token.
    client.check(call(None, String::new())).await.unwrap();
    client
        .check(call(Some(READER), String::new()))
        .await
        .unwrap();

    // Any other service needs a valid token; the auth layer answers before routing, so the
    // (unserved) EngineService shows it: no token, a bad token, then a reader passing auth
    // and reaching the router (UNIMPLEMENTED here).
    let mut engine = vallum_proto::v1::engine_service_client::EngineServiceClient::new(
        client_channel(addr).await,
    );
    let status = |token: Option<&str>| {
        let mut req = tonic::Request::new(vallum_proto::v1::GetStatusRequest {});
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        req
    };
    let e = engine.get_status(status(None)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(e.get_details_error_info().unwrap().reason, "TOKEN_MISSING");
    let e = engine
        .get_status(status(Some("not-a-valid-token-at-all")))
        .await
        .unwrap_err();
    assert_eq!(e.get_details_error_info().unwrap().reason, "TOKEN_INVALID");
    let e = engine.get_status(status(Some(READER))).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");

    // Over the 64-byte limit: RESOURCE_EXHAUSTED with ErrorInfo naming the limit.
    let e = client
        .check(call(Some(READER), "x".repeat(200)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    let info = e.get_details_error_info().unwrap();
    assert_eq!(info.reason, "REQUEST_TOO_LARGE");
    assert_eq!(info.metadata["limit"], "max-request-bytes");
    assert_eq!(info.metadata["max"], "64");
    assert!(
        e.message().contains("exceeds the limit of 64 bytes"),
        "{}",
        e.message()
    );
    drop((client, engine));
    server.stop().await;
}
