//! The kernel as an oracle: real iptables in two network namespaces ([`kernel`]) and the
//! rulesets and packets we load into both ([`corpus`]).

pub mod corpus;
pub mod kernel;
