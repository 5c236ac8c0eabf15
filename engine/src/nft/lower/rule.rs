//! One nft rule lowered onto model rules for one family (see the parent module): its
//! statements left to right, each match applied to every alternative built so far (an
//! anonymous set or verdict map makes one alternative per element), each action closing a
//! segment; the segments then become the chain's rules and, where an action is followed by
//! more, a helper chain.

use super::*;

/// What lowering one chain of one family needs and collects.
pub(super) struct Cx<'a> {
    pub(super) file: &'a str,
    /// The source text's lines (empty for JSON input), to find a statement's column.
    pub(super) lines: &'a [&'a str],
    pub(super) table: &'a Table,
    pub(super) family: Family,
    /// Helper chains made for rules with several actions: (name, rules).
    pub(super) helpers: Vec<(String, Vec<model::Rule>)>,
    /// Named sets the rules matched against.
    pub(super) sets: Vec<LoweredSet>,
}

/// The rule cannot match in this family (`ip saddr` in an IPv6 copy): leave it out.
struct Omit;

/// A match's outcome: `Err(Ok(Omit))` leaves the rule out, `Err(Err(e))` refuses it.
type Step<T> = Result<T, Result<Omit, NftError>>;

fn has_limit(r: &model::Rule) -> bool {
    r.matches.iter().any(|m| matches!(m, Match::Limit(_)))
}

/// Whether `s` is an action (it closes a segment) rather than a match.
fn is_action(s: &Stmt) -> bool {
    !matches!(
        s,
        Stmt::Match(_) | Stmt::Vmap { .. } | Stmt::Limit(_) | Stmt::Counter { .. }
    )
}

/// Whether match `s` makes one alternative per element (an anonymous set that no single
/// model match holds; see `lower_match`).
fn expands(s: &Stmt) -> bool {
    match s {
        Stmt::Vmap { .. } => true,
        Stmt::Match(m) => match &m.right {
            SetRhs::Set(e) if e.len() > 1 && m.op != Op::Ne => match m.left {
                Expr::Ct(CtKey::State | CtKey::Status) => false,
                // One multiport match up to its 15 slots.
                Expr::Payload(Payload {
                    field: "sport" | "dport",
                    ..
                }) => e.len() > 15,
                _ => true,
            },
            _ => false,
        },
        _ => false,
    }
}

fn has_conditions(r: &model::Rule) -> bool {
    r.src.is_some()
        || r.dst.is_some()
        || r.in_iface.is_some()
        || r.out_iface.is_some()
        || r.protocol.is_some()
        || r.fragment.is_some()
        || !r.matches.is_empty()
}

impl Cx<'_> {
    /// An error at the first `word` of the rule's line at or after the rule's column (the
    /// rule's own position when the word is not found or there is no text).
    fn err(&self, at: Pos, word: &str, kind: ErrorKind) -> NftError {
        let mut pos = at;
        if let Some(line) = self.lines.get((at.line as usize).wrapping_sub(1)) {
            let skip: usize = line
                .char_indices()
                .nth((at.column as usize).saturating_sub(1))
                .map_or(line.len(), |(b, _)| b);
            if let Some(b) = line[skip..].find(word) {
                pos.column = (line[..skip + b].chars().count() + 1) as u32;
            }
        }
        NftError::new(self.file, pos, word, kind)
    }

    fn unsupported(&self, at: Pos, word: &str, what: String) -> Result<Omit, NftError> {
        Err(self.err(at, word, ErrorKind::Unsupported(what)))
    }

    /// The model rules of nft rule `r` (the `n`th of chain `chain`), pushing helper chains.
    pub(super) fn lower_rule(
        &mut self,
        r: &super::super::Rule,
        chain: &str,
        n: usize,
    ) -> Result<Vec<model::Rule>, NftError> {
        let loc = location(r.pos);
        let fresh = || model::Rule {
            location: loc,
            ..model::Rule::default()
        };
        let mut segs: Vec<Vec<model::Rule>> = Vec::new();
        let mut cur = vec![fresh()];
        for (i, s) in r.stmts.iter().enumerate() {
            // A limit bucket must be asked once per packet: an expansion after one, or a
            // limit or match after an expansion, goes behind a gate (a jump to a helper
            // chain holding the rest), which one alternative at most passes.
            let gate = (expands(s) && cur.iter().any(has_limit))
                || (cur.len() > 1 && !is_action(s) && !matches!(s, Stmt::Counter { .. }));
            if gate && i > 0 {
                segs.push(std::mem::replace(&mut cur, vec![fresh()]));
            }
            let step = match s {
                Stmt::Match(m) => self.lower_match(r.pos, m, &mut cur),
                Stmt::Vmap { key, map } => {
                    let out = self.vmap(r.pos, key, map, std::mem::take(&mut cur));
                    match out {
                        Ok(v) => {
                            segs.push(v);
                            cur = vec![fresh()];
                            Ok(())
                        }
                        Err(e) => Err(e),
                    }
                }
                Stmt::Counter { .. } => Ok(()),
                _ => match self.action(r.pos, s, &mut cur) {
                    Ok(Some(t)) => {
                        for alt in &mut cur {
                            alt.target = t.clone();
                        }
                        segs.push(std::mem::replace(&mut cur, vec![fresh()]));
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                },
            };
            match step {
                Ok(()) => {}
                Err(Ok(Omit)) => return Ok(Vec::new()),
                Err(Err(e)) => return Err(e),
            }
        }
        if segs.is_empty() || cur.iter().any(has_conditions) || cur.len() > 1 {
            segs.push(cur);
        }
        let mut out = Vec::new();
        self.emit(r.pos, &segs, &mut out, &format!("{chain} #{n}"), 0)?;
        Ok(out)
    }

    /// Writes segments `segs` into `out`: a segment without conditions (or the last one) as
    /// it is; one with conditions followed by more as jumps (gotos when the rule ends in
    /// `return` or `goto`) to a helper chain that holds its action and the rest.
    fn emit(
        &mut self,
        at: Pos,
        segs: &[Vec<model::Rule>],
        out: &mut Vec<model::Rule>,
        helper: &str,
        depth: usize,
    ) -> Result<(), NftError> {
        for (i, seg) in segs.iter().enumerate() {
            let last = i + 1 == segs.len();
            if last || (seg.len() == 1 && !has_conditions(&seg[0])) {
                out.extend(seg.iter().cloned());
                continue;
            }
            let rest = &segs[i + 1..];
            let leaves = rest.last().is_some_and(|s| {
                s.iter()
                    .any(|r| matches!(r.target, Target::Return | Target::Goto(_)))
            });
            if leaves && rest.iter().flatten().any(has_conditions) {
                return Err(self.err(
                    at,
                    "",
                    ErrorKind::Unsupported(
                        "`return`/`goto` after an action and a later match".into(),
                    ),
                ));
            }
            let name = if depth == 0 {
                helper.to_string()
            } else {
                format!("{helper}.{depth}")
            };
            // A gate's segment has no action of its own (`Target::None`).
            let action = seg[0].target.clone();
            for r in seg {
                let mut g = r.clone();
                g.target = if leaves {
                    Target::Goto(name.clone())
                } else {
                    Target::Jump(name.clone())
                };
                out.push(g);
            }
            let mut inner = Vec::new();
            if action != Target::None {
                inner.push(model::Rule {
                    location: seg[0].location,
                    target: action,
                    ..model::Rule::default()
                });
            }
            self.emit(at, rest, &mut inner, helper, depth + 1)?;
            self.helpers.push((name, inner));
            return Ok(());
        }
        Ok(())
    }

    /// The target of an action statement (`None`: it does nothing the engine models, such as
    /// a comment).
    fn action(&mut self, at: Pos, s: &Stmt, cur: &mut [model::Rule]) -> Step<Option<Target>> {
        let fam = self.family;
        Ok(Some(match s {
            Stmt::Verdict(v) => match v {
                Verdict::Accept => Target::Accept,
                Verdict::Drop => Target::Drop,
                Verdict::Return => Target::Return,
                Verdict::Continue => return Ok(None),
                Verdict::Jump(c) => Target::Jump(self.chain(c)),
                Verdict::Goto(c) => Target::Goto(self.chain(c)),
            },
            Stmt::Reject(rj) => {
                let w = match rj {
                    Reject::Default => RejectWith::PortUnreachable,
                    Reject::TcpReset => {
                        for alt in cur.iter_mut() {
                            need_proto(alt, 6)?;
                        }
                        RejectWith::TcpReset
                    }
                    Reject::Icmp(c) if fam == Family::Ipv4 => match c {
                        0 => RejectWith::NetUnreachable,
                        1 => RejectWith::HostUnreachable,
                        2 => RejectWith::ProtoUnreachable,
                        3 => RejectWith::PortUnreachable,
                        9 => RejectWith::NetProhibited,
                        10 => RejectWith::HostProhibited,
                        13 => RejectWith::AdminProhibited,
                        _ => {
                            return Err(self.unsupported(
                                at,
                                "reject",
                                format!("`reject with icmp {c}`"),
                            ));
                        }
                    },
                    Reject::Icmpv6(c) if fam == Family::Ipv6 => match c {
                        0 => RejectWith::NetUnreachable,
                        1 => RejectWith::AdminProhibited,
                        3 => RejectWith::HostUnreachable,
                        4 => RejectWith::PortUnreachable,
                        5 => RejectWith::PolicyFail,
                        6 => RejectWith::RejectRoute,
                        _ => {
                            return Err(self.unsupported(
                                at,
                                "reject",
                                format!("`reject with icmpv6 {c}`"),
                            ));
                        }
                    },
                    // nft's implied `meta nfproto` for the other family's code.
                    Reject::Icmp(_) | Reject::Icmpv6(_) => return Err(Ok(Omit)),
                    Reject::Icmpx(c) => match c {
                        0 => RejectWith::NetUnreachable,
                        1 => RejectWith::PortUnreachable,
                        2 => RejectWith::HostUnreachable,
                        3 => RejectWith::AdminProhibited,
                        _ => {
                            return Err(self.unsupported(
                                at,
                                "reject",
                                format!("`reject with icmpx {c}`"),
                            ));
                        }
                    },
                };
                Target::Reject(w)
            }
            Stmt::Notrack => Target::Notrack,
            Stmt::Log(l) => self.log(at, l)?,
            Stmt::Limit(l) => {
                let m = self.limit(at, l)?;
                for alt in cur.iter_mut() {
                    alt.matches.push(m.clone());
                }
                return Ok(None);
            }
            Stmt::Set { key, value } => self.set_stmt(at, key, value)?,
            Stmt::CounterRef(_) => {
                return Err(self.unsupported(
                    at,
                    "counter",
                    "`counter name` (a named counter)".into(),
                ));
            }
            Stmt::Nat(n) => {
                let word = match n.kind {
                    NatKind::Snat => "snat",
                    NatKind::Dnat => "dnat",
                    NatKind::Masquerade => "masquerade",
                    NatKind::Redirect => "redirect",
                };
                return Err(self.unsupported(
                    at,
                    word,
                    format!("`{word}` outside a `type nat` chain"),
                ));
            }
            Stmt::SetUpdate(u) => {
                let word = u.op.name();
                return Err(self.unsupported(
                    at,
                    word,
                    format!("`{word} @{}` (a set changed by the packet path)", u.set),
                ));
            }
            Stmt::Counter { .. } | Stmt::Match(_) | Stmt::Vmap { .. } => return Ok(None),
        }))
    }

    fn chain(&self, c: &str) -> String {
        chain_name(self.table.family, &self.table.name, c)
    }

    fn log(&self, at: Pos, l: &Log) -> Step<Target> {
        const LEVELS: [&str; 8] = [
            "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
        ];
        if let Some(g) = l.group {
            if l.level.is_some() || l.flags.is_some() {
                return Err(self.unsupported(
                    at,
                    "log",
                    "`log group` with `level` or `flags`".into(),
                ));
            }
            return Ok(Target::Nflog(NflogTarget {
                group: g,
                prefix: l.prefix.clone(),
                range: 0,
                size: l.snaplen,
                threshold: l.queue_threshold.unwrap_or(0),
            }));
        }
        let level = match l.level {
            None => None,
            Some(name) => match LEVELS.iter().position(|n| *n == name) {
                Some(i) => Some(i as u8),
                None => return Err(self.unsupported(at, "level", format!("`log level {name}`"))),
            },
        };
        if l.snaplen.is_some() || l.queue_threshold.is_some() {
            return Err(self.unsupported(
                at,
                "log",
                "`log snaplen`/`queue-threshold` without `group`".into(),
            ));
        }
        let flags = match l.flags.as_deref() {
            None => Vec::new(),
            Some("all") => vec![
                "--log-tcp-sequence".into(),
                "--log-tcp-options".into(),
                "--log-ip-options".into(),
                "--log-uid".into(),
            ],
            Some(f) => return Err(self.unsupported(at, "flags", format!("`log flags {f}`"))),
        };
        Ok(Target::Log(LogTarget {
            prefix: l.prefix.clone(),
            level,
            flags,
        }))
    }

    fn limit(&self, at: Pos, l: &super::super::Limit) -> Step<Match> {
        let unit = match l.per {
            "second" => RateUnit::Second,
            "minute" => RateUnit::Minute,
            "hour" => RateUnit::Hour,
            "day" => RateUnit::Day,
            other => {
                return Err(self.unsupported(at, "limit", format!("`limit rate .../{other}`")));
            }
        };
        if l.over || l.byte_unit.is_some() {
            return Err(self.unsupported(at, "limit", "`limit rate over` and byte rates".into()));
        }
        let rate = u32::try_from(l.rate).ok().filter(|&r| r > 0);
        let Some(rate) = rate else {
            return Err(self.unsupported(at, "limit", format!("`limit rate {}`", l.rate)));
        };
        Ok(Match::Limit(LimitMatch {
            rate,
            unit,
            burst: l.burst.max(1),
        }))
    }

    /// `meta mark set ...`, `ct mark set ...` as MARK / CONNMARK.
    fn set_stmt(&self, at: Pos, key: &Expr, value: &SetValue) -> Step<Target> {
        const ALL: u32 = u32::MAX;
        let num = |e: &Elem| match e {
            Elem::Value(Value::Num(n)) => u32::try_from(*n).ok(),
            _ => None,
        };
        let xmark = |op: Option<(BitOp, u128)>| -> Option<MarkValue> {
            let (op, v) = match op {
                None => return Some(MarkValue { value: 0, mask: 0 }),
                Some((op, v)) => (op, u32::try_from(v).ok()?),
            };
            Some(match op {
                BitOp::Or => MarkValue { value: v, mask: v },
                BitOp::And => MarkValue { value: 0, mask: !v },
                BitOp::Xor => MarkValue { value: v, mask: 0 },
            })
        };
        let t = match (key, value) {
            (Expr::Meta(MetaKey::Mark), SetValue::Value(e)) => num(e).map(|v| {
                Target::Mark(MarkValue {
                    value: v,
                    mask: ALL,
                })
            }),
            (
                Expr::Meta(MetaKey::Mark),
                SetValue::From {
                    expr: Expr::Meta(MetaKey::Mark),
                    op,
                },
            ) => xmark(*op).map(Target::Mark),
            (
                Expr::Meta(MetaKey::Mark),
                SetValue::From {
                    expr: Expr::Ct(CtKey::Mark),
                    op: None,
                },
            ) => Some(Target::Connmark(ConnmarkTarget::Restore {
                nfmask: ALL,
                ctmask: ALL,
            })),
            (Expr::Ct(CtKey::Mark), SetValue::Value(e)) => num(e).map(|v| {
                Target::Connmark(ConnmarkTarget::Set(MarkValue {
                    value: v,
                    mask: ALL,
                }))
            }),
            (
                Expr::Ct(CtKey::Mark),
                SetValue::From {
                    expr: Expr::Ct(CtKey::Mark),
                    op,
                },
            ) => xmark(*op).map(|m| Target::Connmark(ConnmarkTarget::Set(m))),
            (
                Expr::Ct(CtKey::Mark),
                SetValue::From {
                    expr: Expr::Meta(MetaKey::Mark),
                    op: None,
                },
            ) => Some(Target::Connmark(ConnmarkTarget::Save {
                nfmask: ALL,
                ctmask: ALL,
            })),
            _ => None,
        };
        t.ok_or_else(|| self.unsupported(at, "set", "this `set` statement (meta mark and ct mark from a constant or each other are lowered)".into()))
    }

    /// `KEY vmap { e : verdict, ... }`: one alternative per (alternative, element).
    fn vmap(
        &mut self,
        at: Pos,
        key: &Expr,
        map: &SetRhs,
        alts: Vec<model::Rule>,
    ) -> Step<Vec<model::Rule>> {
        let elems = match map {
            SetRhs::Set(e) => e,
            SetRhs::Ref(name) => {
                return Err(self.unsupported(
                    at,
                    "vmap",
                    format!("`vmap @{name}` (a named verdict map)"),
                ));
            }
            SetRhs::Value(_) => {
                return Err(self.unsupported(at, "vmap", "`vmap` of one value".into()));
            }
        };
        if alts.len().saturating_mul(elems.len()) > MAX_EXPANDED_RULES {
            return Err(Err(self.err(
                at,
                "vmap",
                ErrorKind::TooLarge(format!(
                    "a verdict map makes more than {MAX_EXPANDED_RULES} rules"
                )),
            )));
        }
        let mut out = Vec::with_capacity(alts.len() * elems.len());
        for e in elems {
            let Some(MapData::Verdict(v)) = &e.data else {
                return Err(self.unsupported(
                    at,
                    "vmap",
                    "a `vmap` element without a verdict".into(),
                ));
            };
            let target = match v {
                Verdict::Accept => Target::Accept,
                Verdict::Drop => Target::Drop,
                Verdict::Return => Target::Return,
                Verdict::Continue => Target::None,
                Verdict::Jump(c) => Target::Jump(self.chain(c)),
                Verdict::Goto(c) => Target::Goto(self.chain(c)),
            };
            let m = NftMatch {
                left: key.clone(),
                op: Op::Implicit,
                right: SetRhs::Value(e.key.clone()),
            };
            let mut these = alts.clone();
            match self.lower_match(at, &m, &mut these) {
                Ok(()) => {}
                // This element cannot match in this family; the others may.
                Err(Ok(Omit)) => continue,
                Err(e) => return Err(e),
            }
            for mut r in these {
                r.target = target.clone();
                out.push(r);
            }
        }
        if out.is_empty() {
            return Err(Ok(Omit));
        }
        Ok(out)
    }
}

/// Sets the rule's protocol to `p` (an implied `meta l4proto`); a rule that already tests
/// another protocol cannot match.
fn need_proto(r: &mut model::Rule, p: u8) -> Step<()> {
    match r.protocol {
        None => {
            r.protocol = Some(Neg::plain(p));
            Ok(())
        }
        Some(n) if !n.negated && n.value == p => Ok(()),
        Some(n) if n.negated && n.value != p => {
            r.protocol = Some(Neg::plain(p));
            Ok(())
        }
        Some(_) => Err(Ok(Omit)),
    }
}

mod matches;
