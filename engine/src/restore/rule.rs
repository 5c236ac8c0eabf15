//! Parses one command line (`-A CHAIN rule...`, `-I CHAIN [N] rule...`, `-N CHAIN`, ...) as
//! iptables' `do_parse` does with getopt: options in any order, `!` before the option it negates,
//! long options with `--name value` or `--name=value`, short ones with `-p tcp` or `-ptcp`.
//!
//! Matches are loaded by `-m NAME`; an option no loaded match knows loads the match named after
//! the `-p` protocol once (implicit `-p tcp --dport 80`, printed back as `-p tcp -m tcp`).
//! Extension options are dispatched in [`super::extensions`].

use crate::model::{Counters, Family, Iface, IpNet, Match, Neg, Rule, TableKind, Target};

/// Options of the protocol matches that `-p` loads implicitly (tcp, udp, icmp, icmp6).
const PROTOCOL_OPTIONS: [&str; 9] = [
    "--sport",
    "--source-port",
    "--dport",
    "--destination-port",
    "--tcp-flags",
    "--syn",
    "--tcp-option",
    "--icmp-type",
    "--icmpv6-type",
];

use super::extensions::{self, MatchState, PendingTarget};

use super::lexer::{Tok, Token, split_byte};
use super::{ParseError, ParseErrorKind as K, ParseWarning};

/// What a line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command<'t> {
    /// `-A CHAIN rule`.
    Append,
    /// `-I CHAIN [N] rule` (1-based, default 1).
    Insert(u32),
    /// `-D CHAIN N` (`Some`) or `-D CHAIN rule` (`None`).
    Delete(Option<u32>),
    /// `-R CHAIN N rule`.
    Replace(u32),
    /// `-N CHAIN`.
    NewChain,
    /// `-X [CHAIN]`.
    DeleteChain,
    /// `-F [CHAIN]`.
    Flush,
    /// `-P CHAIN POLICY`.
    Policy(Tok<'t>),
    /// `-E CHAIN NEW-NAME`: rename a user chain; the rules that jump or go to it follow.
    Rename(Tok<'t>),
}

/// One parsed command line; its rule went into the caller's [`Rule`].
#[derive(Clone, Debug)]
pub(crate) struct Line<'t> {
    /// The command.
    pub command: Command<'t>,
    /// The command option token (`-A`), for error locations.
    pub command_token: Tok<'t>,
    /// The chain argument, if any.
    pub chain: Option<Tok<'t>>,
    /// Whether any rule option was given.
    pub has_spec: bool,
    /// The `-j`/`-g` argument token when the target is a jump or goto.
    pub target_token: Option<Tok<'t>>,
    /// `-s a,b` / `-d a,b`: the rule stands for one rule per address (see [`AddrLists`]).
    pub lists: Option<Box<AddrLists>>,
    /// Values kept in the kernel's form rather than as written.
    pub warnings: Vec<ParseWarning>,
}

/// The addresses of `-s a,b,...` and `-d a,b,...`. As iptables, such a line stands for one rule
/// per source address and destination address (source-major: `-s a,b -d c,d` is the rules
/// a-c, a-d, b-c, b-d); `-I` inserts each at the same position (so they end up in reverse
/// order), `-D` deletes each, `-R` refuses a list. A side without a list is empty (the rule's
/// own `-s`/`-d` holds for every expansion); a side with one has 2 addresses or more, never
/// negated (iptables: "! not allowed with multiple source or destination IP addresses").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AddrLists {
    /// The `-s` addresses, masked as [`extensions::parse_net`] masks them.
    pub src: Vec<IpNet>,
    /// The `-d` addresses.
    pub dst: Vec<IpNet>,
}

impl AddrLists {
    /// How many rules [`AddrLists::expand`] makes (saturating), counted without building them.
    pub(crate) fn count(&self) -> usize {
        self.src.len().max(1).saturating_mul(self.dst.len().max(1))
    }

    /// The rules `rule` stands for, in the order iptables adds them.
    pub(crate) fn expand(&self, rule: &Rule) -> Vec<Rule> {
        let one = |r: &Option<Neg<IpNet>>| vec![*r];
        let side = |list: &[IpNet], own: &Option<Neg<IpNet>>| {
            if list.is_empty() {
                one(own)
            } else {
                list.iter().map(|n| any_net_is_none(false, *n)).collect()
            }
        };
        let srcs = side(&self.src, &rule.src);
        let dsts = side(&self.dst, &rule.dst);
        let mut out = Vec::with_capacity(srcs.len() * dsts.len());
        for s in &srcs {
            for d in &dsts {
                out.push(Rule {
                    src: *s,
                    dst: *d,
                    ..rule.clone()
                });
            }
        }
        out
    }
}

/// `-s`/`-d` as the rule keeps it: `None` for `0.0.0.0/0` or `::/0` not negated, which matches
/// every address (iptables-save omits it), the address otherwise.
fn any_net_is_none(negated: bool, net: IpNet) -> Option<Neg<IpNet>> {
    (negated || net.prefix_len() != Some(0)).then_some(Neg {
        negated,
        value: net,
    })
}

/// What the line parser needs to know about its surroundings.
pub(crate) struct Ctx<'a> {
    /// Family of the restore.
    pub family: Family,
    /// Table of the current block.
    pub table: TableKind,
    /// 1-based line number.
    pub line: u32,
    /// The `set_exists` callback.
    pub set_exists: Option<&'a dyn Fn(&str) -> bool>,
    /// The `resolve_owner` callback.
    pub resolve_owner: Option<super::ResolveOwner<'a>>,
}

impl Ctx<'_> {
    pub(crate) fn err(&self, tok: &Tok, kind: K) -> ParseError {
        ParseError::new(self.line, tok.column, tok.text, kind)
    }
}

/// Reads tokens in order; an argument attached to its option (`--x=y`, `-ptcp`) is pending.
pub(crate) struct Cursor<'t> {
    toks: &'t [Token<'t>],
    pos: usize,
}

impl<'t> Cursor<'t> {
    fn next(&mut self) -> Option<&'t Token<'t>> {
        let t = self.toks.get(self.pos)?;
        self.pos += 1;
        Some(t)
    }

    fn peek(&self) -> Option<Tok<'t>> {
        self.toks.get(self.pos).map(Token::tok)
    }
}

/// The arguments of one option: the attached one first, then following tokens.
pub(crate) struct Args<'c, 't> {
    cur: &'c mut Cursor<'t>,
    attached: Option<Tok<'t>>,
    /// The option token (a reference: cheaper to hand around than a copy).
    opt: &'t Token<'t>,
    line: u32,
}

impl<'t> Args<'_, 't> {
    /// The next argument, whatever it looks like (as getopt's required argument).
    pub(crate) fn next(&mut self) -> Result<Tok<'t>, ParseError> {
        if let Some(t) = self.attached.take() {
            return Ok(t);
        }
        match self.cur.next() {
            Some(t) => Ok(t.tok()),
            None => Err(self.missing()),
        }
    }

    /// A further argument that must not look like an option (as iptables' `xs_has_arg`).
    pub(crate) fn next_plain(&mut self) -> Result<Tok<'t>, ParseError> {
        if let Some(t) = self.attached.take() {
            return Ok(t);
        }
        match self.cur.peek() {
            Some(t) if !t.text.starts_with('-') && t.text != "!" => {
                self.cur.pos += 1;
                Ok(t)
            }
            _ => Err(self.missing()),
        }
    }

    /// Every following token that does not look like an option (for opaque extensions).
    pub(crate) fn rest_plain(&mut self) -> Vec<String> {
        if let Some(t) = self.attached.take() {
            return vec![t.text.to_string()];
        }
        let mut v = Vec::new();
        while let Some(t) = self.cur.peek() {
            if t.text.starts_with('-') || t.text == "!" {
                break;
            }
            v.push(t.text.to_string());
            self.cur.pos += 1;
        }
        v
    }

    fn missing(&self) -> ParseError {
        ParseError::new(
            self.line,
            self.opt.column,
            &*self.opt.text,
            K::MissingArgument(self.opt.text.to_string()),
        )
    }

    /// The option token these arguments belong to.
    pub(crate) fn opt_token(&self) -> Tok<'t> {
        self.opt.tok()
    }

    /// Fails when an attached argument was not used (`--syn=x`).
    fn finish(self) -> Result<(), ParseError> {
        match self.attached {
            Some(t) => Err(ParseError::new(self.line, t.column, t.text, K::BadArgument)),
            None => Ok(()),
        }
    }
}

/// Splits an option token into its name (a prefix of the token: `--dport`, `-p`) and an
/// attached argument (`--dport=80`, `-ptcp`).
fn split_option(tok: Tok<'_>) -> Option<(&str, Option<Tok<'_>>)> {
    let s = tok.text;
    let attached = |text| Tok {
        text,
        column: tok.column,
    };
    if let Some(long) = s.strip_prefix("--") {
        if long.is_empty() {
            return None;
        }
        return Some(match split_byte(long, b'=') {
            Some((n, v)) => (&s[..2 + n.len()], Some(attached(v))),
            None => (s, None),
        });
    }
    let rest = s.strip_prefix('-')?;
    let c = rest.chars().next()?;
    let tail = &rest[c.len_utf8()..];
    Some((
        &s[..1 + c.len_utf8()],
        (!tail.is_empty()).then(|| attached(tail)),
    ))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Main {
    Cmd(char),
    Table,
    Src,
    Dst,
    In,
    Out,
    Proto,
    Frag,
    Match,
    Jump,
    Goto,
    SetCounters,
    V4,
    V6,
}

impl Main {
    /// The bit of an option that may be given once per rule (for "multiple ... not allowed").
    fn once_bit(self) -> Option<u16> {
        Some(match self {
            Main::Src => 1,
            Main::Dst => 1 << 1,
            Main::In => 1 << 2,
            Main::Out => 1 << 3,
            Main::Proto => 1 << 4,
            Main::Frag => 1 << 5,
            Main::Jump => 1 << 6,
            Main::Goto => 1 << 7,
            Main::SetCounters => 1 << 8,
            _ => return None,
        })
    }
}

fn main_option(name: &str) -> Option<Main> {
    Some(match name {
        "-A" | "--append" => Main::Cmd('A'),
        "-I" | "--insert" => Main::Cmd('I'),
        "-D" | "--delete" => Main::Cmd('D'),
        "-R" | "--replace" => Main::Cmd('R'),
        "-N" | "--new-chain" | "--new" => Main::Cmd('N'),
        "-X" | "--delete-chain" => Main::Cmd('X'),
        "-F" | "--flush" => Main::Cmd('F'),
        "-P" | "--policy" => Main::Cmd('P'),
        "-E" | "--rename-chain" => Main::Cmd('E'),
        "-L" | "--list" | "-S" | "--list-rules" | "-Z" | "--zero" | "-C" | "--check" | "-h"
        | "--help" | "-V" | "--version" => Main::Cmd('?'),
        "-t" | "--table" => Main::Table,
        "-s" | "--source" | "--src" => Main::Src,
        "-d" | "--destination" | "--dst" => Main::Dst,
        "-i" | "--in-interface" => Main::In,
        "-o" | "--out-interface" => Main::Out,
        "-p" | "--protocol" => Main::Proto,
        "-f" | "--fragment" => Main::Frag,
        "-m" | "--match" => Main::Match,
        "-j" | "--jump" => Main::Jump,
        "-g" | "--goto" => Main::Goto,
        "-c" | "--set-counters" => Main::SetCounters,
        "-4" | "--ipv4" => Main::V4,
        "-6" | "--ipv6" => Main::V6,
        _ => return None,
    })
}

/// Which extension unknown `--options` go to when no known extension takes them.
#[derive(Clone, Copy)]
enum Open {
    None,
    Match(usize),
    Target,
}

/// The [`MatchState`]s of a line's matches (index `i` belongs to `rule.matches[i]`): the first
/// few inline, so that a line allocates nothing for them, the rest in a `Vec`.
struct MatchStates<'t> {
    inline: [MatchState<'t>; 4],
    len: usize,
    spill: Vec<MatchState<'t>>,
}

impl<'t> MatchStates<'t> {
    fn new() -> Self {
        MatchStates {
            inline: [MatchState::EMPTY; 4],
            len: 0,
            spill: Vec::new(),
        }
    }

    fn push(&mut self, s: MatchState<'t>) {
        match self.inline.get_mut(self.len) {
            Some(slot) => *slot = s,
            None => self.spill.push(s),
        }
        self.len += 1;
    }

    fn get_mut(&mut self, i: usize) -> &mut MatchState<'t> {
        let n = self.inline.len();
        match self.inline.get_mut(i) {
            Some(s) => s,
            None => &mut self.spill[i - n],
        }
    }
}

/// Adds a match to the rule (the first is kept inline: [`crate::model::MatchList`]).
fn push_match(rule: &mut Rule, m: Match) {
    rule.matches.push(m);
}

/// Parses one command line; the rule's options go into `rule` (a default rule). `Ok(None)`:
/// the line carries the other family's `-4`/`-6` and is skipped, as iptables-restore does.
/// `prefix_counters` are the `[p:b]` before the line.
pub(crate) fn parse_line<'t>(
    toks: &'t [Token<'t>],
    ctx: &Ctx<'_>,
    prefix_counters: Option<Counters>,
    rule: &mut Rule,
) -> Result<Option<Line<'t>>, ParseError> {
    let mut cur = Cursor { toks, pos: 0 };
    let mut invert: Option<Tok> = None;
    rule.counters = prefix_counters;
    let mut command: Option<(Command, Tok)> = None;
    let mut chain: Option<Tok> = None;
    // The matches go straight into `rule.matches`; what is tracked while parsing them is here.
    let mut states = MatchStates::new();
    let mut target: Option<PendingTarget> = None;
    let mut target_token: Option<Tok> = None;
    let mut open = Open::None;
    let mut proto_used = false;
    let mut seen: u16 = 0;
    let mut has_spec = prefix_counters.is_some();
    let mut lists: Option<Box<AddrLists>> = None;
    // The `-i` and `-o` option tokens (for "Can't use -o with INPUT").
    let mut in_tok: Option<Tok> = None;
    let mut out_tok: Option<Tok> = None;
    // A negated `-s`/`-d`, which an address list on the other side forbids.
    let mut negated_addr: Option<Tok> = None;

    while let Some(tok_ref) = cur.next() {
        let tok = tok_ref.tok();
        if tok.text == "!" {
            if invert.is_some() {
                return Err(ctx.err(&tok, K::BadNegation));
            }
            invert = Some(tok);
            continue;
        }
        let Some((name, attached)) = split_option(tok) else {
            return Err(ctx.err(&tok, K::BadArgument));
        };
        let inv = invert.take();
        let mut args = Args {
            cur: &mut cur,
            attached,
            opt: tok_ref,
            line: ctx.line,
        };
        let Some(main) = main_option(name) else {
            if !name.starts_with("--") {
                return Err(ctx.err(&tok, K::UnknownOption(name.to_string())));
            }
            has_spec = true;
            let negated = inv.is_some();
            // Known matches first (most recent first), then a known target. A known match's
            // option does not close an open opaque extension (`-m tcp -m addrtype --dport 1
            // --dst-type LOCAL` is fine).
            let mut handled = false;
            for (i, m) in rule.matches.iter_mut().enumerate().rev() {
                let st = states.get_mut(i);
                if let Some(r) = extensions::match_option(m, st, name, negated, &mut args, ctx) {
                    r?;
                    handled = true;
                    break;
                }
            }
            if handled {
                args.finish()?;
                continue;
            }
            if let Some(pt) = target.as_mut() {
                if let Some(r) = extensions::target_option(pt, name, negated, &mut args, ctx) {
                    r?;
                    args.finish()?;
                    continue;
                }
            }
            // Load the protocol's match implicitly, once (iptables' load_proto), when it knows
            // the option. This comes before an open opaque extension takes the option, so
            // that the canonical print (matches before the target) parses back the same:
            // `-p tcp -j MARK --set-mark 1 --sport 5` gives --sport to tcp, as iptables does.
            let implicit = (!proto_used)
                .then(|| {
                    rule.protocol
                        .and_then(|p| extensions::proto_extension(p.value))
                })
                .flatten();
            let mut implicit_opaque = None;
            // A protocol match that cannot load here (icmp in ip6tables) is an error only when
            // no open extension takes the option either.
            let mut implicit_err = None;
            if let Some(ext) = implicit {
                match extensions::new_match(ext, &tok, ctx) {
                    Err(e) => implicit_err = Some(e),
                    Ok((m, st)) if extensions::is_opaque(&m) => implicit_opaque = Some((m, st)),
                    Ok((mut m, mut st)) => {
                        if let Some(r) =
                            extensions::match_option(&mut m, &mut st, name, negated, &mut args, ctx)
                        {
                            proto_used = true;
                            r?;
                            args.finish()?;
                            push_match(rule, m);
                            states.push(st);
                            continue;
                        }
                    }
                }
            }
            // An option of a protocol match before `-p` is unknown in iptables (load_proto has
            // no protocol yet); an open opaque extension must not swallow it either, or the
            // canonical print (with `-p` first) would give it to the protocol match instead.
            if implicit.is_none() && !proto_used && PROTOCOL_OPTIONS.contains(&name) {
                return Err(ctx.err(&tok, K::UnknownOption(name.to_string())));
            }
            match open {
                Open::Match(i) => {
                    if let Some(m) = rule.matches.get_mut(i) {
                        extensions::opaque_option(m, name, negated, &mut args);
                        continue;
                    }
                }
                Open::Target => {
                    if let Some(pt) = target.as_mut() {
                        extensions::opaque_target_option(pt, name, negated, &mut args);
                        continue;
                    }
                }
                Open::None => {}
            }
            if let Some((mut m, st)) = implicit_opaque {
                proto_used = true;
                extensions::opaque_option(&mut m, name, negated, &mut args);
                push_match(rule, m);
                states.push(st);
                open = Open::Match(rule.matches.len() - 1);
                continue;
            }
            if let Some(e) = implicit_err {
                return Err(e);
            }
            let last_known = target
                .as_ref()
                .filter(|t| !t.is_opaque())
                .map(|t| t.name().to_string())
                .or_else(|| {
                    rule.matches
                        .last()
                        .filter(|m| !extensions::is_opaque(m))
                        .map(|m| m.extension().to_string())
                });
            return Err(ctx.err(
                &tok,
                match last_known {
                    Some(extension) => K::UnknownExtensionOption {
                        extension,
                        option: name.to_string(),
                    },
                    None => K::UnknownOption(name.to_string()),
                },
            ));
        };
        open = Open::None;
        if let Some(i) = inv {
            if !matches!(
                main,
                Main::Src | Main::Dst | Main::In | Main::Out | Main::Proto | Main::Frag
            ) {
                return Err(ctx.err(&i, K::BadNegation));
            }
        }
        if let Some(bit) = main.once_bit() {
            if seen & bit != 0 || (matches!(main, Main::Jump | Main::Goto) && target.is_some()) {
                return Err(ctx.err(&tok, K::DuplicateOption(name.to_string())));
            }
            seen |= bit;
            has_spec = true;
        }
        let negated = inv.is_some();
        match main {
            Main::Cmd(c) => {
                if command.is_some() {
                    return Err(ctx.err(&tok, K::MultipleCommands));
                }
                let cmd = parse_command(c, &tok, &mut args, &mut chain, ctx)?;
                command = Some((cmd, tok));
            }
            Main::Table => return Err(ctx.err(&tok, K::TableOption)),
            Main::Src | Main::Dst => {
                let a = args.next()?;
                let v = if a.text.as_bytes().contains(&b',') {
                    if negated {
                        return Err(ctx.err(&tok, K::NegatedAddressList));
                    }
                    let mut nets = Vec::new();
                    for part in a.text.split(',') {
                        let t = Tok {
                            text: part,
                            column: a.column,
                        };
                        nets.push(extensions::parse_net(&t, ctx.family, ctx)?);
                    }
                    let l = lists.get_or_insert_with(Box::default);
                    let first = any_net_is_none(false, nets[0]);
                    if main == Main::Src {
                        l.src = nets;
                    } else {
                        l.dst = nets;
                    }
                    first
                } else {
                    if negated {
                        negated_addr = Some(tok);
                    }
                    let net = extensions::parse_net(&a, ctx.family, ctx)?;
                    any_net_is_none(negated, net)
                };
                if main == Main::Src {
                    rule.src = v;
                } else {
                    rule.dst = v;
                }
            }
            Main::In | Main::Out => {
                if main == Main::In {
                    in_tok = Some(tok);
                } else {
                    out_tok = Some(tok);
                }
                let a = args.next()?;
                let iface = parse_iface(&a, ctx)?;
                // `-i +` (not negated) matches every interface: iptables-save omits it.
                let v = (negated || iface.name != "+").then_some(Neg {
                    negated,
                    value: iface,
                });
                if main == Main::In {
                    rule.in_iface = v;
                } else {
                    rule.out_iface = v;
                }
            }
            Main::Proto => {
                let a = args.next()?;
                let p = extensions::parse_protocol(&a, ctx)?;
                if p == 0 && negated {
                    return Err(ctx.err(&a, K::NeverMatches));
                }
                rule.protocol = (p != 0).then_some(Neg { negated, value: p });
            }
            Main::Frag => {
                if ctx.family == Family::Ipv6 {
                    return Err(ctx.err(&tok, K::UnknownOption(name.to_string())));
                }
                rule.fragment = Some(!negated);
            }
            Main::Match => {
                let a = args.next()?;
                let (m, st) = extensions::new_match(a.text, &a, ctx)?;
                let opaque = extensions::is_opaque(&m);
                push_match(rule, m);
                states.push(st);
                if opaque {
                    open = Open::Match(rule.matches.len() - 1);
                }
                has_spec = true;
            }
            Main::Jump | Main::Goto => {
                let a = args.next()?;
                let pt = if main == Main::Goto {
                    check_chain_name(&a, ctx)?;
                    target_token = Some(a);
                    PendingTarget::plain(Target::Goto(a.text.to_string()))
                } else {
                    match extensions::new_target(&a, ctx)? {
                        Some(pt) => pt,
                        None => {
                            check_chain_name(&a, ctx)?;
                            target_token = Some(a);
                            PendingTarget::plain(Target::Jump(a.text.to_string()))
                        }
                    }
                };
                if pt.is_opaque() {
                    open = Open::Target;
                }
                target = Some(pt);
            }
            Main::SetCounters => {
                let p = args.next()?;
                let (pk, by) = match p.text.split_once(',') {
                    Some((a, b)) => (a, b),
                    None => (p.text, args.next_plain()?.text),
                };
                let (Ok(packets), Ok(bytes)) = (pk.parse::<u64>(), by.parse::<u64>()) else {
                    return Err(ctx.err(&p, K::BadCounters));
                };
                if rule.counters.is_some() {
                    return Err(ctx.err(&tok, K::DuplicateOption(name.to_string())));
                }
                rule.counters = Some(Counters { packets, bytes });
            }
            // The other family's line: iptables-restore drops it as soon as it sees the flag.
            Main::V4 if ctx.family != Family::Ipv4 => return Ok(None),
            Main::V6 if ctx.family != Family::Ipv6 => return Ok(None),
            Main::V4 | Main::V6 => {}
        }
        args.finish()?;
    }
    if let Some(i) = invert {
        return Err(ctx.err(&i, K::BadNegation));
    }
    let Some((command, command_token)) = command else {
        let t = toks.first().map_or(
            Tok {
                text: "",
                column: 1,
            },
            Token::tok,
        );
        return Err(ctx.err(&t, K::NoCommand));
    };
    if let (Some(_), Some(t)) = (&lists, negated_addr) {
        return Err(ctx.err(&t, K::NegatedAddressList));
    }
    // As iptables' do_parse, by chain name: packets coming in have no output interface yet,
    // packets going out no input interface.
    if let Some(ch) = chain {
        let wrong = match ch.text {
            "PREROUTING" | "INPUT" => out_tok.map(|t| (t, 'o')),
            "POSTROUTING" | "OUTPUT" => in_tok.map(|t| (t, 'i')),
            _ => None,
        };
        if let Some((t, c)) = wrong {
            return Err(ctx.err(&t, K::WrongDirection(c, ch.text.to_string())));
        }
    }
    let protocol = rule.protocol;
    for (i, m) in rule.matches.iter_mut().enumerate() {
        extensions::finish_match(m, states.get_mut(i), protocol, ctx)?;
        // xt_owner's hooks are OUTPUT and POSTROUTING: the kernel refuses it in a builtin
        // chain of another hook (a user chain is validation's, which knows its hooks).
        if let (Match::Owner(_), Some(ch)) = (&*m, chain) {
            if matches!(ch.text, "PREROUTING" | "INPUT" | "FORWARD") {
                return Err(ctx.err(
                    &states.get_mut(i).token(),
                    K::InvalidValue {
                        what: "match",
                        reason: format!(
                            "owner: the kernel loads -m owner only in OUTPUT and POSTROUTING, not {}",
                            ch.text
                        ),
                    },
                ));
            }
        }
    }
    let mut warnings = Vec::new();
    if let Some(mut pt) = target {
        warnings.extend(pt.warning.take());
        let name_token = pt.token;
        rule.target = extensions::finish_target(pt, protocol, ctx)?;
        // xt_TCPMSS's check: "Only works on TCP SYN packets", a `-m tcp` whose flags
        // compare SYN set (not negated) must come with it.
        if let (Target::Opaque(o), Some(tok)) = (&rule.target, name_token) {
            let syn = rule.matches.iter().any(|m| {
                matches!(m, Match::Tcp(t) if t.flags.is_some_and(|f| !f.negated && f.value.comp & 0x02 != 0))
            });
            if o.name == "TCPMSS" && !syn {
                return Err(ctx.err(
                    &tok,
                    K::InvalidValue {
                        what: "target",
                        reason: "TCPMSS: the kernel only loads it with a TCP SYN match \
                                 (-p tcp -m tcp --tcp-flags ... SYN or --syn)"
                            .into(),
                    },
                ));
            }
        }
    }
    Ok(Some(Line {
        command,
        command_token,
        chain,
        has_spec,
        target_token,
        lists,
        warnings,
    }))
}

fn parse_command<'t>(
    c: char,
    tok: &Tok<'t>,
    args: &mut Args<'_, 't>,
    chain: &mut Option<Tok<'t>>,
    ctx: &Ctx<'_>,
) -> Result<Command<'t>, ParseError> {
    let number = |t: &Tok| -> Result<u32, ParseError> {
        match t.text.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(ctx.err(t, K::BadRuleNumber(t.text.to_string()))),
        }
    };
    let optional_chain = |args: &mut Args<'_, 't>| -> Option<Tok<'t>> { args.next_plain().ok() };
    let cmd = match c {
        'A' | 'I' | 'D' | 'R' | 'N' | 'P' | 'E' => {
            let ch = args.next()?;
            check_chain_name(&ch, ctx)?;
            *chain = Some(ch);
            match c {
                'A' => Command::Append,
                'N' => Command::NewChain,
                'I' => match args.next_plain() {
                    Ok(n) => Command::Insert(number(&n)?),
                    Err(_) => Command::Insert(1),
                },
                'D' => match args.next_plain() {
                    Ok(n) => Command::Delete(Some(number(&n)?)),
                    Err(_) => Command::Delete(None),
                },
                'R' => Command::Replace(number(&args.next_plain()?)?),
                'E' => {
                    let new = args.next_plain()?;
                    check_chain_name(&new, ctx)?;
                    Command::Rename(new)
                }
                _ => Command::Policy(args.next_plain()?),
            }
        }
        'X' | 'F' => {
            if let Some(ch) = optional_chain(args) {
                check_chain_name(&ch, ctx)?;
                *chain = Some(ch);
            }
            if c == 'X' {
                Command::DeleteChain
            } else {
                Command::Flush
            }
        }
        _ => return Err(ctx.err(tok, K::UnsupportedCommand)),
    };
    Ok(cmd)
}

/// Checks a chain name as iptables-restore does ([`super::check_chain_name`]), with
/// iptables' "too long" for a name over 28 bytes.
pub(crate) fn check_chain_name(t: &Tok, ctx: &Ctx<'_>) -> Result<(), ParseError> {
    if t.text.len() > super::MAX_CHAIN_NAME && !t.text.starts_with(['-', '!']) {
        return Err(ctx.err(
            t,
            K::TooLong {
                what: "chain name",
                max: super::MAX_CHAIN_NAME,
            },
        ));
    }
    super::check_chain_name(t.text).map_err(|_| ctx.err(t, K::BadChainName))
}

/// `-i`/`-o`: at most 15 bytes (IFNAMSIZ - 1), as iptables: "interface name must be shorter
/// than 16 characters"; a trailing `+` is a prefix wildcard.
pub(super) fn parse_iface(t: &Tok, ctx: &Ctx<'_>) -> Result<Iface, ParseError> {
    if t.text.len() > 15 {
        return Err(ctx.err(
            t,
            K::TooLong {
                what: "interface name",
                max: 15,
            },
        ));
    }
    if t.text.is_empty()
        || t.text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '"' | '\\'))
    {
        return Err(ctx.err(
            t,
            K::InvalidValue {
                what: "interface name",
                reason: "empty or contains '/' or whitespace".into(),
            },
        ));
    }
    Ok(Iface {
        name: t.text.to_string(),
    })
}
