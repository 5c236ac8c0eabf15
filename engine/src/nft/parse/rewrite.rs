//! What nft checks and rewrites in a rule or set once it is read, so that our listing is the
//! kernel's: protocol dependencies nft drops, the reject flavour, the order of adjacent header
//! matches, and interval sets (merged when anonymous, "conflicting intervals" otherwise).

use super::*;
use crate::nft::Dialect;

/// The protocol number a transport header implies (its dependency).
fn transport_number(p: Proto) -> Option<u128> {
    match p {
        Proto::Tcp => Some(6),
        Proto::Udp => Some(17),
        Proto::Icmp => Some(1),
        Proto::Icmpv6 => Some(58),
        _ => None,
    }
}

/// Drops the explicit protocol matches nft drops from its listing because a later match
/// implies them (checked against nft v1.0.6 and the v1.1 vectors). nft remembers, per layer,
/// the last match that could be such a dependency: `meta nfproto` (inet tables) for the network
/// layer, `meta l4proto` (and `ip protocol` in ip tables) for the transport layer. A later
/// `ip`/`ip6` header match removes a network dependency of its family, a `meta l4proto icmp`
/// (or `ipv6-icmp`) one of IPv4 (IPv6), and a tcp/udp/icmp/icmpv6 header match a transport
/// dependency of its protocol, even with matches of other layers in between; any statement
/// that is not a match forgets both. So `meta l4proto tcp ip saddr 1.2.3.4 tcp dport 22` lists
/// as `ip saddr 1.2.3.4 tcp dport 22`, while `ip protocol tcp counter tcp dport 22` stays.
/// nft v1.0 treats `ip6 nexthdr` in ip6 tables like `ip protocol` in ip tables; v1.1 keeps it
/// (extension headers may sit between). The model keeps what was written; this applies when
/// listing.
pub(crate) fn eliminate_dependencies(family: Family, d: Dialect, stmts: &mut Vec<Stmt>) {
    let mut kill = Vec::new();
    let mut net: Option<(usize, u128)> = None;
    let mut l4: Option<(usize, u128)> = None;
    for (i, s) in stmts.iter().enumerate() {
        let Stmt::Match(m) = s else {
            net = None;
            l4 = None;
            continue;
        };
        let single = match (&m.op, &m.right) {
            (Op::Implicit, SetRhs::Value(Elem::Value(Value::Num(n)))) => Some(*n),
            _ => None,
        };
        match (&m.left, single) {
            (Expr::Meta(MetaKey::Nfproto), Some(n)) if family == Family::Inet => {
                net = Some((i, n));
            }
            (Expr::Meta(MetaKey::L4proto), Some(n)) => {
                if let Some((j, f)) = net {
                    if (n == 1 && f == 2) || (n == 58 && f == 10) {
                        kill.push(j);
                        net = None;
                    }
                }
                l4 = Some((i, n));
            }
            (
                Expr::Payload(Payload {
                    proto: Proto::Ip,
                    field: "protocol",
                }),
                Some(n),
            ) if family == Family::Ip => l4 = Some((i, n)),
            (
                Expr::Payload(Payload {
                    proto: Proto::Ip6,
                    field: "nexthdr",
                }),
                Some(n),
            ) if family == Family::Ip6 && d == Dialect::V1_0 => l4 = Some((i, n)),
            (Expr::Payload(p), _) => {
                let f = match p.proto {
                    Proto::Ip => Some(2),
                    Proto::Ip6 => Some(10),
                    _ => None,
                };
                if let (Some(f), Some((j, nf))) = (f, net) {
                    if f == nf {
                        kill.push(j);
                        net = None;
                    }
                }
                if let (Some(t), Some((j, n))) = (transport_number(p.proto), l4) {
                    if t == n {
                        kill.push(j);
                        l4 = None;
                    }
                }
            }
            _ => {}
        }
    }
    kill.sort_unstable();
    kill.dedup();
    for j in kill.into_iter().rev() {
        stmts.remove(j);
    }
}

/// The inclusive bounds of a numeric element.
fn bounds(t: DataType, e: &Elem) -> Option<(u128, u128)> {
    match e {
        Elem::Value(Value::Num(v)) => Some((*v, *v)),
        Elem::Range(Value::Num(l), Value::Num(h)) => Some((*l, *h)),
        Elem::Prefix(a, len) => {
            let host = t.bits() - u32::from(*len);
            let span = if host >= 128 {
                u128::MAX
            } else {
                (1u128 << host) - 1
            };
            Some((*a, a | span))
        }
        _ => None,
    }
}

/// An element for the bounds `lo..=hi`: a value or a range (listed as a prefix where it is one).
fn from_bounds(lo: u128, hi: u128) -> Elem {
    if lo == hi {
        Elem::Value(Value::Num(lo))
    } else {
        Elem::Range(Value::Num(lo), Value::Num(hi))
    }
}

/// For sets with ranges or prefixes (interval sets): overlapping elements of a map (or
/// of a named set, `merge` false) are an error ("conflicting intervals"); those of an
/// anonymous set are merged with their neighbours, as nft does. `elems` is sorted.
pub(crate) fn merge_intervals(
    t: DataType,
    merge: bool,
    elems: &mut Vec<SetElem>,
) -> Result<(), String> {
    let interval = elems
        .iter()
        .any(|e| matches!(e.key, Elem::Range(..) | Elem::Prefix(..)));
    if !interval {
        return Ok(());
    }
    let mut spans: Vec<(u128, u128)> = Vec::with_capacity(elems.len());
    for e in elems.iter() {
        match bounds(t, &e.key) {
            Some(b) => spans.push(b),
            None => return Ok(()),
        }
    }
    let overlaps = spans.windows(2).any(|w| w[1].0 <= w[0].1);
    let mergeable = merge
        && elems
            .iter()
            .all(|e| e.data.is_none() && e.timeout_ms.is_none());
    if !mergeable {
        if overlaps {
            return Err("conflicting intervals: elements overlap".into());
        }
        return Ok(());
    }
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(spans.len());
    for (lo, hi) in spans {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    *elems = merged
        .into_iter()
        .map(|(lo, hi)| SetElem {
            key: from_bounds(lo, hi),
            data: None,
            timeout_ms: None,
            comment: None,
        })
        .collect();
    Ok(())
}

/// The protocol numbers that reach a rule's statements so far: `Some(n)` once a match fixes
/// the transport protocol.
fn l4_of(s: &Stmt) -> Option<u128> {
    match s {
        Stmt::Match(Match {
            left,
            op: Op::Implicit,
            right: SetRhs::Value(Elem::Value(Value::Num(n))),
        }) if matches!(left, Expr::Meta(MetaKey::L4proto))
            || matches!(
                left,
                Expr::Payload(Payload {
                    proto: Proto::Ip,
                    field: "protocol"
                })
            )
            || matches!(
                left,
                Expr::Payload(Payload {
                    proto: Proto::Ip6,
                    field: "nexthdr"
                })
            ) =>
        {
            Some(*n)
        }
        Stmt::Match(Match {
            left: Expr::Payload(p),
            ..
        }) => transport_number(p.proto),
        _ => None,
    }
}

/// The network protocol a statement fixes (4 or 6).
fn l3_of(s: &Stmt) -> Option<u8> {
    match s {
        Stmt::Match(Match {
            left: Expr::Payload(p),
            ..
        }) => match p.proto {
            Proto::Ip | Proto::Icmp => Some(4),
            Proto::Ip6 | Proto::Icmpv6 => Some(6),
            _ => None,
        },
        Stmt::Match(Match {
            left: Expr::Meta(MetaKey::Nfproto),
            op: Op::Implicit,
            right: SetRhs::Value(Elem::Value(Value::Num(n))),
        }) => match n {
            2 => Some(4),
            10 => Some(6),
            _ => None,
        },
        _ => None,
    }
}

/// `reject` as nft evaluates it: the ICMP flavour must fit the family (and the rule's own
/// matches); `reject with tcp reset` needs TCP, and in inet tables nft adds `meta l4proto 6`
/// in front when the rule does not already say TCP; in inet tables `meta nfproto ipv4`
/// right before a reject becomes part of it (`reject with icmp port-unreachable`).
fn reject_dependencies(family: Family, stmts: &mut Vec<Stmt>) -> Result<(), &'static str> {
    let Some(k) = stmts.iter().position(|s| matches!(s, Stmt::Reject(_))) else {
        return Ok(());
    };
    let l3 = stmts[..k].iter().rev().find_map(l3_of);
    let l4 = stmts.iter().rev().find_map(l4_of);
    let Stmt::Reject(r) = &stmts[k] else {
        return Ok(());
    };
    let r = r.clone();
    match (&r, family, l3) {
        (Reject::Icmp(_), Family::Ip6, _) | (Reject::Icmp(_), _, Some(6)) => {
            return Err("`reject with icmp` in an IPv6 context (use icmpv6 or icmpx)");
        }
        (Reject::Icmpv6(_), Family::Ip, _) | (Reject::Icmpv6(_), _, Some(4)) => {
            return Err("`reject with icmpv6` in an IPv4 context (use icmp or icmpx)");
        }
        _ => {}
    }
    if r == Reject::TcpReset {
        match l4 {
            Some(6) => {}
            Some(_) => {
                return Err(
                    "`reject with tcp reset` needs TCP, but the rule matches another protocol",
                );
            }
            None if family == Family::Inet => stmts.insert(
                0,
                Stmt::Match(Match {
                    left: Expr::Meta(MetaKey::L4proto),
                    op: Op::Implicit,
                    right: SetRhs::Value(Elem::Value(Value::Num(6))),
                }),
            ),
            None => {}
        }
        return Ok(());
    }
    if family == Family::Inet && k > 0 {
        if let Some(v) = l3_of(&stmts[k - 1]).filter(|_| {
            matches!(
                stmts[k - 1],
                Stmt::Match(Match {
                    left: Expr::Meta(MetaKey::Nfproto),
                    ..
                })
            )
        }) {
            let new = match (v, &r) {
                (4, Reject::Default) => Some(Reject::Icmp(3)),
                (6, Reject::Default) => Some(Reject::Icmpv6(4)),
                (4, Reject::Icmp(_)) | (6, Reject::Icmpv6(_)) => Some(r.clone()),
                _ => None,
            };
            if let Some(new) = new {
                stmts[k] = Stmt::Reject(new);
                stmts.remove(k - 1);
            }
        }
    }
    Ok(())
}

/// Bit offset and width of a header field (for nft's merge of adjacent payload matches).
fn field_span(p: &Payload) -> Option<(u32, u32)> {
    let span = match (p.proto, p.field) {
        (Proto::Ip, "length") => (16, 16),
        (Proto::Ip, "id") => (32, 16),
        (Proto::Ip, "ttl") => (64, 8),
        (Proto::Ip, "protocol") => (72, 8),
        (Proto::Ip, "saddr") => (96, 32),
        (Proto::Ip, "daddr") => (128, 32),
        (Proto::Ip6, "length") => (32, 16),
        (Proto::Ip6, "nexthdr") => (48, 8),
        (Proto::Ip6, "hoplimit") => (56, 8),
        (Proto::Ip6, "saddr") => (64, 128),
        (Proto::Ip6, "daddr") => (192, 128),
        (Proto::Tcp | Proto::Udp | Proto::Th, "sport") => (0, 16),
        (Proto::Tcp | Proto::Udp | Proto::Th, "dport") => (16, 16),
        (Proto::Udp, "length") => (32, 16),
        (Proto::Icmp | Proto::Icmpv6, "type") => (0, 8),
        (Proto::Icmp | Proto::Icmpv6, "code") => (8, 8),
        _ => return None,
    };
    Some(span)
}

/// nft merges consecutive `==` matches of adjacent fields of one header into one comparison
/// and lists them in header order: `icmp code 1 icmp type 2` lists as
/// `icmp type 2 icmp code 1`.
fn order_adjacent_payloads(stmts: &mut [Stmt]) {
    let key = |s: &Stmt| match s {
        Stmt::Match(Match {
            left: Expr::Payload(p),
            op: Op::Implicit,
            right: SetRhs::Value(Elem::Value(_)),
        }) => field_span(p).map(|sp| (p.proto, sp)),
        _ => None,
    };
    let mut k = 0;
    while k < stmts.len() {
        let Some((proto, _)) = key(&stmts[k]) else {
            k += 1;
            continue;
        };
        let mut end = k + 1;
        while end < stmts.len() && key(&stmts[end]).is_some_and(|(p, _)| p == proto) {
            end += 1;
        }
        if end - k > 1 {
            let run = &mut stmts[k..end];
            let mut spans: Vec<(u32, u32)> =
                run.iter().filter_map(|s| key(s).map(|x| x.1)).collect();
            spans.sort_unstable();
            let contiguous = spans.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0);
            if contiguous {
                run.sort_by_key(|s| key(s).map(|x| x.1.0));
            }
        }
        k = end;
    }
}

/// What nft checks and rewrites in a rule once it is read: no verdict after a nat statement,
/// one network protocol, the reject flavour, and the dependencies nft drops from its listing
/// (see [`reject_dependencies`] and [`order_adjacent_payloads`]; the matches nft drops from its
/// listing are dropped when printing, [`eliminate_dependencies`]).
pub(crate) fn finish_rule(family: Family, stmts: &mut Vec<Stmt>) -> Result<(), String> {
    if stmts.is_empty() {
        return Err("a rule needs at least one statement".into());
    }
    if let Some(k) = stmts.iter().position(|s| matches!(s, Stmt::Nat(_))) {
        if stmts[k + 1..].iter().any(|s| matches!(s, Stmt::Verdict(_))) {
            return Err("a verdict may not follow a nat statement (it ends the rule)".into());
        }
    }
    let l3: Vec<u8> = stmts.iter().filter_map(l3_of).collect();
    if l3.windows(2).any(|w| w[0] != w[1])
        || (family == Family::Ip && l3.contains(&6))
        || (family == Family::Ip6 && l3.contains(&4))
    {
        return Err("conflicting protocols: IPv4 and IPv6 in one rule".into());
    }
    // As nft: `ip protocol udp tcp dport 22` and `tcp dport 22 udp sport 53` cannot match.
    let mut l4: Option<u128> = None;
    for st in stmts.iter() {
        let here = l4_of(st).or(match st {
            Stmt::Match(Match {
                left: Expr::Payload(p),
                ..
            }) => transport_number(p.proto),
            _ => None,
        });
        match (l4, here) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "conflicting protocols specified: {} vs. {}",
                    proto_word(a),
                    proto_word(b)
                ));
            }
            (_, Some(b)) => l4 = Some(b),
            _ => {}
        }
    }
    reject_dependencies(family, stmts).map_err(String::from)?;
    order_adjacent_payloads(stmts);
    Ok(())
}

fn proto_word(n: u128) -> String {
    let mut s = String::new();
    DataType::InetProto.print_value_as(&Value::Num(n), true, &mut s);
    s
}
