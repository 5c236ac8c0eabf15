//! Wiring: store, engine, pipeline, metrics (`/metrics`), gRPC server (TLS, the layers of
//! [`hooks::rpc_layer`]: RPC metrics, request limit, auth, inside [`crate::grpc::connections`]; health,
//! reflection, the six
//! services), packet sources, commit-confirmed timer, conntrack and set garbage collection,
//! shutdown.
//!
//! Start order: open and migrate the store, restore the sets, load the active revisions
//! (which may reference the sets), then SERVING.
//!
//! An active revision that does not load never lets the firewall open silently
//! (`--on-load-failure`, [`OnLoadFailure`]): `refuse` (the default) stops vallumd with
//! ACTIVE_REVISION_NOT_LOADED before SERVING; `degraded` serves the other rulesets and
//! reports NOT_SERVING under the health name `rulesets/NAME` of each failed one until it
//! gets a new revision or is deleted. Either way the store marks it and the audit table has
//! a record (see [`Pipeline::load`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic_health::ServingStatus;
use vallum_engine::Clock;
use vallum_engine::engine::{Engine, EngineConfig};
use vallum_proto::v1::conntrack_service_server::ConntrackServiceServer;
use vallum_proto::v1::counter_service_server::CounterServiceServer;
use vallum_proto::v1::engine_service_server::EngineServiceServer;
use vallum_proto::v1::fleet_service_server::FleetServiceServer;
use vallum_proto::v1::ruleset_service_server::RulesetServiceServer;
use vallum_proto::v1::set_service_server::SetServiceServer;
use vallum_proto::v1::trace_service_server::TraceServiceServer;

use crate::config::{Config, OnLoadFailure};
use crate::control::fleet::agent::{Agent, FleetStats, PipelineLocal};
use crate::control::fleet::service::FleetApi;
use crate::control::hooks::{self, Hooks, MetricsObserver};
use crate::control::pipeline::Pipeline;
use crate::control::{content, example};
use crate::error::{Error, Result};
use crate::grpc::service::State;
use crate::grpc::service::conntrack::ConntrackApi;
use crate::grpc::service::counters::CountersApi;
use crate::grpc::service::engine::EngineApi;
use crate::grpc::service::ruleset::RulesetApi;
use crate::grpc::service::sets::SetApi;
use crate::grpc::service::trace::TraceApi;
use crate::grpc::tls;
use crate::host::sources::Sources;
use crate::telemetry::metrics::Metrics;

pub mod supervisor;

use supervisor::{Stage, Supervisor};

/// How often the store deletes expired idempotency keys and old audit records.
const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// How long each task (a listener's drain, a loop's abort) may take to end at shutdown.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The gRPC service names health reports on (besides "").
pub const SERVICES: [&str; 6] = [
    "vallum.v1.RulesetService",
    "vallum.v1.CounterService",
    "vallum.v1.TraceService",
    "vallum.v1.EngineService",
    "vallum.v1.ConntrackService",
    "vallum.v1.SetService",
];

/// What a run did, printed at exit.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Address served.
    pub listen: String,
    /// Packets classified per (family, hook, verdict), e.g. `ipv4 INPUT DROP`.
    pub verdicts: Vec<(String, u64)>,
    /// Active revisions (ruleset, revision).
    pub active: Vec<(String, u64)>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.verdicts.iter().map(|v| v.1).sum();
        writeln!(f, "vallumd summary: {total} packets classified")?;
        for (k, n) in &self.verdicts {
            writeln!(f, "  {k}: {n}")?;
        }
        if self.active.is_empty() {
            writeln!(f, "  active revisions: none")?;
        }
        for (r, n) in &self.active {
            writeln!(f, "  active: rulesets/{r}/revisions/{n}")?;
        }
        Ok(())
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Loads the token files again on every SIGHUP (token rotation, docs/operations.md "Rotating
/// a token"): [`crate::grpc::auth::TokenReloader::reload`], all or nothing, so a file that does not
/// load keeps the tokens in use (logged with its code). `None` where there is no SIGHUP.
fn spawn_token_reload(
    reloader: crate::grpc::auth::TokenReloader,
    auth: crate::grpc::auth::AuthConfig,
) -> Option<tokio::task::JoinHandle<()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: token files are not reloaded");
                return None;
            }
        };
        Some(tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match reloader.reload(&auth) {
                    Ok(n) => tracing::info!(tokens = n, "token files reloaded (SIGHUP)"),
                    Err(e) => tracing::error!(
                        code = e.reason(),
                        error = %e,
                        "token files not reloaded; the tokens in use stay"
                    ),
                }
            }
        }))
    }
    #[cfg(not(unix))]
    {
        let _ = (reloader, auth);
        None
    }
}

/// Runs `vallumd` until Ctrl-C / SIGTERM (or `--exit-after`), with the default hooks.
///
/// Errors: [`Error`] when the store cannot be opened or migrated, the address cannot be bound,
/// the example does not load, or a packet source cannot start.
pub async fn run(config: Config) -> Result<Summary> {
    run_with(config, Hooks::default(), shutdown_signal()).await
}

/// As [`run`], with explicit hooks and a shutdown future (for embedding and tests).
///
/// Errors: as [`run`].
pub async fn run_with(
    config: Config,
    hooks: Hooks,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary> {
    // The one clock: the engine reads it as `Arc<dyn vallum_engine::Clock>`, the rest as
    // `hooks.clock` (a test injects a manual one through `hooks`).
    let clock: Arc<dyn Clock> = Arc::new(hooks.clock.clone());
    // Every background task and listener; stopped in order at shutdown (or aborted when a
    // start step fails and this is dropped).
    let mut tasks = Supervisor::new(STOP_GRACE);
    let engine = Arc::new(Engine::new(
        EngineConfig {
            cores: config.cores.max(1),
            barrier: config.barrier.into(),
            conntrack: config.conntrack.engine_config(),
        },
        clock.clone(),
    ));
    // Metrics first: the engine-fed gauges are registered before any traffic, and /metrics is
    // up (and printed) before the gRPC listener, so `listening on` means everything is bound.
    let metrics = Metrics::new(&config.metrics)?;
    metrics.observe_engine(engine.clone())?;
    metrics.observe_conntrack(engine.clone());
    let hooks = Hooks {
        limits: config.limits.clone(),
        ..hooks
    }
    .with_observer(Arc::new(MetricsObserver::new(metrics.clone())));
    let tokens = config.auth.load()?;
    config.auth.check_listen(&tokens, config.listen)?;
    let auth = crate::grpc::auth::AuthLayer::with_policy(tokens, config.auth.local_policy()?);
    if let Some(t) = spawn_token_reload(auth.reloader(), config.auth.clone()) {
        tasks.adopt_loop("token reload", t);
    }
    let tls = tls::server_config(&config.tls)?;

    let store = crate::control::store::Store::open_on(&config.db, hooks.clock.clone())
        .await?
        .with_revisions_kept(config.limits.max_revisions_kept)
        .with_retention(config.retention.retention())
        .with_durability(config.sync);
    let kernel_tables =
        crate::host::kernel_tables::KernelTables::new(&config.kernel_tables, hooks.clock.clone())?
            .map(Arc::new);
    let mut pipeline = Pipeline::new(engine.clone(), store.clone(), hooks.clone());
    if let Some(k) = &kernel_tables {
        k.observe(&metrics);
        pipeline = pipeline.with_kernel_tables(k.clone());
    }
    if let crate::config::Source::Nfqueue(_) = &config.source {
        if let Some(f) = crate::host::facts_chains::FactsChains::new(
            config.nfqueue_facts_mark,
            &config.steered_chains,
            config.kernel_tables.kernel_tables_restore.as_deref(),
        )? {
            pipeline = pipeline.with_facts_chains(Arc::new(f));
        }
    }
    let pipeline = Arc::new(pipeline);
    metrics.observe_sets(pipeline.sets().clone())?;
    let stats = pipeline.store().clone();
    metrics.observe_store(move || (stats.written(), stats.fsyncs()));
    // Before any ruleset is validated: which hooks the packet path evaluates here.
    pipeline.sets().set_reached_hooks(
        crate::host::steering::reached_steering(
            &config.source,
            &config.steered_chains,
            crate::host::steering::forwarding(std::path::Path::new("/proc")),
            config.steered_new_only,
            config.steered_loopback,
        )
        // Filter rules waiting for a nat or mangle table the kernel runs are not warned.
        .map(|r| r.with_kernel_tables(&config.kernel_tables.kernel_tables))
        // With NFQUEUE, the steering's facts field decides the kernel-decided matches.
        .map(|r| match &config.source {
            crate::config::Source::Nfqueue(_) => {
                r.with_fact_bits(config.nfqueue_facts_mark.count_ones() as u8)
            }
            _ => r,
        }),
    );
    // The node's addresses for -m addrtype, before any ruleset is loaded or packet classified.
    match crate::host::local_addrs::start(
        pipeline.sets().node_addrs().clone(),
        config.local_addresses.as_ref(),
        config.routes.as_ref(),
        config.local_addresses_refresh,
    ) {
        Ok(task) => {
            if let Some(t) = task {
                tasks.adopt_loop("local addresses refresh", t);
            }
        }
        Err(e) => {
            store.close().await;
            return Err(Error::Startup {
                code: crate::Reason::Internal.info().name,
                message: format!("{e}; give the node's addresses with --local-addresses"),
            });
        }
    }
    let events = crate::telemetry::events::Events::start(hooks.clock.clone())
        .map_err(|e| Error::io("spawn the events thread", e))?;
    metrics.observe_events(events.clone());
    let state = State::new(pipeline.clone(), config.source.to_string(), events.clone());
    // Fleet mode: the etcd client connects lazily, so an unreachable etcd never delays start.
    let fleet = match config.fleet.enabled() {
        true => Some((config.fleet.etcd()?, config.fleet.node()?)),
        false => None,
    };

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    metrics.observe_health(reporter.clone());
    for s in SERVICES {
        reporter
            .set_service_status(s, ServingStatus::NotServing)
            .await;
    }
    // Reflection v1, and v1alpha for the many clients that still only speak it (grpcurl
    // before 1.9, Python grpcio-reflection's descriptor database).
    // FleetService is served (and listed) only in fleet mode.
    let descriptors = match fleet {
        Some(_) => vallum_proto::FILE_DESCRIPTOR_SET.to_vec(),
        None => without_service(vallum_proto::FILE_DESCRIPTOR_SET, "FleetService")?,
    };
    let reflection_builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(&descriptors)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflection_builder()
        .build_v1()
        .map_err(|e| Error::invariant(format!("reflection: {e}")))?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| Error::invariant(format!("reflection: {e}")))?;

    let (metrics_stop_tx, metrics_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let metrics_server = metrics
        .serve(config.metrics.metrics_listen, async {
            let _ = metrics_stop_rx.await;
        })
        .await?;
    stdout_line(format_args!("metrics on {}", metrics_server.local_addr));
    tracing::info!(addr = %metrics_server.local_addr, "metrics on");
    let metrics_drain = tasks.drain(Stage::Metrics);
    tasks.spawn_drained("metrics listener", Stage::Metrics, async move {
        metrics_drain.signalled().await;
        let _ = metrics_stop_tx.send(());
        match metrics_server.task.await {
            Ok(served) => served.map_err(|e| e.to_string()),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(e.to_string()),
        }
    });

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::io(format!("bind {}", config.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("local address", e))?;
    // Bound before `listening on` is printed: that line means every listener is up.
    let mut local = bind_local_socket(&config)?;
    stdout_line(format_args!("listening on {addr}"));
    tracing::info!(%addr, "listening");
    if let Some(l) = &local {
        stdout_line(format_args!("local socket on {}", l.path.display()));
        tracing::info!(path = %l.path.display(), "local socket on");
    }

    // Caps, deadlines and buffered bytes of the connections (`crate::grpc::connections`); the
    // HTTP/2 settings below bound what one connection may hold.
    let connections = crate::grpc::connections::Connections::new(&config.connections);
    let (ping_every, ping_timeout) = config.connections.keepalive();
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(ping_every))
        .http2_keepalive_timeout(Some(ping_timeout))
        .http2_max_header_list_size(crate::grpc::connections::MAX_HEADER_LIST_BYTES)
        .max_concurrent_streams(crate::grpc::connections::MAX_CONCURRENT_STREAMS);
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| Error::invariant(format!("TLS: {e}")))?;
    }
    let max = config.limits.max_request_bytes;
    // One set of routes and one layer stack for both listeners and the local socket's local
    // calls (tonic, or `local_call`, puts the unix peer's credentials into each request, where
    // the auth layer finds them).
    let mut routes = tonic::service::Routes::builder();
    routes
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(
            RulesetServiceServer::new(RulesetApi::new(state.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            CounterServiceServer::new(CountersApi::new(state.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            TraceServiceServer::new(TraceApi::new(state.clone())).max_decoding_message_size(max),
        )
        .add_service(
            EngineServiceServer::new(EngineApi::new(state.clone())).max_decoding_message_size(max),
        )
        .add_service(
            ConntrackServiceServer::new(ConntrackApi::new(state.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            SetServiceServer::new(SetApi::new(state.clone())).max_decoding_message_size(max),
        );
    if let Some((etcd, _)) = fleet.as_ref() {
        routes.add_service(
            FleetServiceServer::new(FleetApi::new(
                state.clone(),
                etcd.clone(),
                config.fleet.keys(),
                config.fleet.fleet_max_request_bytes,
            ))
            .max_decoding_message_size(max),
        );
    }
    let routes = routes.routes();
    let layer = hooks::rpc_layer(&config, &metrics, auth, hooks.clock.clone());
    if let Some(listener) = local.as_mut().and_then(|l| l.listener.take()) {
        let drain = tasks.drain(Stage::Listeners);
        let serve = tonic::transport::Server::builder()
            .http2_max_header_list_size(crate::grpc::connections::MAX_HEADER_LIST_BYTES)
            .max_concurrent_streams(crate::grpc::connections::MAX_CONCURRENT_STREAMS)
            .layer(connections.layer(max))
            .layer(layer.clone())
            .add_routes(routes.clone())
            .serve_with_incoming_shutdown(
                crate::grpc::local_call::incoming(
                    listener,
                    // The same stack as the HTTP/2 connections get below.
                    tower::ServiceBuilder::new()
                        .layer(connections.layer(max))
                        .layer(layer.clone())
                        .service(routes.clone()),
                    crate::grpc::local_call::LocalCallConfig {
                        max_message: max,
                        handshake_timeout: config.connections.handshake_timeout,
                        idle_timeout: config.connections.idle_timeout,
                    },
                ),
                drain.signalled(),
            );
        tasks.spawn_drained("local socket listener", Stage::Listeners, async move {
            serve.await.map_err(|e| e.to_string())
        });
    }
    let drain = tasks.drain(Stage::Listeners);
    let grpc = builder
        .layer(connections.layer(max))
        .layer(layer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(
            // Admitted connections get TCP_NODELAY (`Connections::admit`): without it Nagle's
            // algorithm holds the last segment of a large request or reply until the peer's
            // delayed ACK, ~40 ms on Linux.
            connections.incoming(listener),
            drain.signalled(),
        );
    tasks.spawn_drained("grpc listener", Stage::Listeners, async move {
        grpc.await.map_err(|e| e.to_string())
    });

    // Load the stored state, then SERVING.
    if let Some(d) = config.load_delay {
        tokio::time::sleep(d).await;
    }
    // Sets before rulesets: an active revision may `--match-set` them.
    pipeline.restore_sets().await?;
    let failed = pipeline.load().await?;
    if !failed.is_empty() && config.on_load_failure == OnLoadFailure::Refuse {
        let names: Vec<String> = failed
            .iter()
            .map(|f| {
                format!(
                    "rulesets/{}/revisions/{}: {}",
                    f.ruleset, f.revision, f.error
                )
            })
            .collect();
        tasks.shutdown().await;
        store.close().await;
        return Err(Error::Startup {
            code: crate::Reason::ActiveRevisionNotLoaded.info().name,
            message: format!(
                "refusing to start: {} active revision(s) do not load ({}); fix or replace \
                 them (or start with --on-load-failure degraded to serve the others)",
                failed.len(),
                names.join("; ")
            ),
        });
    }
    // The kernel tables of what loaded (`--kernel-tables`), before SERVING: a crash between
    // a commit's store write and its kernel write is mended here.
    if let Err(e) = pipeline.sync_kernel_tables().await {
        tasks.shutdown().await;
        store.close().await;
        return Err(Error::Startup {
            code: e.reason().info().name,
            message: format!("refusing to start: {e}"),
        });
    }
    if let Some(k) = &kernel_tables {
        tasks.adopt_loop("kernel table checks", k.spawn_checks());
    }
    if config.fleet.enabled() {
        // Before SERVING: a fleet-owned ruleset is refused to local callers from the start.
        state
            .owners
            .load(&config.fleet.fleet_prefix, &store)
            .await?;
    }
    if config.example && store.list_rulesets().await?.is_empty() {
        let checked = content::check(example::NAME, 0, &example::input())?;
        pipeline
            .apply(
                checked,
                "vallumd --example",
                "bundled example ruleset",
                None,
                None,
                &mut None,
            )
            .await?;
    }
    // The table saved by the last graceful stop, before SERVING and before any packet.
    let ct_state = crate::host::conntrack_state::path(&config.db);
    let persist_ct = !config.conntrack.conntrack_state_max_age.is_zero();
    if let (Some(ct), true) = (engine.conntrack(), persist_ct) {
        restore_conntrack(
            ct,
            clock.now_ns(),
            hooks.clock.system_time(),
            config.conntrack.conntrack_state_max_age,
            &ct_state,
        );
    }
    state.ready.store(true, Ordering::Release);
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    for s in SERVICES {
        reporter.set_service_status(s, ServingStatus::Serving).await;
    }
    tasks.adopt_loop(
        "load health",
        spawn_load_health(&pipeline, reporter.clone()),
    );
    hooks.observer.on_start(&engine, &config);
    tasks.adopt_loop(
        "confirm timer",
        pipeline.spawn_confirm_timer(config.confirm_check_interval),
    );
    tasks.adopt_loop(
        "conntrack gc",
        spawn_conntrack_gc(engine.clone(), clock.clone(), &config),
    );
    tasks.adopt_loop(
        "shadow samples",
        spawn_shadow_samples(engine.clone(), events.clone()),
    );
    tasks.adopt_loop(
        "set gc",
        pipeline.spawn_set_gc(crate::control::pipeline::sets::SET_GC_INTERVAL),
    );
    // Expired idempotency keys and old audit records (--idempotency-ttl, --audit-*).
    tasks.adopt_loop("store prune", pipeline.store().spawn_prune(PRUNE_INTERVAL));
    let sources = Sources::start(
        engine.clone(),
        &config.packet_source(),
        config.rate,
        clock.clone(),
        events,
        config.nfqueue_answers(),
        config.worker_nice,
    )?;
    metrics.observe_nfqueue(sources.nfqueue_counters());
    // Health is SERVING and the packet sources are bound: the stored rulesets decide packets
    // from here on. Boot scripts (and the boot bench) wait for this line.
    stdout_line(format_args!("serving"));
    // The agent starts once the stored state is enforced (fail-static: etcd is not needed).
    if let Some((etcd, node)) = fleet {
        let agent = Agent::new(
            etcd,
            Arc::new(PipelineLocal(pipeline.clone())),
            state.owners.clone(),
            config.fleet.keys(),
            node,
            config.fleet.node_labels.clone(),
            config.fleet.lease_ttl(),
            FleetStats::new(&metrics, hooks.clock.clone()),
        )
        .spawn();
        tasks.adopt_loop("fleet agent", agent);
    }

    match config.exit_after {
        Some(d) => {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = shutdown => {}
            }
        }
        None => shutdown.await,
    }

    sources.stop();
    if let (Some(ct), true) = (engine.conntrack(), persist_ct) {
        match crate::host::conntrack_state::save(
            ct,
            clock.now_ns(),
            hooks.clock.system_time(),
            &ct_state,
        ) {
            Ok(n) => tracing::info!(
                entries = n,
                file = %ct_state.display(),
                "conntrack: saved {n} entries to {}",
                ct_state.display()
            ),
            Err(e) => tracing::warn!(error = %e, "conntrack: not saved: {e}"),
        }
    }
    // The loops, then the listeners (the calls in flight end), then /metrics; each task's
    // end is reported (faults logged as errors). The kernel tables stay as written (NAT of
    // running flows keeps working while vallumd restarts); the next start writes them again.
    let stopped = tasks.shutdown().await;
    drop(local);
    tracing::info!(
        tasks = stopped.len(),
        faults = stopped.iter().filter(|r| r.is_fault()).count(),
        "tasks stopped"
    );
    if let Err(e) = metrics.shutdown() {
        tracing::warn!(error = %e, "metrics shutdown failed");
    }
    let summary = Summary {
        listen: addr.to_string(),
        verdicts: engine
            .verdict_counts()
            .into_iter()
            .map(|v| {
                let fam = match v.family {
                    vallum_engine::model::Family::Ipv4 => "ipv4",
                    vallum_engine::model::Family::Ipv6 => "ipv6",
                };
                (format!("{fam} {} {}", v.hook, v.verdict), v.packets)
            })
            .collect(),
        active: pipeline
            .active()
            .into_iter()
            .map(|(k, v)| (k, v.revision))
            .collect(),
    };
    store.close().await;
    Ok(summary)
}

/// The encoded file descriptor set `set` without the service named `service` (in whichever
/// file declares it), for reflection to list only the services served.
///
/// Errors: [`Error::Invariant`] when `set` (compiled in) does not decode.
fn without_service(set: &[u8], service: &str) -> Result<Vec<u8>> {
    use prost::Message as _;
    let mut fds = prost_types::FileDescriptorSet::decode(set)
        .map_err(|e| Error::invariant(format!("file descriptor set: {e}")))?;
    for f in &mut fds.file {
        f.service.retain(|s| s.name() != service);
    }
    Ok(fds.encode_to_vec())
}

/// Writes `text` and a newline to stdout, vallumd's small machine interface (the `metrics
/// on` / `listening on` lines, the summary at exit), and flushes it. A stdout that cannot be
/// written (`/dev/full`, a reader that closed its pipe) is logged as a warning and vallumd goes
/// on: those lines are for the reader, not for vallumd's work.
pub fn stdout_line(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(text)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        tracing::warn!(error = %e, "stdout not written: {e} (the line was: {text})");
    }
}

/// Binds the local socket `--socket` chooses ([`crate::host::local_socket`]): `None` when it is off,
/// or when the default path cannot be bound (a warning says why; TCP still serves).
///
/// Errors: [`Error::Startup`] `SOCKET_BIND` when an explicit `--socket PATH` cannot be bound.
fn bind_local_socket(config: &Config) -> Result<Option<crate::host::local_socket::LocalSocket>> {
    use crate::host::local_socket::{Choice, bind, choose};
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(std::path::PathBuf::from);
    match choose(config.socket.as_deref(), euid, xdg.as_deref()) {
        Choice::Off => Ok(None),
        Choice::Explicit(p) => bind(&p).map(Some).map_err(|e| Error::Startup {
            code: "SOCKET_BIND",
            message: e.to_string(),
        }),
        Choice::Default(p) => match bind(&p) {
            Ok(s) => Ok(Some(s)),
            Err(e) => {
                tracing::warn!(
                    "no local socket: {e} (TCP only; pass --socket PATH, or --socket none to \
                     silence this)"
                );
                Ok(None)
            }
        },
    }
}

/// Restores the connection table saved by the last graceful stop (`conntrack_state`) and
/// says what it did in the log; a bad file is reported and the table starts empty.
fn restore_conntrack(
    ct: &vallum_engine::conntrack::Conntrack,
    now_ns: u64,
    now: std::time::SystemTime,
    max_age: Duration,
    file: &std::path::Path,
) {
    use crate::host::conntrack_state::{Outcome, restore};
    match restore(ct, now_ns, now, max_age, file) {
        Ok(Outcome::Absent) => {}
        Ok(Outcome::Restored(r, age)) => tracing::info!(
            entries = r.restored,
            file = %file.display(),
            "conntrack: restored {} entries from {} (saved {:.1} s ago; {} expired \
             meanwhile, {} over --conntrack-max)",
            r.restored,
            file.display(),
            age.as_secs_f64(),
            r.expired,
            r.full
        ),
        Ok(Outcome::TooOld(age)) => tracing::warn!(
            file = %file.display(),
            "conntrack: {} not restored: saved {:.0} s ago, more than \
             --conntrack-state-max-age {:.0} s",
            file.display(),
            age.as_secs_f64(),
            max_age.as_secs_f64()
        ),
        Err(e) => tracing::warn!(error = %e, "conntrack: not restored, starting empty: {e}"),
    }
}

/// The health name of a ruleset whose active revision did not load (NOT_SERVING while it is
/// not loaded, SERVING once replaced).
pub fn ruleset_health_name(ruleset: &str) -> String {
    format!("rulesets/{ruleset}")
}

/// Keeps health in step with [`Pipeline::not_loaded`]: NOT_SERVING under
/// [`ruleset_health_name`] for every ruleset whose active revision did not load, SERVING
/// again once it is replaced or deleted.
fn spawn_load_health(
    pipeline: &Arc<Pipeline>,
    reporter: tonic_health::server::HealthReporter,
) -> tokio::task::JoinHandle<()> {
    let mut rx = pipeline.watch_not_loaded();
    tokio::spawn(async move {
        let mut shown = std::collections::BTreeSet::new();
        loop {
            let now: std::collections::BTreeSet<String> =
                rx.borrow_and_update().keys().cloned().collect();
            for name in now.difference(&shown) {
                reporter
                    .set_service_status(ruleset_health_name(name), ServingStatus::NotServing)
                    .await;
            }
            for name in shown.difference(&now) {
                reporter
                    .set_service_status(ruleset_health_name(name), ServingStatus::Serving)
                    .await;
            }
            shown = now;
            if rx.changed().await.is_err() {
                return;
            }
        }
    })
}

/// The periodic garbage collection of the connection table: every `--conntrack-gc-interval`,
/// one [`Engine::gc`] step over an eighth of the buckets, on a blocking thread (it takes the
/// table's bucket locks). Nothing runs when conntrack is off.
/// How often the running shadow's sampled differing packets are handed to the packet events.
const SHADOW_SAMPLES_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Hands the running shadow's sampled differing packets
/// ([`Engine::drain_shadow_samples`]) to the packet events (kind SHADOW) every
/// [`SHADOW_SAMPLES_EVERY`]; off the packet path (the cores keep them in bounded rings).
fn spawn_shadow_samples(
    engine: Arc<Engine>,
    events: crate::telemetry::events::Events,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SHADOW_SAMPLES_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some((ruleset, _)) = engine.shadow_revision() else {
                continue;
            };
            let samples = engine.drain_shadow_samples();
            let time = events.clock().system_time();
            events.offer(
                samples
                    .iter()
                    .map(|s| crate::telemetry::events::PacketEvent::shadow(s, &ruleset, time))
                    .collect(),
            );
        }
    })
}

fn spawn_conntrack_gc(
    engine: Arc<Engine>,
    clock: Arc<dyn Clock>,
    config: &Config,
) -> tokio::task::JoinHandle<()> {
    let budget = config.conntrack.gc_budget();
    let every = config.conntrack.conntrack_gc_interval;
    tokio::spawn(async move {
        if engine.conntrack().is_none() {
            return;
        }
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (e, c) = (engine.clone(), clock.clone());
            if let Err(e) = tokio::task::spawn_blocking(move || e.gc(c.now_ns(), budget)).await {
                // A panic in the sweep is a bug: it ends this task with that panic, which the
                // supervisor reports; cancelled means the runtime is shutting down.
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
                return;
            }
        }
    })
}
