//! Operational plumbing of the Vallum server, kept apart from the server core so it can be built
//! and tested alone:
//! - [`metrics`]: OpenTelemetry metrics exported for Prometheus on `/metrics` (feature
//!   `metrics`, on by default), fed by commits, the engine and a gRPC tower layer;
//! - [`auth`]: bearer tokens with roles (read-only, admin) as a tower layer;
//! - [`tls`]: TLS / mTLS server and client configuration (rustls via tonic);
//! - [`limits`]: request size, rules, rulesets and revisions-kept limits.
//!
//! Every error type here has a `reason()` with the UPPER_SNAKE code that goes into
//! `google.rpc.ErrorInfo.reason` (domain [`ERROR_DOMAIN`]); vallumctl maps the gRPC code and
//! that reason to its exit code.

pub mod auth;
pub mod limits;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod tls;

/// The `ErrorInfo.domain` of every error Vallum returns.
pub const ERROR_DOMAIN: &str = "vallum.dev";
