//! pipeline (work in progress).
