//! Vallum's firewall-management service: rulesets stored in SQLite, validated, staged and
//! committed atomically to the engine, plus the packet sources that feed the engine's workers.
//!
//! Layout:
//! - [`config`]: flags and their `VALLUM_*` env twins;
//! - [`store`]: the SQLite store (every query lives there), migrations from `migrations/`;
//! - [`content`]: a revision's canonical content (IPv4 and IPv6 iptables-save text, digest);
//! - [`pipeline`]: the commit pipeline (validate, persist, publish, quiesce, carry) and
//!   commit-confirmed timers; [`outcome`]: how a commit ended, one vocabulary for the store,
//!   the metrics, the watch stream and the alerts;
//! - [`service`]: the gRPC services; [`convert`]: proto <-> domain; [`error`]: errors and their gRPC statuses;
//! - [`fleet`]: fleet mode (desired rulesets in etcd, the node agent, FleetService);
//! - [`sources`]: packet sources feeding one worker thread per core; [`nfqueue_stats`]: what
//!   the kernel and our NFQUEUE workers did with each queued packet;
//! - [`hooks`]: the seams for metrics, auth and limits, and the [`hooks::MetricsObserver`]
//!   that feeds [`metrics`] from the pipeline;
//! - operational plumbing: [`metrics`] (OpenTelemetry -> Prometheus `/metrics`), [`auth`]
//!   (bearer tokens with roles), [`tls`] (TLS / mTLS), [`limits`] (request size, rules,
//!   rulesets, revisions kept), [`connections`] (connection caps and deadlines, buffered
//!   request bytes);
//! - [`server`]: wiring, [`run`].
//!
//! Binary: `vallumd` (the daemon). The command-line client `vallumctl` is its own package,
//! `vallum-cli` (`cli/`), which shares only `vallum-proto` and `vallum-api` (the error table,
//! re-exported by [`error`], and the TLS client config, by [`tls`]) with this crate.

pub mod allocator;
pub mod auth;
pub mod config;
pub mod connections;
pub mod conntrack_state;
pub mod content;
pub mod convert;
pub mod error;
pub mod events;
pub mod example;
pub mod facts_chains;
pub mod fleet;
pub mod hooks;
pub mod kernel_tables;
pub mod limits;
pub mod local_addrs;
pub mod local_socket;
pub mod metrics;
pub mod nfqueue_stats;
pub mod outcome;
pub mod owner_names;
pub mod pipeline;
pub mod routes;
pub mod server;
pub mod service;
pub mod sources;
pub mod steering;
pub mod store;
pub mod tls;

pub use config::Config;
pub use error::{Error, Reason};
pub use server::{Summary, run};
