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
    /// The chain runs before the conntrack lookup (a base chain below priority -200 reaches
    /// it): `ct` expressions and statements are refused there.
    pub(super) before_ct: bool,
    /// Helper chains made for rules with several actions: (name, rules).
    pub(super) helpers: Vec<(String, Vec<model::Rule>)>,
    /// The rules of `helpers`, counted as they are made.
    pub(super) helper_rules: usize,
    /// Named sets the rules matched against.
    pub(super) sets: Vec<LoweredSet>,
}

/// The rule cannot match in this family (`ip saddr` in an IPv6 copy): leave it out.
struct Omit;

/// A match's outcome: `Err(Ok(Omit))` leaves the rule out, `Err(Err(e))` refuses it.
type Step<T> = Result<T, Result<Omit, NftError>>;

/// Where the model rules that count an nft rule's packets (those that passed all its
/// matches: its last segment) went: `len` rules from index `first` of the rules returned for
/// the rule's own chain (`helper` `None`) or of helper chain `helper`.
pub(super) struct Counted {
    pub(super) helper: Option<String>,
    pub(super) first: usize,
    pub(super) len: usize,
}

/// A run of a rule's model rules (see [`Cx::lower_rule`]).
struct Seg {
    /// The alternatives, each with the segment's action as its target.
    rules: Vec<model::Rule>,
    kind: SegKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SegKind {
    /// Conditions then an action (or, last, only conditions).
    Action,
    /// Conditions only, behind which the rest of the rule runs: always a jump to a helper.
    Gate,
    /// Rules that return when they hold (the rest runs when none does), written as they are
    /// (always behind a gate).
    Returns,
}

/// Whether `EXPR != { ... }` is one model match (see `apply_set`): ports (one multiport),
/// ct state/status (the union), addresses (a negated range each); or not a set at all.
fn negates_natively(m: &NftMatch) -> bool {
    let SetRhs::Set(e) = &m.right else {
        return true;
    };
    match &m.left {
        Expr::Ct(CtKey::State | CtKey::Status) => true,
        Expr::Payload(Payload {
            field: "sport" | "dport",
            ..
        }) => e.len() <= 7,
        Expr::Payload(Payload {
            proto: Proto::Ip | Proto::Ip6,
            field: "saddr" | "daddr",
        }) => true,
        _ => false,
    }
}

fn has_limit(r: &model::Rule) -> bool {
    r.matches.iter().any(|m| matches!(m, Match::Limit(_)))
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
    ) -> Result<(Vec<model::Rule>, Option<Counted>), NftError> {
        let loc = location(r.pos);
        let fresh = || model::Rule {
            location: loc,
            ..model::Rule::default()
        };
        let mut segs: Vec<Seg> = Vec::new();
        let mut cur = vec![fresh()];
        let close = |segs: &mut Vec<Seg>, cur: &mut Vec<model::Rule>, gate: bool| {
            let rules = std::mem::replace(cur, vec![fresh()]);
            segs.push(Seg {
                rules,
                kind: if gate { SegKind::Gate } else { SegKind::Action },
            });
        };
        for (i, s) in r.stmts.iter().enumerate() {
            // A limit bucket must be asked once per packet: an expansion after one, or a
            // limit or match after an expansion, goes behind a gate (a jump to a helper
            // chain holding the rest), which one alternative at most passes.
            // Two expansions in a row would multiply; behind a gate they add up. A single
            // value after an expansion stays with each alternative (`meta l4proto { tcp, udp }
            // th dport 53` needs each alternative's protocol).
            let gate = (expands(s) && cur.iter().any(has_limit))
                || (cur.len() > 1 && (matches!(s, Stmt::Limit(_)) || expands(s)));
            if gate && i > 0 {
                close(&mut segs, &mut cur, true);
            }
            // `limit rate over R` and `EXPR != { a, b }` (where no single match holds the
            // negation): behind a gate, a rule per element (or the limit) that returns when it
            // holds, so the rest runs only when none does.
            let returns = match s {
                Stmt::Limit(l) if l.over => {
                    let under = super::super::Limit {
                        over: false,
                        ..l.clone()
                    };
                    match self.limit(r.pos, &under) {
                        Ok(m) => Some(Ok(vec![model::Rule {
                            matches: vec![m].into(),
                            target: Target::Return,
                            location: loc,
                            ..model::Rule::default()
                        }])),
                        Err(e) => Some(Err(e)),
                    }
                }
                Stmt::Match(m) if m.op == Op::Ne && !negates_natively(m) => {
                    let SetRhs::Set(elems) = &m.right else {
                        unreachable!("negates_natively holds for non-sets")
                    };
                    let mut rules = Vec::with_capacity(elems.len());
                    let mut res = Ok(());
                    for e in elems {
                        let pos = NftMatch {
                            left: m.left.clone(),
                            op: Op::Implicit,
                            right: SetRhs::Value(e.key.clone()),
                        };
                        let mut one = vec![fresh()];
                        match self.lower_match(r.pos, &pos, &mut one) {
                            Ok(()) => rules.extend(one.into_iter().map(|mut x| {
                                x.target = Target::Return;
                                x
                            })),
                            Err(Ok(Omit)) => {}
                            Err(e) => {
                                res = Err(e);
                                break;
                            }
                        }
                    }
                    Some(res.map(|()| rules))
                }
                _ => None,
            };
            if let Some(rules) = returns {
                match rules {
                    Ok(rules) => {
                        close(&mut segs, &mut cur, true);
                        segs.push(Seg {
                            rules,
                            kind: SegKind::Returns,
                        });
                        continue;
                    }
                    Err(Ok(Omit)) => return Ok((Vec::new(), None)),
                    Err(Err(e)) => return Err(e),
                }
            }
            let step = match s {
                Stmt::Match(m) => self.lower_match(r.pos, m, &mut cur),
                Stmt::SetUpdate(u) => self.meter(r.pos, u, &mut cur),
                Stmt::Vmap { key, map } => {
                    let out = self.vmap(r.pos, key, map, std::mem::take(&mut cur));
                    match out {
                        Ok(v) => {
                            segs.push(Seg {
                                rules: v,
                                kind: SegKind::Action,
                            });
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
                        close(&mut segs, &mut cur, false);
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                },
            };
            match step {
                Ok(()) => {}
                Err(Ok(Omit)) => return Ok((Vec::new(), None)),
                Err(Err(e)) => return Err(e),
            }
        }
        if segs.is_empty()
            || cur.iter().any(has_conditions)
            || cur.len() > 1
            || segs.last().is_some_and(|s| s.kind == SegKind::Returns)
        {
            segs.push(Seg {
                rules: cur,
                kind: SegKind::Action,
            });
        }
        let mut out = Vec::new();
        let mut counted = None;
        let helper = format!("{chain} #{n}");
        self.emit(r.pos, &segs, &mut out, (&helper, None), 0, &mut counted)?;
        Ok((out, counted))
    }

    /// Writes segments `segs` into `out`: a segment without conditions (or the last one) as
    /// it is, a returning one as it is; one with conditions followed by more, or a gate, as
    /// jumps (gotos when the rule ends in `return` or `goto`) to a helper chain that holds its
    /// action and the rest.
    /// `into` is (the helpers' base name, the helper `out` is for: `None` for the rule's own
    /// chain); `counted` gets where the last segment's rules went.
    fn emit(
        &mut self,
        at: Pos,
        segs: &[Seg],
        out: &mut Vec<model::Rule>,
        (helper, into): (&str, Option<&str>),
        depth: usize,
        counted: &mut Option<Counted>,
    ) -> Result<(), NftError> {
        for (i, seg) in segs.iter().enumerate() {
            let last = i + 1 == segs.len();
            let plain = seg.rules.len() == 1 && !has_conditions(&seg.rules[0]);
            if seg.kind == SegKind::Returns || (seg.kind == SegKind::Action && (last || plain)) {
                if last {
                    *counted = Some(Counted {
                        helper: into.map(str::to_string),
                        first: out.len(),
                        len: seg.rules.len(),
                    });
                }
                out.extend(seg.rules.iter().cloned());
                continue;
            }
            let rest = &segs[i + 1..];
            let leaves = rest.last().is_some_and(|s| {
                s.rules
                    .iter()
                    .any(|r| matches!(r.target, Target::Return | Target::Goto(_)))
            });
            let conditions = rest.iter().flat_map(|s| &s.rules).any(has_conditions);
            if leaves && conditions {
                return Err(self.err(
                    at,
                    "",
                    ErrorKind::Unsupported(
                        "`return`/`goto` after an action, a later match or `limit rate over`"
                            .into(),
                    ),
                ));
            }
            let name = if depth == 0 {
                helper.to_string()
            } else {
                format!("{helper}.{depth}")
            };
            // A gate's segment has no action of its own (`Target::None`).
            let action = seg.rules[0].target.clone();
            for r in &seg.rules {
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
                    location: seg.rules[0].location,
                    target: action,
                    ..model::Rule::default()
                });
            }
            self.emit(
                at,
                rest,
                &mut inner,
                (helper, Some(&name)),
                depth + 1,
                counted,
            )?;
            self.helper_rules += inner.len();
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
            // After conntrack the packet has its entry: notrack does nothing there (the
            // kernel's nft_notrack leaves an attached entry alone).
            Stmt::Notrack if !self.before_ct => return Ok(None),
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

    /// A meter, `add|update @set { KEY limit rate [over] R/UNIT [burst B packets] }` with
    /// KEY one address (`ip saddr`, `ip6 daddr`): a token bucket per key, as `-m hashlimit`
    /// (mode srcip or dstip, the table named `TABLE.SET`, entries expiring after the set's
    /// timeout). The keys live in the engine's hashlimit table, not as set elements.
    fn meter(&mut self, at: Pos, u: &super::super::SetUpdate, cur: &mut [model::Rule]) -> Step<()> {
        use crate::model::{HASHLIMIT_NAME_MAX, HASHLIMIT_SCALE, HashlimitMatch, hashlimit_mode};
        let word = u.op.name();
        let refuse = |what: String| Err(self.unsupported(at, word, what));
        let (Some(Stmt::Limit(l)), 1) = (u.stmts.first(), u.stmts.len()) else {
            return refuse(format!(
                "`{word} @{}` other than a meter (one `limit`)",
                u.set
            ));
        };
        if u.op == super::super::SetUpdateOp::Delete || l.byte_unit.is_some() {
            return refuse(format!(
                "`{word} @{}` other than a packet-rate meter",
                u.set
            ));
        }
        let (fam, mode) = match &u.key {
            Expr::Payload(Payload {
                proto,
                field: f @ ("saddr" | "daddr"),
            }) if matches!(proto, Proto::Ip | Proto::Ip6) => {
                let fam = if *proto == Proto::Ip {
                    Family::Ipv4
                } else {
                    Family::Ipv6
                };
                let mode = if *f == "saddr" {
                    hashlimit_mode::SRC_IP
                } else {
                    hashlimit_mode::DST_IP
                };
                (fam, mode)
            }
            _ => {
                return refuse(format!(
                    "`{word} @{}` keyed by other than one address",
                    u.set
                ));
            }
        };
        if fam != self.family {
            return Err(Ok(Omit));
        }
        let unit_secs: u64 = match l.per {
            "second" => 1,
            "minute" => 60,
            "hour" => 3600,
            "day" => 86_400,
            other => return refuse(format!("`limit rate .../{other}` in a meter")),
        };
        let name = format!("{}.{}", self.table.name, u.set);
        if name.len() > HASHLIMIT_NAME_MAX || l.rate == 0 {
            return refuse(format!(
                "`{word} @{}`: its meter name `{name}` is longer than {HASHLIMIT_NAME_MAX} bytes or its rate 0",
                u.set
            ));
        }
        let set = self.table.sets.iter().find(|s| s.name == u.set);
        let expire = set
            .and_then(|s| s.timeout_ms)
            .or(u.timeout_ms)
            .unwrap_or(unit_secs * 1000);
        let m = HashlimitMatch {
            above: l.over,
            avg: HASHLIMIT_SCALE * unit_secs / l.rate,
            burst: l.burst.max(1),
            mode,
            name,
            size: set.and_then(|s| s.size).unwrap_or(0),
            max: 0,
            gc_interval: 1000,
            expire: u32::try_from(expire).unwrap_or(u32::MAX),
            srcmask: None,
            dstmask: None,
        };
        for a in cur.iter_mut() {
            a.matches.push(Match::Hashlimit(m.clone()));
        }
        Ok(())
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
        // `over` is lowered by the caller (a returning rule behind a gate).
        if let Some(unit) = l.byte_unit {
            return Err(self.unsupported(
                at,
                "limit",
                format!("`limit rate ... {unit}/...` (a byte rate)"),
            ));
        }
        debug_assert!(!l.over);
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
        let ct_read = matches!(
            value,
            SetValue::From {
                expr: Expr::Ct(_),
                ..
            }
        );
        if self.before_ct && (matches!(key, Expr::Ct(_)) || ct_read) {
            return Err(self.unsupported(
                at,
                "ct",
                "`ct mark` in a chain that runs before conntrack (priority below -200)".into(),
            ));
        }
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
            // A named verdict map: an engine verdict map whose elements change without a
            // commit (as `nft add element`), one rule per alternative.
            SetRhs::Ref(name) => {
                let m = self.table.sets.iter().find(|s| &s.name == name);
                let Some(m) = m.filter(|m| m.is_map && m.data == Some(NftSetType::Verdict)) else {
                    return Err(self.unsupported(
                        at,
                        "vmap",
                        format!("`vmap @{name}` (no such verdict map)"),
                    ));
                };
                // A key no engine set holds (`oifname`, `tcp dport`): the map's elements
                // as they are now, one rule each; changing them is a commit.
                if matches::set_key(key, &matches::key_types(m)).is_none() {
                    return self.expand_vmap(at, key, &m.elements, alts);
                }
                let (engine, dirs) = self.engine_set(at, key, name, true)?;
                // `tcp dport vmap @ports`: the protocol the key implies, on each alternative.
                let mut alts = alts;
                if let Expr::Payload(
                    p @ Payload {
                        field: "sport" | "dport",
                        ..
                    },
                ) = key
                {
                    let mut kept = Vec::with_capacity(alts.len());
                    for mut a in alts {
                        match self.transport(at, p.proto, &mut a) {
                            Ok(_) => kept.push(a),
                            Err(Ok(Omit)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    if kept.is_empty() {
                        return Err(Ok(Omit));
                    }
                    alts = kept;
                }
                let target = Target::Vmap(model::VmapTarget {
                    map: engine,
                    dirs,
                    chain_prefix: self.chain(""),
                });
                return Ok(alts
                    .into_iter()
                    .map(|mut r| {
                        r.target = target.clone();
                        r
                    })
                    .collect());
            }
            SetRhs::Value(_) => {
                return Err(self.unsupported(at, "vmap", "`vmap` of one value".into()));
            }
        };
        self.expand_vmap(at, key, elems, alts)
    }

    /// `KEY vmap { e : verdict, ... }` with these elements: one alternative per (alternative,
    /// element).
    fn expand_vmap(
        &mut self,
        at: Pos,
        key: &Expr,
        elems: &[crate::nft::SetElem],
        alts: Vec<model::Rule>,
    ) -> Step<Vec<model::Rule>> {
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
