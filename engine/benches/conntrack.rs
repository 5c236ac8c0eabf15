//! Conntrack SYN-flood benchmark (placeholder; filled in by the next commit).

fn main() {}
