//! The checks of one rule's matches: its own fields (interfaces, addresses, `-p`, `-f`) and
//! each `-m` match (protocol needed, family, ranges, limits on names and values, sets, hooks
//! the match may run at, options the engine does not enforce), then its target (see
//! `targets`), reported at the rule. Commit path: allocates only the messages, reads no
//! clock, takes no lock.

use std::net::IpAddr;

use super::{Severity, TableCheck, ViolationKind, with_why};
use crate::model::{
    AddrTypeLimit, Chain, Family, Hook, IpNet, Match, Rule, SCTP_MAX_FLAGS, TableKind, addr_type,
};
use crate::sets::SetRegistry;

/// A `BadRange` for each `--sport`/`--dport` range whose low end is above its high end.
fn empty_port_ranges(
    errs: &mut Vec<ViolationKind>,
    ranges: [&Option<crate::model::Neg<crate::model::PortRange>>; 2],
) {
    for p in ranges.into_iter().flatten() {
        if p.value.lo > p.value.hi {
            errs.push(ViolationKind::BadRange(format!(
                "{}:{}",
                p.value.lo, p.value.hi
            )));
        }
    }
}

/// Whether a network's address has no bits outside its mask (`contains(addr)`, read in place:
/// this runs for every address of every rule).
fn masked(n: &IpNet) -> bool {
    match (&n.addr, &n.mask) {
        (IpAddr::V4(a), IpAddr::V4(m)) => a.to_bits() & m.to_bits() == a.to_bits(),
        (IpAddr::V6(a), IpAddr::V6(m)) => a.to_bits() & m.to_bits() == a.to_bits(),
        _ => false,
    }
}

impl TableCheck<'_> {
    /// The violations of rule `r`, number `ri` (from 0) of chain `c`, reached from the hooks
    /// `reach` (bit `1 << Hook::index()` each): its fields, its matches and its target.
    pub(super) fn check_rule(
        &mut self,
        c: &Chain,
        ri: usize,
        r: &Rule,
        reach: u8,
        sets: Option<&dyn SetRegistry>,
    ) {
        let table = self.table;
        let family = table.family;
        let enforced = table.kind.is_enforced();
        let reached = |h: Hook| reach & (1 << h.index()) != 0;
        // The kernel's steering decides some matches of filter rules, one facts bit each
        // (`crate::kernel_decided`): the engine need not run them.
        let facts = table.kind == TableKind::Filter
            && sets
                .and_then(|s| s.reached_hooks())
                .is_some_and(|h| h.fact_bits() > 0);
        let mut errs: Vec<ViolationKind> = Vec::new();
        let mut warns: Vec<ViolationKind> = Vec::new();

        for i in [&r.in_iface, &r.out_iface].into_iter().flatten() {
            // As the parser: no whitespace, control characters, '/', quotes or backslashes
            // (iptables: "Invalid character"), so that the printed rule parses back.
            let bad_char =
                |ch: char| ch.is_whitespace() || ch.is_control() || matches!(ch, '/' | '"' | '\\');
            if i.value.name.is_empty()
                || i.value.name.len() > 15
                || i.value.name.chars().any(bad_char)
            {
                errs.push(ViolationKind::TooLong {
                    what: "interface",
                    value: i.value.name.clone(),
                    max: 15,
                });
            }
        }
        if r.fragment.is_some() && family == Family::Ipv6 {
            errs.push(ViolationKind::WrongFamily("-f".into()));
        }
        if enforced {
            if let Some(w) = loopback_not_steered(r, sets) {
                warns.push(w);
            }
        }
        for net in [&r.src, &r.dst].into_iter().flatten() {
            let n = &net.value;
            if n.addr.is_ipv6() != (family == Family::Ipv6)
                || n.mask.is_ipv6() != (family == Family::Ipv6)
            {
                errs.push(ViolationKind::WrongFamily(format!(
                    "address {}/{}",
                    n.addr, n.mask
                )));
            } else if !masked(n) {
                // The kernel compares `(ip & mask) == addr`, so such a rule never matches, but
                // its text form `ADDR/MASK` is masked again by iptables-restore and does.
                errs.push(ViolationKind::BadValue {
                    what: "address",
                    value: format!("{}/{}", n.addr, n.mask),
                    reason: "has bits set outside its mask",
                });
            }
        }
        if r.protocol.is_some_and(|p| p.value == 0) {
            // The model spells `-p all` as `None`; the compiled rule would compare the
            // packet's protocol with 0 instead of matching every protocol.
            errs.push(ViolationKind::BadValue {
                what: "protocol",
                value: "0".into(),
                reason: "`-p all` is written as no protocol",
            });
        }
        let proto = r.protocol.filter(|p| !p.negated).map(|p| p.value);
        let mut mac_used = false;
        let mut owner_used = false;
        let mut physdev_out_used = false;
        for m in &r.matches {
            let needs = |ext: &'static str, protos: &[u8], pname: &'static str| {
                (!proto.is_some_and(|p| protos.contains(&p)))
                    .then_some(ViolationKind::NeedsProtocol { ext, proto: pname })
            };
            match m {
                Match::Tcp(t) => {
                    errs.extend(needs("tcp", &[6], "tcp"));
                    empty_port_ranges(&mut errs, [&t.sport, &t.dport]);
                }
                Match::Udp(u) => {
                    errs.extend(needs("udp", &[17], "udp"));
                    empty_port_ranges(&mut errs, [&u.sport, &u.dport]);
                }
                Match::Multiport(mp) => {
                    errs.extend(needs(
                        "multiport",
                        &[6, 17, 33, 132, 136],
                        "tcp|udp|udplite|sctp|dccp",
                    ));
                    let slots: usize = mp
                        .ports
                        .iter()
                        .map(|p| if p.lo == p.hi { 1 } else { 2 })
                        .sum();
                    if slots > 15 || mp.ports.is_empty() {
                        errs.push(ViolationKind::TooManyPorts(slots));
                    }
                    if mp.ports.iter().any(|p| p.lo > p.hi) {
                        errs.push(ViolationKind::BadRange("multiport".into()));
                    }
                }
                Match::Icmp(i) | Match::Icmpv6(i) if i.code.0 > i.code.1 => {
                    errs.push(ViolationKind::BadRange(format!(
                        "icmp code {}:{}",
                        i.code.0, i.code.1
                    )));
                }
                Match::Icmp(_) => {
                    if family != Family::Ipv4 {
                        errs.push(ViolationKind::WrongFamily("-m icmp".into()));
                    }
                    errs.extend(needs("icmp", &[1], "icmp"));
                }
                Match::Icmpv6(_) => {
                    if family != Family::Ipv6 {
                        errs.push(ViolationKind::WrongFamily("-m icmp6".into()));
                    }
                    errs.extend(needs("icmp6", &[58], "ipv6-icmp"));
                }
                Match::Conntrack(ct) => {
                    if let Some(w) = ct.ctstate.and_then(|s| not_queued(s, "--ctstate", sets)) {
                        warns.push(w);
                    }
                    let by_kernel =
                        facts && crate::kernel_decided::kernel_decided(m, family).is_some();
                    if enforced && !by_kernel {
                        for o in &ct.other {
                            let one = crate::model::ConntrackMatch {
                                ctstate: None,
                                other: vec![o.clone()],
                            };
                            if let Err(name) = one.tuple_conditions(family) {
                                errs.push(ViolationKind::Unsupported {
                                    what: "match",
                                    name,
                                    table: table.kind,
                                });
                            }
                        }
                    }
                }
                Match::State(s) => {
                    if let Some(w) = not_queued(*s, "--state", sets) {
                        warns.push(w);
                    }
                }
                Match::Mark(_) => {}
                Match::Physdev(d) => physdev_out_used |= d.needs_bridged_output(),
                Match::Owner(w) => {
                    owner_used = true;
                    if enforced && w.suppl_groups {
                        errs.push(ViolationKind::Unsupported {
                            what: "match",
                            name: "owner --suppl-groups (NFQUEUE sends no supplementary groups)"
                                .into(),
                            table: table.kind,
                        });
                    }
                }
                Match::Connmark(_) => {
                    if table.kind == TableKind::Raw {
                        warns.push(ViolationKind::NoConntrackInRaw("-m connmark"));
                    }
                }
                Match::Iprange(ir) => {
                    for rg in [ir.src, ir.dst].into_iter().flatten() {
                        let fam_ok = rg.value.lo.is_ipv6() == (family == Family::Ipv6)
                            && rg.value.hi.is_ipv6() == (family == Family::Ipv6);
                        if !fam_ok {
                            errs.push(ViolationKind::WrongFamily("iprange address".into()));
                        } else if rg.value.lo > rg.value.hi {
                            errs.push(ViolationKind::BadRange(format!(
                                "{}-{}",
                                rg.value.lo, rg.value.hi
                            )));
                        }
                    }
                }
                Match::Set(s) => {
                    if s.name.is_empty()
                        || crate::sets::ipset::check_name(&s.name).is_err()
                            && (s.name.len() > 31
                                || s.name
                                    .chars()
                                    .any(|ch| ch.is_whitespace() || ch.is_control()))
                    {
                        errs.push(ViolationKind::TooLong {
                            what: "set name",
                            value: s.name.clone(),
                            max: 31,
                        });
                    }
                    if s.dirs.is_empty() {
                        errs.push(ViolationKind::SetNoFlags(s.name.clone()));
                    }
                    if let Some(reg) = sets {
                        match reg.lookup(&s.name) {
                            None => errs.push(ViolationKind::UnknownSet(s.name.clone())),
                            Some(set) if set.dimensions() > s.dirs.len() && !s.dirs.is_empty() => {
                                errs.push(ViolationKind::SetDimensions {
                                    set: s.name.clone(),
                                    needed: set.dimensions(),
                                    given: s.dirs.len(),
                                })
                            }
                            Some(_) => {}
                        }
                    }
                    if enforced {
                        for o in &s.other {
                            errs.push(ViolationKind::Unsupported {
                                what: "match",
                                name: format!("set {}", o.name),
                                table: table.kind,
                            });
                        }
                    }
                }
                Match::Comment(text) => {
                    if text.len() > 255 || text.chars().any(char::is_control) {
                        errs.push(ViolationKind::TooLong {
                            what: "comment",
                            value: text.clone(),
                            max: 255,
                        });
                    }
                }
                Match::Length(l) => {
                    if l.value.lo > l.value.hi {
                        errs.push(ViolationKind::BadRange(format!(
                            "{}:{}",
                            l.value.lo, l.value.hi
                        )));
                    }
                }
                Match::Limit(l) => {
                    // As libxt_limit: at most 10000 packets a second (XT_LIMIT_SCALE) and a
                    // burst of at most 10000. A faster rate would make the token interval 0 ns
                    // and the match true for every packet.
                    let too_fast = u128::from(l.rate) * 100_000 > u128::from(l.unit.ns());
                    if l.rate == 0
                        || l.burst == 0
                        || too_fast
                        || l.burst > 10_000
                        || l.kernel_overflows()
                    {
                        errs.push(ViolationKind::BadLimit);
                    }
                }
                Match::Mac(_) => mac_used = true,
                Match::Ttl(_) | Match::Ah(_) if family != Family::Ipv4 => {
                    errs.push(ViolationKind::WrongFamily(format!("-m {}", m.extension())));
                }
                Match::Hl(_) | Match::Frag(_) | Match::Rt(_) | Match::Ipv6Header(_)
                    if family != Family::Ipv6 =>
                {
                    errs.push(ViolationKind::WrongFamily(format!("-m {}", m.extension())));
                }
                Match::Ttl(_) | Match::Hl(_) | Match::Tos(_) | Match::Ipv6Header(_) => {}
                Match::Dscp(d) => {
                    if d.value > 63 {
                        errs.push(ViolationKind::BadValue {
                            what: "dscp",
                            value: d.value.to_string(),
                            reason: "DSCP is 0-63",
                        });
                    }
                }
                Match::Ecn(e) => {
                    if e.ece.is_some() || e.cwr.is_some() {
                        errs.extend(needs("ecn --ecn-tcp-ece/--ecn-tcp-cwr", &[6], "tcp"));
                    }
                    if e.ect.is_some_and(|v| v.value > 3) {
                        errs.push(ViolationKind::BadValue {
                            what: "ecn --ecn-ip-ect",
                            value: e.ect.map_or(0, |v| v.value).to_string(),
                            reason: "the ECN field is 0-3",
                        });
                    }
                }
                Match::Ah(a) => {
                    errs.extend(needs("ah", &[51], "ah"));
                    if a.value.lo > a.value.hi {
                        errs.push(ViolationKind::BadRange("ah --ahspi".into()));
                    }
                }
                Match::Frag(f) => {
                    if f.id.value.lo > f.id.value.hi {
                        errs.push(ViolationKind::BadRange("frag --fragid".into()));
                    }
                }
                Match::Rt(rt) => {
                    if rt.segsleft.value.lo > rt.segsleft.value.hi {
                        errs.push(ViolationKind::BadRange("rt --rt-segsleft".into()));
                    }
                    if enforced {
                        if let Some(o) = rt.other.first() {
                            errs.push(ViolationKind::Unsupported {
                                what: "match",
                                name: format!("rt {}", o.name),
                                table: table.kind,
                            });
                        }
                    }
                }
                Match::AddrType(a) => {
                    let all = a.src.map_or(0, |v| v.value) | a.dst.map_or(0, |v| v.value);
                    if a.src.is_none() && a.dst.is_none() {
                        errs.push(ViolationKind::BadValue {
                            what: "addrtype",
                            value: String::new(),
                            reason: "needs --src-type or --dst-type",
                        });
                    }
                    if all >> 12 != 0 {
                        errs.push(ViolationKind::BadValue {
                            what: "addrtype",
                            value: format!("{all:#x}"),
                            reason: "holds bits that name no route type",
                        });
                    }
                    let v6_refused = addr_type::BROADCAST | addr_type::BLACKHOLE | 0xff00;
                    if family == Family::Ipv6 && all & v6_refused != 0 {
                        errs.push(ViolationKind::WrongFamily(format!(
                            "-m addrtype {}",
                            addr_type::names(all & v6_refused)
                        )));
                    }
                    // As addrtype_mt_checkentry.
                    let bad_hooks: &[Hook] = match a.limit {
                        AddrTypeLimit::None => &[],
                        AddrTypeLimit::In => &[Hook::Output, Hook::Postrouting],
                        AddrTypeLimit::Out => &[Hook::Prerouting, Hook::Input],
                    };
                    for &h in bad_hooks {
                        if reached(h) {
                            errs.push(ViolationKind::WrongHook {
                                what: if a.limit == AddrTypeLimit::In {
                                    "-m addrtype --limit-iface-in"
                                } else {
                                    "-m addrtype --limit-iface-out"
                                },
                                hook: h,
                            });
                        }
                    }
                    let undecided = all & !addr_type::decided(family) & 0x0fff;
                    let by_kernel =
                        facts && crate::kernel_decided::kernel_decided(m, family).is_some();
                    if enforced && undecided != 0 && !by_kernel {
                        errs.push(ViolationKind::Unsupported {
                            what: "match",
                            name: format!(
                                "addrtype {} (needs routes beyond the node's local table)",
                                addr_type::names(undecided)
                            ),
                            table: table.kind,
                        });
                    }
                    let needs = a
                        .src
                        .iter()
                        .chain(a.dst.iter())
                        .any(|v| crate::node_addrs::needs_facts(family, v.value));
                    if enforced && needs && sets.is_some_and(|r| r.node_addrs().is_none()) {
                        errs.push(ViolationKind::NodeAddrsUnknown(addr_type::names(all)));
                    }
                }
                Match::Rpfilter(rp) => {
                    // The nft lookup mode is no iptables option: nft tables only.
                    let nft_bit = crate::fib::rpfilter_flags::NFT;
                    let foreign = if table.kind == TableKind::Nft {
                        0
                    } else {
                        nft_bit
                    };
                    if rp.flags & (!crate::fib::rpfilter_flags::ALL | foreign) != 0 {
                        errs.push(ViolationKind::BadValue {
                            what: "rpfilter",
                            value: format!("{:#x}", rp.flags),
                            reason: "holds bits that name no rpfilter option",
                        });
                    }
                    if !matches!(
                        table.kind,
                        TableKind::Raw | TableKind::Mangle | TableKind::Nft
                    ) {
                        errs.push(ViolationKind::RpfilterTable(table.kind));
                    }
                    // As xt_rpfilter's hook mask: PREROUTING only; nft's `fib saddr . iif`
                    // also runs at INPUT and FORWARD (nft_fib_validate).
                    let nft = table.kind == TableKind::Nft;
                    for h in [Hook::Input, Hook::Forward, Hook::Output, Hook::Postrouting] {
                        let nft_ok = nft && matches!(h, Hook::Input | Hook::Forward);
                        if reached(h) && !nft_ok {
                            errs.push(ViolationKind::WrongHook {
                                what: "-m rpfilter",
                                hook: h,
                            });
                        }
                    }
                    let no_routes = |r: &dyn SetRegistry| {
                        r.node_addrs().is_none_or(|n| n.load_routes().is_none())
                    };
                    if enforced && sets.is_some_and(no_routes) {
                        errs.push(ViolationKind::NodeRoutesUnknown);
                    }
                }
                Match::PktType(t) => {
                    if enforced && (reached(Hook::Prerouting) || reached(Hook::Input)) {
                        warns.push(ViolationKind::PktTypeDerived(t.value.name()));
                    }
                    if enforced && sets.is_some_and(|r| r.node_addrs().is_none()) {
                        errs.push(ViolationKind::PktTypeNoAddrs);
                    }
                }
                Match::Recent(r) => {
                    if let Some(reason) = r.kernel_refusal() {
                        errs.push(ViolationKind::BadValue {
                            what: "recent",
                            value: r.name.clone(),
                            reason,
                        });
                    }
                    if r.mask.is_ipv4() != (family == Family::Ipv4) {
                        errs.push(ViolationKind::WrongFamily("-m recent --mask".into()));
                    }
                }
                Match::String(s) => {
                    if let Some(reason) = s.kernel_refusal() {
                        errs.push(ViolationKind::BadValue {
                            what: "string",
                            value: format!("{:?}", String::from_utf8_lossy(&s.pattern)),
                            reason,
                        });
                    }
                    let live = sets.and_then(|r| r.reached_hooks());
                    if let Some(why) = live.as_ref().and_then(|h| h.no_bytes()) {
                        if enforced {
                            warns.push(ViolationKind::NoPacketBytes(why.to_owned()));
                        }
                    }
                }
                Match::Connlimit(c) => {
                    let width = if family == Family::Ipv4 { 32 } else { 128 };
                    if c.prefix > width {
                        errs.push(ViolationKind::BadValue {
                            what: "connlimit",
                            value: c.prefix.to_string(),
                            reason: "--connlimit-mask is longer than the family's addresses",
                        });
                    }
                }
                Match::Hashlimit(h) => {
                    if let Some(reason) = h.kernel_refusal(family) {
                        errs.push(ViolationKind::BadValue {
                            what: "hashlimit",
                            value: h.name.clone(),
                            reason,
                        });
                    }
                }
                Match::U32(u) => {
                    if let Some(reason) = u.kernel_refusal() {
                        errs.push(ViolationKind::BadValue {
                            what: "u32",
                            value: "--u32".into(),
                            reason,
                        });
                    }
                    let live = sets.and_then(|r| r.reached_hooks());
                    if let Some(why) = live.as_ref().and_then(|h| h.no_bytes()) {
                        if enforced {
                            warns.push(ViolationKind::NoBytesFor {
                                what: "-m u32",
                                why: why.to_owned(),
                            });
                        }
                    }
                }
                Match::Sctp(sc) => {
                    errs.extend(needs("sctp", &[132], "sctp"));
                    empty_port_ranges(&mut errs, [&sc.sport, &sc.dport]);
                    if sc
                        .chunks
                        .as_ref()
                        .is_some_and(|c| c.flags.len() > SCTP_MAX_FLAGS)
                    {
                        errs.push(ViolationKind::BadValue {
                            what: "sctp",
                            value: "--chunk-types".into(),
                            reason: "at most 4 chunk types with flags (XT_NUM_SCTP_FLAGS)",
                        });
                    }
                    let live = sets.and_then(|r| r.reached_hooks());
                    if let Some(why) = live.as_ref().and_then(|h| h.no_bytes()) {
                        if enforced && sc.chunks.is_some() {
                            warns.push(ViolationKind::NoBytesFor {
                                what: "-m sctp --chunk-types",
                                why: why.to_owned(),
                            });
                        }
                    }
                }
                Match::Opaque(o) if facts && o.name == "policy" => {
                    // As policy_mt_check: the kernel refuses an input policy at OUTPUT and
                    // an output policy at INPUT.
                    let e = crate::kernel_decided::kernel_decided(m, family);
                    for h in [Hook::Input, Hook::Output] {
                        if reached(h) && e.as_ref().is_some_and(|e| !e.valid_at(h)) {
                            errs.push(ViolationKind::WrongHook {
                                what: if h == Hook::Input {
                                    "-m policy --dir out"
                                } else {
                                    "-m policy --dir in"
                                },
                                hook: h,
                            });
                        }
                    }
                }
                Match::Opaque(o) => {
                    if enforced {
                        errs.push(ViolationKind::Unsupported {
                            what: "match",
                            name: with_why(false, &o.name, &o.name),
                            table: table.kind,
                        });
                    }
                }
            }
        }
        if physdev_out_used && reached(Hook::Output) {
            // As physdev_mt_check: the output port of a locally sent packet is not known
            // at OUTPUT unless the rule asks for bridged traffic.
            errs.push(ViolationKind::WrongHook {
                what: "-m physdev --physdev-out/--physdev-is-out without --physdev-is-bridged",
                hook: Hook::Output,
            });
        }
        // nft's `meta skuid` runs at every hook (a packet without a socket fails it, as the
        // engine's owner match does).
        if owner_used && table.kind != TableKind::Nft {
            // As xt_owner's hooks: only locally generated packets have a socket.
            for h in [Hook::Prerouting, Hook::Input, Hook::Forward] {
                if reached(h) {
                    errs.push(ViolationKind::WrongHook {
                        what: "-m owner",
                        hook: h,
                    });
                }
            }
        }
        if mac_used {
            for h in [Hook::Output, Hook::Postrouting] {
                if reached(h) {
                    errs.push(ViolationKind::WrongHook {
                        what: "-m mac",
                        hook: h,
                    });
                }
            }
        }
        self.check_target(r, proto, reach, &mut errs, &mut warns);
        for e in errs {
            self.at_rule(c, ri, r, e);
        }
        for w in warns {
            self.push(
                Severity::Warning,
                Some(c),
                Some(ri as u32 + 1),
                r.location,
                w,
            );
        }
    }
}

/// The [`ViolationKind::LoopbackNotSteered`] warning of a rule that can match only loopback
/// packets, when the registry says the steering never queues them; `None` otherwise. Only
/// loopback packets have: `-i lo` / `-o lo` (not negated, no `+`), or a source or destination
/// inside 127.0.0.0/8 or equal to `::1` (the kernel drops such addresses arriving on any other
/// device as martians, and routes them to `lo` only).
fn loopback_not_steered(r: &Rule, sets: Option<&dyn SetRegistry>) -> Option<ViolationKind> {
    let why = sets?.reached_hooks()?.no_loopback()?.to_owned();
    let iface = |opt: &str, i: &Option<crate::model::Neg<crate::model::Iface>>| {
        i.as_ref()
            .filter(|i| !i.negated && i.value.name == "lo")
            .map(|_| format!("{opt} lo"))
    };
    let addr = |opt: &str, n: &Option<crate::model::Neg<IpNet>>| {
        let n = n.as_ref().filter(|n| !n.negated)?;
        let inside = match (n.value.addr, n.value.mask) {
            (IpAddr::V4(a), IpAddr::V4(m)) => a.octets()[0] == 127 && m.octets()[0] == 255,
            (IpAddr::V6(a), IpAddr::V6(m)) => {
                a == std::net::Ipv6Addr::LOCALHOST && m.to_bits() == u128::MAX
            }
            _ => false,
        };
        inside.then(|| format!("{opt} {}", n.value.addr))
    };
    let what = iface("-i", &r.in_iface)
        .or_else(|| iface("-o", &r.out_iface))
        .or_else(|| addr("-s", &r.src))
        .or_else(|| addr("-d", &r.dst))?;
    Some(ViolationKind::LoopbackNotSteered(what, why))
}

/// The [`ViolationKind::StateNotQueued`] warning of a `--ctstate` / `--state` (`option`) whose
/// states, `!` aside, are only ESTABLISHED and RELATED, when the registry says only new
/// packets are steered; `None` otherwise.
fn not_queued(
    states: crate::model::Neg<u8>,
    option: &str,
    sets: Option<&dyn crate::sets::SetRegistry>,
) -> Option<ViolationKind> {
    use crate::model::ct_state::{ESTABLISHED, RELATED};
    let why = sets?.reached_hooks()?.only_new()?.to_owned();
    let only_old = states.value != 0 && states.value & !(ESTABLISHED | RELATED) == 0;
    if !only_old {
        return None;
    }
    let names: Vec<&str> = [(ESTABLISHED, "ESTABLISHED"), (RELATED, "RELATED")]
        .into_iter()
        .filter(|(b, _)| states.value & b != 0)
        .map(|(_, n)| n)
        .collect();
    let neg = if states.negated { "! " } else { "" };
    Some(ViolationKind::StateNotQueued(
        format!("{neg}{option} {}", names.join(",")),
        why,
    ))
}
