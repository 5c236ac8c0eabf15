//! Every method of `vallum.v1` goes through the layer: the methods are taken from the auth
//! table ([`crate::grpc::auth::api_methods`]) and called over the services' own tonic
//! routes with an empty request, as a client's call arrives after the RPC layers.

use super::*;
use crate::control::fleet::Keys;
use crate::control::fleet::etcd::Etcd;
use crate::control::fleet::service::FleetApi;
use crate::control::hooks::Hooks;
use crate::control::pipeline::Pipeline;
use crate::control::store::Store;
use crate::grpc::auth::{Access, Caller, Role, Scope, api_methods};
use crate::grpc::service::conntrack::ConntrackApi;
use crate::grpc::service::counters::CountersApi;
use crate::grpc::service::engine::EngineApi;
use crate::grpc::service::ruleset::RulesetApi;
use crate::grpc::service::sets::SetApi;
use crate::grpc::service::trace::TraceApi;
use tonic_types::StatusExt as _;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Engine, EngineConfig};
use vallum_proto::v1::conntrack_service_server::ConntrackServiceServer;
use vallum_proto::v1::counter_service_server::CounterServiceServer;
use vallum_proto::v1::engine_service_server::EngineServiceServer;
use vallum_proto::v1::fleet_service_server::FleetServiceServer;
use vallum_proto::v1::ruleset_service_server::RulesetServiceServer;
use vallum_proto::v1::set_service_server::SetServiceServer;
use vallum_proto::v1::trace_service_server::TraceServiceServer;

/// The services over one state (not ready: the test says when), their routes, and the
/// store's file (kept by the temporary directory).
struct Served {
    state: Arc<State>,
    routes: tonic::service::Routes,
    db: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn served() -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    let hooks = Hooks::default();
    let clock = hooks.clock.clone();
    let store = Store::open_on(&db, hooks.clock.clone())
        .await
        .expect("store");
    let engine = Arc::new(Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(hooks.clock.clone()),
    ));
    let pipeline = Arc::new(Pipeline::new(engine, store, hooks));
    let events = crate::telemetry::events::Events::start(clock).expect("events thread");
    let state = State::new(pipeline, "none".into(), events);
    // An etcd that is never reached: every call here ends before it would be.
    let etcd = Etcd::connect(&["http://127.0.0.1:9".to_string()]).expect("etcd client");
    let mut routes = tonic::service::Routes::builder();
    routes
        .add_service(RulesetServiceServer::new(RulesetApi::new(state.clone())))
        .add_service(CounterServiceServer::new(CountersApi::new(state.clone())))
        .add_service(TraceServiceServer::new(TraceApi::new(state.clone())))
        .add_service(EngineServiceServer::new(EngineApi::new(state.clone())))
        .add_service(ConntrackServiceServer::new(ConntrackApi::new(
            state.clone(),
        )))
        .add_service(SetServiceServer::new(SetApi::new(state.clone())))
        .add_service(FleetServiceServer::new(FleetApi::new(
            state.clone(),
            etcd,
            Keys::new("/vallum-test"),
            1 << 20,
        )));
    Served {
        state,
        routes: routes.routes(),
        db,
        _dir: dir,
    }
}

/// Calls `Service/Method` with an empty request (as `caller`, when given) and returns the
/// status the call ended with (OK when it did not fail).
async fn call_empty(
    routes: &tonic::service::Routes,
    method: &str,
    caller: Option<&Caller>,
) -> Status {
    use tower::ServiceExt as _;
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://vallumd/vallum.v1.{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        // One gRPC frame: not compressed, 0 bytes (every field at its default).
        .body(String::from("\0\0\0\0\0"))
        .expect("request");
    if let Some(c) = caller {
        request.extensions_mut().insert(c.clone());
    }
    let response = routes.clone().oneshot(request).await.expect("routed");
    assert_eq!(response.status(), http::StatusCode::OK, "{method}");
    // A refusal is a trailers-only response: its status is in the headers.
    Status::from_header_map(response.headers()).unwrap_or_else(|| Status::new(tonic::Code::Ok, ""))
}

/// The audit rows, oldest first: (method, caller, outcome).
fn audit_rows(db: &std::path::Path) -> Vec<(String, String, String)> {
    let conn = rusqlite::Connection::open(db).expect("open the store");
    let mut q = conn
        .prepare("SELECT method, caller, outcome FROM audit ORDER BY id")
        .expect("query");
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .collect::<rusqlite::Result<_>>()
        .expect("rows")
}

fn reason(s: &Status) -> String {
    s.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// Until the stored state is loaded every method, reads included, answers NOT_READY and
/// writes nothing.
#[tokio::test]
async fn a_server_that_is_not_ready_refuses_every_method() {
    let s = served().await;
    let mut not_refused = Vec::new();
    let mut n = 0;
    for (method, _) in api_methods() {
        n += 1;
        let status = call_empty(&s.routes, method, None).await;
        if reason(&status) != "NOT_READY" {
            not_refused.push(format!(
                "{method}: {:?} {}",
                status.code(),
                status.message()
            ));
        }
    }
    assert!(n > 40, "the auth table lists every method ({n})");
    assert!(not_refused.is_empty(), "not refused: {not_refused:#?}");
    assert!(
        audit_rows(&s.db).is_empty(),
        "a refusal before the call writes no row"
    );
}

/// A caller whose scope holds no operation is refused every mutating method with
/// PERMISSION_DENIED (SCOPE_DENIED, before its request is read), and each refusal is one
/// audit row naming the caller; a read is not refused.
#[tokio::test]
async fn a_denied_caller_is_refused_and_audited_on_every_mutating_method() {
    let s = served().await;
    s.state
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    let caller = Caller {
        name: Arc::from("nobody"),
        role: Role::Admin,
        scope: Some(Arc::new(Scope::default())),
    };
    let mut wrong = Vec::new();
    let mut mutating = 0;
    for (method, access) in api_methods() {
        if access != Access::Admin {
            continue;
        }
        mutating += 1;
        let before = audit_rows(&s.db).len();
        let status = call_empty(&s.routes, method, Some(&caller)).await;
        let rows = audit_rows(&s.db);
        let row = (rows.len() == before + 1).then(|| rows[before].clone());
        let audited = row.as_ref().is_some_and(|(_, who, outcome)| {
            who.starts_with("nobody [") && outcome == "SCOPE_DENIED"
        });
        if status.code() != tonic::Code::PermissionDenied
            || reason(&status) != "SCOPE_DENIED"
            || !audited
        {
            wrong.push(format!(
                "{method}: {:?} {} {}, audit rows {before} -> {}: {row:?}",
                status.code(),
                reason(&status),
                status.message(),
                rows.len()
            ));
        }
    }
    assert!(
        mutating >= 20,
        "the auth table lists the mutating methods ({mutating})"
    );
    assert!(wrong.is_empty(), "not refused and audited: {wrong:#?}");
    // The same caller may read (the scope limits changes only).
    let status = call_empty(&s.routes, "RulesetService/ListRulesets", Some(&caller)).await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
}

/// A digest task that panicked fails the call that waits for it, and the call still has
/// its audit record (without the digest).
#[tokio::test]
async fn a_failed_digest_task_still_leaves_an_audit_record() {
    let s = served().await;
    let mut cx = Cx {
        state: s.state.clone(),
        caller: "local:uid=0".into(),
        audit: None,
        digesting: Some(tokio::task::spawn_blocking(|| -> AuditEntry {
            panic!("digest failed")
        })),
        method: "Apply",
    };
    let e = cx.join_audit().await.expect_err("the task panicked");
    assert!(
        matches!(e, Error::TaskFailed { task: "audit", .. }),
        "{e:?}"
    );
    let row = cx.audit.expect("a record");
    assert_eq!(
        (
            row.caller.as_str(),
            row.method.as_str(),
            row.request_digest.as_str()
        ),
        ("local:uid=0", "Apply", "")
    );
    // A task that ran gives its record.
    let mut cx = Cx {
        digesting: Some(tokio::task::spawn_blocking(|| {
            audit_entry_of("c".into(), "Apply", "d".into())
        })),
        audit: None,
        ..cx
    };
    cx.join_audit().await.expect("joined");
    assert_eq!(cx.audit.map(|a| a.request_digest), Some("d".to_string()));
}

/// A call marked as running on a task of its own ([`on_own_task`], a local call's
/// connection) runs in place: on the caller's task, its answer unchanged; any other call runs
/// on a task spawned for it (a gRPC handler's future may be dropped by its client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_its_own_task_runs_in_place_and_others_on_a_spawned_task() {
    let id = || async { Ok::<_, Status>(tokio::task::id()) };
    let outer = tokio::spawn(async move {
        let here = tokio::task::id();
        let spawned = to_completion(id()).await.expect("spawned call");
        let in_place = on_own_task(async { to_completion(id()).await })
            .await
            .expect("call in place");
        (here, spawned, in_place)
    });
    let (here, spawned, in_place) = outer.await.expect("outer task");
    assert_ne!(spawned, here, "a gRPC call runs on a task of its own");
    assert_eq!(in_place, here, "a call on its own task runs there");
    // An error is the call's own either way.
    let refused = on_own_task(to_completion(async {
        Err::<(), _>(Status::failed_precondition("no"))
    }))
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
}

/// A handler that panics when `bug`.
fn handler_bug(bug: bool) -> Result<(), Status> {
    assert!(!bug, "a bug in a handler");
    Ok(())
}

/// A call run in place that panics answers INTERNAL, as one whose spawned task panicked, and
/// the task it ran on goes on (the next call on that connection is served).
#[tokio::test]
async fn a_call_in_place_that_panics_is_internal_and_the_task_goes_on() {
    let panicked = on_own_task(to_completion(async { handler_bug(true) }))
        .await
        .unwrap_err();
    assert_eq!(panicked.code(), tonic::Code::Internal);
    assert_eq!(reason(&panicked), "INTERNAL");
    assert!(
        !panicked.message().contains("a bug in a handler"),
        "the panic's text stays in the log: {}",
        panicked.message()
    );
    let spawned = to_completion(async { handler_bug(true) })
        .await
        .unwrap_err();
    assert_eq!(spawned.code(), tonic::Code::Internal);
    let next = on_own_task(to_completion(async { Ok::<_, Status>(7) })).await;
    assert_eq!(next.expect("the next call"), 7);
}
