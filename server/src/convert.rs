//! convert (work in progress).
