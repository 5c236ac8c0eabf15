//! The integration tests of `vallum-engine`, one binary (one link, one process): each module is
//! one area (the file's head says what it checks); `support` and `oracle` hold what they share.
//! Tests that need root or a tool are `#[ignore = "needs ..."]`; run them with
//! `cargo test -p vallum-engine --test it -- --include-ignored` (as root). One module:
//! `cargo test -p vallum-engine --test it -- conformance::`.

// Each module uses a different part of the shared helpers.
#[allow(dead_code)]
mod oracle;
#[allow(dead_code)]
mod support;
// The ClassBench-style generator the benches use too.
#[path = "../../benches/support/classbench.rs"]
mod classbench;

mod addrtype;
mod chain_scale;
mod classify_diff;
mod classify_incremental;
mod classify_prop;
mod commit_edit;
mod conformance;
mod connlimit;
mod conntrack_tuples;
mod counter_cells;
mod ct_target;
mod fuzz_corpus;
mod hashlimit;
mod header_matches;
mod indexed_bytes;
mod kernel_connlimit;
mod kernel_loads;
mod kernel_nat_tuple;
mod kernel_oracle;
mod kernel_stateful;
mod kernel_string;
mod layout;
mod log_ring;
mod marks;
mod nflog;
mod nft_kernel;
mod nft_lower;
mod nft_oracle;
mod nft_vectors;
mod not_enforced;
mod owner;
mod parse_threads;
mod pcap_corpus;
mod physdev;
mod readme;
mod recent;
mod retire;
mod rpfilter;
mod semantics;
mod sets_docker;
mod stateful;
mod string;
mod support_table;
