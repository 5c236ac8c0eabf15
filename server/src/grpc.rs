//! The gRPC edge: everything between a client's request and the control plane.
//!
//! - [`call`]: the one handler layer every method runs through (ready, caller, grant,
//!   idempotency, audit, refused); [`service`]: the gRPC services (RulesetService,
//!   EngineService, ...); [`convert`]: proto <-> domain, the only place protobuf types meet
//!   domain types;
//! - [`auth`]: bearer tokens with roles and the local socket's peer credentials;
//!   [`limits`]: request size, rules, rulesets, revisions kept; [`connections`]: connection caps
//!   and deadlines, buffered request bytes; [`local_call`]: the local socket's HTTP/2 and
//!   local-call connections; [`tls`]: TLS / mTLS.

pub mod auth;
pub mod call;
pub mod connections;
pub mod convert;
pub mod limits;
pub mod local_call;
pub mod service;
pub mod tls;
