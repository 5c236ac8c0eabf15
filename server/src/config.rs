//! config (work in progress).
