//! store (work in progress).
