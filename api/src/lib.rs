//! What vallumd (`vallum-server`) and vallumctl (`vallum-cli`) share besides the gRPC API of
//! `vallum-proto`:
//!
//! - [`reason`]: the one table of error reasons: each row's UPPER_SNAKE `ErrorInfo.reason`, gRPC
//!   code and `vallumctl` exit code, and the rows of failures `vallumctl` finds itself.
//! - [`tls`]: reading PEM files into a TLS client configuration (and the identity both sides
//!   present), with the errors that names the flag or file.
//!
//! The crate is small on purpose: building vallumctl builds this, `vallum-proto` and tonic, not
//! the daemon's store, metrics or packet path.

pub mod reason;
pub mod tls;

pub use reason::{ClientReason, Reason};
