//! nftables text in and out: a model of an nft ruleset, a parser for the text `nft -f` reads
//! (as `nft list ruleset` prints it and as nftables.conf files are written) and the printer of
//! the canonical `nft list ruleset` listing.
//!
//! [`parse`] reads `flush ruleset`, `table FAMILY NAME { ... }` blocks (chains, sets, maps),
//! the commands `add|create table|chain|rule|set|map|element ...`, and `define`/`$name`
//! variables (expanded before parsing, sized first: see [`MAX_EXPANDED_TOKENS`]). It follows
//! nftables v1.1 syntax for the expressions listed in [`Expr`] and [`Stmt`]; anything else is
//! refused by name at its position ([`ErrorKind::Unsupported`]), never dropped. Errors carry
//! FILE:LINE:COL of the user's text. `include` is refused (a request carries one file); the
//! families bridge, arp and netdev are refused by name.
//!
//! [`print()`] writes the text `nft list ruleset` prints for the same ruleset (nft v1.1.6: tab
//! indentation, sets before chains, symbolic priorities, values in each datatype's canonical
//! form, set elements sorted as nft sorts them). Values are typed by the expression they are
//! compared with (`icmp type 8` is `echo-request`, `ip protocol tcp` is `6`), so the listing
//! of a parsed text is the kernel's listing, byte for byte (checked against the nft project's
//! shell-dump vectors and, with root, against kernel nftables in a private namespace).
//!
//! [`lower()`] maps a parsed ruleset onto the engine's rule model ([`crate::model`]), where the
//! snapshot enforces it with the same classifier and counters as iptables rulesets (see
//! `nft/lower.rs` for what each statement becomes and what is refused).
//!
//! Why a hand-written parser: there is no maintained Rust crate that reads nft text (the
//! `nftables` crate models only the JSON form, `nft -j`), and nft's own grammar (bison) is
//! context-sensitive (a value's meaning depends on the expression it is compared with), which a
//! generated lexer does not simplify; the tokenizer is ~150 lines.

mod json;
mod lexer;
pub mod lower;
mod parse;
mod print;
mod types;

use std::fmt;

pub use json::{from_json, to_json, to_json_as};
pub use lower::{CountedAt, Lowered, LoweredSet, StoredOnly, lower};
pub use parse::{MAX_EXPANDED_TOKENS, MAX_SET_ELEMENTS, parse};
pub use print::{Dialect, print, print_as, rule_text};
pub use types::DataType;

// === model ===

/// An nft ruleset: tables in the order they were created (as `nft list ruleset` lists them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Tables, in creation order.
    pub tables: Vec<Table>,
}

/// An address family of a table (bridge, arp and netdev are refused when parsing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `ip`: IPv4 only.
    Ip,
    /// `ip6`: IPv6 only.
    Ip6,
    /// `inet`: both; base chains see IPv4 and IPv6 packets.
    Inet,
}

impl Family {
    /// The keyword nft uses.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
        }
    }
}

/// A table: a namespace of chains and sets of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Its family.
    pub family: Family,
    /// Its name (any name nft accepts).
    pub name: String,
    /// Named sets and maps, in creation order.
    pub sets: Vec<Set>,
    /// Chains, in creation order.
    pub chains: Vec<Chain>,
    /// `comment "..."`.
    pub comment: Option<String>,
    /// Where it was first declared.
    pub pos: Pos,
}

/// A chain: a base chain (attached to a hook) or a regular chain (reached by jump/goto).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Its name.
    pub name: String,
    /// Hook, type, priority and policy of a base chain; `None` for a regular chain.
    pub base: Option<BaseChain>,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
    /// `comment "..."`.
    pub comment: Option<String>,
    /// Where it was first declared.
    pub pos: Pos,
}

/// What makes a chain a base chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseChain {
    /// `type filter|nat|route`.
    pub kind: ChainType,
    /// The netfilter hook.
    pub hook: Hook,
    /// The priority as a number (symbolic names are resolved: raw -300, mangle -150,
    /// dstnat -100, filter 0, security 50, srcnat 100; lower runs first).
    pub priority: i32,
    /// What happens to a packet that reaches the end of the chain (default accept).
    pub policy: Policy,
}

/// A base chain's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainType {
    /// `filter`.
    Filter,
    /// `nat`.
    Nat,
    /// `route` (output only).
    Route,
}

/// A netfilter hook of the ip, ip6 and inet families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// `prerouting`.
    Prerouting,
    /// `input`.
    Input,
    /// `forward`.
    Forward,
    /// `output`.
    Output,
    /// `postrouting`.
    Postrouting,
}

/// A base chain's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
}

/// A rule: statements run left to right; a match that fails ends the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The statements, in order.
    pub stmts: Vec<Stmt>,
    /// `comment "..."`.
    pub comment: Option<String>,
    /// Where the rule starts.
    pub pos: Pos,
}

/// One statement of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stmt {
    /// `LEFT [op] RIGHT`: a relational expression.
    Match(Match),
    /// A verdict.
    Verdict(Verdict),
    /// `counter [packets N bytes M]` (an anonymous counter; the numbers are listed as given).
    Counter {
        /// Packets counted.
        packets: u64,
        /// Bytes counted.
        bytes: u64,
    },
    /// `counter name NAME`: a named counter object.
    CounterRef(String),
    /// `limit rate [over] N/unit [burst M packets|bytes]`.
    Limit(Limit),
    /// `log [prefix ..] [level ..] [group ..] ...`.
    Log(Log),
    /// `reject [with ...]`.
    Reject(Reject),
    /// `notrack`.
    Notrack,
    /// `snat`, `dnat`, `masquerade`, `redirect`.
    Nat(Nat),
    /// `KEY vmap { ... }` or `KEY vmap @map`: the verdict of the element KEY finds.
    Vmap {
        /// The lookup key.
        key: Expr,
        /// The verdict map.
        map: SetRhs,
    },
    /// `add @set { KEY ... }`, `update @set { KEY ... }`, `delete @set { KEY }`: change a named
    /// set from the packet path (dynamic sets, per-key rate limits).
    SetUpdate(SetUpdate),
    /// `meta mark set V`, `ct mark set V`: write a packet or connection field.
    Set {
        /// The field (`meta mark`, `ct mark`).
        key: Expr,
        /// The value written.
        value: SetValue,
    },
}

/// `add|update|delete @set { KEY [timeout T] [STATEMENTS] }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetUpdate {
    /// add, update or delete.
    pub op: SetUpdateOp,
    /// The named set (of the same table).
    pub set: String,
    /// The element's key, computed from the packet (`ip saddr`, `ip saddr . tcp dport`).
    pub key: Expr,
    /// `timeout T` of the element added (ms).
    pub timeout_ms: Option<u64>,
    /// Per-element statements: `limit ...` and `counter` (a meter).
    pub stmts: Vec<Stmt>,
}

/// What a [`SetUpdate`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetUpdateOp {
    /// `add`: insert the key if absent.
    Add,
    /// `update`: insert or refresh its timeout.
    Update,
    /// `delete`: remove the key.
    Delete,
}

impl SetUpdateOp {
    /// The keyword.
    pub fn name(self) -> &'static str {
        match self {
            SetUpdateOp::Add => "add",
            SetUpdateOp::Update => "update",
            SetUpdateOp::Delete => "delete",
        }
    }
}

/// What a `set` statement writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetValue {
    /// A constant (`meta mark set 0x10`).
    Value(Elem),
    /// Another mark, optionally combined with a constant: `meta mark set ct mark`,
    /// `meta mark set meta mark | 0x4000` (kube-proxy's `mark set mark or 0x4000`).
    From {
        /// `meta mark` or `ct mark`.
        expr: Expr,
        /// `& M`, `| M` or `^ M`.
        op: Option<(BitOp, u128)>,
    },
}

/// A bitwise operator of [`SetValue::From`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitOp {
    /// `&` (`and`).
    And,
    /// `|` (`or`).
    Or,
    /// `^` (`xor`).
    Xor,
}

impl BitOp {
    /// The symbol nft lists.
    pub fn symbol(self) -> &'static str {
        match self {
            BitOp::And => "&",
            BitOp::Or => "|",
            BitOp::Xor => "^",
        }
    }
}

/// `LEFT op RIGHT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// The packet expression.
    pub left: Expr,
    /// The relational operator (`==` is implicit in the listing).
    pub op: Op,
    /// The value, set or set reference.
    pub right: SetRhs,
}

/// A relational operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// No operator written: equality, for a set "is an element of", and for a flag type
    /// (`ct state`, `tcp flags`) "any of these bits is set".
    Implicit,
    /// `==`: equality (listed only where it differs from [`Op::Implicit`]: flag types and
    /// masked marks).
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `>`.
    Gt,
    /// `<=`.
    Le,
    /// `>=`.
    Ge,
}

/// The right-hand side of a match or the map of a vmap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetRhs {
    /// One value (or prefix, range, flag list, concatenation).
    Value(Elem),
    /// An anonymous set `{ a, b, c }` (a map when its elements carry data).
    Set(Vec<SetElem>),
    /// `@name`: a named set or map of the same table.
    Ref(String),
}

/// An expression that reads the packet or its metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// A header field (`ip saddr`, `tcp dport`, `th dport`, `icmp type`).
    Payload(Payload),
    /// `meta KEY` (or an unqualified key such as `iifname`).
    Meta(MetaKey),
    /// `ct KEY`.
    Ct(CtKey),
    /// `fib FLAGS RESULT`.
    Fib {
        /// Which of saddr, daddr, mark, iif, oif make the lookup key (bits, as [`FIB_FLAGS`]).
        flags: u8,
        /// What it returns.
        result: FibResult,
    },
    /// `numgen random|inc mod N [offset M]`.
    Numgen {
        /// `random` (true) or `inc`.
        random: bool,
        /// The modulus.
        modulus: u32,
        /// Added to the result.
        offset: u32,
    },
    /// `A . B . C`: a concatenation (for sets and maps keyed by several fields).
    Concat(Vec<Expr>),
    /// `EXPR & MASK`: a bitwise and, for marks (listed `meta mark & 0x000000ff == 0x00000001`)
    /// and TCP flags (`tcp flags & (fin | syn | rst | ack) == syn` lists as
    /// `tcp flags syn / fin,syn,rst,ack`, and `== 0` as `tcp flags ! fin,syn`).
    And(Box<Expr>, u128),
}

/// The flags of `fib`, in the order nft prints them.
pub const FIB_FLAGS: [&str; 5] = ["saddr", "daddr", "mark", "iif", "oif"];

/// What `fib` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FibResult {
    /// `oif`: the output interface index (compared with `exists`/`missing` or a name).
    Oif,
    /// `oifname`.
    Oifname,
    /// `type`: the address type (`local`, `unicast`, ...).
    Type,
}

impl FibResult {
    /// The result's name as nft writes it (text and JSON alike).
    pub fn name(self) -> &'static str {
        match self {
            FibResult::Oif => "oif",
            FibResult::Oifname => "oifname",
            FibResult::Type => "type",
        }
    }

    /// The result named `name` (`oif`, `oifname`, `type`), as [`FibResult::name`] writes it.
    pub fn from_name(name: &str) -> Option<FibResult> {
        [FibResult::Oif, FibResult::Oifname, FibResult::Type]
            .into_iter()
            .find(|r| r.name() == name)
    }
}

/// The names of the [`FIB_FLAGS`] set in `flags`, in that order.
pub fn fib_flag_names(flags: u8) -> Vec<&'static str> {
    FIB_FLAGS
        .iter()
        .enumerate()
        .filter(|(b, _)| flags & (1 << b) != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// A header field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Payload {
    /// The header: ip, ip6, tcp, udp, th, icmp, icmpv6.
    pub proto: Proto,
    /// The field name as nft spells it (`saddr`, `dport`, `type`, ...).
    pub field: &'static str,
}

/// A header with fields we model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// IPv4.
    Ip,
    /// IPv6.
    Ip6,
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// `th`: the transport header's ports, whatever the protocol.
    Th,
    /// ICMP.
    Icmp,
    /// ICMPv6.
    Icmpv6,
}

/// A `meta` key (the subset real rulesets use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaKey {
    /// `iif` (interface index; listed by name).
    Iif,
    /// `oif`.
    Oif,
    /// `iifname`.
    Iifname,
    /// `oifname`.
    Oifname,
    /// `meta l4proto`.
    L4proto,
    /// `meta nfproto`.
    Nfproto,
    /// `meta mark`.
    Mark,
    /// `meta pkttype`.
    Pkttype,
    /// `meta skuid`.
    Skuid,
    /// `meta skgid`.
    Skgid,
    /// `meta length`.
    Length,
}

/// A `ct` key (the subset real rulesets use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtKey {
    /// `ct state`.
    State,
    /// `ct status`.
    Status,
    /// `ct mark`.
    Mark,
    /// `ct direction`.
    Direction,
}

/// A typed value (its datatype comes from the expression it is compared with).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    /// A number: addresses, ports, flags, marks, symbolic constants (host order).
    Num(u128),
    /// A string: interface names.
    Str(String),
}

/// One element of a set or one side of a match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Elem {
    /// One value.
    Value(Value),
    /// `ADDR/LEN`.
    Prefix(u128, u8),
    /// `LOW-HIGH`, inclusive.
    Range(Value, Value),
    /// `A . B`: one element of a concatenated type.
    Concat(Vec<Elem>),
}

/// An element of a set or map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetElem {
    /// The key.
    pub key: Elem,
    /// The data of a map element (`key : data`).
    pub data: Option<MapData>,
    /// `timeout T` of this element, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// `expires T`: the time left before a timed element goes, as a kernel listing shows it
    /// (ms). Runtime state: kept so a live `nft list ruleset` reads and lists back as given.
    pub expires_ms: Option<u64>,
    /// `comment "..."` of this element.
    pub comment: Option<String>,
}

/// The data of a map element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapData {
    /// A value of the map's data type.
    Value(Elem),
    /// A verdict (verdict maps).
    Verdict(Verdict),
}

/// A verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `continue`.
    Continue,
    /// `return`.
    Return,
    /// `jump CHAIN`.
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
}

/// `limit rate [over] RATE/UNIT [burst N packets|bytes]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// `over`: match when the rate is exceeded.
    pub over: bool,
    /// The rate (packets, or bytes when `bytes` is set).
    pub rate: u64,
    /// For byte rates: the unit as written (`bytes`, `kbytes`, `mbytes`).
    pub byte_unit: Option<&'static str>,
    /// `second`, `minute`, `hour`, `day`, `week`.
    pub per: &'static str,
    /// The burst (nft lists `burst 5 packets` for packet rates when none was given).
    pub burst: u32,
}

/// `log ...` options, each `None` when not given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    /// `prefix "..."`.
    pub prefix: Option<String>,
    /// `level emerg|alert|crit|err|warn|notice|info|debug|audit` (warn is the default and not listed).
    pub level: Option<&'static str>,
    /// `group N` (nflog).
    pub group: Option<u16>,
    /// `snaplen N`.
    pub snaplen: Option<u32>,
    /// `queue-threshold N`.
    pub queue_threshold: Option<u16>,
    /// `flags ...` as written (`all`, `tcp sequence,options`, `ip options`, `skuid`, `ether`).
    pub flags: Option<String>,
}

/// `reject [with icmp|icmpv6|icmpx CODE | with tcp reset]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reject {
    /// `reject` (the family's default: port-unreachable).
    Default,
    /// `reject with tcp reset`.
    TcpReset,
    /// `reject with icmp CODE`.
    Icmp(u8),
    /// `reject with icmpv6 CODE`.
    Icmpv6(u8),
    /// `reject with icmpx CODE`.
    Icmpx(u8),
}

/// A nat statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nat {
    /// snat, dnat, masquerade or redirect.
    pub kind: NatKind,
    /// `ip`/`ip6` after snat/dnat (needed in inet tables).
    pub family: Option<Family>,
    /// `to ADDR` (a value, range, or `map` expression); `None` for masquerade/redirect.
    pub addr: Option<NatAddr>,
    /// `:PORT` or `:LOW-HIGH`.
    pub port: Option<Elem>,
    /// Flags: `random`, `fully-random`, `persistent` (bits 1, 2, 4 as nft lists them).
    pub flags: u8,
}

/// The address of snat/dnat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NatAddr {
    /// A value, range or prefix.
    Value(Elem),
    /// `KEY map { ... }` / `KEY map @m`: looked up per packet.
    Map {
        /// The lookup key.
        key: Expr,
        /// The map.
        map: SetRhs,
    },
}

/// Which nat statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatKind {
    /// `snat`.
    Snat,
    /// `dnat`.
    Dnat,
    /// `masquerade`.
    Masquerade,
    /// `redirect`.
    Redirect,
}

/// A named set or map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    /// Its name.
    pub name: String,
    /// `map` (elements carry data) rather than `set`.
    pub is_map: bool,
    /// The key type.
    pub key: SetType,
    /// The data type of a map (`None` for a set).
    pub data: Option<SetType>,
    /// `flags` bits: constant 1, interval 2, timeout 4, dynamic 8 (listed as constant,
    /// dynamic, interval, timeout). A set with a `timeout` has the timeout flag, as nft sets it.
    pub flags: u8,
    /// `timeout T` (ms).
    pub timeout_ms: Option<u64>,
    /// `gc-interval T` (ms).
    pub gc_interval_ms: Option<u64>,
    /// `size N`.
    pub size: Option<u32>,
    /// `counter`: every element counts packets.
    pub counter: bool,
    /// `comment "..."`.
    pub comment: Option<String>,
    /// `elements = { ... }`, sorted as nft lists them.
    pub elements: Vec<SetElem>,
    /// Where it was declared.
    pub pos: Pos,
}

/// A set's key or data type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetType {
    /// `type A [. B ...]`.
    Types(Vec<DataType>),
    /// `typeof EXPR`: the type of an expression.
    Typeof(Expr),
    /// `: verdict` of a verdict map.
    Verdict,
}

/// Bits of [`Set::flags`].
pub const SET_FLAGS: [&str; 4] = ["constant", "interval", "timeout", "dynamic"];

// === errors ===

/// A 1-based line and column in the user's text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// 1-based line.
    pub line: u32,
    /// 1-based column (characters).
    pub column: u32,
}

/// A parse error at FILE:LINE:COL of the user's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{}:{}: {kind}{}", pos.line, pos.column, near(token))]
pub struct NftError {
    /// The file name the caller gave.
    pub file: String,
    /// Where.
    pub pos: Pos,
    /// The offending token as written (empty at the end of a line).
    pub token: String,
    /// What is wrong.
    pub kind: ErrorKind,
}

fn near(token: &str) -> String {
    if token.is_empty() {
        String::new()
    } else {
        format!(" (at `{token}`)")
    }
}

impl NftError {
    pub(crate) fn new(file: &str, pos: Pos, token: &str, kind: ErrorKind) -> NftError {
        NftError {
            file: file.to_string(),
            pos,
            token: token.to_string(),
            kind,
        }
    }
}

/// What is wrong with nft text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    /// A `"` without its closing quote on the same line.
    #[error("unterminated string")]
    UnterminatedString,
    /// Something else was expected here.
    #[error("expected {0}")]
    Unexpected(&'static str),
    /// `include`: a request carries one file.
    #[error("`include` is refused: a ruleset is one file; inline the included file")]
    Include,
    /// A family other than ip, ip6, inet.
    #[error("family `{0}` is not supported (ip, ip6 and inet are)")]
    Family(String),
    /// Syntax nft accepts that this model does not (refused rather than dropped).
    #[error("{0} is not supported")]
    Unsupported(String),
    /// A value that is not of the expression's datatype.
    #[error("`{value}` is not a valid {dtype}")]
    BadValue {
        /// The value as written.
        value: String,
        /// The expected datatype's nft name.
        dtype: &'static str,
    },
    /// Syntax that nft refuses too (a combination that cannot work).
    #[error("{0}")]
    Invalid(String),
    /// `$name` with no `define`.
    #[error("undefined variable")]
    UndefinedVariable,
    /// A table, chain or set named twice or not found.
    #[error("{0}")]
    Name(String),
    /// Variables would expand past [`MAX_EXPANDED_TOKENS`], or a set past [`MAX_SET_ELEMENTS`].
    #[error("too large: {0}")]
    TooLarge(String),
}

/// The errors of one text (at least one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftErrors(pub Vec<NftError>);

impl fmt::Display for NftErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NftErrors {}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> NftError {
        parse("rules.nft", text).expect_err("must fail").0.remove(0)
    }

    #[test]
    fn include_and_families_are_refused_at_their_position() {
        let e = err("flush ruleset\n  include \"/etc/nftables.d/*.nft\"\n");
        assert_eq!(
            (e.pos.line, e.pos.column, &e.kind),
            (2, 3, &ErrorKind::Include)
        );
        assert!(
            e.to_string()
                .starts_with("rules.nft:2:3: `include` is refused"),
            "{e}"
        );
        let e = err("table bridge filter {\n}\n");
        assert_eq!(e.kind, ErrorKind::Family("bridge".into()));
        assert_eq!((e.pos.line, e.pos.column), (1, 7));
        assert_eq!(
            err("add table netdev x\n").kind,
            ErrorKind::Family("netdev".into())
        );
    }

    #[test]
    fn unmodelled_expressions_are_refused_by_name_not_dropped() {
        let e = err("table inet t {\n\tchain c {\n\t\ttcp dport 22 meta cpu 1 accept\n\t}\n}\n");
        assert_eq!(e.kind, ErrorKind::Unsupported("`meta cpu`".into()));
        assert_eq!((e.pos.line, e.pos.column), (3, 16));
        let e = err("table ip t {\n\tchain c {\n\t\tquota 10 mbytes drop\n\t}\n}\n");
        assert_eq!(e.kind, ErrorKind::Unsupported("`quota`".into()));
        let e = err("table ip t {\n\tchain c {\n\t\ttcp dport 70000 drop\n\t}\n}\n");
        assert!(
            matches!(
                e.kind,
                ErrorKind::BadValue {
                    dtype: "inet_service",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!((e.pos.line, e.pos.column), (3, 13));
        let e = err("table ip t {\n\tchain c {\n\t\tip protocol udp tcp dport 22\n\t}\n}\n");
        assert_eq!(
            e.kind,
            ErrorKind::Invalid("conflicting protocols specified: udp vs. tcp".into())
        );
        let e = err("table ip t {\n\tchain c {\n\t\tjump nowhere\n\t}\n}\n");
        assert!(matches!(e.kind, ErrorKind::Name(_)), "{e}");
    }

    #[test]
    fn defines_expand_and_nested_defines_are_sized_before_they_grow() {
        let text = "define ports = { 22, 80 }\ndefine lan = 10.0.0.0/8\n\
                    table inet filter {\n\tchain input {\n\t\ttype filter hook input priority 0;\n\
                    \t\tip saddr $lan tcp dport $ports accept\n\t}\n}\n";
        let rs = parse("f", text).expect("parses");
        assert_eq!(
            print(&rs),
            "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\
             \t\tip saddr 10.0.0.0/8 tcp dport { 22, 80 } accept\n\t}\n}\n"
        );
        // 2^40 tokens if expanded: refused at the use that passes the limit, in time
        // proportional to the limit.
        let mut bomb = String::from("define a0 = { 1, 2 }\n");
        for k in 1..40 {
            bomb.push_str(&format!("define a{k} = {{ $a{}, $a{} }}\n", k - 1, k - 1));
        }
        let e = err(&bomb);
        assert!(matches!(e.kind, ErrorKind::TooLarge(_)), "{e}");
        assert_eq!(
            err("table ip t {\n\tchain c {\n\t\tip saddr $nope\n\t}\n}\n").kind,
            ErrorKind::UndefinedVariable
        );
    }

    #[test]
    fn commands_and_priorities_list_as_nft_does() {
        let text = "add table ip nat\n\
                    add chain ip nat post { type nat hook postrouting priority 100; }\n\
                    add chain ip nat out { type nat hook output priority -100; }\n\
                    add chain ip nat pre { type nat hook prerouting priority dstnat + 5; policy accept; }\n\
                    add chain ip nat raw { type filter hook prerouting priority -310; }\n\
                    add rule ip nat post oifname \"eth0\" masquerade\n\
                    insert rule ip nat post ip saddr 10.0.0.0/8 counter\n";
        let rs = parse("f", text).expect("parses");
        assert_eq!(
            print(&rs),
            "table ip nat {\n\
             \tchain post {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip saddr 10.0.0.0/8 counter packets 0 bytes 0\n\t\toifname \"eth0\" masquerade\n\t}\n\n\
             \tchain out {\n\t\ttype nat hook output priority -100; policy accept;\n\t}\n\n\
             \tchain pre {\n\t\ttype nat hook prerouting priority dstnat + 5; policy accept;\n\t}\n\n\
             \tchain raw {\n\t\ttype filter hook prerouting priority raw - 10; policy accept;\n\t}\n}\n"
        );
    }

    #[test]
    fn listing_reparses_to_the_same_model() {
        let text = "table inet fw {\n\
                    \tset blocked { type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 192.168.1.1 } }\n\
                    \tmap svc { type ipv4_addr . inet_proto . inet_service : verdict; }\n\
                    \tchain svc1 { }\n\
                    \tchain input { type filter hook input priority filter; policy drop;\n\
                    \t\tct state established,related accept\n\
                    \t\tct state invalid drop\n\
                    \t\tiif \"lo\" accept\n\
                    \t\tfib saddr . iif oif missing drop\n\
                    \t\tip saddr @blocked drop\n\
                    \t\tip daddr . meta l4proto . th dport vmap @svc\n\
                    \t\tnumgen random mod 2 vmap { 0 : jump svc1, 1 : jump svc1 }\n\
                    \t\tmeta l4proto icmp icmp type echo-request limit rate 10/second accept\n\
                    \t\ttcp flags syn tcp dport 22 log prefix \"ssh \" level info counter accept\n\
                    \t\treject with icmpx admin-prohibited\n\
                    \t}\n}\n";
        let rs = parse("f", text).expect("parses");
        let listing = print(&rs);
        let again = parse("listing", &listing).expect("the listing parses");
        assert_eq!(print(&again), listing);
        assert!(
            listing.contains(
                "\t\ticmp type echo-request limit rate 10/second burst 5 packets accept\n"
            ),
            "{listing}"
        );
        assert!(
            listing.contains("\t\tfib saddr . iif oif missing drop\n"),
            "{listing}"
        );
        assert!(
            listing.contains("\t\treject with icmpx admin-prohibited\n"),
            "{listing}"
        );
    }

    #[test]
    fn comments_and_timeouts_list_where_nft_puts_them() {
        let text = "table ip t { comment \"tc\"\n\tset s { type ipv4_addr; size 100; flags interval; timeout 1m; \
                    comment \"sc\"; elements = { 1.2.3.4 comment \"ec\" } }\n\
                    \tchain c { comment \"cc\"; type filter hook input priority 0; policy accept; }\n}\n";
        let rs = parse("f", text).expect("parses");
        assert_eq!(
            print(&rs),
            "table ip t {\n\tcomment \"tc\"\n\tset s {\n\t\ttype ipv4_addr\n\t\tsize 100\n\
             \t\tflags interval,timeout\n\t\ttimeout 1m\n\t\tcomment \"sc\"\n\
             \t\telements = { 1.2.3.4 comment \"ec\" }\n\t}\n\n\tchain c {\n\t\tcomment \"cc\"\n\
             \t\ttype filter hook input priority filter; policy accept;\n\t}\n}\n"
        );
    }

    #[test]
    fn flag_masks_and_mark_arithmetic_list_as_the_kernel_lists_them() {
        // Each pair was listed by nft v1.0.6 from the kernel (see tests/it/nft_kernel.rs);
        // v1.1 keeps the and-form as written (the py vectors check that).
        let cases = [
            (
                "tcp flags & (syn|ack) == syn|ack accept",
                "tcp flags syn,ack / syn,ack accept",
            ),
            (
                "tcp flags & (fin|syn|rst|ack) != syn drop",
                "tcp flags != syn / fin,syn,rst,ack drop",
            ),
            (
                "tcp flags & (syn|ack) == 0 drop",
                "tcp flags ! syn,ack drop",
            ),
            (
                "tcp flags syn,ack / syn,ack,fin accept",
                "tcp flags syn,ack / fin,syn,ack accept",
            ),
            (
                "tcp flags & syn == syn accept",
                "tcp flags & syn == syn accept",
            ),
            (
                "mark set mark and 0xff",
                "meta mark set meta mark & 0x000000ff",
            ),
            ("ct mark set mark", "ct mark set meta mark"),
            ("mark set ct mark", "meta mark set ct mark"),
            (
                "ct mark set ct mark or 0x10",
                "ct mark set ct mark | 0x00000010",
            ),
            (
                "add @m { ip saddr limit rate 10/second burst 5 packets } accept",
                "add @m { ip saddr limit rate 10/second } accept",
            ),
            (
                "update @m { ip saddr timeout 30s counter }",
                "update @m { ip saddr timeout 30s counter packets 0 bytes 0 }",
            ),
            (
                "ct state vmap { established : accept, related : accept, invalid : drop }",
                "ct state vmap { invalid : drop, established : accept, related : accept }",
            ),
        ];
        for (input, want) in cases {
            let text = format!(
                "table inet t {{\n\tset m {{ type ipv4_addr; flags dynamic,timeout; }}\n\
                 \tchain c {{\n\t\t{input}\n\t}}\n}}\n"
            );
            let rs = parse("f", &text).unwrap_or_else(|e| panic!("{input}: {e}"));
            let listing = print_as(&rs, Dialect::V1_0);
            let rule = listing.lines().rev().nth(2).map(str::trim);
            assert_eq!(rule, Some(want), "{input}");
            let again = json::from_json("j", &to_json(&rs).to_string()).expect("JSON reads back");
            assert_eq!(
                print_as(&again, Dialect::V1_0),
                listing,
                "{input}: JSON round trip"
            );
        }
    }

    /// A live listing (as nft v1.0.6 printed it from the kernel, `expires` included) reads and
    /// lists back byte for byte.
    #[test]
    fn a_live_listing_with_expiring_elements_lists_back_as_given() {
        let live = "table ip t {\n\tcomment \"tc\"\n\tset s {\n\t\ttype ipv4_addr\n\t\tsize 100\n\
                    \t\tflags interval,timeout\n\t\ttimeout 1m\n\t\tcomment \"sc\"\n\
                    \t\telements = { 1.2.3.4 expires 59s988ms comment \"ec\" }\n\t}\n\n\
                    \tchain c {\n\t\tcomment \"cc\"\n\
                    \t\ttype filter hook input priority filter; policy accept;\n\t}\n}\n";
        let rs = parse("live", live).expect("parses");
        assert_eq!(rs.tables[0].sets[0].elements[0].expires_ms, Some(59_988));
        assert_eq!(print(&rs), live);
    }

    /// A kube-proxy-style table of 5,000 services written as kube-proxy writes it, one
    /// `add` command per chain, rule and map element: chains and sets are found by index, and
    /// elements are sorted once, so the cost grows with the text (no scan per command).
    #[test]
    fn five_thousand_services_as_kube_proxy_writes_them() {
        const N: usize = 5_000;
        let mut text = String::from(
            "add table ip kp\nadd map ip kp service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n\
             add chain ip kp services\nadd rule ip kp services ip daddr . meta l4proto . th dport vmap @service-ips\n",
        );
        for k in 0..N {
            let (a, b) = (k / 250, k % 250);
            text.push_str(&format!(
                "add chain ip kp svc-{k}\nadd chain ip kp ep-{k}\n\
                 add rule ip kp svc-{k} numgen random mod 1 vmap {{ 0 : goto ep-{k} }}\n\
                 add rule ip kp ep-{k} meta l4proto tcp dnat to 10.180.{a}.{b}:80\n\
                 add element ip kp service-ips {{ 172.30.{a}.{b} . tcp . 80 : goto svc-{k} }}\n"
            ));
        }
        let rs = parse("kp", &text).expect("parses");
        let t = &rs.tables[0];
        assert_eq!(t.chains.len(), 2 * N + 1);
        assert_eq!(t.sets[0].elements.len(), N);
        let listing = print(&rs);
        let again = parse("listing", &listing).expect("listing parses");
        assert_eq!(again.tables[0].chains.len(), 2 * N + 1);
        let json = json::from_json("json", &to_json(&rs).to_string()).expect("JSON reads back");
        assert_eq!(print(&json), listing);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

        /// Any sequence of nft words parses without panicking; what parses lists as a fixed
        /// point (its listing parses back to the same listing) and survives JSON.
        #[test]
        fn token_soup_never_panics_and_listings_are_fixed_points(
            words in proptest::collection::vec(proptest::sample::select(SOUP), 0..60)
        ) {
            let text = words.join(" ");
            if let Ok(rs) = parse("soup", &text) {
                let listing = print(&rs);
                let again = parse("listing", &listing).map_err(|e| {
                    proptest::test_runner::TestCaseError::fail(format!("{text:?}\n{listing}\n{e}"))
                })?;
                proptest::prop_assert_eq!(print(&again), listing.clone());
                let json = json::from_json("json", &to_json(&rs).to_string()).map_err(|e| {
                    proptest::test_runner::TestCaseError::fail(format!("{text:?}\n{e}"))
                })?;
                proptest::prop_assert_eq!(print(&json), listing);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

        /// Rules made of statements real rulesets use, in any order and family: what parses
        /// lists, and the listing of that listing is a fixed point in text and JSON. (One
        /// round may still change a listing, as in nft: dropping an implied match can make two
        /// header matches adjacent, which nft then merges and orders when it is loaded again.)
        #[test]
        fn rules_of_real_statements_list_as_fixed_points(
            family in proptest::sample::select(&["ip", "ip6", "inet"][..]),
            stmts in proptest::collection::vec(proptest::sample::select(STATEMENTS), 1..7)
        ) {
            // A rule that repeats an implied match (`meta l4proto icmp meta l4proto icmp icmp
            // type 8`) loses one per listing, in nft too (checked on v1.0.6): not a fixed point
            // there either, so repeated statements are left out.
            let mut seen = stmts.clone();
            seen.sort_unstable();
            seen.dedup();
            proptest::prop_assume!(seen.len() == stmts.len());
            let text = format!(
                "table {family} t {{\n\tset s {{ type ipv4_addr; flags interval; }}\n\tchain d {{ }}\n\
                 \tchain c {{ type filter hook input priority 0;\n\t\t{}\n\t}}\n}}\n",
                stmts.join(" ")
            );
            if let Ok(first) = parse("rule", &text) {
                let rs = parse("first listing", &print(&first)).map_err(|e| {
                    proptest::test_runner::TestCaseError::fail(format!("{text}\n{e}"))
                })?;
                let listing = print(&rs);
                let again = parse("listing", &listing).map_err(|e| {
                    proptest::test_runner::TestCaseError::fail(format!("{text}\n{listing}\n{e}"))
                })?;
                proptest::prop_assert_eq!(print(&again), listing.clone(), "{}", text);
                let json = json::from_json("json", &to_json(&rs).to_string()).map_err(|e| {
                    proptest::test_runner::TestCaseError::fail(format!("{text}\n{e}"))
                })?;
                proptest::prop_assert_eq!(print(&json), listing, "{}", text);
            }
        }
    }

    const STATEMENTS: &[&str] = &[
        "tcp dport 22",
        "tcp sport 1",
        "udp dport { 53, 67-68 }",
        "th dport 1-5",
        "ip saddr 10.0.0.0/8",
        "ip daddr 1.2.3.4",
        "ip protocol tcp",
        "ip protocol udp",
        "meta l4proto tcp",
        "meta l4proto icmp",
        "meta nfproto ipv4",
        "meta nfproto ipv6",
        "ip6 saddr ::1",
        "ip6 nexthdr tcp",
        "icmp type echo-request",
        "icmp code 1",
        "icmp type 2",
        "icmpv6 type nd-router-advert",
        "ct state established,related",
        "ct state { new, untracked }",
        "ct status dnat",
        "ct mark 0x1",
        "meta mark & 0xff == 0x1",
        "iifname \"lo\"",
        "oifname != \"eth0\"",
        "ip saddr @s",
        "ip saddr != @s",
        "counter",
        "counter packets 1 bytes 2",
        "limit rate 10/second",
        "limit rate over 1 mbytes/second",
        "log prefix \"x \" level info",
        "tcp flags & (syn | ack) == syn",
        "tcp flags syn / syn,ack",
        "tcp flags ! fin,rst",
        "fib saddr . iif oif missing",
        "fib daddr type local",
        "meta pkttype broadcast",
        "ip daddr . tcp dport { 1.2.3.4 . 80, 5.6.7.8 . 443 }",
        "tcp dport vmap { 22 : accept, 80 : jump d }",
        "numgen random mod 2 vmap { 0 : jump d, 1 : drop }",
        "mark set mark or 0x4000",
        "ct mark set meta mark",
        "notrack",
        "accept",
        "drop",
        "jump d",
        "goto d",
        "return",
        "continue",
        "reject",
        "reject with tcp reset",
        "reject with icmpx admin-prohibited",
        "reject with icmp host-unreachable",
        "reject with icmpv6 no-route",
        "masquerade",
        "snat ip to 1.2.3.4",
        "dnat to 10.0.0.1:80",
        "redirect to :8080",
        "comment \"c\"",
    ];

    const SOUP: &[&str] = &[
        "table",
        "ip",
        "ip6",
        "inet",
        "t",
        "{",
        "}",
        "chain",
        "c",
        "d",
        "type",
        "filter",
        "nat",
        "hook",
        "input",
        "postrouting",
        "priority",
        "0",
        "-10",
        "srcnat",
        ";",
        "policy",
        "drop",
        "accept",
        "tcp",
        "udp",
        "th",
        "dport",
        "sport",
        "22",
        "80",
        "saddr",
        "daddr",
        "10.0.0.0/8",
        "1.2.3.4",
        "::1",
        "set",
        "map",
        "s",
        "@s",
        "ct",
        "state",
        "established",
        ",",
        "related",
        "new",
        "counter",
        "limit",
        "rate",
        "10/second",
        "burst",
        "5",
        "packets",
        "log",
        "prefix",
        "\"x\"",
        "jump",
        "goto",
        "return",
        "meta",
        "mark",
        "0x10",
        "&",
        "==",
        "!=",
        "<",
        "vmap",
        ":",
        "numgen",
        "random",
        "mod",
        "2",
        "fib",
        "oif",
        "missing",
        ".",
        "iif",
        "local",
        "define",
        "$v",
        "v",
        "=",
        "\n",
        "elements",
        "flags",
        "interval",
        "1-5",
        "/",
        "reject",
        "with",
        "icmpx",
        "admin-prohibited",
        "masquerade",
        "snat",
        "to",
        "1.2.3.4:80",
        "ipv4_addr",
        "inet_service",
        "verdict",
        "typeof",
        "(",
        ")",
        "|",
        "!",
        "comment",
        "add",
        "rule",
        "element",
        "flush",
        "ruleset",
        "include",
        "iifname",
        "\"lo\"",
        "icmp",
        "echo-request",
        "l4proto",
        "protocol",
        "6",
        "timeout",
        "30s",
        "syn",
        "flags",
        "or",
        "0x4000",
        "notrack",
        "insert",
        "delete",
        "bridge",
        "$",
    ];
}
