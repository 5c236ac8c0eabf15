//! Named sets and maps of an nft table as engine sets: which set type holds a key, the
//! engine set a named set or verdict map becomes (made from its declaration the first time it
//! is used), and the verdicts of a map's elements.

use super::matches::{addr, prefixes, width};
use super::*;
use crate::nft::{DataType, SetElem};

impl Cx<'_> {
    /// `LEFT @set`: the engine set of named set `name` ([`set_name`]), made from its
    /// declaration the first time.
    pub(super) fn named_set(&mut self, at: Pos, left: &Expr, name: &str, neg: bool) -> Step<Match> {
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
pub(super) fn port_set<'t>(table: &'t Table, name: &str) -> Option<&'t [SetElem]> {
    let set = table.sets.iter().find(|s| s.name == name && !s.is_map)?;
    let types = match &set.key {
        NftSetType::Types(t) => t.clone(),
        NftSetType::Typeof(e) => crate::nft::parse::expr_types(e),
        NftSetType::Verdict => return None,
    };
    (types == [DataType::InetService]).then_some(set.elements.as_slice())
}
