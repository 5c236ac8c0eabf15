//! What vallumd tells its operators besides the API's answers.
//!
//! - [`metrics`]: OpenTelemetry -> Prometheus `/metrics`, process metrics, OTLP traces;
//! - [`events`]: packet events (`-j LOG` hits and sampled drops) on their way to the process
//!   log and to `WatchPacketEvents` subscribers.

pub mod events;
pub mod metrics;
