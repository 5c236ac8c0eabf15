//! Shared helpers of the test modules: one rule through parse/print ([`one_rule`]) and seeded
//! generators with a fixed clock ([`seeded`]).

pub mod one_rule;
pub mod seeded;
