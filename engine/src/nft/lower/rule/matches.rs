//! One nft match (`LEFT [op] RIGHT`) applied to the alternatives of a rule being lowered:
//! each left expression onto the model field or `-m` match that tests the same thing.

use super::*;
use crate::model::ct_state;
use crate::nft::print::expr_string;
use crate::nft::{DataType, SetElem};

/// The value of a numeric element.
fn num(e: &Elem) -> Option<u128> {
    match e {
        Elem::Value(Value::Num(n)) => Some(*n),
        _ => None,
    }
}

/// An inclusive numeric range of a value or `LOW-HIGH` element.
fn range(e: &Elem) -> Option<(u128, u128)> {
    match e {
        Elem::Value(Value::Num(n)) => Some((*n, *n)),
        Elem::Range(Value::Num(a), Value::Num(b)) => Some((*a, *b)),
        _ => None,
    }
}

fn addr(fam: Family, v: u128) -> IpAddr {
    match fam {
        Family::Ipv4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::Ipv6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

fn width(fam: Family) -> u8 {
    match fam {
        Family::Ipv4 => 32,
        Family::Ipv6 => 128,
    }
}

/// nft's `ct_state` bits as the model's [`ct_state`] bits (untracked is 64 in nft).
fn ct_bits(v: u128) -> Option<u8> {
    let mut out = 0;
    for (n, m) in [
        (1, ct_state::INVALID),
        (2, ct_state::ESTABLISHED),
        (4, ct_state::RELATED),
        (8, ct_state::NEW),
        (64, ct_state::UNTRACKED),
    ] {
        if v & n != 0 {
            out |= m;
        }
    }
    (v & !(1 | 2 | 4 | 8 | 64) == 0).then_some(out)
}

/// The prefixes that exactly cover `lo..=hi` of `bits` bits, at most `2 * bits` of them.
fn prefixes(lo: u128, hi: u128, bits: u8) -> Vec<(u128, u8)> {
    let mut out = Vec::new();
    let mut a = lo;
    loop {
        // The largest aligned block at `a` that stays within `hi`.
        let mut len = bits;
        while len > 0 {
            let size_bits = u32::from(bits - len + 1);
            let mask = if size_bits >= 128 {
                u128::MAX
            } else {
                (1u128 << size_bits) - 1
            };
            if a & mask != 0 || a.checked_add(mask).is_none_or(|end| end > hi) {
                break;
            }
            len -= 1;
        }
        out.push((a, len));
        let size_bits = u32::from(bits - len);
        let last = if size_bits >= 128 {
            u128::MAX
        } else {
            a + ((1u128 << size_bits) - 1)
        };
        if last >= hi {
            return out;
        }
        a = last + 1;
    }
}

impl Cx<'_> {
    /// Applies match `m` to every alternative in `alts`, dropping those it makes impossible;
    /// `Err(Ok(Omit))` when none is left.
    pub(super) fn lower_match(
        &mut self,
        at: Pos,
        m: &NftMatch,
        alts: &mut Vec<model::Rule>,
    ) -> Step<()> {
        let neg = match m.op {
            Op::Implicit | Op::Eq => false,
            Op::Ne => true,
            Op::Lt | Op::Gt | Op::Le | Op::Ge => return self.ordered(at, m, alts),
        };
        match &m.right {
            // A named set of ports: a `bitmap:port` engine set (its elements change without a
            // commit) behind the protocol the expression implies.
            SetRhs::Ref(name) if port_set(self.table, name).is_some() => {
                let Expr::Payload(p) = &m.left else {
                    let table = self.table;
                    let elems = port_set(table, name).unwrap_or_default();
                    return self.apply_set(at, &m.left, elems, neg, alts);
                };
                let sm = self.named_set(at, &m.left, name, neg)?;
                let proto = p.proto;
                self.each(alts, |cx, a| {
                    cx.transport(at, proto, a)?;
                    a.matches.push(sm.clone());
                    Ok(())
                })
            }
            SetRhs::Ref(name) => {
                let sm = self.named_set(at, &m.left, name, neg)?;
                for a in alts.iter_mut() {
                    a.matches.push(sm.clone());
                }
                Ok(())
            }
            SetRhs::Value(e) => self.each(alts, |cx, a| cx.apply(at, &m.left, e, neg, a)),
            SetRhs::Set(elems) => self.apply_set(at, &m.left, elems, neg, alts),
        }
    }

    /// Runs `f` on each alternative, keeping those it does not omit.
    fn each(
        &mut self,
        alts: &mut Vec<model::Rule>,
        mut f: impl FnMut(&mut Self, &mut model::Rule) -> Step<()>,
    ) -> Step<()> {
        let mut kept = Vec::with_capacity(alts.len());
        for mut a in alts.drain(..) {
            match f(self, &mut a) {
                Ok(()) => kept.push(a),
                Err(Ok(Omit)) => {}
                Err(e) => return Err(e),
            }
        }
        settle(alts, kept)
    }

    fn refuse<T>(&self, at: Pos, word: &str, what: impl Into<String>) -> Step<T> {
        Err(self.unsupported(at, word, what.into()))
    }

    /// `LEFT < V`, `<=`, `>`, `>=` on ports, lengths, TTLs and uids: the range they leave.
    fn ordered(&mut self, at: Pos, m: &NftMatch, alts: &mut Vec<model::Rule>) -> Step<()> {
        let Some(v) = (match &m.right {
            SetRhs::Value(e) => num(e),
            _ => None,
        }) else {
            return self.refuse(
                at,
                "",
                format!("`{} <`, `>` with a set", expr_string(&m.left)),
            );
        };
        let max: u128 = match &m.left {
            Expr::Payload(Payload {
                field: "ttl" | "hoplimit",
                ..
            }) => 255,
            Expr::Meta(MetaKey::Skuid | MetaKey::Skgid) => u128::from(u32::MAX),
            _ => 0xffff,
        };
        let (lo, hi) = match m.op {
            Op::Lt if v > 0 => (0, v - 1),
            Op::Le => (0, v),
            Op::Gt if v < max => (v + 1, max),
            Op::Ge => (v, max),
            _ => return Err(Ok(Omit)),
        };
        let e = Elem::Range(Value::Num(lo), Value::Num(hi));
        self.each(alts, |cx, a| cx.apply(at, &m.left, &e, false, a))
    }

    fn apply_set(
        &mut self,
        at: Pos,
        left: &Expr,
        elems: &[SetElem],
        neg: bool,
        alts: &mut Vec<model::Rule>,
    ) -> Step<()> {
        // Ports: one multiport match (15 slots, a range takes 2).
        if let Expr::Payload(
            p @ Payload {
                field: "sport" | "dport",
                ..
            },
        ) = left
        {
            let ports: Option<Vec<PortRange>> = elems
                .iter()
                .map(|e| range(&e.key))
                .map(|r| {
                    r.map(|(lo, hi)| PortRange {
                        lo: lo as u16,
                        hi: hi as u16,
                    })
                })
                .collect();
            let slots: usize = ports
                .iter()
                .flatten()
                .map(|r| if r.lo == r.hi { 1 } else { 2 })
                .sum();
            if let Some(ports) = ports.filter(|_| slots <= 15) {
                let dir = if p.field == "sport" {
                    MultiportDir::Source
                } else {
                    MultiportDir::Destination
                };
                return self.each(alts, |cx, a| {
                    cx.transport(at, p.proto, a)?;
                    a.matches.push(Match::Multiport(MultiportMatch {
                        dir,
                        negated: neg,
                        ports: ports.clone(),
                    }));
                    Ok(())
                });
            }
        }
        // Flags: any of the union's bits.
        if matches!(left, Expr::Ct(CtKey::State | CtKey::Status)) {
            let union = elems
                .iter()
                .map(|e| num(&e.key))
                .try_fold(0u128, |u, v| Some(u | v?));
            if let Some(u) = union {
                let e = Elem::Value(Value::Num(u));
                return self.each(alts, |cx, a| cx.apply(at, left, &e, neg, a));
            }
        }
        if neg {
            // `!= { a, b }` holds when no element does: a negated test per element, which
            // only address ranges can stack in one rule.
            let v6 = match left {
                Expr::Payload(Payload {
                    proto: Proto::Ip,
                    field: f @ ("saddr" | "daddr"),
                }) => Some((false, *f)),
                Expr::Payload(Payload {
                    proto: Proto::Ip6,
                    field: f @ ("saddr" | "daddr"),
                }) => Some((true, *f)),
                _ => None,
            };
            let Some((v6, field)) = v6 else {
                return self.refuse(
                    at,
                    "!=",
                    format!(
                        "`{} != {{ ... }}` (a negated anonymous set)",
                        expr_string(left)
                    ),
                );
            };
            let fam = if v6 { Family::Ipv6 } else { Family::Ipv4 };
            if fam != self.family {
                return Err(Ok(Omit));
            }
            let mut ms = Vec::with_capacity(elems.len());
            for e in elems {
                let (lo, hi) = match &e.key {
                    Elem::Prefix(a, l) => {
                        let host = if *l >= width(fam) {
                            0
                        } else {
                            (1u128 << (width(fam) - l)) - 1
                        };
                        (*a, *a | host)
                    }
                    k => match range(k) {
                        Some(r) => r,
                        None => {
                            return self.refuse(
                                at,
                                field,
                                format!("`{} != {{ ... }}` with this element", expr_string(left)),
                            );
                        }
                    },
                };
                let r = Neg {
                    negated: true,
                    value: AddrRange {
                        lo: addr(fam, lo),
                        hi: addr(fam, hi),
                    },
                };
                ms.push(iprange(field == "saddr", r));
            }
            for a in alts.iter_mut() {
                a.matches.extend(ms.iter().cloned());
            }
            return Ok(());
        }
        // Anything else: one alternative per element (disjoint elements: at most one holds).
        if alts.len().saturating_mul(elems.len()) > MAX_EXPANDED_RULES {
            return Err(Err(self.err(
                at,
                "{",
                ErrorKind::TooLarge(format!(
                    "an anonymous set makes more than {MAX_EXPANDED_RULES} rules"
                )),
            )));
        }
        let mut out = Vec::with_capacity(alts.len() * elems.len());
        for a in alts.iter() {
            for e in elems {
                let mut b = a.clone();
                match self.apply(at, left, &e.key, false, &mut b) {
                    Ok(()) => out.push(b),
                    Err(Ok(Omit)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        settle(alts, out)
    }

    /// The rule's transport protocol for a `PROTO sport|dport` test: tcp and udp set it (an
    /// implied `meta l4proto`); `th` needs an earlier tcp or udp test.
    pub(super) fn transport(&self, at: Pos, proto: Proto, a: &mut model::Rule) -> Step<u8> {
        let p = match proto {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            _ => match a.protocol {
                Some(Neg {
                    negated: false,
                    value: p @ (6 | 17),
                }) => p,
                _ => {
                    return self.refuse(
                        at,
                        "th",
                        "`th sport|dport` without `meta l4proto tcp|udp` before it",
                    );
                }
            },
        };
        need_proto(a, p)?;
        Ok(p)
    }

    /// Applies `LEFT == e` (`!=` when `neg`) to one alternative.
    fn apply(
        &mut self,
        at: Pos,
        left: &Expr,
        e: &Elem,
        neg: bool,
        a: &mut model::Rule,
    ) -> Step<()> {
        match left {
            Expr::Payload(p) => self.payload(at, *p, e, neg, a),
            Expr::Meta(k) => self.meta(at, *k, e, neg, a),
            Expr::Ct(k) => self.ct(at, *k, e, None, neg, a),
            Expr::And(inner, mask) => {
                let mask = u32::try_from(*mask).ok();
                match (&**inner, mask) {
                    (
                        Expr::Payload(Payload {
                            proto: Proto::Tcp,
                            field: "flags",
                        }),
                        Some(m),
                    ) => {
                        let comp = num(e).and_then(|v| u8::try_from(v).ok());
                        let (Some(comp), Ok(mask)) = (comp, u8::try_from(m)) else {
                            return self.refuse(at, "flags", "this `tcp flags` test");
                        };
                        need_proto(a, 6)?;
                        let f = TcpFlags { mask, comp };
                        a.matches.push(Match::Tcp(TcpMatch {
                            flags: Some(Neg {
                                negated: neg,
                                value: f,
                            }),
                            ..TcpMatch::default()
                        }));
                        Ok(())
                    }
                    (Expr::Meta(MetaKey::Mark), Some(m)) => {
                        let Some(v) = num(e).and_then(|v| u32::try_from(v).ok()) else {
                            return self.refuse(at, "mark", "this `meta mark` value");
                        };
                        a.matches.push(Match::Mark(Neg {
                            negated: neg,
                            value: MarkValue { value: v, mask: m },
                        }));
                        Ok(())
                    }
                    (Expr::Ct(k @ CtKey::Mark), Some(m)) => self.ct(at, *k, e, Some(m), neg, a),
                    _ => self.refuse(
                        at,
                        "&",
                        format!("`{} & ...` (this masked expression)", expr_string(inner)),
                    ),
                }
            }
            Expr::Fib { flags, result } => self.fib(at, *flags, *result, e, neg, a),
            // `A . B == a . b` is `A == a` and `B == b` (an element of a concatenated set or
            // verdict map); its negation is no conjunction of model matches.
            Expr::Concat(parts) => match e {
                Elem::Concat(vals) if !neg && vals.len() == parts.len() => {
                    for (p, v) in parts.iter().zip(vals) {
                        self.apply(at, p, v, false, a)?;
                    }
                    Ok(())
                }
                _ => self.refuse(
                    at,
                    ".",
                    format!(
                        "`{}` (a concatenation) compared with this value or negated",
                        expr_string(left)
                    ),
                ),
            },
            Expr::Numgen { .. } => self.refuse(at, "numgen", "`numgen`"),
        }
    }

    fn payload(
        &mut self,
        at: Pos,
        p: Payload,
        e: &Elem,
        neg: bool,
        a: &mut model::Rule,
    ) -> Step<()> {
        let fam = self.family;
        let fam_of = match p.proto {
            Proto::Ip | Proto::Icmp => Some(Family::Ipv4),
            Proto::Ip6 | Proto::Icmpv6 => Some(Family::Ipv6),
            _ => None,
        };
        if fam_of.is_some_and(|f| f != fam) {
            return Err(Ok(Omit));
        }
        let word = p.field;
        match (p.proto, p.field) {
            (Proto::Ip | Proto::Ip6, "saddr" | "daddr") => {
                let src = p.field == "saddr";
                let net = match e {
                    Elem::Value(Value::Num(v)) => IpNet::new(addr(fam, *v), width(fam)),
                    Elem::Prefix(v, l) => IpNet::new(addr(fam, *v), *l),
                    Elem::Range(Value::Num(lo), Value::Num(hi)) => {
                        let r = Neg {
                            negated: neg,
                            value: AddrRange {
                                lo: addr(fam, *lo),
                                hi: addr(fam, *hi),
                            },
                        };
                        a.matches.push(iprange(src, r));
                        return Ok(());
                    }
                    _ => None,
                };
                let Some(net) = net else {
                    return self.refuse(at, word, format!("this `{word}` value"));
                };
                let slot = if src { &mut a.src } else { &mut a.dst };
                if slot.is_some() {
                    // A second test of the same field: as an address range match.
                    let lo = net.addr;
                    let bits = |ip: IpAddr| match ip {
                        IpAddr::V4(x) => u128::from(u32::from(x)),
                        IpAddr::V6(x) => u128::from(x),
                    };
                    let hi = addr(
                        fam,
                        bits(net.addr)
                            | (!bits(net.mask)
                                & if fam == Family::Ipv4 {
                                    u128::from(u32::MAX)
                                } else {
                                    u128::MAX
                                }),
                    );
                    let r = Neg {
                        negated: neg,
                        value: AddrRange { lo, hi },
                    };
                    a.matches.push(iprange(src, r));
                } else {
                    *slot = Some(Neg {
                        negated: neg,
                        value: net,
                    });
                }
                Ok(())
            }
            (Proto::Ip, "protocol") | (Proto::Ip6, "nexthdr") => self.protocol(at, word, e, neg, a),
            (Proto::Tcp | Proto::Udp | Proto::Th, "sport" | "dport") => {
                let Some((lo, hi)) = range(e) else {
                    return self.refuse(at, word, format!("this `{word}` value"));
                };
                let proto = self.transport(at, p.proto, a)?;
                let r = Some(Neg {
                    negated: neg,
                    value: PortRange {
                        lo: lo as u16,
                        hi: hi as u16,
                    },
                });
                let src = p.field == "sport";
                a.matches.push(if proto == 6 {
                    let (sport, dport) = if src { (r, None) } else { (None, r) };
                    Match::Tcp(TcpMatch {
                        sport,
                        dport,
                        ..TcpMatch::default()
                    })
                } else {
                    let (sport, dport) = if src { (r, None) } else { (None, r) };
                    Match::Udp(UdpMatch { sport, dport })
                });
                Ok(())
            }
            (Proto::Tcp, "flags") => {
                let Some(v) = num(e).and_then(|v| u8::try_from(v).ok()) else {
                    return self.refuse(at, "flags", "this `tcp flags` value");
                };
                if v.count_ones() != 1 {
                    return self.refuse(
                        at,
                        "flags",
                        "`tcp flags A,B` (any of several flags); write `tcp flags & (A|B) == ...`",
                    );
                }
                need_proto(a, 6)?;
                let f = TcpFlags { mask: v, comp: v };
                a.matches.push(Match::Tcp(TcpMatch {
                    flags: Some(Neg {
                        negated: neg,
                        value: f,
                    }),
                    ..TcpMatch::default()
                }));
                Ok(())
            }
            (Proto::Icmp | Proto::Icmpv6, "type" | "code") => {
                let v6 = p.proto == Proto::Icmpv6;
                need_proto(a, if v6 { 58 } else { 1 })?;
                let Some((lo, hi)) =
                    range(e).filter(|&(lo, hi)| hi <= 255 && (p.field == "code" || lo == hi))
                else {
                    return self.refuse(at, word, format!("this `{word}` value"));
                };
                let existing = a.matches.iter_mut().rev().find_map(|m| match m {
                    Match::Icmp(i) | Match::Icmpv6(i) => Some(i),
                    _ => None,
                });
                if p.field == "type" {
                    let m = IcmpMatch {
                        negated: neg,
                        icmp_type: Some(lo as u8),
                        code: (0, 255),
                    };
                    a.matches
                        .push(if v6 { Match::Icmpv6(m) } else { Match::Icmp(m) });
                    return Ok(());
                }
                match existing {
                    Some(i) if !neg && !i.negated && i.code == (0, 255) => {
                        i.code = (lo as u8, hi as u8);
                        Ok(())
                    }
                    _ => self.refuse(
                        at,
                        "code",
                        format!(
                            "`{} code` without a `type` test before it",
                            if v6 { "icmpv6" } else { "icmp" }
                        ),
                    ),
                }
            }
            (Proto::Ip | Proto::Ip6, "length") => {
                let Some((lo, hi)) = range(e) else {
                    return self.refuse(at, word, "this `length` value");
                };
                // ip6's length is the payload's; the match reads the layer-3 length.
                let add = if p.proto == Proto::Ip6 { 40 } else { 0 };
                let (lo, hi) = ((lo + add).min(0xffff) as u16, (hi + add).min(0xffff) as u16);
                a.matches.push(Match::Length(Neg {
                    negated: neg,
                    value: PortRange { lo, hi },
                }));
                Ok(())
            }
            (Proto::Ip, "ttl") | (Proto::Ip6, "hoplimit") => {
                let op = match range(e) {
                    Some((v, w)) if v == w => (if neg { TtlOp::Ne } else { TtlOp::Eq }, v as u8),
                    Some((0, w)) if !neg && w < 255 => (TtlOp::Lt, (w + 1) as u8),
                    Some((v, 255)) if !neg && v > 0 => (TtlOp::Gt, (v - 1) as u8),
                    _ => return self.refuse(at, word, format!("this `{word}` test")),
                };
                let m = TtlMatch {
                    op: op.0,
                    value: op.1,
                };
                a.matches.push(if p.proto == Proto::Ip {
                    Match::Ttl(m)
                } else {
                    Match::Hl(m)
                });
                Ok(())
            }
            (Proto::Ip | Proto::Ip6, "dscp") => {
                let Some(v) = num(e).filter(|&v| v < 64) else {
                    return self.refuse(at, "dscp", "this `dscp` value");
                };
                a.matches.push(Match::Dscp(Neg {
                    negated: neg,
                    value: v as u8,
                }));
                Ok(())
            }
            _ => self.refuse(at, word, format!("`{} {word}`", proto_name(p.proto))),
        }
    }

    fn protocol(&self, at: Pos, word: &str, e: &Elem, neg: bool, a: &mut model::Rule) -> Step<()> {
        let Some(p) = num(e).and_then(|v| u8::try_from(v).ok()) else {
            return self.refuse(at, word, format!("this `{word}` value"));
        };
        if !neg {
            return need_proto(a, p);
        }
        match a.protocol {
            None => {
                a.protocol = Some(Neg {
                    negated: true,
                    value: p,
                });
                Ok(())
            }
            Some(Neg {
                negated: false,
                value,
            }) if value == p => Err(Ok(Omit)),
            Some(Neg { negated: false, .. }) => Ok(()),
            Some(_) => self.refuse(at, word, "a second `!=` protocol test"),
        }
    }

    fn meta(&mut self, at: Pos, k: MetaKey, e: &Elem, neg: bool, a: &mut model::Rule) -> Step<()> {
        let n = num(e);
        match k {
            MetaKey::Iif | MetaKey::Iifname | MetaKey::Oif | MetaKey::Oifname => {
                let word = match k {
                    MetaKey::Iif => "iif",
                    MetaKey::Iifname => "iifname",
                    MetaKey::Oif => "oif",
                    _ => "oifname",
                };
                let Elem::Value(Value::Str(s)) = e else {
                    return self.refuse(at, word, format!("this `{word}` value"));
                };
                // nft's trailing `*` is the engine's `+`; `\*` is a literal `*`. A literal `+`
                // would read as the wildcard.
                if s.contains('+') {
                    return self.refuse(at, word, format!("`{word} \"{s}\"` (a `+` in a name)"));
                }
                let name = match s.strip_suffix('*') {
                    Some(p) if p.ends_with('\\') => format!("{}*", &p[..p.len() - 1]),
                    Some(p) => format!("{p}+"),
                    None => s.clone(),
                };
                let slot = if matches!(k, MetaKey::Iif | MetaKey::Iifname) {
                    &mut a.in_iface
                } else {
                    &mut a.out_iface
                };
                if slot.is_some() {
                    return self.refuse(at, word, format!("a second interface test (`{word}`)"));
                }
                *slot = Some(Neg {
                    negated: neg,
                    value: Iface { name },
                });
                Ok(())
            }
            MetaKey::L4proto => self.protocol(at, "l4proto", e, neg, a),
            MetaKey::Nfproto => {
                let f = match n {
                    Some(2) => Family::Ipv4,
                    Some(10) => Family::Ipv6,
                    _ => return self.refuse(at, "nfproto", "this `meta nfproto` value"),
                };
                if (f == self.family) == neg {
                    Err(Ok(Omit))
                } else {
                    Ok(())
                }
            }
            MetaKey::Mark => {
                let Some(v) = n.and_then(|v| u32::try_from(v).ok()) else {
                    return self.refuse(at, "mark", "this `meta mark` value");
                };
                a.matches.push(Match::Mark(Neg {
                    negated: neg,
                    value: MarkValue {
                        value: v,
                        mask: u32::MAX,
                    },
                }));
                Ok(())
            }
            MetaKey::Pkttype => {
                let t = match n {
                    Some(0) => PktType::Unicast,
                    Some(1) => PktType::Broadcast,
                    Some(2) => PktType::Multicast,
                    _ => return self.refuse(at, "pkttype", "this `meta pkttype` value"),
                };
                a.matches.push(Match::PktType(Neg {
                    negated: neg,
                    value: t,
                }));
                Ok(())
            }
            MetaKey::Skuid | MetaKey::Skgid => {
                let Some((lo, hi)) = range(e).filter(|&(_, hi)| hi <= u128::from(u32::MAX)) else {
                    return self.refuse(at, "sk", "this `meta skuid|skgid` value");
                };
                let r = Some(Neg {
                    negated: neg,
                    value: IdRange {
                        lo: lo as u32,
                        hi: hi as u32,
                    },
                });
                let (uid, gid) = if k == MetaKey::Skuid {
                    (r, None)
                } else {
                    (None, r)
                };
                a.matches.push(Match::Owner(OwnerMatch {
                    socket: None,
                    uid,
                    gid,
                    suppl_groups: false,
                }));
                Ok(())
            }
            MetaKey::Length => {
                let Some((lo, hi)) = range(e) else {
                    return self.refuse(at, "length", "this `meta length` value");
                };
                let r = PortRange {
                    lo: lo.min(0xffff) as u16,
                    hi: hi.min(0xffff) as u16,
                };
                a.matches.push(Match::Length(Neg {
                    negated: neg,
                    value: r,
                }));
                Ok(())
            }
        }
    }

    fn ct(
        &mut self,
        at: Pos,
        k: CtKey,
        e: &Elem,
        mask: Option<u32>,
        neg: bool,
        a: &mut model::Rule,
    ) -> Step<()> {
        if self.before_ct {
            let name = match k {
                CtKey::State => "ct state",
                CtKey::Status => "ct status",
                CtKey::Mark => "ct mark",
                CtKey::Direction => "ct direction",
            };
            return self.refuse(
                at,
                "ct",
                format!("`{name}` in a chain that runs before conntrack (priority below -200)"),
            );
        }
        let n = num(e);
        match k {
            CtKey::State => {
                let Some(bits) = n.and_then(ct_bits) else {
                    return self.refuse(at, "state", "this `ct state` value");
                };
                a.matches.push(Match::State(Neg {
                    negated: neg,
                    value: bits,
                }));
                Ok(())
            }
            CtKey::Status => {
                // snat 16, dnat 32: the conntrack match's SNAT/DNAT pseudo-states.
                let bits = match n {
                    Some(v) if v != 0 && v & !(16 | 32) == 0 => {
                        (if v & 16 != 0 { ct_state::SNAT } else { 0 })
                            | (if v & 32 != 0 { ct_state::DNAT } else { 0 })
                    }
                    _ => return self.refuse(at, "status", "`ct status` other than snat and dnat"),
                };
                a.matches.push(Match::Conntrack(ConntrackMatch {
                    ctstate: Some(Neg {
                        negated: neg,
                        value: bits,
                    }),
                    other: Vec::new(),
                }));
                Ok(())
            }
            CtKey::Mark => {
                let Some(v) = n.and_then(|v| u32::try_from(v).ok()) else {
                    return self.refuse(at, "mark", "this `ct mark` value");
                };
                let value = MarkValue {
                    value: v,
                    mask: mask.unwrap_or(u32::MAX),
                };
                a.matches.push(Match::Connmark(Neg {
                    negated: neg,
                    value,
                }));
                Ok(())
            }
            CtKey::Direction => {
                let reply = match n {
                    Some(0) => neg,
                    Some(1) => !neg,
                    _ => return self.refuse(at, "direction", "this `ct direction` value"),
                };
                let o = OpaqueOption {
                    negated: false,
                    name: "--ctdir".into(),
                    args: vec![if reply { "REPLY" } else { "ORIGINAL" }.into()],
                };
                a.matches.push(Match::Conntrack(ConntrackMatch {
                    ctstate: None,
                    other: vec![o],
                }));
                Ok(())
            }
        }
    }

    /// `fib ... type T` as `-m addrtype`, `fib saddr [. mark] [. iif] oif missing|exists` as
    /// `-m rpfilter`.
    fn fib(
        &mut self,
        at: Pos,
        flags: u8,
        result: FibResult,
        e: &Elem,
        neg: bool,
        a: &mut model::Rule,
    ) -> Step<()> {
        const SADDR: u8 = 1;
        const DADDR: u8 = 2;
        const MARK: u8 = 4;
        const IIF: u8 = 8;
        const OIF: u8 = 16;
        let n = num(e);
        match result {
            FibResult::Type => {
                let Some(t) = n.filter(|&t| t < 12) else {
                    return self.refuse(at, "type", "this `fib ... type` value");
                };
                let addr_side = flags & (SADDR | DADDR);
                if flags & MARK != 0
                    || addr_side == 0
                    || addr_side == SADDR | DADDR
                    || flags & IIF != 0 && flags & OIF != 0
                {
                    return self.refuse(at, "fib", "this `fib` key");
                }
                let limit = if flags & IIF != 0 {
                    model::AddrTypeLimit::In
                } else if flags & OIF != 0 {
                    model::AddrTypeLimit::Out
                } else {
                    model::AddrTypeLimit::None
                };
                let v = Some(Neg {
                    negated: neg,
                    value: 1u16 << t,
                });
                let (src, dst) = if addr_side == SADDR {
                    (v, None)
                } else {
                    (None, v)
                };
                a.matches
                    .push(Match::AddrType(AddrTypeMatch { src, dst, limit }));
                Ok(())
            }
            FibResult::Oif if flags & SADDR != 0 && flags & (DADDR | OIF) == 0 => {
                use crate::fib::rpfilter_flags as F;
                let exists = match n {
                    Some(0) => neg,
                    Some(1) => !neg,
                    _ => return self.refuse(at, "oif", "this `fib ... oif` value"),
                };
                let mut f = F::NFT;
                if flags & IIF == 0 {
                    f |= F::LOOSE;
                }
                if flags & MARK != 0 {
                    f |= F::VALID_MARK;
                }
                if !exists {
                    f |= F::INVERT;
                }
                a.matches.push(Match::Rpfilter(RpfilterMatch { flags: f }));
                Ok(())
            }
            _ => self.refuse(at, "fib", format!("`fib ... {}`", result.name())),
        }
    }

    /// `LEFT @set`: the engine set of named set `name` ([`set_name`]), made from its
    /// declaration the first time.
    fn named_set(&mut self, at: Pos, left: &Expr, name: &str, neg: bool) -> Step<Match> {
        let (engine, dirs) = self.engine_set(at, left, name, false)?;
        Ok(Match::Set(SetMatch {
            negated: neg,
            name: engine,
            dirs,
            other: Vec::new(),
        }))
    }

    /// The engine set of named set (or, with `vmap`, verdict map) `name` looked up by key
    /// `left`, made from its declaration the first time, and how the key is read: a set of
    /// addresses (`hash:ip`, `hash:net` with `flags interval`) or of `ADDR . inet_proto .
    /// inet_service` (`hash:ip,port`); a verdict map's elements carry their verdicts
    /// ([`crate::sets::verdict`]), each `jump`/`goto` naming a chain of the table.
    pub(super) fn engine_set(
        &mut self,
        at: Pos,
        left: &Expr,
        name: &str,
        vmap: bool,
    ) -> Step<(String, Vec<SetDir>)> {
        let Some(set) = self.table.sets.iter().find(|s| s.name == name) else {
            return self.refuse(at, name, format!("`@{name}`: no such set"));
        };
        if set.is_map != vmap || (vmap && set.data != Some(NftSetType::Verdict)) {
            let what = if vmap {
                "not a verdict map"
            } else {
                "a map used as a set"
            };
            return self.refuse(at, name, format!("`@{name}` ({what})"));
        }
        let Some((fam, kind, dirs)) = set_key(left, &key_types(set)) else {
            return self.refuse(at, name, format!("`@{name}` with this key or set type"));
        };
        // A set of ports serves both families (one engine set).
        let fam = match fam {
            Some(f) if f != self.family => return Err(Ok(Omit)),
            Some(f) => f,
            None => Family::Ipv4,
        };
        let interval = set.flags & 2 != 0;
        let kind = kind.unwrap_or(if interval {
            SetType::HashNet
        } else {
            SetType::HashIp
        });
        let engine = set_name(self.table.family, &self.table.name, name);
        if engine.len() > crate::sets::ipset::MAX_NFT_NAME_LEN {
            return self.refuse(
                at,
                name,
                format!(
                    "`@{name}`: its engine name `{engine}` is longer than {} bytes",
                    crate::sets::ipset::MAX_NFT_NAME_LEN
                ),
            );
        }
        if !self.sets.iter().any(|s| s.name == engine) {
            let mut elements = Vec::with_capacity(set.elements.len());
            for el in &set.elements {
                let first = elements.len();
                let verdict = if vmap {
                    self.map_verdict(at, name, el)?
                } else {
                    crate::sets::verdict::NONE
                };
                // An element's own timeout; a live listing's `expires` is the time it has left.
                let secs = |ms: u64| ms.div_ceil(1000).min(u64::from(u32::MAX)) as u32;
                let opts = AddOptions {
                    timeout: el.expires_ms.or(el.timeout_ms).map(secs),
                    counters: None,
                };
                if elements.len() > crate::nft::MAX_SET_ELEMENTS {
                    return Err(Err(self.err(
                        at,
                        name,
                        ErrorKind::TooLarge(format!(
                            "`@{name}` makes more than {} engine set elements",
                            crate::nft::MAX_SET_ELEMENTS
                        )),
                    )));
                }
                match &el.key {
                    // Ports (`bitmap:port`): a range is every port in it (at most 65536).
                    Elem::Value(Value::Num(v)) if kind == SetType::BitmapPort => {
                        elements.push((Element::port(*v as u16), opts))
                    }
                    Elem::Range(Value::Num(lo), Value::Num(hi))
                        if kind == SetType::BitmapPort && lo <= hi =>
                    {
                        for p in *lo as u16..=*hi as u16 {
                            elements.push((Element::port(p), opts));
                        }
                    }
                    Elem::Value(Value::Num(v)) => {
                        elements.push((Element::new(addr(fam, *v), width(fam), None), opts))
                    }
                    Elem::Prefix(v, l) => {
                        elements.push((Element::new(addr(fam, *v), *l, None), opts))
                    }
                    Elem::Range(Value::Num(lo), Value::Num(hi)) if lo <= hi => {
                        for (p, l) in prefixes(*lo, *hi, width(fam)) {
                            elements.push((Element::new(addr(fam, p), l, None), opts));
                        }
                    }
                    Elem::Concat(c) => match c.as_slice() {
                        [
                            Elem::Value(Value::Num(v)),
                            Elem::Value(Value::Num(pr)),
                            Elem::Value(Value::Num(port)),
                        ] => {
                            elements.push((
                                Element::new(
                                    addr(fam, *v),
                                    width(fam),
                                    Some((*pr as u8, *port as u16)),
                                ),
                                opts,
                            ));
                        }
                        _ => {
                            return self.refuse(
                                at,
                                name,
                                format!("`@{name}`: an element with ranges or prefixes"),
                            );
                        }
                    },
                    _ => return self.refuse(at, name, format!("`@{name}`: this element")),
                }
                // Every engine element of one nft element (an interval's prefixes): its verdict.
                for (e, _) in &mut elements[first..] {
                    *e = e.with_verdict(verdict);
                }
            }
            let mut spec = SetSpec::new(kind, fam);
            spec.timeout = set
                .timeout_ms
                .map(|ms| ms.div_ceil(1000).min(u64::from(u32::MAX)) as u32);
            spec.counters = set.counter;
            // nft bounds a set without `size` by memory only: the engine set then takes up to
            // MAX_SET_ELEMENTS (more elements than `nft -f` reads into one set), so
            // `nft add element` style adds keep working past the listed ones.
            spec.maxelem = set
                .size
                .unwrap_or(crate::nft::MAX_SET_ELEMENTS as u32)
                .max(elements.len() as u32);
            self.sets.push(LoweredSet {
                name: engine.clone(),
                spec,
                elements,
                pos: set.pos,
            });
        }
        Ok((engine, dirs))
    }
}

impl Cx<'_> {
    /// The verdict number ([`crate::sets::verdict`]) of element `el` of verdict map `map`;
    /// a `jump`/`goto` must name a chain of the table (as nft refuses one that does not).
    fn map_verdict(&self, at: Pos, map: &str, el: &SetElem) -> Step<u32> {
        use crate::sets::verdict;
        let Some(MapData::Verdict(v)) = &el.data else {
            return self.refuse(at, map, format!("`@{map}`: an element without a verdict"));
        };
        let (goto, chain) = match v {
            Verdict::Accept => return Ok(verdict::ACCEPT),
            Verdict::Drop => return Ok(verdict::DROP),
            Verdict::Return => return Ok(verdict::RETURN),
            Verdict::Continue => return Ok(verdict::CONTINUE),
            Verdict::Jump(c) => (false, c),
            Verdict::Goto(c) => (true, c),
        };
        if !self.table.chains.iter().any(|c| &c.name == chain) {
            return self.refuse(
                at,
                map,
                format!("`@{map}`: an element's chain `{chain}` does not exist"),
            );
        }
        verdict::chain(goto, chain)
            .map_err(|why| Err(self.err(at, map, ErrorKind::TooLarge(format!("`@{map}`: {why}")))))
    }
}

/// How an engine set holds the key `left` of a named set or map of key `types`: the family
/// (`None`: both, a set of ports), the set type (`None`: an address set, `hash:ip` or
/// `hash:net` by the set's flags) and how the key is read from the packet; `None` when no
/// engine set type holds it.
pub(in crate::nft::lower) fn set_key(
    left: &Expr,
    types: &[DataType],
) -> Option<(Option<Family>, Option<SetType>, Vec<SetDir>)> {
    let dir = |f: &str| {
        if f.starts_with('s') {
            SetDir::Src
        } else {
            SetDir::Dst
        }
    };
    Some(match (left, types) {
        (
            Expr::Payload(Payload {
                proto: Proto::Ip,
                field: f @ ("saddr" | "daddr"),
            }),
            [DataType::Ipv4Addr],
        ) => (Some(Family::Ipv4), None, vec![dir(f)]),
        (
            Expr::Payload(Payload {
                proto: Proto::Ip6,
                field: f @ ("saddr" | "daddr"),
            }),
            [DataType::Ipv6Addr],
        ) => (Some(Family::Ipv6), None, vec![dir(f)]),
        // `tcp dport @ports`, `th sport @ports`: the rule tests the protocol.
        (
            Expr::Payload(Payload {
                proto: Proto::Tcp | Proto::Udp | Proto::Th,
                field: f @ ("sport" | "dport"),
            }),
            [DataType::InetService],
        ) => (None, Some(SetType::BitmapPort), vec![dir(f)]),
        (
            Expr::Concat(parts),
            [
                t @ (DataType::Ipv4Addr | DataType::Ipv6Addr),
                DataType::InetProto,
                DataType::InetService,
            ],
        ) => match parts.as_slice() {
            [
                Expr::Payload(Payload {
                    proto: Proto::Ip | Proto::Ip6,
                    field: f @ ("saddr" | "daddr"),
                }),
                Expr::Meta(MetaKey::L4proto),
                Expr::Payload(Payload {
                    proto: Proto::Th,
                    field: g @ ("sport" | "dport"),
                }),
            ] => {
                let fam = if *t == DataType::Ipv4Addr {
                    Family::Ipv4
                } else {
                    Family::Ipv6
                };
                (Some(fam), Some(SetType::HashIpPort), vec![dir(f), dir(g)])
            }
            _ => return None,
        },
        _ => return None,
    })
}

/// The key types of named set `set` (a `typeof` resolved).
pub(in crate::nft::lower) fn key_types(set: &crate::nft::Set) -> Vec<DataType> {
    match &set.key {
        NftSetType::Types(t) => t.clone(),
        NftSetType::Typeof(e) => crate::nft::parse::expr_types(e),
        NftSetType::Verdict => Vec::new(),
    }
}

/// The elements of named set `name` of `table` when it is a set of ports (`inet_service`).
fn port_set<'t>(table: &'t Table, name: &str) -> Option<&'t [SetElem]> {
    let set = table.sets.iter().find(|s| s.name == name && !s.is_map)?;
    let types = match &set.key {
        NftSetType::Types(t) => t.clone(),
        NftSetType::Typeof(e) => crate::nft::parse::expr_types(e),
        NftSetType::Verdict => return None,
    };
    (types == [DataType::InetService]).then_some(set.elements.as_slice())
}

fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Ip => "ip",
        Proto::Ip6 => "ip6",
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
        Proto::Th => "th",
        Proto::Icmp => "icmp",
        Proto::Icmpv6 => "icmpv6",
    }
}

/// An address range match on the source (`src`) or the destination address.
fn iprange(src: bool, r: Neg<AddrRange>) -> Match {
    Match::Iprange(if src {
        IprangeMatch {
            src: Some(r),
            dst: None,
        }
    } else {
        IprangeMatch {
            src: None,
            dst: Some(r),
        }
    })
}

/// Puts the alternatives that survived back; none left means the rule can never match here
/// (`Omit`: it is left out of this family), as an empty expansion of it.
fn settle(alts: &mut Vec<model::Rule>, kept: Vec<model::Rule>) -> Step<()> {
    *alts = kept;
    if alts.is_empty() {
        Err(Ok(Omit))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::prefixes;

    #[test]
    fn ranges_split_into_covering_prefixes() {
        assert_eq!(prefixes(10, 10, 32), vec![(10, 32)]);
        assert_eq!(prefixes(0, u128::from(u32::MAX), 32), vec![(0, 0)]);
        assert_eq!(prefixes(0x0a000000, 0x0a0000ff, 32), vec![(0x0a000000, 24)]);
        assert_eq!(prefixes(1, 6, 32), vec![(1, 32), (2, 31), (4, 31), (6, 32)]);
        assert_eq!(prefixes(0, u128::MAX, 128), vec![(0, 0)]);
    }
}
