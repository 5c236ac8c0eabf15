//! error (work in progress).
