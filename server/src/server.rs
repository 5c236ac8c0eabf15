//! server (work in progress).
