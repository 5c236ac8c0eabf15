//! `vallum-iptables`: `iptables`, `ip6tables`, `iptables-restore`, `ip6tables-restore`,
//! `iptables-save` and `ip6tables-save` backed by vallumd, one binary chosen by argv[0] (as
//! `xtables-nft-multi`), or by its first argument when called as `vallum-iptables`.
//!
//! It finds vallumd through `VALLUM_SERVER` (default `http://127.0.0.1:50051`), `VALLUM_TOKEN`,
//! and TLS through `VALLUM_CA`/`VALLUM_CERT`/`VALLUM_KEY`/`VALLUM_TLS_DOMAIN` as vallumctl does
//! (no TLS set-up unless one of them or an `https://` server asks); it writes the ruleset
//! `VALLUM_RULESET` (default `iptables`).
//!
//! Commands: `-A -I -D -R -N -X -F -P` go to `EditRuleset` as one edit; `-C` is a `-D` with
//! `validate_only`; `-S` prints the active revision as iptables -S does. `-L`, `-E` and `-Z`
//! are refused (exit 2). `-t`, `-w`/`-W`, `-4`/`-6`, `-n`, `-v`, `-x`, `--line-numbers` are
//! accepted. Exit codes as iptables 1.8: 0 done, 1 the command failed, 2 usage.

use std::io::{Read, Write};
use std::process::ExitCode;

use tonic::metadata::MetadataValue;
use tonic::transport::Endpoint;
use vallum_proto::v1 as pb;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;

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

type Client = RulesetServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Auth>,
>;

#[derive(Clone)]
struct Auth(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn ruleset() -> String {
    env("VALLUM_RULESET").unwrap_or_else(|| "iptables".to_owned())
}

/// Runs `f` with a client on a single-threaded runtime.
fn with_client<T>(f: impl AsyncFnOnce(&mut Client) -> Result<T, Fail>) -> Result<T, Fail> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(format!("runtime: {e}")))?;
    rt.block_on(async {
        let server = env("VALLUM_SERVER").unwrap_or_else(|| "http://127.0.0.1:50051".to_owned());
        let mut ep = Endpoint::from_shared(server.clone())
            .map_err(|e| failed(format!("VALLUM_SERVER {server}: {e}")))?;
        let ca = env("VALLUM_CA").map(std::path::PathBuf::from);
        let cert = env("VALLUM_CERT").map(std::path::PathBuf::from);
        let key = env("VALLUM_KEY").map(std::path::PathBuf::from);
        if server.starts_with("https://") || ca.is_some() || cert.is_some() {
            let cfg = vallum_api::tls::client_config(
                ca.as_deref(),
                cert.as_deref(),
                key.as_deref(),
                env("VALLUM_TLS_DOMAIN").as_deref(),
            )
            .map_err(|e| failed(format!("TLS: {e}")))?;
            ep = ep
                .tls_config(cfg)
                .map_err(|e| failed(format!("TLS: {e}")))?;
        }
        let channel = ep
            .connect()
            .await
            .map_err(|e| failed(format!("can't reach vallumd at {server}: {e}")))?;
        let token = match env("VALLUM_TOKEN") {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| failed("VALLUM_TOKEN must be printable ASCII"))?,
            ),
            None => None,
        };
        let mut c = RulesetServiceClient::with_interceptor(channel, Auth(token))
            .max_decoding_message_size(256 << 20);
        f(&mut c).await
    })
}

/// The first field violation's description of a refusal, or its message.
fn status_text(s: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    if let Some(b) = s.get_error_details().bad_request() {
        if let Some(v) = b.field_violations.first() {
            return v.description.clone();
        }
    }
    s.message().to_owned()
}

/// iptables' words for why an edit failed.
fn iptables_words(prog: &str, s: &tonic::Status) -> Fail {
    let text = status_text(s);
    let words = if text.contains("does a matching rule exist") {
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
async fn active_text(c: &mut Client, v6: bool, counters: bool) -> Result<String, Fail> {
    let name = ruleset();
    let rs = match c
        .get_ruleset(pb::GetRulesetRequest {
            name: format!("rulesets/{name}"),
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(String::new()),
        Err(s) => return Err(failed(status_text(&s))),
    };
    if rs.active_revision == 0 {
        return Ok(String::new());
    }
    let out = c
        .export_revision(pb::ExportRevisionRequest {
            name: format!("rulesets/{name}/revisions/{}", rs.active_revision),
            format: pb::ExportFormat::IptablesSave as i32,
            counters,
        })
        .await
        .map_err(|s| failed(status_text(&s)))?
        .into_inner()
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
            "-w" | "--wait" => {
                if it.peek().is_some_and(|n| n.parse::<u32>().is_ok()) {
                    it.next();
                }
            }
            "-W" | "--wait-interval" => {
                it.next();
            }
            "-4" | "--ipv4" => v6 = false,
            "-6" | "--ipv6" => v6 = true,
            "-n" | "--numeric" | "-v" | "--verbose" | "-x" | "--exact" | "--line-numbers" => {}
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
        "-S" => list_rules(&table, v6, rest.first().map(String::as_str)),
        "-L" | "-Z" | "-E" => Err(usage(
            prog,
            format!("{short} is not supported by vallum-iptables (use -S, vallumctl counters)"),
        )),
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
            with_client(async |c| {
                c.edit_ruleset(pb::EditRulesetRequest {
                    ruleset: ruleset(),
                    edits: vec![edit],
                    validate_only: check,
                    message: format!("{prog} {short}"),
                    ..Default::default()
                })
                .await
                .map_err(|s| iptables_words(prog, &s))?;
                Ok(String::new())
            })
        }
    }
}

/// `-S [CHAIN]`: `-P` for builtin chains, `-N` for user chains, then the rules, as iptables -S.
fn list_rules(table: &str, v6: bool, chain: Option<&str>) -> Result<String, Fail> {
    let text = with_client(async |c| active_text(c, v6, false).await)?;
    let mut out = String::new();
    let blocks = table_blocks(&text, Some(table));
    let lines = blocks.first().map(|(_, l)| l.clone()).unwrap_or_else(|| {
        let builtin: &[&str] = match table {
            "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
            "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
            "raw" => &["PREROUTING", "OUTPUT"],
            _ => &["INPUT", "FORWARD", "OUTPUT"],
        };
        builtin
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
            o => return Err(usage(prog, format!("unknown argument '{o}'"))),
        }
    }
    let text = with_client(async |c| active_text(c, v6, counters).await)?;
    let mut out = String::new();
    for (t, lines) in table_blocks(&text, table.as_deref()) {
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
    let (mut noflush, mut counters, mut test) = (false, false, false);
    let mut file = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" | "--noflush" => noflush = true,
            "-c" | "--counters" => counters = true,
            "-t" | "--test" => test = true,
            "-w" | "--wait" | "-W" | "--wait-interval" | "-M" | "--modprobe" | "-T" | "--table" => {
                it.next();
            }
            "-v" | "--verbose" | "-4" | "-6" => {}
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
    with_client(async |c| {
        let priority = match c
            .get_ruleset(pb::GetRulesetRequest {
                name: format!("rulesets/{}", ruleset()),
            })
            .await
        {
            Ok(r) => r.into_inner().priority,
            Err(_) => 0,
        };
        c.apply(pb::ApplyRequest {
            ruleset: ruleset(),
            source: Some(source),
            message: prog.to_owned(),
            priority,
            validate_only: test,
            allow_empty: true,
            ..Default::default()
        })
        .await
        .map_err(|s| failed(format!("{prog}: {}", status_text(&s))))?;
        Ok(String::new())
    })
}
