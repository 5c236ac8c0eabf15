//! sources (work in progress).
