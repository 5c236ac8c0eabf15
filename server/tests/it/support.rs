//! Shared helpers of every test module: a real `vallumd` and clients ([`vallumd`], re-exported
//! here), real etcd ([`etcd`]), network namespaces ([`netns`]), the deployment's PromQL
//! ([`promql`]), a test's own tonic server ([`served`]) and the request fuzzer's generators
//! ([`fuzz_gen`]).

pub mod etcd;
pub mod fuzz_gen;
pub mod netns;
pub mod promql;
pub mod served;
pub mod vallumd;

pub use vallumd::*;
