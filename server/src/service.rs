//! service (work in progress).
