//! Filter and raw rules that wait for what a stored-only table of the same ruleset does: a
//! `--ctstate DNAT` after the nat table's DNAT, `--ctorigdst` after it, `-m mark` after the
//! mangle table's MARK. The engine does not run nat or mangle; unless the kernel runs them
//! (vallumd's `--kernel-tables`, which then hands their facts with the packet: the NAT bits
//! and original tuple of the kernel's conntrack entry, the mark), such a rule never sees
//! what it waits for. Each gets a warning at its own location naming the table, the rule
//! there that does it, and the flag ([`ViolationKind::WaitsForTable`]).
//!
//! Only a ruleset whose own nat or mangle table does it is warned: a mark or a NAT the host's
//! other tools set reaches the engine with the packet (NFQUEUE hands the mark and the
//! kernel's conntrack entry) and needs no flag. Nothing is said without the node's facts
//! ([`SetRegistry::reached_hooks`]: no packet source). One pass over the rules' matches, run
//! whole by [`super::validate`] and [`super::validate_after`] (it depends on other tables than
//! the rule's own, so an unchanged rule is checked again).

use crate::model::{Location, Match, Ruleset, TableKind, Target, ct_state};
use crate::sets::SetRegistry;

use super::{Severity, Violation, ViolationKind};

/// The first rule of `kind` tables of `ruleset` whose target is one of `targets`: its
/// location and target name.
fn producer(ruleset: &Ruleset, kind: TableKind, targets: &[&str]) -> Option<(Location, String)> {
    ruleset
        .tables
        .iter()
        .filter(|t| t.kind == kind)
        .flat_map(|t| &t.chains)
        .flat_map(|c| c.rules.iter())
        .find_map(|r| {
            let name = match &r.target {
                Target::Opaque(o) => o.name.as_str(),
                Target::Mark(_) => "MARK",
                Target::Connmark(_) => "CONNMARK",
                _ => return None,
            };
            targets
                .contains(&name)
                .then(|| (r.location, name.to_string()))
        })
}

/// The conntrack options that read what NAT did to the connection.
const NAT_OPTIONS: [&str; 9] = [
    "--ctorigsrc",
    "--ctorigdst",
    "--ctreplsrc",
    "--ctrepldst",
    "--ctorigsrcport",
    "--ctorigdstport",
    "--ctreplsrcport",
    "--ctrepldstport",
    "--ctstatus",
];

/// What a match waits for from `nat` (`Some(description)`), if anything.
fn waits_for_nat(m: &Match) -> Option<String> {
    let Match::Conntrack(c) = m else {
        return None;
    };
    let mut what = Vec::new();
    if let Some(s) = &c.ctstate {
        if s.value & ct_state::DNAT != 0 {
            what.push("--ctstate DNAT".to_string());
        }
        if s.value & ct_state::SNAT != 0 {
            what.push("--ctstate SNAT".to_string());
        }
    }
    what.extend(
        c.other
            .iter()
            .filter(|o| NAT_OPTIONS.contains(&o.name.as_str()))
            .map(|o| o.name.clone()),
    );
    (!what.is_empty()).then(|| what.join(", "))
}

/// Pushes a [`ViolationKind::WaitsForTable`] warning for every filter or raw rule of
/// `ruleset` that waits for its stored-only nat or mangle table (see the module docs).
pub(super) fn waits_for_tables(
    ruleset: &Ruleset,
    sets: Option<&dyn SetRegistry>,
    out: &mut Vec<Violation>,
) {
    let Some(node) = sets.and_then(|s| s.reached_hooks()) else {
        return;
    };
    let nat = (!node.kernel_runs(TableKind::Nat))
        .then(|| {
            producer(
                ruleset,
                TableKind::Nat,
                &["DNAT", "SNAT", "MASQUERADE", "REDIRECT", "NETMAP"],
            )
        })
        .flatten();
    let mangle = (!node.kernel_runs(TableKind::Mangle))
        .then(|| producer(ruleset, TableKind::Mangle, &["MARK", "CONNMARK"]))
        .flatten();
    if nat.is_none() && mangle.is_none() {
        return;
    }
    for table in &ruleset.tables {
        if !matches!(table.kind, TableKind::Filter | TableKind::Raw) {
            continue;
        }
        for chain in &table.chains {
            for (i, rule) in chain.rules.iter().enumerate() {
                for m in rule.matches.iter() {
                    let found = match (m, &nat, &mangle) {
                        (Match::Mark(_), _, Some(p)) => {
                            Some(("-m mark".to_string(), TableKind::Mangle, p))
                        }
                        (_, Some(p), _) => waits_for_nat(m).map(|w| (w, TableKind::Nat, p)),
                        _ => None,
                    };
                    let Some((what, kind, (at, target))) = found else {
                        continue;
                    };
                    out.push(Violation {
                        severity: Severity::Warning,
                        ruleset: ruleset.name.clone(),
                        family: Some(table.family),
                        table: Some(table.kind),
                        chain: Some(chain.name.clone()),
                        rule: Some(i as u32 + 1),
                        location: rule.location,
                        kind: ViolationKind::WaitsForTable {
                            what,
                            table: kind,
                            target: target.clone(),
                            line: at.line,
                        },
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{ReachedHooks, validate, validate_after};
    use super::*;
    use crate::model::Hook;
    use crate::restore::{ParseOptions, parse_ruleset};
    use crate::sets::IpSet;

    /// A registry with no set and the node's facts.
    struct Node(Arc<ReachedHooks>);

    impl SetRegistry for Node {
        fn lookup(&self, _name: &str) -> Option<Arc<dyn IpSet>> {
            None
        }
        fn reached_hooks(&self) -> Option<Arc<ReachedHooks>> {
            Some(self.0.clone())
        }
    }

    fn node(kernel: &[TableKind]) -> Node {
        let hooks = [Hook::Input, Hook::Forward, Hook::Output];
        Node(Arc::new(
            ReachedHooks::delivered(&hooks, &hooks, "all steered").with_kernel_tables(kernel),
        ))
    }

    /// firewalld's forward-port and mark recipe, Docker's DOCKER-USER recipe.
    const TEXT: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n\
        :OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
        -A PREROUTING -p tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80\nCOMMIT\n\
        *mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
        :OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
        -A PREROUTING -s 10.1.0.0/16 -j MARK --set-xmark 0x64/0xffffffff\nCOMMIT\n\
        *filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A FORWARD -m conntrack --ctstate DNAT -j ACCEPT\n\
        -A FORWARD -m conntrack --ctorigdst 192.0.2.1 --ctorigdstport 8080 -j ACCEPT\n\
        -A FORWARD -m mark --mark 0x64/0x65 -j ACCEPT\n\
        -A FORWARD -m conntrack --ctstate ESTABLISHED -j ACCEPT\nCOMMIT\n";

    fn waits(v: &[Violation]) -> Vec<String> {
        v.iter()
            .filter(|v| matches!(v.kind, ViolationKind::WaitsForTable { .. }))
            .map(|v| {
                assert_eq!(v.severity, Severity::Warning, "{v}");
                v.to_string()
            })
            .collect()
    }

    #[test]
    fn rules_waiting_for_stored_tables_are_warned_at_the_rule() {
        let rs = parse_ruleset("fw", TEXT, &ParseOptions::default()).unwrap();
        let got = waits(&validate(&rs, Some(&node(&[]))));
        assert_eq!(
            got,
            [
                "20:1: warning: filter/FORWARD#1: --ctstate DNAT waits for what table nat does \
                 (DNAT at line 6); nat is stored only here and not handed to the kernel, so \
                 this rule never sees it: run vallumd with --kernel-tables nat (e.g. \
                 --kernel-tables nat,mangle) and the kernel's facts reach the rule with the \
                 packet",
                "21:1: warning: filter/FORWARD#2: --ctorigdst, --ctorigdstport waits for what \
                 table nat does (DNAT at line 6); nat is stored only here and not handed to \
                 the kernel, so this rule never sees it: run vallumd with --kernel-tables nat \
                 (e.g. --kernel-tables nat,mangle) and the kernel's facts reach the rule with \
                 the packet",
                "22:1: warning: filter/FORWARD#3: -m mark waits for what table mangle does \
                 (MARK at line 14); mangle is stored only here and not handed to the kernel, \
                 so this rule never sees it: run vallumd with --kernel-tables mangle (e.g. \
                 --kernel-tables nat,mangle) and the kernel's facts reach the rule with the \
                 packet",
            ]
        );
        // The incremental validation says the same.
        assert_eq!(waits(&validate_after(&rs, &rs, Some(&node(&[]))).0), got);
        // With the kernel running nat, only the mark rule is warned; with both, none.
        let nat = waits(&validate(&rs, Some(&node(&[TableKind::Nat]))));
        assert_eq!(nat.len(), 1);
        assert!(nat[0].contains("-m mark"), "{nat:?}");
        let both = node(&[TableKind::Nat, TableKind::Mangle]);
        assert!(waits(&validate(&rs, Some(&both))).is_empty());
        // Without the node's facts (no packet source) nothing is said.
        assert!(waits(&validate(&rs, None)).is_empty());
    }

    /// A mark or NAT the ruleset's own tables do not make (the host's tools) is not warned.
    #[test]
    fn marks_and_nat_from_elsewhere_are_not_warned() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
            -A INPUT -m mark --mark 0x1 -j ACCEPT\n\
            -A INPUT -m conntrack --ctstate DNAT -j ACCEPT\nCOMMIT\n";
        let rs = parse_ruleset("fw", text, &ParseOptions::default()).unwrap();
        assert!(waits(&validate(&rs, Some(&node(&[])))).is_empty());
    }
}
