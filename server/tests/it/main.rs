//! The integration tests of `vallum-server`, one binary (one link, one process): each module is
//! one area (the file's head says what it checks), `support` holds what they share. Tests that
//! need root, a namespace or a tool are `#[ignore = "needs ..."]`; run them with
//! `cargo test -p vallum-server --test it -- --include-ignored` (as root, with the tools
//! `.ci/run` installs). One module: `cargo test -p vallum-server --test it -- fleet::`.
//!
//! The modules share one process, so none changes what the others see of it: no test sets an
//! environment variable or the working directory of the process (a vallumd's environment is its
//! own, [`support::Daemon::start_env`]; only `connections` raises this process's descriptor
//! limit, which the others do not lower); every listener binds port 0; the network namespaces
//! a test makes are named after the process id with a prefix of its module's own (`vallum-{a,b,c}`
//! nfqueue, `vallum-{o,n}{a,b}` nfqueue_overload, `vallum-k{h,c,x}` kernel_tables, `vc-` corpus,
//! `vb-` physdev_bridge, `vcx-` and `vallum-first`/`vallum-try` coexist, `vrj-` reject,
//! `vallum-lo` hooks_reached), and the tests of one module that could collide hold a lock of
//! that module or a tag of their own. Tests run two at a time on a 2-core machine as before
//! (the harness's default, one thread per CPU).

mod support;

mod addrtype;
mod auth_scopes;
mod cancelled_apply;
mod cli;
mod coexist;
mod connections;
mod conntrack;
mod conntrack_restart;
mod corpus;
mod counters;
mod deploy;
mod e2e;
mod e2e_ops;
mod e2e_sets;
mod fleet;
mod grpc_fuzz;
mod hardening;
mod hooks_reached;
mod idempotency;
mod install;
mod kernel_decided;
mod kernel_tables;
mod layers;
mod limits;
mod local_socket;
mod logging;
mod metrics;
mod names;
mod nfqueue;
mod nfqueue_overload;
mod nft;
mod noflush;
mod otlp_traces;
mod outcomes;
mod packet_events;
mod pagination;
mod physdev_bridge;
mod prometheus_server;
mod python_client;
mod readme;
mod real_dumps;
mod reject;
mod reject_cost;
mod rpfilter;
mod sizing;
mod startup;
mod tls;
mod token_rotation;
mod trace_limit;
mod watch_resume;
