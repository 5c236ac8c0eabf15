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
