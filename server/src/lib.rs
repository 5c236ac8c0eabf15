//! Vallum's firewall-management service: rulesets stored in SQLite, validated, staged and
//! committed atomically to the engine, plus the packet sources that feed the engine's workers.
//!
//! Layout (docs/architecture.md walks a commit and a packet through it):
//! - [`grpc`]: the edge. The gRPC services, proto <-> domain conversion, authentication, limits,
//!   connection caps and TLS;
//! - [`control`]: the control plane. The commit pipeline, the SQLite store, a revision's
//!   canonical content, commit outcomes, the hooks the plumbing plugs into, fleet mode;
//! - [`host`]: the Linux adapters. Packet sources (NFQUEUE, pcap), rtnetlink (routes, local
//!   addresses), the kernel's own tables (`iptables-restore`), steering, /proc readers, the
//!   local unix socket, the allocator, NSS owner names, the connection table across a restart;
//! - [`telemetry`]: metrics (OpenTelemetry -> Prometheus `/metrics`, OTLP traces) and packet
//!   events;
//! - [`config`]: flags and their `VALLUM_*` env twins; [`error`]: errors and their gRPC
//!   statuses; [`server`]: wiring, [`run`].
//!
//! Binary: `vallumd` (the daemon). The command-line client `vallumctl` is its own package,
//! `vallum-cli` (`cli/`), which shares only `vallum-proto` and `vallum-api` (the error table,
//! re-exported by [`error`], and the TLS client config, by [`grpc::tls`]) with this crate.

pub mod config;
pub mod control;
pub mod error;
pub mod grpc;
pub mod host;
pub mod server;
pub mod telemetry;

pub use config::Config;
pub use error::{Error, Reason};
pub use server::{Summary, run};
