//! `vallum-iptables`: `iptables`, `ip6tables`, `iptables-restore`, `ip6tables-restore`,
//! `iptables-save` and `ip6tables-save` backed by vallumd, one binary chosen by `argv[0]` (as
//! `xtables-nft-multi`), or by its first argument when called as `vallum-iptables`.
//!
//! It finds vallumd through `VALLUM_SERVER` (default: the local socket `unix:/run/vallum/vallumd.sock`
//! when it exists, else `http://127.0.0.1:50051`; `socket.rs`), `VALLUM_TOKEN`,
//! and TLS through `VALLUM_CA`/`VALLUM_CERT`/`VALLUM_KEY`/`VALLUM_TLS_DOMAIN` as vallumctl does
//! (no TLS set-up unless one of them or an `https://` server asks); it writes the ruleset
//! `VALLUM_RULESET` (default `iptables`). Its changes ask for the durability `VALLUM_SYNC`
//! (`full` or `normal`, default `normal`: see [`durability`]).
//!
//! Commands: `-A -I -D -R -N -X -F -P -E` go to `EditRuleset` as one edit; `-C` is a `-D`
//! with `validate_only`; `-S` prints the active revision as iptables -S does, `-L` (with
//! `-n -v -x --line-numbers`) as iptables 1.8 lists it (see [`list`]), `-Z [CHAIN [N]]`
//! zeroes counters (`CounterService.ZeroCounters`). `-t`, `-w`/`-W`, `-4`/`-6` are accepted.
//! Exit codes as iptables 1.8: 0 done, 1 the command failed, 2 usage.
//!
//! Every call waits while vallumd answers NOT_READY (it is still loading its stored state,
//! e.g. right after it printed "listening on"): up to the `-w` seconds (for ever with a bare
//! `-w`, as iptables waits for the xtables lock), else [`DEFAULT_WAIT`]. With `-w` a server
//! that does not accept connections yet is waited for too.

// The crate root is this file: its modules would be looked up beside it, not under
// `iptables/`.
#[path = "iptables/call.rs"]
mod call;
#[path = "iptables/list.rs"]
mod list;
#[path = "socket.rs"]
mod socket;

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use call::{Conn, Refusal};
use vallum_proto::v1 as pb;

/// Separates the IPv6 part of an exported revision (as vallumd's `content::V6_SEPARATOR`).
const V6_SEPARATOR: &str = "# ---- ip6tables-save ----\n";

/// What a failed call prints and exits with.
struct Fail {
    code: u8,
    message: String,
}

fn usage(prog: &str, m: impl std::fmt::Display) -> Fail {
    Fail {
        code: 2,
        message: format!(
            "{prog} v1.8.9 (vallum): {m}\nTry `{prog} -h' or '{prog} --help' for more information."
        ),
    }
}

fn failed(m: impl Into<String>) -> Fail {
    Fail {
        code: 1,
        message: m.into(),
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    let argv0 = args.first().cloned().unwrap_or_default();
    let mut prog = std::path::Path::new(&argv0)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    args.remove(0);
    if prog.starts_with("vallum-iptables") {
        if args.is_empty() {
            eprintln!(
                "usage: vallum-iptables iptables|ip6tables|iptables-save|ip6tables-save|iptables-restore|ip6tables-restore ARGS"
            );
            return ExitCode::from(2);
        }
        prog = args.remove(0);
    }
    let v6 = prog.starts_with("ip6tables");
    let applet = prog
        .trim_start_matches("ip6tables")
        .trim_start_matches("iptables");
    let run = match applet {
        "" => command(&prog, v6, args),
        "-save" => save(&prog, v6, args),
        "-restore" => restore(&prog, v6, args),
        _ => Err(usage(&prog, "unknown applet")),
    };
    match run {
        Ok(out) => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(out.as_bytes());
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("{}", f.message);
            ExitCode::from(f.code)
        }
    }
}

// === talking to vallumd ===

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn ruleset() -> String {
    env("VALLUM_RULESET").unwrap_or_else(|| "iptables".to_owned())
}

/// The durability the changes ask for: `VALLUM_SYNC` (`full` or `normal`), default `normal`
/// (in vallumd's WAL, kept by a crash of vallumd, not fsynced: the kernel's iptables keeps
/// nothing across a power loss either; docs/operations.md "Durability").
fn durability(prog: &str) -> Result<i32, Fail> {
    match env("VALLUM_SYNC").as_deref() {
        None | Some("normal") => Ok(pb::Durability::Normal as i32),
        Some("full") => Ok(pb::Durability::Full as i32),
        Some(v) => Err(failed(format!(
            "{prog}: VALLUM_SYNC={v}: expected full or normal"
        ))),
    }
}

/// How long a call waits while vallumd is not ready without `-w`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

/// How long to wait for vallumd: `-w N` (`Some(N s)`), a bare `-w` (`None`: for ever), or
/// [`DEFAULT_WAIT`] without `-w` (then a refused connection fails at once).
#[derive(Clone, Copy, Debug)]
struct Wait {
    limit: Option<Duration>,
    /// `-w` was given.
    asked: bool,
}

impl Default for Wait {
    fn default() -> Self {
        Wait {
            limit: Some(DEFAULT_WAIT),
            asked: false,
        }
    }
}

/// `-w [SECONDS]` with the argument iterator after it: a bare `-w` waits for ever.
fn wait_option(it: &mut std::iter::Peekable<std::vec::IntoIter<String>>) -> Wait {
    let secs = it.peek().and_then(|n| n.parse::<u64>().ok());
    if secs.is_some() {
        it.next();
    }
    Wait {
        limit: secs.map(Duration::from_secs),
        asked: true,
    }
}

// The methods the drop-in calls.
const EDIT_RULESET: &str = "/vallum.v1.RulesetService/EditRuleset";
const GET_RULESET: &str = "/vallum.v1.RulesetService/GetRuleset";
const EXPORT_REVISION: &str = "/vallum.v1.RulesetService/ExportRevision";
const APPLY: &str = "/vallum.v1.RulesetService/Apply";
const ZERO_COUNTERS: &str = "/vallum.v1.CounterService/ZeroCounters";

/// Runs `f` with a connection to vallumd ([`Conn::open`]).
fn with_client<T>(wait: Wait, f: impl FnOnce(&mut Conn) -> Result<T, Fail>) -> Result<T, Fail> {
    f(&mut Conn::open(wait)?)
}

/// iptables' words for why an edit (`command`, short form) failed.
fn iptables_words(prog: &str, command: &str, s: &Refusal) -> Fail {
    let text = call::text(s);
    let words = if command == "-E" && text.contains("builtin chain cannot be renamed") {
        "No chain/target/match by that name.".to_owned()
    } else if command == "-E" && text.contains("already exists") {
        "File exists.".to_owned()
    } else if text.contains("does a matching rule exist") {
        "Bad rule (does a matching rule exist in that chain?).".to_owned()
    } else if text.contains("already exists") || text.contains("declared twice") {
        "Chain already exists.".to_owned()
    } else if text.contains("does not exist") || text.contains("no chain") {
        "No chain/target/match by that name.".to_owned()
    } else {
        return failed(format!("{prog}: {text}"));
    };
    failed(format!("{prog}: {words}\n({text})"))
}

/// The active revision's iptables-save text of one family ("" when there is none).
fn active_text(c: &mut Conn, v6: bool, counters: bool) -> Result<String, Fail> {
    let name = ruleset();
    let get = pb::GetRulesetRequest {
        name: format!("rulesets/{name}"),
    };
    let rs: pb::Ruleset = match c.call(GET_RULESET, &get) {
        Ok(r) => r,
        Err(s) if s.code == call::NOT_FOUND => return Ok(String::new()),
        Err(s) => return Err(failed(call::text(&s))),
    };
    if rs.active_revision == 0 {
        return Ok(String::new());
    }
    let export = pb::ExportRevisionRequest {
        name: format!("rulesets/{name}/revisions/{}", rs.active_revision),
        format: pb::ExportFormat::IptablesSave as i32,
        counters,
    };
    let out = c
        .call::<_, pb::ExportRevisionResponse>(EXPORT_REVISION, &export)
        .map_err(|s| failed(call::text(&s)))?
        .content;
    let (a, b) = match out.split_once(V6_SEPARATOR) {
        Some((a, b)) => (a.to_owned(), b.to_owned()),
        None => (out, String::new()),
    };
    Ok(if v6 { b } else { a })
}

/// The blocks of `text` for `table` (all with `None`).
fn table_blocks(text: &str, table: Option<&str>) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            out.push((t.to_owned(), Vec::new()));
        } else if line == "COMMIT" || line.starts_with('#') {
            continue;
        } else if let Some((_, lines)) = out.last_mut() {
            lines.push(line.to_owned());
        }
    }
    out.retain(|(t, _)| table.is_none_or(|x| x == t));
    out
}

// === iptables / ip6tables ===

fn command(prog: &str, mut v6: bool, args: Vec<String>) -> Result<String, Fail> {
    let mut table = "filter".to_owned();
    let mut wait = Wait::default();
    let mut listing = list::Format::default();
    let mut cmd: Option<String> = None;
    let mut rest: Vec<String> = Vec::new();
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-t" | "--table" => {
                table = it
                    .next()
                    .ok_or_else(|| usage(prog, "option \"-t\" requires an argument"))?;
            }
            "-w" | "--wait" => wait = wait_option(&mut it),
            "-W" | "--wait-interval" => {
                it.next();
            }
            "-4" | "--ipv4" => v6 = false,
            "-6" | "--ipv6" => v6 = true,
            // As iptables 1.8 (`iptables v1.8.9 (legacy)`): ufw reads the version from it.
            "-V" | "--version" => return Ok(version(prog)),
            "-n" | "--numeric" => listing.numeric = true,
            "-v" | "--verbose" => listing.verbose = true,
            "-x" | "--exact" => listing.exact = true,
            "--line-numbers" => listing.line_numbers = true,
            // Combined short flags as scripts write them (`-nvL`, `-vnxL`).
            s if s.len() > 2
                && s.starts_with('-')
                && !s.starts_with("--")
                && s[1..].chars().all(|c| "nvxL".contains(c))
                && s.contains('L') =>
            {
                for c in s[1..].chars() {
                    match c {
                        'n' => listing.numeric = true,
                        'v' => listing.verbose = true,
                        'x' => listing.exact = true,
                        _ => {}
                    }
                }
                if cmd.is_some() {
                    return Err(usage(prog, "Cannot use more than one command"));
                }
                cmd = Some("-L".to_owned());
            }
            "-A" | "--append" | "-I" | "--insert" | "-D" | "--delete" | "-R" | "--replace"
            | "-C" | "--check" | "-N" | "--new-chain" | "-X" | "--delete-chain" | "-F"
            | "--flush" | "-P" | "--policy" | "-S" | "--list-rules" | "-L" | "--list" | "-Z"
            | "--zero" | "-E" | "--rename-chain" => {
                if cmd.is_some() {
                    return Err(usage(prog, "Cannot use more than one command"));
                }
                cmd = Some(a);
            }
            _ => rest.push(a),
        }
    }
    let Some(cmd) = cmd else {
        return Err(usage(prog, "no command specified"));
    };
    let short = match cmd.as_str() {
        "--append" => "-A",
        "--insert" => "-I",
        "--delete" => "-D",
        "--replace" => "-R",
        "--check" => "-C",
        "--new-chain" => "-N",
        "--delete-chain" => "-X",
        "--flush" => "-F",
        "--policy" => "-P",
        "--list-rules" => "-S",
        "--list" => "-L",
        "--zero" => "-Z",
        "--rename-chain" => "-E",
        s => s,
    };
    match short {
        "-S" => list_rules(wait, &table, v6, rest.first().map(String::as_str)),
        "-L" => list::run(
            wait,
            prog,
            &table,
            v6,
            rest.first().map(String::as_str),
            listing,
        ),
        "-Z" => zero(wait, prog, &table, v6, &rest),
        "-E" if rest.len() != 2 => {
            Err(usage(prog, "-E requires old-chain-name and new-chain-name"))
        }
        _ => {
            let check = short == "-C";
            let mut words = vec![if check {
                "-D".to_owned()
            } else {
                short.to_owned()
            }];
            words.extend(rest);
            let edit = pb::RuleCommand {
                family: if v6 {
                    pb::Family::Ipv6
                } else {
                    pb::Family::Ipv4
                } as i32,
                table,
                args: words,
            };
            let request = pb::EditRulesetRequest {
                ruleset: ruleset(),
                edits: vec![edit],
                validate_only: check,
                message: format!("{prog} {short}"),
                durability: durability(prog)?,
                ..Default::default()
            };
            with_client(wait, |c| {
                c.call::<_, pb::CommitResult>(EDIT_RULESET, &request)
                    .map_err(|s| iptables_words(prog, short, &s))?;
                Ok(String::new())
            })
        }
    }
}

/// `-Z [CHAIN [N]]`: zeroes the counters of the table (a chain, a rule) in vallumd, as
/// iptables -Z: "No chain/target/match by that name." for a missing chain, "Index of counter
/// too big." past the chain's end. A ruleset that does not exist yet has nothing to zero.
fn zero(wait: Wait, prog: &str, table: &str, v6: bool, rest: &[String]) -> Result<String, Fail> {
    let chain = rest.first().cloned().unwrap_or_default();
    let rule = match rest.get(1) {
        Some(n) => n
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| usage(prog, format!("Invalid rule number `{n}'")))?,
        None => 0,
    };
    if rest.len() > 2 {
        return Err(usage(prog, format!("Bad argument `{}'", rest[2])));
    }
    let request = pb::ZeroCountersRequest {
        ruleset: ruleset(),
        family: if v6 {
            pb::Family::Ipv6
        } else {
            pb::Family::Ipv4
        } as i32,
        table: table.to_owned(),
        chain: chain.clone(),
        rule,
    };
    with_client(wait, |c| {
        match c.call::<_, pb::ZeroCountersResponse>(ZERO_COUNTERS, &request) {
            Ok(_) => Ok(String::new()),
            // No such ruleset yet: its tables are empty, with their builtin chains.
            Err(s)
                if s.code == call::NOT_FOUND
                    && !call::text(&s).contains("/chains/")
                    && (chain.is_empty() || builtin(table, &chain)) =>
            {
                if rule != 0 {
                    return Err(failed(format!("{prog}: Index of counter too big.")));
                }
                Ok(String::new())
            }
            Err(s) if s.code == call::NOT_FOUND => Err(failed(format!(
                "{prog}: No chain/target/match by that name."
            ))),
            Err(s) if call::text(&s).contains("Index of counter too big") => {
                Err(failed(format!("{prog}: Index of counter too big.")))
            }
            Err(s) => Err(failed(format!("{prog}: {}", call::text(&s)))),
        }
    })
}

/// Whether `chain` is a builtin chain of `table`.
fn builtin(table: &str, chain: &str) -> bool {
    builtin_chains(table).contains(&chain)
}

/// The builtin chains of `table`, in hook order.
fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        "raw" => &["PREROUTING", "OUTPUT"],
        _ => &["INPUT", "FORWARD", "OUTPUT"],
    }
}

/// `-S [CHAIN]`: `-P` for builtin chains, `-N` for user chains, then the rules, as iptables -S.
fn list_rules(wait: Wait, table: &str, v6: bool, chain: Option<&str>) -> Result<String, Fail> {
    let text = with_client(wait, |c| active_text(c, v6, false))?;
    let mut out = String::new();
    let blocks = table_blocks(&text, Some(table));
    let lines = blocks.first().map(|(_, l)| l.clone()).unwrap_or_else(|| {
        builtin_chains(table)
            .iter()
            .map(|c| format!(":{c} ACCEPT [0:0]"))
            .collect()
    });
    for l in &lines {
        if let Some(decl) = l.strip_prefix(':') {
            let mut w = decl.split(' ');
            let (name, policy) = (w.next().unwrap_or(""), w.next().unwrap_or("-"));
            if chain.is_some_and(|c| c != name) {
                continue;
            }
            if policy == "-" {
                out.push_str(&format!("-N {name}\n"));
            } else {
                out.push_str(&format!("-P {name} {policy}\n"));
            }
        }
    }
    for l in &lines {
        if let Some(rule) = l.strip_prefix("-A ") {
            let name = rule.split(' ').next().unwrap_or("");
            if chain.is_none_or(|c| c == name) {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    Ok(out)
}

/// `-V`: the program, the iptables version whose grammar it speaks, and the backend.
fn version(prog: &str) -> String {
    format!("{prog} v1.8.9 (vallum)\n")
}

// === iptables-save ===

fn save(prog: &str, v6: bool, args: Vec<String>) -> Result<String, Fail> {
    let mut counters = false;
    let mut table = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-c" | "--counters" => counters = true,
            "-t" | "--table" => {
                table = Some(
                    it.next()
                        .ok_or_else(|| usage(prog, "option \"-t\" requires an argument"))?,
                )
            }
            "-4" | "-6" => {}
            "-V" | "--version" => return Ok(version(prog)),
            o => return Err(usage(prog, format!("unknown argument '{o}'"))),
        }
    }
    let text = with_client(Wait::default(), |c| active_text(c, v6, counters))?;
    let mut out = String::new();
    let mut blocks = table_blocks(&text, table.as_deref());
    // `-t TABLE` of a table no call wrote: as the kernel's, which loads the table and prints
    // its builtin chains.
    if let (Some(t), true) = (&table, blocks.is_empty()) {
        if ["filter", "nat", "mangle", "raw", "security"].contains(&t.as_str()) {
            let chains = builtin_chains(t).iter();
            blocks.push((
                t.clone(),
                chains.map(|c| format!(":{c} ACCEPT [0:0]")).collect(),
            ));
        }
    }
    for (t, lines) in blocks {
        out.push_str(&format!("# Generated by {prog} v1.8.9 (vallum)\n*{t}\n"));
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
        out.push_str("COMMIT\n# Completed\n");
    }
    Ok(out)
}

// === iptables-restore ===

fn restore(prog: &str, v6: bool, args: Vec<String>) -> Result<String, Fail> {
    let durability = durability(prog)?;
    let (mut noflush, mut counters, mut test) = (false, false, false);
    let mut file = None;
    let mut wait = Wait::default();
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" | "--noflush" => noflush = true,
            "-c" | "--counters" => counters = true,
            "-t" | "--test" => test = true,
            "-w" | "--wait" => wait = wait_option(&mut it),
            "-W" | "--wait-interval" | "-M" | "--modprobe" | "-T" | "--table" => {
                it.next();
            }
            "-v" | "--verbose" | "-4" | "-6" => {}
            "-V" | "--version" => return Ok(version(prog)),
            o if o.starts_with('-') => return Err(usage(prog, format!("unknown option '{o}'"))),
            f => file = Some(f.to_owned()),
        }
    }
    let mut text = String::new();
    match &file {
        Some(f) => {
            text = std::fs::read_to_string(f).map_err(|e| failed(format!("{prog}: {f}: {e}")))?
        }
        None => {
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| failed(format!("{prog}: stdin: {e}")))?;
        }
    }
    // Without --noflush iptables-restore flushes each table it names (its rules and user
    // chains) and leaves the others: the same as noflush with `-F` and `-X` first.
    if !noflush {
        let mut t = String::with_capacity(text.len() + 64);
        for line in text.lines() {
            t.push_str(line);
            t.push('\n');
            if line.starts_with('*') {
                t.push_str("-F\n-X\n");
            }
        }
        text = t;
    }
    let source = pb::RulesetSource {
        source: Some(pb::ruleset_source::Source::Text(pb::RestoreText {
            content: text,
            family: if v6 {
                pb::Family::Ipv6
            } else {
                pb::Family::Ipv4
            } as i32,
            filename: file.unwrap_or_else(|| "<stdin>".to_owned()),
            noflush: true,
            counters,
            ..Default::default()
        })),
    };
    with_client(wait, |c| {
        let get = pb::GetRulesetRequest {
            name: format!("rulesets/{}", ruleset()),
        };
        let priority = match c.call::<_, pb::Ruleset>(GET_RULESET, &get) {
            Ok(r) => r.priority,
            Err(_) => 0,
        };
        let apply = pb::ApplyRequest {
            ruleset: ruleset(),
            source: Some(source),
            message: prog.to_owned(),
            priority,
            validate_only: test,
            allow_empty: true,
            durability,
            ..Default::default()
        };
        c.call::<_, pb::CommitResult>(APPLY, &apply)
            .map_err(|s| failed(format!("{prog}: {}", call::text(&s))))?;
        Ok(String::new())
    })
}
