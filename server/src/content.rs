//! content (work in progress).
