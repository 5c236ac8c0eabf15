//! Matches the kernel decides for the engine, one mark bit each.
//!
//! Which: in the filter table, `-m policy` (the packet's IPsec state, which only the kernel's
//! xfrm knows) and `-m conntrack` with `--ctstatus`, `--ctexpire`, `--ctstate DNAT`/`SNAT` or an option of
//! the original or reply tuple (`--ctorig*`, `--ctrepl*`): the kernel's conntrack entry, NAT
//! included, which the engine's own tracker does not see (it sees the packet after the
//! kernel's NAT); and IPv6 `-m addrtype` with ANYCAST or UNREACHABLE (a lookup in the kernel's
//! whole routing table, as match_lookup_rt6). [`kernel_decided`] says whether a match is one, and gives its expression: the
//! match as iptables-save prints it, per family.
//!
//! How. The node's steering has a mark field for them (vallumd's `--nfqueue-facts-mark`, the
//! same as `vallumctl dataplane install --facts-mark`; its width is
//! [`ReachedHooks::fact_bits`](crate::validate::ReachedHooks::fact_bits), 0 when there is
//! none). Every commit assigns each distinct expression of the active rulesets one bit of the
//! field ([`FactBits::assign`]); vallumd writes, per steered hook, a kernel chain that clears
//! the field and sets each expression's bit when the kernel's own match holds for the packet
//! (`-A VALLUM-FACTS-INPUT -m policy --dir in --pol none -j MARK --set-xmark B/B`), which the
//! steering jumps to before its NFQUEUE rule; the packet source hands the field with the packet
//! ([`crate::packet::PacketMeta::kernel_facts`], bit `i` for the expression of bit `i`) and the
//! compiled match reads its bit. So the kernel decides these matches exactly as in its own
//! ruleset. Without a field they are decided as before: `--ctstatus` and `-m policy` are
//! refused, the tuples are the engine tracker's.
//!
//! Assignment: an expression that stays keeps its bit (rules compiled earlier and shared by the
//! incremental compile read the same bit); a new one takes the lowest bit that neither the
//! active nor the next assignment holds, else the lowest free one (a bit whose expression was
//! just removed: for the moment between the kernel's chain and the engine's snapshot being
//! replaced, a rule of the old snapshot may read it; only a ruleset that changes then is
//! affected). IPv4 and IPv6 packets pass different kernel chains, so each family has the whole
//! field. A ruleset that needs more distinct expressions of one family than the field has bits
//! is refused at the first rule whose expression does not fit, before anything is stored
//! ("count before you expand": one pass over the rules, at most `fact_bits` expressions kept per
//! family).

use crate::model::{
    AddrTypeLimit, Family, Hook, Location, Match, Ruleset, TableKind, addr_type, ct_state,
};
use crate::restore::print_match_spec;

/// The most bits a field may have.
pub const MAX_FACT_BITS: u8 = 32;

/// One expression the kernel decides: the match as iptables-save prints it (`-m conntrack
/// --ctstate DNAT`), of one family, and the steered hooks where the kernel takes it
/// (`-m policy --dir in` not at OUTPUT, `--dir out` not at INPUT).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FactExpr {
    /// The family of the rules it comes from.
    pub family: Family,
    /// The match, as iptables-save prints it.
    pub text: String,
    /// Bit `1 << Hook::index()` per hook where it may be evaluated.
    pub hooks: u8,
}

impl FactExpr {
    /// Whether the kernel takes it at `hook`.
    pub fn valid_at(&self, hook: Hook) -> bool {
        self.hooks & 1 << hook.index() != 0
    }
}

/// The conntrack options that read the kernel's entry beyond the engine tracker's view.
const KERNEL_CT_OPTIONS: [&str; 10] = [
    "--ctorigsrc",
    "--ctorigdst",
    "--ctreplsrc",
    "--ctrepldst",
    "--ctorigsrcport",
    "--ctorigdstport",
    "--ctreplsrcport",
    "--ctrepldstport",
    "--ctstatus",
    "--ctexpire",
];

/// Whether `m` (of a filter rule of `family`) is decided by the kernel where the steering has
/// a facts field, and its expression.
pub fn kernel_decided(m: &Match, family: Family) -> Option<FactExpr> {
    let all_hooks =
        1 << Hook::Input.index() | 1 << Hook::Forward.index() | 1 << Hook::Output.index();
    let hooks = match m {
        Match::Conntrack(c) => {
            let nat = c
                .ctstate
                .is_some_and(|s| s.value & (ct_state::DNAT | ct_state::SNAT) != 0);
            let kernel = c
                .other
                .iter()
                .any(|o| KERNEL_CT_OPTIONS.contains(&o.name.as_str()));
            if !nat && !kernel {
                return None;
            }
            all_hooks
        }
        // As policy_mt_check: an input policy is not valid at OUTPUT (nor POSTROUTING), an
        // output policy not at INPUT (nor PREROUTING).
        Match::Opaque(o) if o.name == "policy" => {
            let dir_in = o
                .options
                .iter()
                .any(|x| x.name == "--dir" && x.args.first().is_some_and(|a| a == "in"));
            if dir_in {
                1 << Hook::Input.index() | 1 << Hook::Forward.index()
            } else {
                1 << Hook::Forward.index() | 1 << Hook::Output.index()
            }
        }
        // IPv6 ANYCAST and UNREACHABLE need the kernel's route lookup (match_lookup_rt6); the
        // hooks as addrtype_mt_checkentry_v1 allows the device limit.
        Match::AddrType(a) if family == Family::Ipv6 => {
            let all = a.src.map_or(0, |v| v.value) | a.dst.map_or(0, |v| v.value);
            if all & !addr_type::decided(family) & 0x0fff == 0 {
                return None;
            }
            match a.limit {
                AddrTypeLimit::None => all_hooks,
                AddrTypeLimit::In => 1 << Hook::Input.index() | 1 << Hook::Forward.index(),
                AddrTypeLimit::Out => 1 << Hook::Forward.index() | 1 << Hook::Output.index(),
            }
        }
        _ => return None,
    };
    Some(FactExpr {
        family,
        text: print_match_spec(m),
        hooks,
    })
}

/// Which expression holds which bit of the facts field, per family (IPv4 and IPv6 packets go
/// through different kernel chains, so each family has the whole field): slot `i` is bit `i`
/// (counted from the field's lowest bit).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FactBits {
    slots: [Vec<Option<FactExpr>>; 2],
}

/// A ruleset needs more distinct kernel-decided expressions than the field has bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactsOverflow {
    /// The ruleset of the first rule whose expression did not fit.
    pub ruleset: String,
    /// Its table's family.
    pub family: Family,
    /// Its chain.
    pub chain: String,
    /// Its 1-based position in the chain.
    pub rule: u32,
    /// Where it was written.
    pub location: Location,
    /// The expression.
    pub text: String,
    /// The field's width in bits.
    pub bits: u8,
}

fn family_index(f: Family) -> usize {
    match f {
        Family::Ipv4 => 0,
        Family::Ipv6 => 1,
    }
}

impl FactBits {
    /// The bit of `family`'s expression `text`, if it has one.
    pub fn bit(&self, family: Family, text: &str) -> Option<u8> {
        self.slots[family_index(family)]
            .iter()
            .position(|s| s.as_ref().is_some_and(|e| e.text == text))
            .map(|i| i as u8)
    }

    /// The assigned expressions with their bits, IPv4 first, lowest bit first.
    pub fn exprs(&self) -> impl Iterator<Item = (u8, &FactExpr)> {
        self.slots.iter().flat_map(|f| {
            f.iter()
                .enumerate()
                .filter_map(|(i, s)| s.as_ref().map(|e| (i as u8, e)))
        })
    }

    /// Whether no expression has a bit.
    pub fn is_empty(&self) -> bool {
        self.slots.iter().flatten().all(Option::is_none)
    }

    /// The assignment for `rulesets` in a field of `bits` bits, stable against `prev` (see
    /// the module docs). Walks each filter rule's matches once and keeps at most `bits`
    /// expressions per family.
    ///
    /// Errors: [`FactsOverflow`] at the first rule (rulesets in the given order, then tables,
    /// chains and rules as written) whose expression finds no free bit in its family.
    pub fn assign<'a>(
        prev: &FactBits,
        bits: u8,
        rulesets: impl IntoIterator<Item = &'a Ruleset>,
    ) -> Result<FactBits, FactsOverflow> {
        let bits = bits.min(MAX_FACT_BITS);
        let mut wanted: [Vec<FactExpr>; 2] = [Vec::new(), Vec::new()];
        let mut overflow = None;
        for rs in rulesets {
            for table in rs.tables.iter().filter(|t| t.kind == TableKind::Filter) {
                let wanted = &mut wanted[family_index(table.family)];
                for chain in &table.chains {
                    for (i, rule) in chain.rules.iter().enumerate() {
                        for m in rule.matches.iter() {
                            let Some(e) = kernel_decided(m, table.family) else {
                                continue;
                            };
                            if wanted.contains(&e) {
                                continue;
                            }
                            if wanted.len() == usize::from(bits) {
                                overflow.get_or_insert(FactsOverflow {
                                    ruleset: rs.name.clone(),
                                    family: table.family,
                                    chain: chain.name.clone(),
                                    rule: i as u32 + 1,
                                    location: rule.location,
                                    text: e.text,
                                    bits,
                                });
                                continue;
                            }
                            wanted.push(e);
                        }
                    }
                }
            }
        }
        if let Some(o) = overflow {
            return Err(o);
        }
        let mut out = FactBits::default();
        for (f, wanted) in wanted.into_iter().enumerate() {
            let prev = &prev.slots[f];
            let mut slots: Vec<Option<FactExpr>> = vec![None; usize::from(bits)];
            let mut new = Vec::new();
            for e in wanted {
                match prev.iter().position(|s| s.as_ref() == Some(&e)) {
                    Some(i) if i < slots.len() => slots[i] = Some(e),
                    _ => new.push(e),
                }
            }
            for e in new {
                let unused =
                    |i: usize| slots[i].is_none() && prev.get(i).is_none_or(Option::is_none);
                let i = (0..slots.len())
                    .find(|&i| unused(i))
                    .or_else(|| (0..slots.len()).find(|&i| slots[i].is_none()))
                    .expect("counted: at most `bits` expressions");
                slots[i] = Some(e);
            }
            while slots.last().is_some_and(Option::is_none) {
                slots.pop();
            }
            out.slots[f] = slots;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::{ParseOptions, parse_ruleset};

    fn rs(name: &str, rules: &[&str]) -> Ruleset {
        let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n");
        for r in rules {
            text.push_str(&format!("-A INPUT {r}\n"));
        }
        text.push_str("COMMIT\n");
        parse_ruleset(name, &text, &ParseOptions::default()).unwrap()
    }

    #[test]
    fn which_matches_the_kernel_decides() {
        let r = rs(
            "a",
            &[
                "-m conntrack --ctstate DNAT -j ACCEPT",
                "-m conntrack --ctstate ESTABLISHED -j ACCEPT",
                "-m conntrack --ctstatus ASSURED -j ACCEPT",
                "-m conntrack --ctorigdst 192.0.2.1 --ctorigdstport 80 -j ACCEPT",
                "-m conntrack --ctproto 6 -j ACCEPT",
                "-m policy --dir in --pol none -j ACCEPT",
                "-m policy --dir out --pol ipsec -j ACCEPT",
            ],
        );
        let chain = r.tables[0].chain("INPUT").unwrap();
        let got: Vec<Option<(String, u8)>> = chain
            .rules
            .iter()
            .map(|rule| kernel_decided(&rule.matches[0], Family::Ipv4).map(|e| (e.text, e.hooks)))
            .collect();
        let (i, f, o) = (
            1 << Hook::Input.index(),
            1 << Hook::Forward.index(),
            1 << Hook::Output.index(),
        );
        assert_eq!(
            got,
            [
                Some(("-m conntrack --ctstate DNAT".to_string(), i | f | o)),
                None,
                Some(("-m conntrack --ctstatus ASSURED".to_string(), i | f | o)),
                Some((
                    "-m conntrack --ctorigdst 192.0.2.1 --ctorigdstport 80".to_string(),
                    i | f | o
                )),
                None,
                Some(("-m policy --dir in --pol none".to_string(), i | f)),
                Some(("-m policy --dir out --pol ipsec".to_string(), f | o)),
            ]
        );
    }

    #[test]
    fn ipv6_addrtype_types_beyond_the_local_table_are_the_kernels() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n\
                    -A INPUT -m addrtype --dst-type ANYCAST -j ACCEPT\n\
                    -A INPUT -m addrtype --src-type UNREACHABLE --limit-iface-in -j ACCEPT\n\
                    -A INPUT -m addrtype --dst-type LOCAL -j ACCEPT\nCOMMIT\n";
        let opts = ParseOptions {
            family: Family::Ipv6,
            ..ParseOptions::default()
        };
        let r = parse_ruleset("a", text, &opts).unwrap();
        let chain = r.tables[0].chain("INPUT").unwrap();
        let got: Vec<Option<(String, u8)>> = chain
            .rules
            .iter()
            .map(|rule| kernel_decided(&rule.matches[0], Family::Ipv6).map(|e| (e.text, e.hooks)))
            .collect();
        let (i, f, o) = (
            1 << Hook::Input.index(),
            1 << Hook::Forward.index(),
            1 << Hook::Output.index(),
        );
        assert_eq!(
            got,
            [
                Some(("-m addrtype --dst-type ANYCAST".to_string(), i | f | o)),
                Some((
                    "-m addrtype --src-type UNREACHABLE --limit-iface-in".to_string(),
                    i | f
                )),
                None,
            ]
        );
    }

    /// A registry with no set and a steering of `bits` facts bits.
    struct Node(std::sync::Arc<crate::validate::ReachedHooks>);

    impl crate::sets::SetRegistry for Node {
        fn lookup(&self, _name: &str) -> Option<std::sync::Arc<dyn crate::sets::IpSet>> {
            None
        }
        fn reached_hooks(&self) -> Option<std::sync::Arc<crate::validate::ReachedHooks>> {
            Some(self.0.clone())
        }
    }

    fn node(bits: u8) -> Node {
        let hooks = [Hook::Input, Hook::Forward, Hook::Output];
        Node(std::sync::Arc::new(
            crate::validate::ReachedHooks::delivered(&hooks, &hooks, "steered")
                .with_fact_bits(bits),
        ))
    }

    /// With a facts field, validation lets the kernel-decided matches through (and refuses a
    /// policy where the kernel does); without one it refuses them as before.
    #[test]
    fn validation_follows_the_facts_field() {
        use crate::validate::{Severity, ViolationKind, validate};
        let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                    -A INPUT -m policy --dir in --pol none -j ACCEPT\n\
                    -A INPUT -m conntrack --ctstatus ASSURED -j ACCEPT\n\
                    -A OUTPUT -m policy --dir in --pol ipsec -j ACCEPT\nCOMMIT\n";
        let r = parse_ruleset("a", text, &ParseOptions::default()).unwrap();
        let errors = |bits: u8| -> Vec<(u32, String)> {
            validate(&r, Some(&node(bits)))
                .into_iter()
                .filter(|v| v.severity == Severity::Error)
                .map(|v| {
                    let kind = match v.kind {
                        ViolationKind::WrongHook { what, .. } => format!("hook {what}"),
                        ViolationKind::Unsupported { name, .. } => format!("unsupported {name}"),
                        k => k.to_string(),
                    };
                    (v.location.line, kind)
                })
                .collect()
        };
        assert_eq!(errors(8), [(7, "hook -m policy --dir in".to_string())]);
        let without = errors(0);
        assert_eq!(without.len(), 3, "{without:?}");
        assert!(
            without.iter().all(|(_, k)| k.starts_with("unsupported ")),
            "{without:?}"
        );
    }

    /// Through the engine: a commit assigns the bits, the compiled rule reads its bit from the
    /// packet's `kernel_facts`, and a second commit that adds an expression keeps the first
    /// one's bit.
    #[test]
    fn the_engine_reads_the_bits_it_assigned() {
        use crate::engine::{Change, Engine, EngineConfig};
        use crate::packet::{Packet, PacketFacts, PacketMeta};
        use crate::snapshot::Verdict;

        struct Zero;
        impl crate::Clock for Zero {
            fn now_ns(&self) -> u64 {
                0
            }
        }
        let engine = Engine::new(
            EngineConfig {
                cores: 1,
                barrier: crate::dataplane::BarrierStrategy::SeqCst,
                conntrack: None,
            },
            std::sync::Arc::new(Zero),
        );
        let sets = node(4);
        let put = |text: &str| {
            let rs = parse_ruleset("a", text, &ParseOptions::default()).unwrap();
            engine.commit(Change::Put(rs), &sets).unwrap();
        };
        put("*filter\n:INPUT DROP [0:0]\n\
             -A INPUT -m policy --dir in --pol none -j ACCEPT\nCOMMIT\n");
        let facts = engine.kernel_facts();
        assert_eq!(
            facts.bit(Family::Ipv4, "-m policy --dir in --pol none"),
            Some(0)
        );
        let verdict = |kernel_facts: u32| {
            let p = Packet {
                meta: PacketMeta::default(),
                facts: PacketFacts {
                    kernel_facts,
                    ..PacketFacts::default()
                },
            };
            engine.trace(&p, 0).verdict
        };
        assert_eq!(verdict(0b1), Verdict::Accept);
        assert_eq!(verdict(0), Verdict::Drop);
        put("*filter\n:INPUT DROP [0:0]\n\
             -A INPUT -m conntrack --ctstate DNAT -j ACCEPT\n\
             -A INPUT -m policy --dir in --pol none -j ACCEPT\nCOMMIT\n");
        let facts = engine.kernel_facts();
        assert_eq!(
            facts.bit(Family::Ipv4, "-m policy --dir in --pol none"),
            Some(0)
        );
        assert_eq!(
            facts.bit(Family::Ipv4, "-m conntrack --ctstate DNAT"),
            Some(1)
        );
        assert_eq!(verdict(0b10), Verdict::Accept);
        assert_eq!(verdict(0b1), Verdict::Accept);
        assert_eq!(verdict(0b100), Verdict::Drop);
        // A dry run counts as the commit does: three more expressions do not fit 4 bits.
        let more = parse_ruleset(
            "b",
            "*filter\n:INPUT ACCEPT [0:0]\n\
             -A INPUT -m conntrack --ctstatus ASSURED -j ACCEPT\n\
             -A INPUT -m conntrack --ctstatus SEEN_REPLY -j ACCEPT\n\
             -A INPUT -m conntrack --ctstate SNAT -j ACCEPT\nCOMMIT\n",
            &ParseOptions::default(),
        )
        .unwrap();
        let v = engine.validate(&more, &sets);
        let over: Vec<_> = v
            .iter()
            .filter(|v| {
                matches!(
                    v.kind,
                    crate::validate::ViolationKind::TooManyKernelFacts { .. }
                )
            })
            .collect();
        assert_eq!(over.len(), 1, "{v:?}");
        assert_eq!((over[0].ruleset.as_str(), over[0].rule), ("b", Some(3)));
        assert!(engine.commit(Change::Put(more), &sets).is_err());
    }

    /// An expression keeps its bit across commits; a new one avoids a bit just freed while
    /// another is free; the same expression in two rulesets or rules takes one bit.
    #[test]
    fn bits_are_stable_and_counted() {
        let a = rs(
            "a",
            &[
                "-m conntrack --ctstate DNAT -j ACCEPT",
                "-m policy --dir in --pol none -j ACCEPT",
                "-m conntrack --ctstate DNAT -j DROP",
            ],
        );
        let b = rs("b", &["-m conntrack --ctstatus SEEN_REPLY -j ACCEPT"]);
        let one = FactBits::assign(&FactBits::default(), 4, [&a, &b]).unwrap();
        let bit = |f: &FactBits, t: &str| f.bit(Family::Ipv4, t);
        assert_eq!(bit(&one, "-m conntrack --ctstate DNAT"), Some(0));
        assert_eq!(bit(&one, "-m policy --dir in --pol none"), Some(1));
        assert_eq!(bit(&one, "-m conntrack --ctstatus SEEN_REPLY"), Some(2));
        assert_eq!(one.exprs().count(), 3);
        // `a` drops its policy rule and takes another expression: bit 1 was just freed and
        // bit 3 never used, so the new one takes 3; the others stay.
        let a2 = rs(
            "a",
            &[
                "-m conntrack --ctstate DNAT -j ACCEPT",
                "-m conntrack --ctstate SNAT -j ACCEPT",
            ],
        );
        let two = FactBits::assign(&one, 4, [&a2, &b]).unwrap();
        assert_eq!(bit(&two, "-m conntrack --ctstate DNAT"), Some(0));
        assert_eq!(bit(&two, "-m conntrack --ctstatus SEEN_REPLY"), Some(2));
        assert_eq!(bit(&two, "-m conntrack --ctstate SNAT"), Some(3));
        assert_eq!(bit(&two, "-m policy --dir in --pol none"), None);
        // Too many for 2 bits: refused at the first rule that does not fit.
        let e = FactBits::assign(&FactBits::default(), 2, [&a, &b]).unwrap_err();
        assert_eq!(
            (e.ruleset.as_str(), e.rule, e.text.as_str(), e.bits),
            ("b", 1, "-m conntrack --ctstatus SEEN_REPLY", 2)
        );
        // IPv6 has the whole field too.
        let v6 = parse_ruleset(
            "six",
            "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m conntrack --ctstatus ASSURED -j ACCEPT\n\
             -A INPUT -m addrtype --dst-type ANYCAST -j ACCEPT\nCOMMIT\n",
            &ParseOptions {
                family: Family::Ipv6,
                ..ParseOptions::default()
            },
        )
        .unwrap();
        let both = FactBits::assign(&FactBits::default(), 2, [&v6, &b]).unwrap();
        assert_eq!(bit(&both, "-m conntrack --ctstatus SEEN_REPLY"), Some(0));
        assert_eq!(
            both.bit(Family::Ipv6, "-m addrtype --dst-type ANYCAST"),
            Some(1)
        );
        // No field: any kernel-decided match overflows, none is needed otherwise.
        assert!(FactBits::assign(&FactBits::default(), 0, [&a]).is_err());
        let plain = rs("p", &["-m conntrack --ctstate ESTABLISHED -j ACCEPT"]);
        assert!(
            FactBits::assign(&FactBits::default(), 0, [&plain])
                .unwrap()
                .is_empty()
        );
    }
}
