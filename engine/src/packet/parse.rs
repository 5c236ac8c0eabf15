//! TODO(helper): see packet.rs
