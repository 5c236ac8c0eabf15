//! Edits of single rules ([`RuleEdit`]): insert, delete or replace a rule at a chain and
//! position, as `iptables -I CHAIN N`, `iptables -D CHAIN N` and `iptables -R CHAIN N`, or
//! nftables' incremental rule updates. [`Ruleset::with_edits`] applies them to a ruleset and
//! returns the edited one; its chains share every rule chunk the edits leave alone with the
//! original ([`super::RuleList`]), so a one-rule edit of a 100k-rule chain neither copies nor
//! re-parses the chain.

use super::{Family, Rule, Ruleset, TableKind};

/// What a [`RuleEdit`] does at its rule number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EditOp {
    /// `-I CHAIN N RULE`: the rule becomes number N; the rules from N on move one place back.
    /// N may be one past the last rule (an append).
    Insert(Rule),
    /// `-D CHAIN N`: rule N goes; the rules after it move one place forward.
    Delete,
    /// `-R CHAIN N RULE`: rule N is replaced.
    Replace(Rule),
}

/// One edit of one chain's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleEdit {
    /// Family of the table.
    pub family: Family,
    /// Table kind.
    pub table: TableKind,
    /// Chain name.
    pub chain: String,
    /// 1-based rule number, as iptables' `rulenum`: `1..=len + 1` for an insert, `1..=len`
    /// for a delete or replace, where `len` is the chain's rule count after the edits before
    /// this one.
    pub number: u32,
    /// Insert, delete or replace.
    pub op: EditOp,
}

/// Why [`Ruleset::with_edits`] refused a list of edits; nothing was applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The ruleset has no table of this family and kind.
    #[error("edit {edit}: no {family:?} {table} table")]
    NoSuchTable {
        /// 0-based index of the edit in the list.
        edit: usize,
        /// Family.
        family: Family,
        /// Table kind.
        table: TableKind,
    },
    /// The table has no chain of this name (as iptables: "No chain/target/match by that
    /// name").
    #[error("edit {edit}: no chain {chain} in the {family:?} {table} table")]
    NoSuchChain {
        /// 0-based index of the edit in the list.
        edit: usize,
        /// Family.
        family: Family,
        /// Table kind.
        table: TableKind,
        /// Chain name.
        chain: String,
    },
    /// The rule number is 0 or past the end (as iptables: "Index of insertion too big",
    /// "Index of deletion too big", "Replace failed").
    #[error("edit {edit}: chain {chain} has {rules} rule(s), no rule number {number} to {op}")]
    BadRuleNumber {
        /// 0-based index of the edit in the list.
        edit: usize,
        /// Chain name.
        chain: String,
        /// The number given.
        number: u32,
        /// Rules in the chain at that edit.
        rules: usize,
        /// `insert at`, `delete` or `replace`.
        op: &'static str,
    },
}

impl Ruleset {
    /// This ruleset with `edits` applied in order (each sees the result of the ones before
    /// it). The result equals, rule for rule, what the same edits on `Vec`s of rules give;
    /// its chains share the rule chunks no edit touched with this ruleset's (a one-rule edit
    /// copies one chunk of at most 512 rules). The edited rules are not validated
    /// here: a commit validates them ([`crate::validate`]).
    ///
    /// Errors: [`EditError`] for the first edit naming a table or chain that does not exist
    /// or a rule number out of range; `self` is unchanged either way.
    pub fn with_edits(
        &self,
        edits: impl IntoIterator<Item = RuleEdit>,
    ) -> Result<Ruleset, EditError> {
        let mut next = self.clone();
        for (k, e) in edits.into_iter().enumerate() {
            let table = next
                .tables
                .iter_mut()
                .find(|t| t.family == e.family && t.kind == e.table)
                .ok_or(EditError::NoSuchTable {
                    edit: k,
                    family: e.family,
                    table: e.table,
                })?;
            let (family, kind) = (table.family, table.kind);
            let Some(chain) = table.chains.iter_mut().find(|c| c.name == e.chain) else {
                return Err(EditError::NoSuchChain {
                    edit: k,
                    family,
                    table: kind,
                    chain: e.chain,
                });
            };
            let len = chain.rules.len();
            let (max, op) = match e.op {
                EditOp::Insert(_) => (len + 1, "insert at"),
                EditOp::Delete => (len, "delete"),
                EditOp::Replace(_) => (len, "replace"),
            };
            let n = e.number as usize;
            if n == 0 || n > max {
                return Err(EditError::BadRuleNumber {
                    edit: k,
                    chain: e.chain,
                    number: e.number,
                    rules: len,
                    op,
                });
            }
            match e.op {
                EditOp::Insert(rule) => chain.rules.insert(n - 1, rule),
                EditOp::Delete => {
                    chain.rules.remove(n - 1);
                }
                EditOp::Replace(rule) => {
                    chain.rules.set(n - 1, rule);
                }
            }
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Target;

    fn ruleset() -> Ruleset {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                    -A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp --dport 80 -j ACCEPT\n\
                    COMMIT\n";
        crate::restore::parse_ruleset("t", text, &Default::default()).expect("parses")
    }

    fn edit(chain: &str, number: u32, op: EditOp) -> RuleEdit {
        RuleEdit {
            family: Family::Ipv4,
            table: TableKind::Filter,
            chain: chain.into(),
            number,
            op,
        }
    }

    fn drop_rule() -> Rule {
        Rule {
            target: Target::Drop,
            ..Rule::default()
        }
    }

    #[test]
    fn edits_apply_in_order_as_iptables_numbers_them() {
        let rs = ruleset();
        let next = rs
            .with_edits([
                edit("INPUT", 3, EditOp::Insert(drop_rule())),
                edit("INPUT", 1, EditOp::Delete),
                edit("INPUT", 1, EditOp::Replace(drop_rule())),
            ])
            .expect("in range");
        let mut want = rs.tables[0].chains[0].rules.to_vec();
        want.push(drop_rule());
        want.remove(0);
        want[0] = drop_rule();
        assert_eq!(next.tables[0].chains[0].rules, want);
        assert_eq!(next.tables[0].chains[1..], rs.tables[0].chains[1..]);
    }

    #[test]
    fn bad_edits_are_refused_and_change_nothing() {
        let rs = ruleset();
        let before = rs.clone();
        let cases = [
            (
                edit("INPUT", 4, EditOp::Insert(drop_rule())),
                "chain INPUT has 1 rule(s), no rule number 4 to insert at",
            ),
            (
                edit("INPUT", 0, EditOp::Delete),
                "no rule number 0 to delete",
            ),
            (
                edit("OUTPUT", 1, EditOp::Replace(drop_rule())),
                "chain OUTPUT has 0 rule(s), no rule number 1 to replace",
            ),
            (edit("NOPE", 1, EditOp::Delete), "no chain NOPE"),
            (
                RuleEdit {
                    table: TableKind::Raw,
                    ..edit("INPUT", 1, EditOp::Delete)
                },
                "no Ipv4 raw table",
            ),
        ];
        for (bad, msg) in cases {
            // The first edit is fine; the second one fails the whole list.
            let err = rs
                .with_edits([edit("INPUT", 1, EditOp::Delete), bad])
                .expect_err("refused");
            let text = err.to_string();
            assert!(text.starts_with("edit 1: "), "{text}");
            assert!(text.contains(msg), "{text}");
            assert_eq!(rs, before);
        }
    }
}
