//! The kernel as an oracle: real iptables in two network namespaces ([`kernel`]), kernel
//! nftables in the same namespaces ([`nft`]), and the rulesets and packets we load into both
//! ([`corpus`]).

pub mod corpus;
pub mod kernel;
pub mod nft;
