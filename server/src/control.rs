//! The control plane: what a ruleset is, where it is kept and how a commit reaches the engine.
//!
//! - [`pipeline`]: the commit pipeline (validate, persist, publish, quiesce, carry) and
//!   commit-confirmed timers; [`outcome`]: how a commit ended, one vocabulary for the store,
//!   the metrics, the watch stream and the alerts;
//! - [`store`]: the SQLite store (every query lives there), migrations from `migrations/`;
//! - [`content`]: a revision's canonical content (IPv4 and IPv6 iptables-save text, digest);
//!   [`example`]: the bundled example ruleset;
//! - [`hooks`]: the seams for metrics, auth and limits, and the [`hooks::MetricsObserver`]
//!   that feeds [`crate::telemetry::metrics`] from the pipeline;
//! - [`fleet`]: fleet mode (desired rulesets in etcd, the node agent, FleetService).

pub mod content;
pub mod example;
pub mod fleet;
pub mod hooks;
pub mod outcome;
pub mod pipeline;
pub mod store;
