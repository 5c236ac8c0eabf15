//! example (work in progress).
