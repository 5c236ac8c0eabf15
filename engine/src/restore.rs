//! The iptables-restore text parser and the canonical (iptables-save) printer.
//!
//! [`parse`] reads the text `iptables-restore` (or `ip6tables-restore`, chosen by
//! [`ParseOptions::family`]) accepts: `*table` ... `COMMIT` blocks with `:CHAIN POLICY [p:b]`
//! declarations and `-N/-X/-F/-A/-I/-D/-R/-P` command lines. It follows iptables-restore v1.8.11
//! (legacy backend): see the module docs of the submodules for the option grammar. Errors carry the
//! 1-based line and column of the offending token; every bad line yields at least one error and a
//! text with errors never yields a (partial) ruleset.
//!
//! [`print()`] writes the canonical iptables-save form of tables; [`print_rule_spec`] writes a
//! single rule (the part after `-A CHAIN `), which other code uses as the rule's identity.
//! For every text `t` that parses, `parse(print(parse(t)))` equals `parse(t)` up to locations
//! (checked by the conformance tests and the `restore` fuzz target).
//!
//! What is deliberately NOT checked here (validation, [`crate::validate`], does it): loops,
//! jumps to chains of another table, extensions valid only at some hooks (`-m mac` outside
//! PREROUTING/INPUT/FORWARD), opaque extensions in enforced tables.

mod addrtype;
mod connlimit;
mod ext_options;
pub(crate) mod extensions;
mod hashlimit;
mod header_matches;
mod lexer;
mod nat;
mod opaque;
mod owner;
mod physdev;
mod print;
mod recent;
mod rpfilter;
mod rule;
mod sctp;
mod string;
mod support;
mod tables;
mod u32_match;

use std::fmt;

use crate::echo::clipped;
use crate::model::{Family, Location, Ruleset, Table, TableKind};

pub use lexer::{Token, UnterminatedQuote, tokenize};
pub use print::{
    LineChange, PrintOptions, print, print_changes, print_match_spec, print_rule_spec, print_s,
    print_table,
};
pub(crate) use support::why_not_enforced;
pub use support::{Support, SupportRow, support_markdown, support_table};

/// How to read the text: which tool is emulated and with which flags.
#[derive(Clone, Copy)]
pub struct ParseOptions<'a> {
    /// `Ipv4` reads as `iptables-restore`, `Ipv6` as `ip6tables-restore`: the family of every
    /// table, the address syntax, and which of `-4`/`-6` lines are kept.
    pub family: Family,
    /// As `iptables-restore --noflush`: tables are not flushed first, so commands may name
    /// chains this text never declares (existing state). Such references are recorded in
    /// [`Restore::external`] for validation instead of failing with "Couldn't load target".
    pub noflush: bool,
    /// As `iptables-restore --counters`: keep `[p:b]` / `-c p b` rule counters and builtin policy
    /// counters. Without it they are still syntax-checked but reset to zero, as iptables does.
    pub counters: bool,
    /// Tells whether an ipset exists (`-m set --match-set NAME`); `None` accepts every name
    /// (set existence is then validation's job).
    pub set_exists: Option<&'a dyn Fn(&str) -> bool>,
    /// Looks up the user or group name of `-m owner --uid-owner NAME` / `--gid-owner NAME`
    /// in the host's databases, as iptables does when it loads the rule (`getpwnam` /
    /// `getgrnam`, before reading the word as a number); `None`: names are refused (the
    /// engine reads no host file: vallumd gives the lookup). The rule keeps the number.
    pub resolve_owner: Option<ResolveOwner<'a>>,
    /// The most rules the `-s a,b,...` / `-d a,b,...` lines of one text may stand for, all
    /// together (each line stands for sources x destinations rules, see `AddrLists`). The
    /// product is counted before a line is expanded: a line that would pass the limit fails
    /// with [`ParseErrorKind::TooManyRules`] and is not expanded, so a short text never
    /// builds a huge table. `usize::MAX` (the default) counts without a limit; vallumd
    /// passes `--max-rules`.
    pub max_rules: usize,
}

/// Which host database [`ParseOptions::resolve_owner`] is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerDb {
    /// Users (`--uid-owner`): the uid.
    User,
    /// Groups (`--gid-owner`): the gid.
    Group,
}

/// The lookup of [`ParseOptions::resolve_owner`]: the id of a user or group name, `None` when
/// the host has no such name. `Sync`: the parser's read-ahead threads call it.
pub type ResolveOwner<'a> = &'a (dyn Fn(OwnerDb, &str) -> Option<u32> + Sync);

impl Default for ParseOptions<'_> {
    /// IPv4, no `--noflush`, no `--counters`, every set name accepted, no rule limit.
    fn default() -> Self {
        ParseOptions {
            family: Family::Ipv4,
            noflush: false,
            counters: false,
            set_exists: None,
            resolve_owner: None,
            max_rules: usize::MAX,
        }
    }
}

impl fmt::Debug for ParseOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParseOptions")
            .field("family", &self.family)
            .field("noflush", &self.noflush)
            .field("counters", &self.counters)
            .field("set_exists", &self.set_exists.map(|_| "<fn>"))
            .field("resolve_owner", &self.resolve_owner.map(|_| "<fn>"))
            .field("max_rules", &self.max_rules)
            .finish()
    }
}

/// What a restore text yields: the tables it defines, and (with `--noflush`) what it expects
/// to already exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restore {
    /// Tables in the order of their first `*table` line, each with builtin chains first (hook
    /// order) and user chains sorted by name (the order legacy iptables-save prints).
    pub tables: Vec<Table>,
    /// With [`ParseOptions::noflush`]: every command that names a chain this text does not
    /// declare (it must exist already), in text order. Always empty without `noflush`.
    pub external: Vec<ExternalRef>,
    /// What was accepted but changed on the way, as the kernel changes it (a `--log-prefix`
    /// cut to 29 bytes), in line order.
    pub warnings: Vec<ParseWarning>,
}

/// Something the text asks for that is kept in the form the kernel would keep it, not as
/// written; the ruleset still parses. Callers show it like a validation warning.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{location}: warning: {kind} near '{token}'")]
pub struct ParseWarning {
    /// Line and column of the token.
    pub location: Location,
    /// The token as written.
    pub token: String,
    /// What was changed.
    pub kind: ParseWarningKind,
}

/// The kinds of [`ParseWarning`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseWarningKind {
    /// `--log-prefix` longer than the kernel's 29 bytes (`struct ipt_log_info.prefix` is 30
    /// bytes with its NUL): as iptables (`xtopt_parse_string`), the first 29 bytes are kept
    /// (here cut back to a character boundary, so that the model stays UTF-8).
    #[error("--log-prefix is {len} bytes; the kernel keeps the first 29: {kept:?}")]
    LogPrefixTruncated {
        /// The prefix's length as written, in bytes.
        len: usize,
        /// What is kept.
        kept: String,
    },
    /// A line iptables-restore (legacy, 1.8.9) refuses but that has one clear meaning: a
    /// carriage return at its end (CRLF line ends), a line of blanks, a blank before `*`,
    /// `:`, `#` or `COMMIT`, or a `COMMIT` that is not the whole line or has no newline.
    /// The line is read as if the blanks or the carriage return were not there (the exported
    /// tables are in iptables-save's form, which iptables-restore loads). One warning per
    /// kind, at its first line, counting the others (a CRLF file is one warning).
    #[error(
        "iptables-restore refuses this line ({why}){}; accepted here as if it were not there, and exported in iptables-save's form",
        if *.more > 0 { format!(", and {} more lines like it", .more) } else { String::new() }
    )]
    RestoreRefusesLine {
        /// What iptables-restore trips on.
        why: &'static str,
        /// Further lines of the text with the same quirk.
        more: usize,
    },
    /// `--nflog-prefix` longer than the kernel's 63 bytes (`xt_nflog_info.prefix[64]`): as
    /// iptables-legacy, the first 63 bytes are kept (cut back to a character boundary).
    #[error("--nflog-prefix is {len} bytes; the kernel keeps the first 63: {kept:?}")]
    NflogPrefixTruncated {
        /// The prefix's length as written, in bytes.
        len: usize,
        /// What is kept.
        kept: String,
    },
}

/// A parsed ruleset with the warnings of its text ([`parse_ruleset_warned`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warned {
    /// The ruleset, as [`parse_ruleset_threads`] returns it.
    pub ruleset: Ruleset,
    /// The text's warnings, in line order.
    pub warnings: Vec<ParseWarning>,
}

/// A reference to a chain that must exist outside the parsed text (`--noflush` only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalRef {
    /// Family of the table.
    pub family: Family,
    /// Table the command ran in.
    pub table: TableKind,
    /// The chain name.
    pub chain: String,
    /// What the command did with it.
    pub kind: ExternalRefKind,
    /// Where the chain name was written.
    pub location: Location,
}

/// What a `--noflush` command did with a chain the text does not declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExternalRefKind {
    /// `-j CHAIN`.
    Jump,
    /// `-g CHAIN`.
    Goto,
    /// `-A CHAIN` / `-I CHAIN`: rules were added to an existing chain (the parsed table holds the
    /// chain with only the added rules).
    AddRules,
    /// `-D CHAIN ...` / `-R CHAIN ...` of a rule this text did not create.
    ChangeRule,
    /// `-F CHAIN`.
    Flush,
    /// `-X CHAIN` (also recorded for chains declared in the text, as the kernel's copy goes too).
    Delete,
    /// `:BUILTIN - [p:b]`: the builtin chain keeps its existing policy.
    KeepPolicy,
}

/// One problem in the text, at a line and column, near a token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {kind} near '{}'", clipped(.token))]
pub struct ParseError {
    /// Line and column of the offending token (column 0 when the problem is a missing line).
    pub location: Location,
    /// The offending token (empty at end of line or file).
    pub token: String,
    /// What is wrong.
    pub kind: ParseErrorKind,
}

/// Every error of a text that did not parse, in line order (at least one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseErrors(pub Vec<ParseError>);

impl fmt::Display for ParseErrors {
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

impl std::error::Error for ParseErrors {}

/// The kinds of [`ParseError`]. Messages follow iptables' wording where it has one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    /// A `"` was opened and the line ended first.
    #[error("unterminated quote")]
    UnterminatedQuote,
    /// A line that is neither `*table`, `:chain`, `COMMIT`, a command nor a `#` comment, or a
    /// command line outside a `*table` block.
    #[error("unexpected line: {0}")]
    UnexpectedLine(&'static str),
    /// The text is nftables syntax (`nft list ruleset`: `table inet filter {`, `flush
    /// ruleset`, `add rule ...`), not iptables-restore text; reported once, at its first line,
    /// and nothing after it is read.
    #[error(
        "this is nftables syntax (as `nft list ruleset` prints), not iptables-restore text: \
         give what `iptables-save` (or `iptables-nft-save`) prints; nothing after this line was read"
    )]
    NftablesSyntax,
    /// `*name` with a name that is not filter, raw, nat, mangle or security.
    #[error("unknown table")]
    UnknownTable,
    /// A `*table` block without its `COMMIT` (at end of file or before the next `*table`).
    #[error("table '{}' has no COMMIT line", clipped(.0))]
    MissingCommit(String),
    /// `-t` inside a restore block (iptables-restore adds `-t <table>` itself).
    #[error("the -t option is not allowed in restore input")]
    TableOption,
    /// A command iptables-restore does not accept here (`-L`, `-E`, ...).
    #[error("command not supported in restore input")]
    UnsupportedCommand,
    /// A rule line without `-A/-I/-D/-R/-N/-X/-F/-P`.
    #[error("no command specified")]
    NoCommand,
    /// Two commands on one line.
    #[error("only one command per line")]
    MultipleCommands,
    /// An option without its argument(s).
    #[error("option '{}' requires an argument", clipped(.0))]
    MissingArgument(String),
    /// A word where an option was expected (iptables: "Bad argument").
    #[error("bad argument")]
    BadArgument,
    /// An option no loaded extension knows (iptables: `unknown option "--dport"`).
    #[error("unknown option '{}'", clipped(.0))]
    UnknownOption(String),
    /// An option a known extension does not have.
    #[error("extension '{}' has no option '{}'", clipped(.extension), clipped(.option))]
    UnknownExtensionOption {
        /// The extension (`tcp`, `LOG`).
        extension: String,
        /// The option as written.
        option: String,
    },
    /// `-m NAME` of an extension that does not exist.
    #[error("Couldn't load match '{}'", clipped(.0))]
    UnknownMatch(String),
    /// `-j NAME` that is neither a target nor a chain declared on an earlier line (as
    /// iptables-restore: chains must be declared before they are jumped to); `hint` is the
    /// nearest target or declared chain name, when one is close (`ACCPET` -> `ACCEPT`).
    #[error(
        "chain '{}' is not declared (as iptables-restore: chains must be declared before use){}",
        clipped(.name),
        .hint.as_ref().map(|h| format!("; did you mean '{h}'?")).unwrap_or_default()
    )]
    UnknownTarget {
        /// The name after `-j` / `-g`.
        name: String,
        /// The nearest known target or declared chain.
        hint: Option<String>,
    },
    /// A value that does not parse (port, address, number, name...).
    #[error("invalid {what}: {reason}")]
    InvalidValue {
        /// What was being parsed.
        what: &'static str,
        /// Why it is wrong.
        reason: String,
    },
    /// A hostname where an address is needed. iptables resolves names when it loads the rules
    /// (and keeps whatever addresses DNS gave then); the engine is sans-IO and resolves
    /// nothing, so the text must say the addresses.
    #[error(
        "hostnames are not supported: iptables resolves them once, at load time; write the address(es) instead"
    )]
    Hostname,
    /// `! -s a,b` / `! -d a,b` (as iptables).
    #[error("! not allowed with multiple source or destination IP addresses")]
    NegatedAddressList,
    /// The `-s a,b,...` / `-d a,b,...` lines of the text stand for more rules than
    /// [`ParseOptions::max_rules`] (counted before the line is expanded).
    #[error(
        "-s/-d address lists expand to {count} rules, more than the limit of {max} (--max-rules)"
    )]
    TooManyRules {
        /// Rules the lists up to and including this line stand for (saturating).
        count: usize,
        /// The limit ([`ParseOptions::max_rules`]).
        max: usize,
    },
    /// `-R` with an address list (as iptables).
    #[error("Replacement rule does not specify a unique address")]
    ReplaceWithList,
    /// `-o` in PREROUTING or INPUT, `-i` in POSTROUTING or OUTPUT (as iptables, which checks
    /// the chain's name: "Can't use -o with INPUT").
    #[error("Can't use -{0} with {1}")]
    WrongDirection(char, String),
    /// A name longer than its kernel limit.
    #[error("{what} too long ({max} bytes max)")]
    TooLong {
        /// Chain name, interface, set name, comment, log prefix.
        what: &'static str,
        /// The limit in bytes.
        max: usize,
    },
    /// The same option twice in one extension or rule.
    #[error("multiple '{}' options not allowed", clipped(.0))]
    DuplicateOption(String),
    /// Options that cannot be combined.
    #[error("'{}' cannot be combined with '{}'", clipped(.0), clipped(.1))]
    Conflict(String, String),
    /// `!` before something that cannot be negated, or twice.
    #[error("negation not allowed here")]
    BadNegation,
    /// An extension without one of its mandatory options.
    #[error("extension '{}' needs {needs}", clipped(.extension))]
    MissingOption {
        /// The extension.
        extension: String,
        /// What it needs.
        needs: &'static str,
    },
    /// An extension that needs `-p PROTO` (not negated), as the kernel's protocol check.
    #[error("extension '{}' needs '-p {proto}' (not negated)", clipped(.extension))]
    NeedsProtocol {
        /// The extension.
        extension: String,
        /// The protocol(s) it works with.
        proto: &'static str,
    },
    /// `! -p all`: the rule can never match.
    #[error("rule would never match protocol")]
    NeverMatches,
    /// An extension used in a table where the kernel refuses it.
    #[error("'{}' is only valid in table '{table}'", clipped(.extension))]
    WrongTable {
        /// The extension.
        extension: String,
        /// The table it needs.
        table: &'static str,
    },
    /// `-A/-I/-D/-F/-X/-P` naming a chain that does not exist.
    #[error("chain '{}' does not exist", clipped(.0))]
    NoSuchChain(String),
    /// `-N` of a chain that exists, or a user chain named like a builtin chain or a target.
    #[error("chain '{}' already exists or clashes with a builtin name", clipped(.0))]
    ChainExists(String),
    /// An invalid chain name (empty, or starting with `-` or `!`).
    #[error("invalid chain name")]
    BadChainName,
    /// A policy on a user chain, or a policy that is not ACCEPT or DROP.
    #[error("bad policy (ACCEPT or DROP on a builtin chain, '-' on a user chain)")]
    BadPolicy,
    /// Counters that are not `[packets:bytes]` / `-c PACKETS BYTES`.
    #[error("invalid counters")]
    BadCounters,
    /// `-I/-D/-R` with a rule number outside the chain.
    #[error("index of {} is out of range", clipped(.0))]
    BadRuleNumber(String),
    /// `-D CHAIN rulespec` that matches no rule.
    #[error("bad rule (does a matching rule exist in that chain?)")]
    NoSuchRule,
    /// `-X` of a builtin chain, of a chain still holding rules or still referenced.
    #[error("cannot delete chain '{}': builtin, not empty or still referenced", clipped(.0))]
    ChainInUse(String),
    /// `-g` or `-j` to a builtin chain.
    #[error("cannot jump to builtin chain '{}'", clipped(.0))]
    JumpToBuiltin(String),
    /// `-m set` naming a set the `set_exists` callback does not know.
    #[error("set '{}' does not exist", clipped(.0))]
    NoSuchSet(String),
}

impl ParseWarning {
    pub(crate) fn new(
        line: u32,
        column: u32,
        token: impl Into<String>,
        kind: ParseWarningKind,
    ) -> Self {
        ParseWarning {
            location: Location { line, column },
            token: token.into(),
            kind,
        }
    }
}

impl ParseError {
    pub(crate) fn new(
        line: u32,
        column: u32,
        token: impl Into<String>,
        kind: ParseErrorKind,
    ) -> Self {
        ParseError {
            location: Location { line, column },
            token: token.into(),
            kind,
        }
    }
}

/// Parses an iptables-restore text (see the module docs).
///
/// # Errors
/// Every problem found, at least one per bad line; nothing is returned then.
pub fn parse(text: &str, opts: &ParseOptions<'_>) -> Result<Restore, ParseErrors> {
    tables::parse(text, opts)
}

/// Longest chain name in bytes (XT_EXTENSION_MAXNAMELEN - 1), as iptables.
pub const MAX_CHAIN_NAME: usize = 28;

/// The grammar of chain names, as iptables-restore checks a `:NAME` line: 1 to
/// [`MAX_CHAIN_NAME`] bytes, not starting with `-` or `!`, without whitespace, control
/// characters, `"` or `\` (those could not be written back unambiguously).
///
/// Errors: what is wrong, for a message.
pub fn check_chain_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_CHAIN_NAME {
        Err("a chain name has 1 to 28 bytes")
    } else if name.starts_with(['-', '!']) {
        Err("a chain name must not start with '-' or '!'")
    } else if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\\')
    {
        Err("a chain name has no whitespace, control characters, quotes or backslashes")
    } else {
        Ok(())
    }
}

/// Parses a restore text into a named [`Ruleset`] of priority 0 (no `--noflush`: every chain
/// must be declared). Warnings are dropped: see [`parse_ruleset_warned`].
///
/// # Errors
/// As [`parse`].
pub fn parse_ruleset(
    name: &str,
    text: &str,
    opts: &ParseOptions<'_>,
) -> Result<Ruleset, ParseErrors> {
    parse_ruleset_threads(name, text, opts, 1)
}

/// As [`parse_ruleset_threads`], with the text's warnings ([`Restore::warnings`]), which the
/// other `parse_ruleset*` functions drop: callers that store what users send should use this
/// one and show the warnings.
///
/// # Errors
/// As [`parse`].
pub fn parse_ruleset_warned(
    name: &str,
    text: &str,
    opts: &ParseOptions<'_>,
    threads: usize,
) -> Result<Warned, ParseErrors> {
    let opts = ParseOptions {
        noflush: false,
        ..*opts
    };
    let r = tables::parse_with(text, &opts, threads)?;
    Ok(Warned {
        ruleset: Ruleset {
            name: name.to_string(),
            priority: 0,
            tables: r.tables,
        },
        warnings: r.warnings,
    })
}

/// As [`parse_ruleset`] (warnings dropped: see [`parse_ruleset_warned`]), with the rule lines
/// of a large text (2048 lines or more) tokenized
/// and parsed ahead on up to `threads` scoped threads (at most 8), each over a contiguous run
/// of lines; the commands are then carried out in order on the calling thread. The result,
/// errors included, is the same as [`parse_ruleset`]'s. `threads` <= 1, a small text, or a
/// [`ParseOptions::set_exists`] callback (not required to be `Sync`) parse on the calling
/// thread only.
///
/// # Errors
/// As [`parse`].
pub fn parse_ruleset_threads(
    name: &str,
    text: &str,
    opts: &ParseOptions<'_>,
    threads: usize,
) -> Result<Ruleset, ParseErrors> {
    parse_ruleset_warned(name, text, opts, threads).map(|w| w.ruleset)
}

/// As [`parse_ruleset`]'s tables for `text`, reusing the parse of a previous text:
/// `previous` must be the tables [`parse_ruleset`] (or [`parse_ruleset_threads`]) returned
/// for `previous_text` with the same `opts` (tables of other families are ignored). Only the
/// lines between the texts' common first and last lines are parsed; the unchanged rules are
/// copied with their locations moved. Returns exactly the tables (locations included) a full
/// parse of `text` returns, or `None` when the shortcut does not apply: `previous_text` is
/// not a plain dump (every command line an `-A` that appends one rule, each table and chain
/// declared once, as `iptables-save` writes), the changed lines are not `-A` commands inside
/// one `*table` block, one of them does not parse, names a chain not declared above it, or
/// `opts` has `noflush` or a `set_exists` callback. Parse `text` in full then (which also
/// reports every error with its position).
pub fn parse_after(
    previous_text: &str,
    previous: &[Table],
    text: &str,
    opts: &ParseOptions<'_>,
) -> Option<Vec<Table>> {
    tables::parse_after(previous_text, previous, text, opts)
}

/// As [`parse_after`], when `previous_text` is also the canonical print of `previous`'s tables
/// of the family (`print(.., &PrintOptions::default())` gives it back byte for byte): returns
/// the tables and, when it can be made from `previous_text` by printing only the new rules
/// in place of the changed lines, the canonical print of those tables as a [`TextSplice`] of
/// `previous_text` (applied, exactly what [`print()`] returns for them); `None` for the print
/// otherwise (print them in full).
///
/// Cost: a comparison of the two texts (their common first and last bytes), a count of their
/// newlines, the changed lines and the lines above them in their table block, a copy of the
/// rule chunk lists, and the rules whose lines moved (a change in line count moves the lines
/// of every rule below it). The previous text is trusted to be a plain dump, as a canonical
/// print is: its lines are not read one by one (that pass is [`parse_after`]'s).
pub fn parse_after_canonical(
    previous_text: &str,
    previous: &[Table],
    text: &str,
    opts: &ParseOptions<'_>,
) -> Option<(Vec<Table>, Option<TextSplice>)> {
    tables::reparse(previous_text, previous, text, opts, true)
}

/// A change to a text: bytes `range` of the text replaced by `text`
/// ([`parse_after_canonical`]'s print, as a change to the previous print).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextSplice {
    /// The bytes of the previous text replaced (line boundaries).
    pub range: std::ops::Range<usize>,
    /// What replaces them.
    pub text: String,
}

impl TextSplice {
    /// The text `previous` with this change made. Panics when [`TextSplice::range`] is not a
    /// range of char boundaries of `previous` (it is for the text it was made from).
    pub fn apply(&self, previous: &str) -> String {
        let mut out = String::with_capacity(previous.len() - self.range.len() + self.text.len());
        out.push_str(&previous[..self.range.start]);
        out.push_str(&self.text);
        out.push_str(&previous[self.range.end..]);
        out
    }
}

/// Parses `text` as `iptables-restore --noflush` input applied to `base`: the complete tables
/// of `opts.family` as they are now (tables of the other family are ignored), e.g. the active
/// ruleset's model, as iptables-restore --noflush applies a text to the kernel's tables. Every
/// command sees the base's chains and rules (`-D`/`-R`/`-I N` by number or rule, `-X` of a
/// chain in use, `-N` of one that exists are checked against them), and the result holds
/// every table: the base's in their order, changed or not, then new ones. The base is not
/// parsed or copied: its tables are cloned ([`crate::model::RuleList`] shares its chunks), so
/// the cost is the text's plus one pass over the rules of each table the text names (to count
/// jumps for `-X`), not a parse of the base. Base rules keep their locations; the text's rules
/// have the text's. [`Restore::external`] lists what the text names but neither it nor the
/// base has (a jump to a missing chain, `-X`/`-F` of one, a chain only appended to), for the
/// caller to refuse as iptables-restore --noflush would.
///
/// # Errors
/// As [`parse`].
pub fn parse_onto(
    base: &[Table],
    text: &str,
    opts: &ParseOptions<'_>,
) -> Result<Restore, ParseErrors> {
    tables::parse_onto(base, text, opts)
}

/// Sets every [`Location`] in the tables to the default, so that models parsed from different
/// texts (say, an input and its canonical print) compare equal when they mean the same.
pub fn clear_locations(tables: &mut [Table]) {
    for t in tables {
        t.location = Location::default();
        for c in &mut t.chains {
            c.location = Location::default();
            for r in &mut c.rules {
                r.location = Location::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counters, LogTarget, Policy, Target};

    fn v4() -> ParseOptions<'static> {
        ParseOptions::default()
    }

    fn rules(text: &str, opts: &ParseOptions<'_>, chain: &str) -> Vec<String> {
        let r = parse(text, opts).unwrap_or_else(|e| panic!("parse failed: {e}"));
        r.tables[0]
            .chain(chain)
            .map(|c| {
                c.rules
                    .iter()
                    .map(|r| print_rule_spec(r, opts.family))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn errors(text: &str, opts: &ParseOptions<'_>) -> Vec<String> {
        match parse(text, opts) {
            Ok(r) => panic!("expected errors, got {r:?}"),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn error_display_has_line_column_and_token() {
        let e = errors("*filter\n-A INPUT -p tcp --dport 99999\nCOMMIT\n", &v4());
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("2:25: invalid port"), "{}", e[0]);
        assert!(e[0].ends_with("near '99999'"), "{}", e[0]);
    }

    #[test]
    fn nftables_input_is_one_error_that_says_so() {
        let text = "#!/usr/sbin/nft -f\nflush ruleset\n\ntable inet filter {\n\
                    \tchain input {\n\t\ttype filter hook input priority filter; policy drop;\n\
                    \t\tct state established,related accept\n\t\ttcp dport 22 accept\n\t}\n}\n";
        let e = errors(text, &v4());
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("2:1: this is nftables syntax") && e[0].contains("iptables-save"),
            "{}",
            e[0]
        );
        let e = errors("table ip nat {\n}\n", &v4());
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("nftables syntax"), "{}", e[0]);
        // An iptables command outside a block is not taken for nft.
        let e = errors("-A INPUT -j ACCEPT\n", &v4());
        assert!(e[0].contains("outside a *table block"), "{}", e[0]);
    }

    #[test]
    fn unknown_target_suggests_the_nearest_target_or_chain() {
        let text = "*filter\n:MY-CHAIN - [0:0]\n-A INPUT -j ACCPET\n-A INPUT -j accept\n\
                    -A INPUT -j MY-CHIAN\n-A INPUT -j QWERTY\nCOMMIT\n";
        let e = errors(text, &v4());
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(
            e[0].starts_with("3:13: chain 'ACCPET' is not declared")
                && e[0].contains("did you mean 'ACCEPT'?"),
            "{}",
            e[0]
        );
        assert!(e[1].contains("did you mean 'ACCEPT'?"), "{}", e[1]);
        assert!(e[2].contains("did you mean 'MY-CHAIN'?"), "{}", e[2]);
        assert!(!e[3].contains("did you mean"), "{}", e[3]);
    }

    #[test]
    fn collects_one_error_per_bad_line_and_no_partial_result() {
        let text = "*filter\n-A INPUT -j NOPE\n-A INPUT -j ACCEPT\n-A INPUT -m nosuch\nCOMMIT\n";
        let e = errors(text, &v4());
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].starts_with("2:13: chain 'NOPE' is not declared"),
            "{}",
            e[0]
        );
        assert!(!e[0].contains("did you mean"), "{}", e[0]);
        assert!(
            e[1].starts_with("4:13: Couldn't load match 'nosuch'"),
            "{}",
            e[1]
        );
    }

    #[test]
    fn missing_commit_and_lines_outside_tables() {
        let e = errors("-A INPUT -j ACCEPT\n*filter\n", &v4());
        assert!(e[0].starts_with("1:1: unexpected line"), "{e:?}");
        assert!(e[1].contains("no COMMIT"), "{e:?}");
        // At the end of the text (line 4, column 1: after the last newline; columns are
        // 1-based).
        let e = errors("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n", &v4());
        assert!(
            e[0].starts_with("4:1: table 'filter' has no COMMIT line"),
            "{e:?}"
        );
    }

    /// Tokens are echoed with control characters escaped and cut when long: a message stays
    /// one short line whatever the text holds.
    #[test]
    fn echoed_tokens_are_escaped_and_cut() {
        let e = errors("*filter\n-A INPUT -j AC\0CEPT\nCOMMIT\n", &v4());
        assert!(e[0].contains("'AC\\0CEPT'"), "{e:?}");
        assert!(!e[0].contains('\0'), "{e:?}");
        let long = "x".repeat(10_000);
        let e = errors(&format!("*filter\n-A INPUT --{long} 1\nCOMMIT\n"), &v4());
        assert!(e[0].len() < 400, "{} bytes: {}", e[0].len(), &e[0][..400]);
        assert!(e[0].contains("(10002 bytes)"), "{e:?}");
    }

    #[test]
    fn chains_must_be_declared_before_use() {
        let text = "*filter\n-A INPUT -j LATER\n:LATER - [0:0]\nCOMMIT\n";
        assert!(parse(text, &v4()).is_err());
        let ok = "*filter\n:LATER - [0:0]\n-A INPUT -j LATER\nCOMMIT\n";
        assert_eq!(rules(ok, &v4(), "INPUT"), ["-j LATER"]);
        // With --noflush the jump is recorded for validation instead.
        let nf = ParseOptions {
            noflush: true,
            ..v4()
        };
        let r = parse(text, &nf).expect("noflush accepts");
        assert_eq!(r.external[0].chain, "LATER");
        assert_eq!(r.external[0].kind, ExternalRefKind::Jump);
    }

    #[test]
    fn insert_positions() {
        let text = "*filter\n-A INPUT -j ACCEPT\n-I INPUT -j DROP\n-I INPUT 3 -j RETURN\n-I INPUT 2 -p tcp\nCOMMIT\n";
        assert_eq!(
            rules(text, &v4(), "INPUT"),
            ["-j DROP", "-p tcp", "-j ACCEPT", "-j RETURN"]
        );
        let e = errors("*filter\n-I INPUT 2 -j DROP\nCOMMIT\n", &v4());
        assert!(e[0].contains("index of 2 is out of range"), "{e:?}");
        let e = errors("*filter\n-I INPUT 0 -j DROP\nCOMMIT\n", &v4());
        assert!(e[0].starts_with("2:10:"), "{e:?}");
    }

    #[test]
    fn delete_by_number_and_by_spec() {
        let text = "*filter\n-A INPUT -j ACCEPT\n-A INPUT -p udp -j DROP\n-A INPUT -j RETURN\n\
                    -D INPUT 1\n-D INPUT -p udp -j DROP\nCOMMIT\n";
        assert_eq!(rules(text, &v4(), "INPUT"), ["-j RETURN"]);
        let e = errors(
            "*filter\n-A INPUT -j ACCEPT\n-D INPUT -j DROP\nCOMMIT\n",
            &v4(),
        );
        assert!(e[0].contains("bad rule"), "{e:?}");
        let e = errors("*filter\n-D INPUT 1\nCOMMIT\n", &v4());
        assert!(e[0].contains("out of range"), "{e:?}");
    }

    #[test]
    fn counters_prefix_and_option() {
        let text = "*filter\n:INPUT DROP [3:4]\n[1:2] -A INPUT -j ACCEPT\n-A INPUT -c 5 6 -j DROP\nCOMMIT\n";
        let with = ParseOptions {
            counters: true,
            ..v4()
        };
        let r = parse(text, &with).expect("parses");
        let c = r.tables[0].chain("INPUT").expect("INPUT");
        assert_eq!(c.policy, Some(Policy::Drop));
        assert_eq!(
            c.counters,
            Counters {
                packets: 3,
                bytes: 4
            }
        );
        assert_eq!(
            c.rules[0].counters,
            Some(Counters {
                packets: 1,
                bytes: 2
            })
        );
        assert_eq!(
            c.rules[1].counters,
            Some(Counters {
                packets: 5,
                bytes: 6
            })
        );
        assert_eq!(
            print(&r.tables, &PrintOptions { counters: true }),
            "*filter\n:INPUT DROP [3:4]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
             [1:2] -A INPUT -j ACCEPT\n[5:6] -A INPUT -j DROP\nCOMMIT\n"
        );
        // Without --counters they are checked but dropped.
        let r = parse(text, &v4()).expect("parses");
        let c = r.tables[0].chain("INPUT").expect("INPUT");
        assert_eq!(c.counters, Counters::default());
        assert_eq!(c.rules[0].counters, None);
        assert!(parse("*filter\n[1:x] -A INPUT\nCOMMIT\n", &v4()).is_err());
        assert!(parse("*filter\n:INPUT ACCEPT [1]\nCOMMIT\n", &v4()).is_err());
    }

    #[test]
    fn implicit_protocol_match_and_canonical_order() {
        let text = "*filter\n-A INPUT -m comment --comment \"a b\" -p tcp --dport 22 ! -s 10.1.2.3/8 -j ACCEPT\nCOMMIT\n";
        assert_eq!(
            rules(text, &v4(), "INPUT"),
            ["! -s 10.0.0.0/8 -p tcp -m comment --comment \"a b\" -m tcp --dport 22 -j ACCEPT"]
        );
    }

    #[test]
    fn opaque_extensions_round_trip_and_known_ones_reject_unknown_options() {
        let text = "*nat\n-A POSTROUTING -m addrtype ! --src-type LOCAL -j SNAT --to-source 192.0.2.1 --random\nCOMMIT\n";
        assert_eq!(
            rules(text, &v4(), "POSTROUTING"),
            ["-m addrtype ! --src-type LOCAL -j SNAT --to-source 192.0.2.1 --random"]
        );
        let e = errors("*filter\n-A INPUT -p udp -m udp --flags x\nCOMMIT\n", &v4());
        assert!(
            e[0].contains("extension 'udp' has no option '--flags'"),
            "{e:?}"
        );
    }

    #[test]
    fn hostnames_and_name_limits() {
        let e = errors("*filter\n-A INPUT -s example.com\nCOMMIT\n", &v4());
        assert!(
            e[0].contains("hostnames are not supported: iptables resolves them once, at load time"),
            "{e:?}"
        );
        let e = errors("*filter\n-A INPUT -s 10.0.0.1,localhost\nCOMMIT\n", &v4());
        assert!(e[0].contains("hostnames are not supported"), "{e:?}");
        let long = "c".repeat(29);
        assert!(parse(&format!("*filter\n:{long} - [0:0]\nCOMMIT\n"), &v4()).is_err());
        let ok = "c".repeat(28);
        assert!(parse(&format!("*filter\n:{ok} - [0:0]\nCOMMIT\n"), &v4()).is_ok());
        let set = "s".repeat(32);
        assert!(
            parse(
                &format!("*filter\n-A INPUT -m set --match-set {set} src\nCOMMIT\n"),
                &v4()
            )
            .is_err()
        );
    }

    #[test]
    fn address_lists_expand_like_iptables() {
        let text = "*filter\n-A INPUT -s 10.0.0.1,10.0.0.2 -d 1.1.1.1,0/0 -j DROP\nCOMMIT\n";
        assert_eq!(
            rules(text, &v4(), "INPUT"),
            [
                "-s 10.0.0.1/32 -d 1.1.1.1/32 -j DROP",
                "-s 10.0.0.1/32 -j DROP",
                "-s 10.0.0.2/32 -d 1.1.1.1/32 -j DROP",
                "-s 10.0.0.2/32 -j DROP",
            ]
        );
        let e = errors("*filter\n-A INPUT ! -s 1.1.1.1,2.2.2.2\nCOMMIT\n", &v4());
        assert!(
            e[0].starts_with("2:12: ! not allowed with multiple source"),
            "{e:?}"
        );
        let e = errors(
            "*filter\n-A INPUT -s 1.1.1.1\n-R INPUT 1 -s 1.1.1.1,2.2.2.2\nCOMMIT\n",
            &v4(),
        );
        assert!(
            e[0].contains("Replacement rule does not specify a unique address"),
            "{e:?}"
        );
        // The read-ahead parser of large texts expands them the same way.
        let mut big = String::from("*filter\n");
        for i in 0..3000 {
            big.push_str(&format!(
                "-A INPUT -s 10.0.{}.{},192.0.2.1 -j ACCEPT\n",
                i / 250,
                i % 250
            ));
        }
        big.push_str("COMMIT\n");
        let one = parse_ruleset("a", &big, &v4()).expect("parses");
        let four = parse_ruleset_threads("a", &big, &v4(), 4).expect("parses");
        assert_eq!(one, four);
        assert_eq!(one.tables[0].chains[0].rules.len(), 6000);
    }

    #[test]
    fn interfaces_the_chain_cannot_see_are_refused_like_iptables() {
        let e = errors("*filter\n-A INPUT -p tcp -o eth0\nCOMMIT\n", &v4());
        assert!(e[0].starts_with("2:17: Can't use -o with INPUT"), "{e:?}");
        let e = errors(
            "*nat\n-A POSTROUTING -i eth0 -j MASQUERADE\nCOMMIT\n",
            &v4(),
        );
        assert!(e[0].contains("Can't use -i with POSTROUTING"), "{e:?}");
        // User chains are not checked (iptables goes by the chain's name).
        let ok = "*filter\n:U - [0:0]\n-A U -o eth0\n-A FORWARD -i eth1 -o eth0\nCOMMIT\n";
        assert_eq!(rules(ok, &v4(), "U"), ["-o eth0"]);
    }

    #[test]
    fn long_log_prefixes_are_cut_like_the_kernel_with_a_warning() {
        let text =
            "*filter\n-A INPUT -j LOG --log-prefix \"[UFW BLOCK] a very long prefix \"\nCOMMIT\n";
        let r = parse(text, &v4()).expect("parses");
        assert_eq!(
            print_rule_spec(&r.tables[0].chains[0].rules[0], Family::Ipv4),
            "-j LOG --log-prefix \"[UFW BLOCK] a very long prefi\""
        );
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        let w = r.warnings[0].to_string();
        assert!(
            w.starts_with("2:30: warning: --log-prefix is 31 bytes; the kernel keeps the first 29"),
            "{w}"
        );
        let warned = parse_ruleset_warned("a", text, &v4(), 1).expect("parses");
        assert_eq!(warned.warnings, r.warnings);
        // Cut at a character boundary: 28 ASCII bytes and a 2-byte character.
        let text = format!(
            "*filter\n-A INPUT -j LOG --log-prefix {}é\nCOMMIT\n",
            "a".repeat(28)
        );
        let r = parse(&text, &v4()).expect("parses");
        assert_eq!(
            r.tables[0].chains[0].rules[0].target,
            Target::Log(LogTarget {
                prefix: Some("a".repeat(28)),
                ..LogTarget::default()
            })
        );
        // 29 bytes: no warning.
        let text = format!(
            "*filter\n-A INPUT -j LOG --log-prefix {}\nCOMMIT\n",
            "a".repeat(29)
        );
        assert!(parse(&text, &v4()).expect("parses").warnings.is_empty());
    }

    #[test]
    fn family_prefixes() {
        let text =
            "*filter\n-6 -A INPUT -s ::1 -j ACCEPT\n-4 -A INPUT -s 127.0.0.1 -j ACCEPT\nCOMMIT\n";
        assert_eq!(rules(text, &v4(), "INPUT"), ["-s 127.0.0.1/32 -j ACCEPT"]);
        let v6 = ParseOptions {
            family: Family::Ipv6,
            ..v4()
        };
        assert_eq!(rules(text, &v6, "INPUT"), ["-s ::1/128 -j ACCEPT"]);
    }

    const ONTO_BASE: &str = "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:X - [0:0]\n\
        -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n-A INPUT -j X\n-A X -s 10.0.0.0/8 -j DROP\nCOMMIT\n\
        *nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
        -A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE\nCOMMIT\n";

    #[test]
    fn parse_onto_applies_commands_to_known_tables() {
        let base = parse(ONTO_BASE, &v4()).expect("base parses").tables;
        let text = "*filter\n-I INPUT 2 -p tcp --dport 80 -j ACCEPT\n-D INPUT -p tcp --dport 22 -j ACCEPT\n\
                    -N Y\n-A Y -j RETURN\n-R X 1 -s 10.0.0.0/8 -j REJECT\n-P FORWARD DROP\nCOMMIT\n";
        let r = parse_onto(&base, text, &v4()).expect("applies");
        assert!(r.external.is_empty(), "{:?}", r.external);
        let want = "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:X - [0:0]\n:Y - [0:0]\n\
                    -A INPUT -p tcp -m tcp --dport 80 -j ACCEPT\n-A INPUT -j X\n\
                    -A X -s 10.0.0.0/8 -j REJECT --reject-with icmp-port-unreachable\n-A Y -j RETURN\nCOMMIT\n\
                    *nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
                    -A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE\nCOMMIT\n";
        assert_eq!(print(&r.tables, &PrintOptions::default()), want);
        // The new rule has the text's location; the untouched nat table is the base's.
        assert_eq!(r.tables[0].chains[0].rules[0].location.line, 2);
        assert_eq!(r.tables[1], base[1]);
        // A table the base lacks starts empty, its builtin chains known.
        let r = parse_onto(&base, "*raw\n-A PREROUTING -j NOTRACK\nCOMMIT\n", &v4()).expect("raw");
        assert!(r.external.is_empty(), "{:?}", r.external);
        assert_eq!(r.tables.len(), 3);
        assert_eq!(r.tables[2].kind, TableKind::Raw);
    }

    #[test]
    fn parse_onto_checks_commands_against_the_base() {
        let base = parse(ONTO_BASE, &v4()).expect("base parses").tables;
        for (text, want) in [
            ("-D INPUT 3", "out of range"),
            ("-I INPUT 4 -j DROP", "out of range"),
            ("-R INPUT 3 -j DROP", "out of range"),
            ("-D INPUT -p udp -j ACCEPT", "matching rule"),
            ("-X X", "still referenced"),
            ("-N X", "exists"),
            ("-I OUTPUT 2 -j DROP", "out of range"),
            // The base is the whole table: a chain it lacks does not exist (as iptables).
            ("-X ALSO", "does not exist"),
        ] {
            let full = format!("*filter\n{text}\nCOMMIT\n");
            let e = match parse_onto(&base, &full, &v4()) {
                Ok(r) => panic!("{text}: applied: {:?}", r.external),
                Err(e) => e.to_string(),
            };
            assert!(e.to_lowercase().contains(want), "{text}: {e}");
        }
        // What neither the text nor the base has is left to the caller, as with --noflush.
        let r = parse_onto(
            &base,
            "*filter\n-A NOPE -j ACCEPT\n-A INPUT -j GONE\nCOMMIT\n",
            &v4(),
        )
        .expect("parses");
        let kinds: Vec<(&str, ExternalRefKind)> = r
            .external
            .iter()
            .map(|e| (e.chain.as_str(), e.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("NOPE", ExternalRefKind::AddRules),
                ("GONE", ExternalRefKind::Jump),
            ]
        );
    }

    #[test]
    fn rename_chain_moves_its_references() {
        let base = parse(ONTO_BASE, &v4()).expect("base parses").tables;
        let r = parse_onto(&base, "*filter\n-E X Y\nCOMMIT\n", &v4()).expect("renames");
        let text = print(&r.tables[..1], &PrintOptions::default());
        assert!(text.contains(":Y - [0:0]\n"), "{text}");
        assert!(
            text.contains("-A INPUT -j Y\n-A Y -s 10.0.0.0/8 -j DROP\n"),
            "{text}"
        );
        assert!(!text.contains(" X"), "{text}");
        // The renamed chain is in use under its new name, and the old one is gone.
        let r = parse_onto(&r.tables, "*filter\n-X Y\nCOMMIT\n", &v4());
        assert!(r.is_err());
        for (text, want) in [
            ("-E INPUT Z", "builtin"),
            ("-E NOPE Z", "nope"),
            ("-E X INPUT", "exists"),
            ("-E X ACCEPT", "exists"),
            ("-E X", "option"),
        ] {
            let full = format!("*filter\n{text}\nCOMMIT\n");
            let e = match parse_onto(&base, &full, &v4()) {
                Ok(_) => panic!("{text}: applied"),
                Err(e) => e.to_string().to_lowercase(),
            };
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// 1,500 rules over four filter chains and a raw table: the base the print tests edit.
    fn edit_fixture() -> String {
        let mut text = String::from(
            "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n",
        );
        for i in 0..1500 {
            let chain = ["INPUT", "A", "B", "OUTPUT"][i % 7 % 4];
            text.push_str(&format!(
                "-A {chain} -s 10.{}.{}.0/24 -p tcp -m tcp --dport {} -j ACCEPT\n",
                i / 256,
                i % 256,
                i % 1000 + 1
            ));
        }
        text.push_str("COMMIT\n*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -j NOTRACK\nCOMMIT\n");
        text
    }

    #[test]
    fn chain_targets_are_counted_from_the_base_when_asked() {
        let base = "*filter\n:INPUT ACCEPT [0:0]\n:C - [0:0]\n:D - [0:0]\n-A INPUT -j C\n-A INPUT -p tcp -j ACCEPT\n-A C -j D\nCOMMIT\n";
        let old = parse(base, &v4()).expect("parses").tables;
        let onto = |t: &str| parse_onto(&old, &format!("*filter\n{t}\nCOMMIT\n"), &v4());
        let in_use = |t: &str| match onto(t) {
            Err(e) => {
                e.0.iter()
                    .any(|e| matches!(e.kind, ParseErrorKind::ChainInUse(_)))
            }
            Ok(_) => false,
        };
        assert!(in_use("-F C\n-X C"), "INPUT jumps to C");
        assert!(onto("-D INPUT -j C\n-F C\n-X C").is_ok());
        assert!(in_use("-F D\n-X D"), "C jumps to D");
        assert!(onto("-F C\n-X D").is_ok());
        assert!(
            in_use("-E C E\n-F E\n-X E"),
            "INPUT jumps to the renamed chain"
        );
        assert!(onto("-A INPUT -p udp -j ACCEPT\n-F\n-X C\n-X D").is_ok());
    }

    /// [`print_changes`] applied to the old print gives the new print, for edits of every
    /// shape (insert, append, delete, replace, flush, chains created and deleted, a policy,
    /// two tables at once), and counts the old print's lines; nothing changed is no change;
    /// tables added is `None`.
    #[test]
    fn print_changes_make_the_new_print() {
        let text = edit_fixture();
        let mut old = parse(&text, &v4()).expect("parses").tables;
        let mut old_text = print(&old, &PrintOptions::default());
        let edits = [
            "-I INPUT 1 -j DROP",
            "-A B -j RETURN",
            "-D A 7",
            "-R INPUT 100 -s 1.2.3.4 -j DROP",
            "-F B",
            "-N C\n-A C -j ACCEPT\n-A INPUT -j C",
            "-N AA\n-A AA -j DROP\n-N Z\n-A B -j Z",
            "-D INPUT -j C\n-F C\n-X C\n-F AA\n-X AA",
            "-P INPUT ACCEPT",
            "-I OUTPUT 200 -p udp -j ACCEPT",
            "-D OUTPUT 1\n-D OUTPUT 1\n-A OUTPUT -j DROP",
            "-F INPUT",
            "-A INPUT -j ACCEPT",
        ];
        for (k, e) in edits.iter().enumerate() {
            let t = if k % 3 == 2 {
                "*raw\n-A OUTPUT -j NOTRACK\nCOMMIT\n*filter"
            } else {
                "*filter"
            };
            let t = format!("{t}\n{e}\nCOMMIT\n");
            let new = parse_onto(&old, &t, &v4())
                .unwrap_or_else(|x| panic!("{e}: {x}"))
                .tables;
            let want = print(&new, &PrintOptions::default());
            let (changes, lines) = print_changes(&old, &new).expect("same tables");
            assert_eq!(lines, old_text.lines().count(), "{e}");
            let old_lines: Vec<&str> = old_text.split_inclusive('\n').collect();
            let mut got = String::new();
            let mut at = 0;
            for c in &changes {
                assert!(c.line >= at, "{e}: changes in order");
                got.extend(old_lines[at..c.line].iter().copied());
                got.push_str(&c.text);
                at = c.line + c.old_lines;
            }
            got.extend(old_lines[at..].iter().copied());
            assert_eq!(got, want, "{e}");
            // Only what changed is printed: a one-rule edit prints at most a rule or a head.
            if !e.contains('\n') && !e.starts_with("-F") {
                let printed: usize = changes.iter().map(|c| c.text.lines().count()).sum();
                assert!(printed <= 8, "{e}: {printed} lines printed");
            }
            old = new;
            old_text = want;
        }
        assert_eq!(
            print_changes(&old, &old),
            Some((Vec::new(), old_text.lines().count()))
        );
        let more = parse_onto(&old, "*nat\n-A OUTPUT -j ACCEPT\nCOMMIT\n", &v4())
            .expect("parses")
            .tables;
        assert_eq!(print_changes(&old, &more), None);
    }

    /// Lines iptables-restore refuses are accepted with one warning per quirk at its first
    /// line, counting the others; the model is the one without the quirks.
    #[test]
    fn restore_quirks_are_warned_once_per_kind() {
        let crlf = "*filter\r\n-A INPUT -j ACCEPT\r\n-A INPUT -j DROP\r\nCOMMIT\r\n";
        let r = parse(crlf, &v4()).expect("accepted");
        let w: Vec<String> = r.warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(
            w,
            [
                "1:8: warning: iptables-restore refuses this line (a carriage return at its end \
                 (CRLF line ends), which it reads as part of the last word), and 2 more lines \
                 like it; accepted here as if it were not there, and exported in \
                 iptables-save's form near '\\r'",
                "4:1: warning: iptables-restore refuses this line (COMMIT must be the whole \
                 line, ended by a newline); accepted here as if it were not there, and \
                 exported in iptables-save's form near 'COMMIT'",
            ]
        );
        let plain = parse(
            "*filter\n-A INPUT -j ACCEPT\n-A INPUT -j DROP\nCOMMIT\n",
            &v4(),
        )
        .expect("parses");
        assert_eq!(r.tables, plain.tables);
        assert!(plain.warnings.is_empty());
        // A line of blanks after COMMIT, and a blank before it.
        let r = parse("*filter\n-A INPUT -j ACCEPT\n COMMIT\n  \n", &v4()).expect("accepted");
        let kinds: Vec<(u32, &str)> = r
            .warnings
            .iter()
            .filter_map(|w| match w.kind {
                ParseWarningKind::RestoreRefusesLine { why, .. } => Some((w.location.line, why)),
                _ => None,
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (3, "a blank before *, :, # or COMMIT"),
                (
                    4,
                    "a line of blanks, which it reads as a rule line without a command"
                )
            ]
        );
    }
}
