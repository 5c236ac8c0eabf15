//! hooks (work in progress).
