//! Compiling one rule: a model [`Rule`] (its fields, `-m` matches and target) into the
//! [`CRule`] the evaluator runs, with chain names resolved to indices, sets looked up in the
//! registry and the named state of `-m recent`/`-m hashlimit` found or made. Commit path:
//! allocates the compiled rule, takes no lock, reads no clock; an extension it cannot
//! compile is a [`RuleError`], never a dropped match.

use std::cell::RefCell;
use std::sync::Arc;

use crate::model::{Match, Neg, PortRange, Rule, Target};
use crate::packet::IfName;
use crate::sets::SetRegistry;

use super::super::*;

/// A compile error before the chain context is known.
pub(crate) enum RuleError {
    UnknownChain(String),
    Unsupported(String),
    UnknownSet(String),
}

impl RuleError {
    pub(crate) fn in_context(
        self,
        (ruleset, table, chain): (String, TableKind, String),
    ) -> CompileError {
        match self {
            RuleError::UnknownChain(target) => CompileError::UnknownChain {
                ruleset,
                table,
                chain,
                target,
            },
            RuleError::Unsupported(extension) => CompileError::Unsupported {
                ruleset,
                table,
                chain,
                extension,
            },
            RuleError::UnknownSet(set) => CompileError::UnknownSet { ruleset, set },
        }
    }
}

/// A named verdict map: its set (which becomes a verdict map here, refused when it holds
/// elements without a verdict) and every `jump`/`goto` verdict number of the chains named
/// `chain_prefix` + NAME, resolved to this table's chain indices (a verdict added to the map
/// later can only name a chain that exists now).
fn compile_vmap(
    v: &crate::model::VmapTarget,
    chains: &HashMap<&str, u32>,
    sets: &dyn SetRegistry,
) -> Result<CVmap, RuleError> {
    use crate::sets::{SetRef, verdict};
    let set = sets
        .lookup(&v.map)
        .ok_or_else(|| RuleError::UnknownSet(v.map.clone()))?;
    let SetRef::Handle(set) = SetRef::new(set) else {
        return Err(RuleError::Unsupported(format!(
            "vmap @{}: not a managed set",
            v.map
        )));
    };
    if !set.bind_map() {
        return Err(RuleError::Unsupported(format!(
            "vmap @{}: the set holds elements without a verdict",
            v.map
        )));
    }
    let mut targets = rustc_hash::FxHashMap::default();
    for (&name, &index) in chains {
        let Some(local) = name.strip_prefix(v.chain_prefix.as_str()) else {
            continue;
        };
        // Helper chains (`NAME #N`) are the lowering's own; no verdict names them.
        if local.contains(" #") {
            continue;
        }
        for (goto, t) in [(false, CTarget::Jump(index)), (true, CTarget::Goto(index))] {
            let id = verdict::chain(goto, local).map_err(RuleError::Unsupported)?;
            targets.insert(id, t);
        }
    }
    set.resolve_verdicts(targets.keys().copied().collect());
    Ok(CVmap {
        set,
        dirs: v.dirs.clone().into_boxed_slice(),
        chains: targets,
    })
}

fn iface_pattern(i: &Neg<crate::model::Iface>) -> Option<(bool, IfacePattern)> {
    let (name, wildcard) = match i.value.name.strip_suffix('+') {
        Some(p) => (p, true),
        None => (i.value.name.as_str(), false),
    };
    Some((
        i.negated,
        IfacePattern {
            name: IfName::new(name)?,
            wildcard,
        },
    ))
}

pub(crate) fn compile_rule(
    rule: &Rule,
    chains: &HashMap<&str, u32>,
    sets: &dyn SetRegistry,
    (named, ruleset): (&RefCell<NamedState>, &Arc<str>),
    v6: bool,
    raw: bool,
) -> Result<CRule, RuleError> {
    let mut matches = Vec::with_capacity(rule.matches.len());
    let family = if v6 { Family::Ipv6 } else { Family::Ipv4 };
    for m in &rule.matches {
        // Decided by the kernel's steering where it has a bit for it (filter only: raw runs
        // before conntrack).
        if !raw {
            let bit = crate::kernel_decided::kernel_decided(m, family)
                .and_then(|e| sets.kernel_fact_bit(family, &e.text));
            if let Some(bit) = bit {
                matches.push(CMatch::KernelFact(1 << bit));
                continue;
            }
        }
        let neg = |n: &Option<Neg<PortRange>>| n.map(|p| (p.negated, p.value));
        let c = match m {
            Match::Tcp(t) => CMatch::Tcp {
                sport: neg(&t.sport),
                dport: neg(&t.dport),
                flags: t.flags.map(|f| (f.negated, f.value.mask, f.value.comp)),
                option: t.option.map(|o| (o.negated, o.value)),
            },
            Match::Udp(u) => CMatch::Udp {
                sport: neg(&u.sport),
                dport: neg(&u.dport),
            },
            Match::Multiport(mp) => CMatch::Multiport {
                dir: mp.dir,
                negated: mp.negated,
                ports: mp.ports.clone().into_boxed_slice(),
            },
            // IPv4 type 255 matches every ICMP packet whatever the code range (the kernel's
            // icmp_type_code_match tests `test_type == 0xFF` first). The parser keeps
            // `--icmp-type 255/0` as `Some(255)` so that it prints back as written (as newer
            // iptables-save does), and a structured model may carry it too.
            Match::Icmp(i) => CMatch::Icmp {
                negated: i.negated,
                icmp_type: i.icmp_type.filter(|&t| t != 255),
                code: i.code,
            },
            Match::Icmpv6(i) => CMatch::Icmp {
                negated: i.negated,
                icmp_type: i.icmp_type,
                code: i.code,
            },
            Match::Conntrack(ct) if !ct.other.is_empty() => {
                let family = if v6 { Family::Ipv6 } else { Family::Ipv4 };
                let c = ct
                    .tuple_conditions(family)
                    .map_err(RuleError::Unsupported)?;
                let net =
                    |n: &crate::model::IpNet| AddrMatch::new(addr_bits(n.addr), addr_bits(n.mask));
                CMatch::Conntrack(Box::new(CConntrack {
                    state: ct.ctstate.map(|s| (s.negated, s.value)),
                    reply: c.reply,
                    proto: c.proto,
                    addrs: c.addrs.map(|a| a.map(|(neg, n)| (neg, net(&n)))),
                    ports: c.ports,
                }))
            }
            Match::Conntrack(ct) => match ct.ctstate {
                Some(s) => CMatch::CtState {
                    negated: s.negated,
                    bits: s.value,
                },
                None => continue,
            },
            Match::State(s) => CMatch::CtState {
                negated: s.negated,
                bits: s.value,
            },
            Match::Iprange(r) => CMatch::Iprange(Box::new(IprangeMatch {
                src: r.src.map(|n| (n.negated, n.value.lo, n.value.hi)),
                dst: r.dst.map(|n| (n.negated, n.value.lo, n.value.hi)),
            })),
            Match::Set(s) => {
                if let Some(o) = s.other.first() {
                    return Err(RuleError::Unsupported(format!("set {}", o.name)));
                }
                let set = sets
                    .lookup(&s.name)
                    .ok_or_else(|| RuleError::UnknownSet(s.name.clone()))?;
                CMatch::Set {
                    negated: s.negated,
                    set: crate::sets::SetRef::new(set),
                    dirs: s.dirs.clone().into_boxed_slice(),
                }
            }
            Match::Comment(_) => continue,
            Match::Mark(mk) => CMatch::Mark {
                negated: mk.negated,
                value: mk.value.value,
                mask: mk.value.mask,
            },
            Match::Owner(w) if w.suppl_groups => {
                return Err(RuleError::Unsupported("owner --suppl-groups".into()));
            }
            Match::Owner(w) => CMatch::Owner(*w),
            Match::Physdev(d) => {
                let pattern = |i: &Option<Neg<crate::model::Iface>>| match i {
                    None => Ok(None),
                    Some(n) => iface_pattern(n).map(Some).ok_or_else(|| {
                        RuleError::Unsupported(format!("physdev interface {}", n.value.name))
                    }),
                };
                CMatch::Physdev(Box::new(super::super::CPhysdev {
                    physdev_in: pattern(&d.physdev_in)?,
                    physdev_out: pattern(&d.physdev_out)?,
                    is_in: d.is_in,
                    is_out: d.is_out,
                    is_bridged: d.is_bridged,
                }))
            }
            // The raw table runs before conntrack: no entry to read (validation warns).
            Match::Connmark(_) if raw => CMatch::Never,
            Match::Connmark(mk) => CMatch::Connmark {
                negated: mk.negated,
                value: mk.value.value,
                mask: mk.value.mask,
            },
            Match::Length(l) => CMatch::Length {
                negated: l.negated,
                range: l.value,
            },
            Match::Limit(l) => {
                let interval_ns = l.interval_ns();
                CMatch::Limit(TokenBucket {
                    interval_ns,
                    burst_ns: interval_ns.saturating_mul(u64::from(l.burst.max(1) - 1)),
                    tat: AtomicU64::new(0),
                })
            }
            Match::Mac(mac) => CMatch::Mac {
                negated: mac.negated,
                mac: mac.value,
            },
            Match::Ttl(t) | Match::Hl(t) => CMatch::Ttl(*t),
            Match::Tos(t) => CMatch::Tos {
                negated: t.negated,
                value: t.value.value,
                mask: t.value.mask,
            },
            // xt_dscp: `(dsfield >> 2) == dscp`.
            Match::Dscp(d) => CMatch::Tos {
                negated: d.negated,
                value: d.value << 2,
                mask: 0xfc,
            },
            Match::Ecn(e) => CMatch::Ecn(*e),
            Match::Ah(a) => CMatch::Ah {
                negated: a.negated,
                spi: a.value,
            },
            Match::Frag(f) => CMatch::Frag(Box::new(*f)),
            Match::Rt(r) => {
                if let Some(o) = r.other.first() {
                    return Err(RuleError::Unsupported(format!("rt {}", o.name)));
                }
                CMatch::Rt(Box::new(r.clone()))
            }
            Match::Ipv6Header(h) => CMatch::Ipv6Header(*h),
            Match::AddrType(a) => {
                let family = if v6 { Family::Ipv6 } else { Family::Ipv4 };
                let masks = a.src.iter().chain(a.dst.iter());
                let undecided = masks.clone().map(|v| v.value).fold(0, |x, y| x | y)
                    & !crate::model::addr_type::decided(family);
                if undecided != 0 {
                    return Err(RuleError::Unsupported(format!(
                        "addrtype {}",
                        crate::model::addr_type::names(undecided)
                    )));
                }
                let addrs = if masks
                    .clone()
                    .any(|v| crate::node_addrs::needs_facts(family, v.value))
                {
                    Some(sets.node_addrs().ok_or_else(|| {
                        RuleError::Unsupported("addrtype without the node's addresses".into())
                    })?)
                } else {
                    None
                };
                CMatch::AddrType(Box::new(CAddrType {
                    src: a.src.map(|v| (v.negated, v.value)),
                    dst: a.dst.map(|v| (v.negated, v.value)),
                    limit: a.limit,
                    addrs,
                }))
            }
            Match::Rpfilter(rp) => CMatch::Rpfilter {
                flags: rp.flags,
                addrs: sets.node_addrs().ok_or_else(|| {
                    RuleError::Unsupported("rpfilter without the node's routes".into())
                })?,
            },
            Match::PktType(t) => CMatch::PktType {
                negated: t.negated,
                kind: t.value,
                addrs: sets.node_addrs(),
            },
            Match::Recent(r) => CMatch::Recent(Box::new(named.borrow_mut().recent(ruleset, r))),
            Match::Hashlimit(h) => {
                let family = if v6 { Family::Ipv6 } else { Family::Ipv4 };
                CMatch::Hashlimit(Box::new(named.borrow_mut().hashlimit(ruleset, family, h)))
            }
            Match::Connlimit(c) => CMatch::Connlimit(Box::new(CConnlimit::new(c, v6))),
            Match::String(s) => CMatch::String(Box::new(CString::new(s))),
            Match::Sctp(s) => CMatch::Sctp(s.clone()),
            Match::U32(u) => CMatch::U32(u.clone()),
            Match::Opaque(o) => return Err(RuleError::Unsupported(o.name.clone())),
        };
        matches.push(c);
    }
    let resolve = |name: &str| {
        chains
            .get(name)
            .copied()
            .ok_or_else(|| RuleError::UnknownChain(name.to_string()))
    };
    let target = match &rule.target {
        Target::None => CTarget::Continue,
        Target::Accept => CTarget::Accept,
        Target::Drop => CTarget::Drop,
        Target::Return => CTarget::Return,
        Target::Reject(w) => CTarget::Reject(*w),
        Target::Jump(c) => CTarget::Jump(resolve(c)?),
        Target::Goto(c) => CTarget::Goto(resolve(c)?),
        Target::Log(l) => CTarget::Log(Box::new(LogSpec {
            prefix: l.prefix.as_deref().map(Arc::from),
            level: l.level.unwrap_or(4),
            nflog_group: None,
        })),
        Target::Nflog(n) => CTarget::Log(Box::new(LogSpec {
            prefix: n.prefix.as_deref().map(Arc::from),
            level: 4,
            nflog_group: Some(n.group),
        })),
        Target::Notrack => CTarget::Notrack,
        Target::Mark(m) => CTarget::Mark(*m),
        // As above: no conntrack entry in the raw table, CONNMARK does nothing there.
        Target::Connmark(_) if raw => CTarget::Continue,
        Target::Connmark(c) => CTarget::Connmark(*c),
        // As xt_ct_tg_check: with --notrack the other options are not used.
        Target::Ct(ct) if ct.notrack => CTarget::Notrack,
        Target::Ct(ct) => {
            // --helper runs no ALG here (validation warns); --timeout and the event masks
            // are not enforced.
            if let Some(o) = ct.other.iter().find(|o| o.name != "--helper") {
                return Err(RuleError::Unsupported(format!("CT {}", o.name)));
            }
            CTarget::Ct(ct.zone.unwrap_or(crate::model::CtZoneSpec {
                id: 0,
                from_mark: false,
                dirs: crate::model::CtZone::ORIG | crate::model::CtZone::REPLY,
            }))
        }
        Target::Vmap(v) => CTarget::Vmap(Box::new(compile_vmap(v, chains, sets)?)),
        Target::Opaque(o) => return Err(RuleError::Unsupported(o.name.clone())),
    };
    let iface = |i: &Option<Neg<crate::model::Iface>>| -> Result<_, RuleError> {
        match i {
            None => Ok(None),
            Some(n) => iface_pattern(n)
                .map(Some)
                .ok_or_else(|| RuleError::Unsupported(format!("interface {}", n.value.name))),
        }
    };
    let (src, src_negated) = addr_match(&rule.src);
    let (dst, dst_negated) = addr_match(&rule.dst);
    Ok(CRule {
        src,
        dst,
        src_negated,
        dst_negated,
        in_iface: iface(&rule.in_iface)?,
        out_iface: iface(&rule.out_iface)?,
        protocol: rule.protocol.map(|p| (p.negated, p.value)),
        fragment: rule.fragment,
        matches: Matches::new(matches),
        target,
    })
}
