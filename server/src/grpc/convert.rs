//! proto <-> domain conversions: the only module that knows both `vallum_proto::v1` and the
//! engine/store types. Conversions from requests return [`Error::BadRequest`] with field
//! paths (`source.structured.tables[0].chains[1].rules[2]`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use vallum_engine::conntrack::tuple::{PROTO_TCP, PROTO_UDP};
use vallum_engine::conntrack::{ConnFilter, ConnView, Conntrack, TcpState, Tuple};
use vallum_engine::echo::quoted;
use vallum_engine::model::{Family, Hook, IpNet, Policy, Ruleset, TableKind, ct_state, tcp_flags};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{check_chain_name, print_rule_spec};
use vallum_engine::snapshot::{StepOutcome, TraceStep, Verdict};
use vallum_engine::validate::Severity;
use vallum_proto::v1 as pb;

use crate::control::content::nft::NftPart;
use crate::control::content::{Finding, RulesetInput, TextPart};
use crate::control::outcome::Outcome;
use crate::control::pipeline::{CommitEvent, CommitResult};
use crate::control::store::{Durability, Phases, RevisionRow, RevisionState, RulesetRow};
use crate::error::{Error, FieldViolation, Reason, Result};

pub mod sets;

// === names ===

/// Longest ruleset name in bytes: a DNS label's 63 (RFC 1035), so a name fits a label, a
/// Kubernetes name and a file name.
pub const MAX_RULESET_NAME: usize = 63;

/// Checks a ruleset name, optionally prefixed `rulesets/`. The one grammar of ruleset names:
/// 1 to [`MAX_RULESET_NAME`] bytes of `A-Z a-z 0-9 . _ -`, the first a letter or digit (so
/// neither `.` nor `..`, which would turn `rulesets/../revisions/1` into a path, nor a name
/// read as a flag such as `-x`). The length is checked before anything else, and the message
/// repeats at most a few dozen characters of the input.
///
/// Errors: [`Error::BadRequest`] on `field`.
pub fn ruleset_id(field: &str, s: &str) -> Result<String> {
    let name = s.strip_prefix("rulesets/").unwrap_or(s);
    let why = if name.is_empty() || name.len() > MAX_RULESET_NAME {
        Some("has 1 to 63 bytes")
    } else if !name.as_bytes()[0].is_ascii_alphanumeric() {
        Some("starts with a letter or digit")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        Some("has only A-Z a-z 0-9 . _ -")
    } else {
        None
    };
    match why {
        None => Ok(name.to_string()),
        Some(why) => Err(Error::invalid(
            field,
            format!(
                "{} is not a ruleset name: a ruleset name {why} (optionally prefixed rulesets/)",
                quoted(s)
            ),
        )),
    }
}

/// Longest file name a text source may carry, in bytes: it starts every `FILE:LINE:COL` of
/// every message, so it is kept well under the size of a status (a path of PATH_MAX, 4096
/// bytes, would leave room for one violation).
pub const MAX_FILENAME: usize = 1024;

/// The file name of a text for `FILE:LINE:COL` messages (`<request>` when empty).
///
/// Errors: [`Error::BadRequest`] on `field` when longer than [`MAX_FILENAME`] or holding a
/// control character (it is printed at the start of messages).
pub fn filename(field: &str, s: &str) -> Result<String> {
    if s.len() > MAX_FILENAME || s.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!(
                "{} is not a file name (at most {MAX_FILENAME} bytes, no control characters)",
                quoted(s)
            ),
        ));
    }
    Ok(if s.is_empty() {
        "<request>".to_string()
    } else {
        s.to_string()
    })
}

/// Parses `rulesets/{r}/revisions/{n}` into (r, n).
///
/// Errors: [`Error::BadRequest`] on `field`.
pub fn revision_name(field: &str, s: &str) -> Result<(String, u64)> {
    let bad = || {
        Error::invalid(
            field,
            format!(
                "{} is not a revision name (rulesets/{{ruleset}}/revisions/{{n}}, n >= 1)",
                quoted(s)
            ),
        )
    };
    let rest = s.strip_prefix("rulesets/").ok_or_else(bad)?;
    let (r, n) = rest.split_once("/revisions/").ok_or_else(bad)?;
    let n: u64 = n.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    Ok((ruleset_id(field, r)?, n))
}

/// `rulesets/{r}/revisions/{n}`.
pub fn revision_resource(ruleset: &str, n: u64) -> String {
    format!("rulesets/{ruleset}/revisions/{n}")
}

/// The largest `seconds` of a `google.protobuf.Duration` (about 10,000 years; duration.proto).
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

/// A `google.protobuf.Duration` as a std duration (`None` when absent or zero).
///
/// Errors: [`Error::BadRequest`] on `field` for negative durations and for values outside
/// duration.proto's range (`nanos` in 0..=999,999,999, `seconds` at most 315,576,000,000).
pub fn duration(field: &str, d: Option<&prost_types::Duration>) -> Result<Option<Duration>> {
    match d {
        None => Ok(None),
        Some(d) if d.seconds < 0 || d.nanos < 0 => {
            Err(Error::invalid(field, "must not be negative"))
        }
        Some(d) if d.nanos > 999_999_999 || d.seconds > MAX_DURATION_SECONDS => Err(
            Error::invalid(field, "out of range for google.protobuf.Duration"),
        ),
        Some(d) => {
            let d = Duration::new(d.seconds as u64, d.nanos as u32);
            Ok((!d.is_zero()).then_some(d))
        }
    }
}

/// Unix ns as a timestamp.
pub fn timestamp(ns: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ns.div_euclid(1_000_000_000),
        nanos: ns.rem_euclid(1_000_000_000) as i32,
    }
}

/// The family of request field `field` (UNSPECIFIED is IPv4).
///
/// Errors: INVALID_ARGUMENT at `field` for a value that is not a `Family` (99, -1).
pub fn family_of(field: &str, v: i32) -> Result<Family> {
    match pb::Family::try_from(v) {
        Ok(pb::Family::Unspecified | pb::Family::Ipv4) => Ok(Family::Ipv4),
        Ok(pb::Family::Ipv6) => Ok(Family::Ipv6),
        Err(_) => Err(Error::invalid(field, format!("unknown family {v}"))),
    }
}

/// A request's `durability`: `None` (unspecified) leaves it to vallumd's `--sync`.
///
/// Errors: [`Error::BadRequest`] on `field` for a value the proto does not name.
pub fn durability(field: &str, v: i32) -> Result<Option<Durability>> {
    match pb::Durability::try_from(v) {
        Ok(pb::Durability::Unspecified) => Ok(None),
        Ok(pb::Durability::Full) => Ok(Some(Durability::Full)),
        Ok(pb::Durability::Normal) => Ok(Some(Durability::Normal)),
        Err(_) => Err(Error::invalid(field, format!("unknown durability {v}"))),
    }
}

/// The proto family.
pub fn family_pb(f: Family) -> pb::Family {
    match f {
        Family::Ipv4 => pb::Family::Ipv4,
        Family::Ipv6 => pb::Family::Ipv6,
    }
}

// === ruleset sources ===

/// A source's `(noflush, counters)` flags (`RestoreText.noflush` / `.counters`; structured
/// input has neither).
pub fn restore_flags(src: &pb::RulesetSource) -> (bool, bool) {
    match &src.source {
        Some(pb::ruleset_source::Source::Text(t)) => (t.noflush, t.counters),
        _ => (false, false),
    }
}

impl TryFrom<&pb::RulesetSource> for RulesetInput {
    type Error = Error;

    fn try_from(src: &pb::RulesetSource) -> Result<Self> {
        use pb::ruleset_source::Source;
        match &src.source {
            None => Err(Error::invalid(
                "source",
                "a ruleset source (text, structured or nft) is required",
            )),
            Some(Source::Text(t)) => {
                let family = family_of("source.text.family", t.family)?;
                let filename = filename("source.text.filename", &t.filename)?;
                let mut parts = vec![TextPart {
                    text: t.content.clone(),
                    family,
                    filename: filename.clone(),
                    field: "source.text.content".into(),
                    line_fields: None,
                }];
                if !t.content_v6.is_empty() {
                    if family == Family::Ipv6 {
                        return Err(Error::invalid(
                            "source.text.content_v6",
                            "content_v6 needs content in family IPV4 (content is already IPv6)",
                        ));
                    }
                    parts.push(TextPart {
                        text: t.content_v6.clone(),
                        family: Family::Ipv6,
                        filename: format!("{filename} (v6)"),
                        field: "source.text.content_v6".into(),
                        line_fields: None,
                    });
                }
                Ok(RulesetInput { parts, nft: None })
            }
            Some(Source::Structured(spec)) => structured(spec),
            Some(Source::Nft(t)) => Ok(RulesetInput {
                parts: Vec::new(),
                nft: Some(NftPart {
                    text: t.content.clone(),
                    json: t.json,
                    filename: filename("source.nft.filename", &t.filename)?,
                    field: "source.nft.content".into(),
                }),
            }),
        }
    }
}

fn quote(field: &str, s: &str) -> Result<String> {
    if s.contains('"') || s.contains('\n') || s.contains('\\') {
        return Err(Error::invalid(
            field,
            format!("{} contains a quote, backslash or newline", quoted(s)),
        ));
    }
    if s.is_empty() || s.contains(char::is_whitespace) {
        Ok(format!("\"{s}\""))
    } else {
        Ok(s.to_string())
    }
}

fn neg(out: &mut Vec<String>, field: &str, flag: &str, n: Option<&pb::Negatable>) -> Result<()> {
    if let Some(n) = n {
        if n.value.is_empty() {
            if n.negated {
                return Err(Error::invalid(field, "negated without a value"));
            }
            return Ok(());
        }
        if n.negated {
            out.push("!".into());
        }
        out.push(flag.into());
        out.push(quote(field, &n.value)?);
    }
    Ok(())
}

fn extension(out: &mut Vec<String>, field: &str, e: &pb::Extension) -> Result<()> {
    for (i, o) in e.options.iter().enumerate() {
        let f = format!("{field}.options[{i}]");
        if o.negated {
            out.push("!".into());
        }
        let name = if o.name.starts_with('-') {
            o.name.clone()
        } else {
            format!("--{}", o.name)
        };
        out.push(quote(&f, &name)?);
        for a in &o.args {
            out.push(quote(&f, a)?);
        }
    }
    Ok(())
}

/// The restore text of one structured rule (the part after `-A CHAIN `).
fn rule_text(field: &str, r: &pb::RuleSpec) -> Result<String> {
    let mut out = Vec::new();
    neg(
        &mut out,
        &format!("{field}.source"),
        "-s",
        r.source.as_ref(),
    )?;
    neg(
        &mut out,
        &format!("{field}.destination"),
        "-d",
        r.destination.as_ref(),
    )?;
    neg(
        &mut out,
        &format!("{field}.in_interface"),
        "-i",
        r.in_interface.as_ref(),
    )?;
    neg(
        &mut out,
        &format!("{field}.out_interface"),
        "-o",
        r.out_interface.as_ref(),
    )?;
    neg(
        &mut out,
        &format!("{field}.protocol"),
        "-p",
        r.protocol.as_ref(),
    )?;
    match r.fragment.as_str() {
        "" => {}
        "fragment" => out.push("-f".into()),
        "not-fragment" => out.extend(["!".to_string(), "-f".to_string()]),
        other => {
            return Err(Error::invalid(
                format!("{field}.fragment"),
                format!(
                    "{}: expected \"\", \"fragment\" or \"not-fragment\"",
                    quoted(other)
                ),
            ));
        }
    }
    for (i, m) in r.matches.iter().enumerate() {
        let f = format!("{field}.matches[{i}]");
        out.push("-m".into());
        out.push(quote(&f, &m.name)?);
        extension(&mut out, &f, m)?;
    }
    if let Some(t) = r.target.as_ref().filter(|t| !t.name.is_empty()) {
        let f = format!("{field}.target");
        out.push(if r.goto { "-g" } else { "-j" }.into());
        out.push(quote(&f, &t.name)?);
        extension(&mut out, &f, t)?;
    }
    Ok(out.join(" "))
}

/// The fields of a structured ruleset that become the frame of its text (table names, chain
/// names, policies), checked by field path before anything is rendered: a bad one would
/// otherwise be reported in terms of the text made from it (chain name `A B` gave "invalid
/// counters near '-'").
fn structured_frame(spec: &pb::RulesetSpec) -> Vec<FieldViolation> {
    let mut bad = Vec::new();
    for (ti, t) in spec.tables.iter().enumerate() {
        let tf = format!("source.structured.tables[{ti}]");
        if TableKind::from_name(&t.table).is_none() {
            let names: Vec<&str> = TableKind::ALL.iter().map(|k| k.name()).collect();
            bad.push(FieldViolation::new(
                format!("{tf}.table"),
                format!(
                    "unknown table {} (one of {})",
                    quoted(&t.table),
                    names.join(", ")
                ),
            ));
        }
        for (ci, c) in t.chains.iter().enumerate() {
            let cf = format!("{tf}.chains[{ci}]");
            if let Err(why) = check_chain_name(&c.name) {
                bad.push(FieldViolation::new(
                    format!("{cf}.name"),
                    format!("{}: {why}", quoted(&c.name)),
                ));
            }
            if !matches!(c.policy.as_str(), "" | "-" | "ACCEPT" | "DROP") {
                bad.push(FieldViolation::new(
                    format!("{cf}.policy"),
                    format!(
                        "{}: expected ACCEPT or DROP (builtin chains), \"\" or \"-\" (user chains)",
                        quoted(&c.policy)
                    ),
                ));
            }
        }
    }
    bad
}

fn structured(spec: &pb::RulesetSpec) -> Result<RulesetInput> {
    let frame = structured_frame(spec);
    if !frame.is_empty() {
        return Err(bad_request(frame));
    }
    let mut parts: Vec<TextPart> = Vec::new();
    let mut errors = Vec::new();
    for (ti, t) in spec.tables.iter().enumerate() {
        let tf = format!("source.structured.tables[{ti}]");
        let family = family_of(&format!("{tf}.family"), t.family)?;
        let part = match parts.iter_mut().position(|p| p.family == family) {
            Some(i) => &mut parts[i],
            None => {
                parts.push(TextPart {
                    text: String::new(),
                    family,
                    filename: "<structured>".into(),
                    field: "source.structured".into(),
                    line_fields: Some(Vec::new()),
                });
                let n = parts.len() - 1;
                &mut parts[n]
            }
        };
        let mut lines: Vec<(String, String)> =
            vec![(format!("*{}", t.table), format!("{tf}.table"))];
        for (ci, c) in t.chains.iter().enumerate() {
            let cf = format!("{tf}.chains[{ci}]");
            let policy = if c.policy.is_empty() {
                "-"
            } else {
                c.policy.as_str()
            };
            lines.push((format!(":{} {policy} [0:0]", c.name), cf));
        }
        for (ci, c) in t.chains.iter().enumerate() {
            for (ri, r) in c.rules.iter().enumerate() {
                let rf = format!("{tf}.chains[{ci}].rules[{ri}]");
                match rule_text(&rf, r) {
                    Ok(text) => lines.push((format!("-A {} {text}", c.name), rf)),
                    Err(Error::BadRequest { violations, .. }) => errors.extend(violations),
                    Err(e) => return Err(e),
                }
            }
        }
        lines.push(("COMMIT".into(), tf));
        for (text, field) in lines {
            part.text.push_str(&text);
            part.text.push('\n');
            if let Some(f) = part.line_fields.as_mut() {
                f.push(field);
            }
        }
    }
    if !errors.is_empty() {
        return Err(Error::BadRequest {
            reason: Reason::InvalidArgument,
            violations: errors,
        });
    }
    if parts.is_empty() {
        return Err(Error::invalid(
            "source.structured.tables",
            "at least one table is required",
        ));
    }
    Ok(RulesetInput { parts, nft: None })
}

// === rulesets, revisions, commits ===

/// A finding as the API's violation.
pub fn violation(f: &Finding) -> pb::Violation {
    pb::Violation {
        severity: match f.severity {
            Severity::Error => pb::Severity::Error,
            Severity::Warning => pb::Severity::Warning,
        } as i32,
        location: f.display_location(),
        path: f.path.clone(),
        message: f.message.clone(),
        reason: f.reason.info().name.to_string(),
    }
}

fn state_pb(s: RevisionState) -> pb::RevisionState {
    match s {
        RevisionState::Staged => pb::RevisionState::Staged,
        RevisionState::Active => pb::RevisionState::Active,
        RevisionState::Superseded => pb::RevisionState::Superseded,
        RevisionState::Rejected => pb::RevisionState::Rejected,
        RevisionState::PendingConfirm => pb::RevisionState::PendingConfirm,
    }
}

/// A revision row as the API's revision; `content` fills the content field.
pub fn revision(r: &RevisionRow, content: bool, warnings: &[Finding]) -> pb::Revision {
    pb::Revision {
        name: revision_resource(&r.ruleset, r.number),
        ruleset: format!("rulesets/{}", r.ruleset),
        number: r.number,
        parent: r.parent.unwrap_or(0),
        digest: r.digest.clone(),
        author: r.author.clone(),
        message: r.message.clone(),
        create_time: Some(timestamp(r.created_at)),
        state: state_pb(r.state) as i32,
        content: if content {
            r.content.combined()
        } else {
            String::new()
        },
        rule_count: r.rule_count,
        warnings: warnings.iter().map(violation).collect(),
    }
}

/// A ruleset row as the API's ruleset.
pub fn ruleset(r: &RulesetRow) -> pb::Ruleset {
    pb::Ruleset {
        name: format!("rulesets/{}", r.name),
        priority: r.priority,
        etag: r.etag.clone(),
        active_revision: r.active_revision.unwrap_or(0),
        latest_revision: r.latest_revision,
        update_time: Some(timestamp(r.updated_at)),
    }
}

/// Nanoseconds as a `google.protobuf.Duration` (exact: a u64 of ns is ~584 years, inside
/// the Duration range).
pub fn duration_pb(ns: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ns / 1_000_000_000) as i64,
        nanos: (ns % 1_000_000_000) as i32,
    }
}

/// Phase durations.
pub fn phases(p: &Phases) -> pb::CommitPhases {
    pb::CommitPhases {
        validate: Some(duration_pb(p.validate_ns)),
        compile: Some(duration_pb(p.compile_ns)),
        persist: Some(duration_pb(p.persist_ns)),
        publish: Some(duration_pb(p.publish_ns)),
        quiesce: Some(duration_pb(p.quiesce_ns)),
        carry: Some(duration_pb(p.carry_ns)),
        total: Some(duration_pb(p.total_ns)),
        cores_waited: p.cores_waited,
    }
}

/// A commit result.
pub fn commit_result(c: &CommitResult) -> pb::CommitResult {
    pb::CommitResult {
        revision: Some(revision(&c.revision, false, &c.warnings)),
        phases: Some(phases(&c.phases)),
        confirm_deadline: c.confirm_deadline.map(timestamp),
        etag: c.etag.clone(),
    }
}

/// A commit outcome.
pub fn outcome(o: Outcome) -> pb::CommitOutcome {
    match o {
        Outcome::Committed => pb::CommitOutcome::Committed,
        Outcome::Confirmed => pb::CommitOutcome::Confirmed,
        Outcome::RolledBack => pb::CommitOutcome::RolledBack,
        Outcome::Reverted => pb::CommitOutcome::Reverted,
        Outcome::Refused => pb::CommitOutcome::Refused,
        Outcome::Failed => pb::CommitOutcome::Failed,
    }
}

/// A commit event.
pub fn commit_event(e: &CommitEvent) -> pb::CommitEvent {
    pb::CommitEvent {
        sequence: e.sequence,
        revision: match e.revision {
            Some(n) => revision_resource(&e.ruleset, n),
            None => format!("rulesets/{}", e.ruleset),
        },
        outcome: outcome(e.outcome) as i32,
        phases: Some(phases(&e.phases)),
        error: e.error.clone().unwrap_or_default(),
        time: Some(timestamp(e.time_ns)),
    }
}

// === packets and traces ===

fn protocol(field: &str, s: &str) -> Result<u8> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "" | "all" => 0,
        "icmp" => 1,
        "tcp" => 6,
        "udp" => 17,
        "gre" => 47,
        "esp" => 50,
        "ah" => 51,
        "icmpv6" | "ipv6-icmp" | "icmp6" => 58,
        "sctp" => 132,
        "udplite" => 136,
        other => other
            .parse()
            .map_err(|_| Error::invalid(field, format!("unknown protocol {}", quoted(s))))?,
    })
}

fn iface(field: &str, s: &str) -> Result<IfName> {
    IfName::new(s).ok_or_else(|| Error::invalid(field, "interface names have at most 15 bytes"))
}

/// The hook a `vallum.v1.Hook` value names (`INPUT` for HOOK_UNSPECIFIED).
///
/// Errors: [`Error::BadRequest`] on `field` for a number that is not a `Hook`.
pub fn hook(field: &str, v: i32) -> Result<Hook> {
    match pb::Hook::try_from(v) {
        Ok(pb::Hook::Unspecified | pb::Hook::Input) => Ok(Hook::Input),
        Ok(pb::Hook::Prerouting) => Ok(Hook::Prerouting),
        Ok(pb::Hook::Forward) => Ok(Hook::Forward),
        Ok(pb::Hook::Output) => Ok(Hook::Output),
        Ok(pb::Hook::Postrouting) => Ok(Hook::Postrouting),
        Err(_) => Err(Error::invalid(
            field,
            format!("unknown hook {v} (HOOK_PREROUTING ... HOOK_POSTROUTING)"),
        )),
    }
}

/// The proto hook.
pub fn hook_pb(h: Hook) -> pb::Hook {
    match h {
        Hook::Prerouting => pb::Hook::Prerouting,
        Hook::Input => pb::Hook::Input,
        Hook::Forward => pb::Hook::Forward,
        Hook::Output => pb::Hook::Output,
        Hook::Postrouting => pb::Hook::Postrouting,
    }
}

/// A packet spec as packet metadata (a function, not `TryFrom`: both types are foreign here,
/// so the orphan rule forbids the impl).
///
/// Errors: [`Error::BadRequest`] with `packet.*` field paths.
pub fn packet(p: &pb::PacketSpec) -> Result<Packet> {
    {
        let addr = |field: &str, s: &str| -> Result<Option<IpAddr>> {
            if s.is_empty() {
                return Ok(None);
            }
            s.parse()
                .map(Some)
                .map_err(|_| Error::invalid(field, format!("{} is not an IP address", quoted(s))))
        };
        let src = addr("packet.source", &p.source)?;
        let dst = addr("packet.destination", &p.destination)?;
        let family = match pb::Family::try_from(p.family) {
            Ok(pb::Family::Ipv4) => Family::Ipv4,
            Ok(pb::Family::Ipv6) => Family::Ipv6,
            Ok(pb::Family::Unspecified) => match src.or(dst) {
                Some(IpAddr::V6(_)) => Family::Ipv6,
                _ => Family::Ipv4,
            },
            Err(_) => return Err(Error::invalid("packet.family", "unknown family")),
        };
        let unspecified = match family {
            Family::Ipv4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Family::Ipv6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let (src, dst) = (src.unwrap_or(unspecified), dst.unwrap_or(unspecified));
        if src.is_ipv4() != (family == Family::Ipv4) || dst.is_ipv4() != (family == Family::Ipv4) {
            return Err(Error::invalid(
                "packet.family",
                "addresses do not match the family",
            ));
        }
        let port = |field: &str, v: u32| -> Result<u16> {
            u16::try_from(v).map_err(|_| Error::invalid(field, "ports are 0..65535"))
        };
        let byte = |field: &str, v: u32| -> Result<u8> {
            u8::try_from(v).map_err(|_| Error::invalid(field, "must be 0..255"))
        };
        let mut flags = 0u8;
        for c in p.tcp_flags.chars() {
            flags |= match c.to_ascii_uppercase() {
                'F' => tcp_flags::FIN,
                'S' => tcp_flags::SYN,
                'R' => tcp_flags::RST,
                'P' => tcp_flags::PSH,
                'A' => tcp_flags::ACK,
                'U' => tcp_flags::URG,
                _ => {
                    return Err(Error::invalid(
                        "packet.tcp_flags",
                        format!("{c:?} is not one of FSRPAU"),
                    ));
                }
            };
        }
        let ct = match p.ct_state.to_ascii_uppercase().as_str() {
            "" | "NEW" => ct_state::NEW,
            "ESTABLISHED" => ct_state::ESTABLISHED,
            "RELATED" => ct_state::RELATED,
            "INVALID" => ct_state::INVALID,
            "UNTRACKED" => ct_state::UNTRACKED,
            other => {
                return Err(Error::invalid(
                    "packet.ct_state",
                    format!("unknown state {}", quoted(other)),
                ));
            }
        };
        let src_mac = if p.source_mac.is_empty() {
            None
        } else {
            let bytes: Vec<u8> = p
                .source_mac
                .split(':')
                .map(|h| u8::from_str_radix(h, 16))
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| Error::invalid("packet.source_mac", "expected aa:bb:cc:dd:ee:ff"))?;
            Some(<[u8; 6]>::try_from(bytes.as_slice()).map_err(|_| {
                Error::invalid("packet.source_mac", "expected six bytes aa:bb:cc:dd:ee:ff")
            })?)
        };
        Ok(Packet {
            meta: PacketMeta {
                family,
                hook: hook("packet.hook", p.hook)?,
                src,
                dst,
                protocol: protocol("packet.protocol", &p.protocol)?,
                sport: port("packet.source_port", p.source_port)?,
                dport: port("packet.destination_port", p.destination_port)?,
                tcp_flags: flags,
                icmp_type: byte("packet.icmp_type", p.icmp_type)?,
                icmp_code: byte("packet.icmp_code", p.icmp_code)?,
                len: if p.length == 0 { 60 } else { p.length },
                mark: p.mark,
                ct_state: ct,
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface: iface("packet.in_interface", &p.in_interface)?,
                out_iface: iface("packet.out_interface", &p.out_interface)?,
                src_mac,
                phys_in: iface("packet.physdev_in", &p.physdev_in)?,
                phys_out: iface("packet.physdev_out", &p.physdev_out)?,
                ..PacketFacts::default()
            },
        })
    }
}

fn step_outcome(o: StepOutcome) -> pb::TraceStepOutcome {
    use pb::TraceStepOutcome as T;
    match o {
        StepOutcome::Continue => T::Continue,
        StepOutcome::Jump => T::Jump,
        StepOutcome::Goto => T::Goto,
        StepOutcome::Return => T::Return,
        StepOutcome::Accept => T::Accept,
        StepOutcome::Drop => T::Drop,
        StepOutcome::Reject => T::Reject,
        StepOutcome::Policy(Policy::Accept) => T::PolicyAccept,
        StepOutcome::Policy(Policy::Drop) => T::PolicyDrop,
    }
}

/// The canonical text of rule `number` (1-based) of a chain, when it exists.
pub fn rule_text_of(
    rulesets: &[std::sync::Arc<Ruleset>],
    ruleset: &str,
    family: Family,
    table: TableKind,
    chain: &str,
    number: u32,
) -> Option<String> {
    let rs = rulesets.iter().find(|r| r.name == ruleset)?;
    let rule = rs
        .table(family, table)?
        .chain(chain)?
        .rules
        .get(usize::try_from(number).ok()?.checked_sub(1)?)?;
    Some(print_rule_spec(rule, family))
}

/// A trace step, with the rule text looked up in `rulesets`.
pub fn trace_step(s: &TraceStep, rulesets: &[std::sync::Arc<Ruleset>]) -> pb::TraceStep {
    let text = match s.rule {
        Some(n) => {
            rule_text_of(rulesets, &s.ruleset, s.family, s.table, &s.chain, n).unwrap_or_default()
        }
        None => String::new(),
    };
    pb::TraceStep {
        ruleset: s.ruleset.to_string(),
        family: family_pb(s.family) as i32,
        table: s.table.name().to_string(),
        chain: s.chain.to_string(),
        rule: s.rule.unwrap_or(0),
        outcome: step_outcome(s.outcome) as i32,
        text,
        nft_rule: 0,
    }
}

/// The proto verdict.
pub fn verdict(v: Verdict) -> pb::Verdict {
    match v {
        Verdict::Accept => pb::Verdict::Accept,
        Verdict::Drop => pb::Verdict::Drop,
        Verdict::Reject(_) => pb::Verdict::Reject,
    }
}

/// Field violations as a bad request with reason INVALID_ARGUMENT.
pub fn bad_request(violations: Vec<FieldViolation>) -> Error {
    Error::BadRequest {
        reason: Reason::InvalidArgument,
        violations,
    }
}

// === conntrack ===

/// The name of a [`ct_state`] bit (`NEW`, `ESTABLISHED`, `RELATED`, `INVALID`, `UNTRACKED`;
/// empty for anything else).
pub fn ct_state_name(bit: u8) -> &'static str {
    match bit {
        ct_state::NEW => "NEW",
        ct_state::ESTABLISHED => "ESTABLISHED",
        ct_state::RELATED => "RELATED",
        ct_state::INVALID => "INVALID",
        ct_state::UNTRACKED => "UNTRACKED",
        _ => "",
    }
}

/// An address or prefix (`10.0.0.0/8`) of a conntrack filter; `None` when empty.
pub fn prefix(field: &str, s: &str) -> Result<Option<IpNet>> {
    if s.is_empty() {
        return Ok(None);
    }
    let bad = || {
        Error::invalid(
            field,
            format!("{} is not an address or prefix (ADDR[/LEN])", quoted(s)),
        )
    };
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => l.parse::<u8>().ok().filter(|&l| l <= max).ok_or_else(bad)?,
    };
    Ok(IpNet::new(addr, len))
}

/// A conntrack filter from the API. Every bad field is reported (paths
/// `{prefix}.source`, `{prefix}.protocol`, ...).
///
/// Errors: [`Error::BadRequest`] with one violation per bad field: an unknown family, protocol
/// or state, a malformed address/prefix or one of the other family, a port above 65535.
pub fn conntrack_filter(prefix_path: &str, f: &pb::ConntrackFilter) -> Result<ConnFilter> {
    /// The value of a field check, its violations collected in `bad`.
    fn keep<T>(bad: &mut Vec<FieldViolation>, r: Result<Option<T>>) -> Option<T> {
        match r {
            Ok(v) => v,
            Err(Error::BadRequest { violations, .. }) => {
                bad.extend(violations);
                None
            }
            Err(e) => {
                bad.push(FieldViolation::new("filter", e.to_string()));
                None
            }
        }
    }
    let mut bad = Vec::new();
    let path = |name: &str| format!("{prefix_path}.{name}");
    let family = keep(
        &mut bad,
        match pb::Family::try_from(f.family) {
            Ok(pb::Family::Unspecified) => Ok(None),
            Ok(pb::Family::Ipv4) => Ok(Some(Family::Ipv4)),
            Ok(pb::Family::Ipv6) => Ok(Some(Family::Ipv6)),
            Err(_) => Err(Error::invalid(
                path("family"),
                format!("unknown family {}", f.family),
            )),
        },
    );
    // `all` (0) means any protocol, as for `-p`.
    let protocol = keep(
        &mut bad,
        protocol(&path("protocol"), &f.protocol).map(|p| (p != 0).then_some(p)),
    );
    let src = keep(&mut bad, prefix(&path("source"), &f.source));
    let dst = keep(&mut bad, prefix(&path("destination"), &f.destination));
    let port = |name: &str, v: u32| -> Result<Option<u16>> {
        match v {
            0 => Ok(None),
            1..=65535 => Ok(Some(v as u16)),
            _ => Err(Error::invalid(path(name), "ports are 1..65535 (0: any)")),
        }
    };
    let sport = keep(&mut bad, port("source_port", f.source_port));
    let dport = keep(&mut bad, port("destination_port", f.destination_port));
    let tcp_state = keep(
        &mut bad,
        if f.state.is_empty() {
            Ok(None)
        } else {
            TcpState::from_name(&f.state).map(Some).ok_or_else(|| {
                let names: Vec<&str> = TcpState::ALL.iter().map(|s| s.name()).collect();
                Error::invalid(
                    path("state"),
                    format!(
                        "unknown TCP state {} (one of {})",
                        quoted(&f.state),
                        names.join(", ")
                    ),
                )
            })
        },
    );
    // Addresses must agree with each other and with the family.
    let fam_of = |n: &IpNet| {
        if n.addr.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        }
    };
    let want = family.or(src.as_ref().map(fam_of));
    for (name, n) in [("source", &src), ("destination", &dst)] {
        if let (Some(w), Some(n)) = (want, n) {
            if fam_of(n) != w {
                bad.push(FieldViolation::new(
                    path(name),
                    format!("{} is not an {} address", n.addr, family_label(w)),
                ));
            }
        }
    }
    // Conditions that can never hold together are refused rather than matching nothing:
    // the tracker keys only TCP and UDP flows by port (ICMP keeps type and code there, other
    // protocols 0), and only TCP entries have a state.
    if let Some(p) = protocol {
        for (name, set) in [("source_port", sport), ("destination_port", dport)] {
            if set.is_some() && p != PROTO_TCP && p != PROTO_UDP {
                bad.push(FieldViolation::new(
                    path(name),
                    format!("ports apply to tcp and udp entries only, not protocol {p}"),
                ));
            }
        }
        if tcp_state.is_some() && p != PROTO_TCP {
            bad.push(FieldViolation::new(
                path("state"),
                format!("states apply to tcp entries only, not protocol {p}"),
            ));
        }
    }
    if !bad.is_empty() {
        return Err(bad_request(bad));
    }
    Ok(ConnFilter {
        family,
        protocol,
        src,
        dst,
        sport,
        dport,
        tcp_state,
    })
}

fn family_label(f: Family) -> &'static str {
    match f {
        Family::Ipv4 => "IPv4",
        Family::Ipv6 => "IPv6",
    }
}

/// One tuple of an entry as the API's.
fn conntrack_tuple(t: &Tuple) -> pb::ConntrackTuple {
    let icmp = matches!(t.protocol, 1 | 58);
    pb::ConntrackTuple {
        source: t.src.to_string(),
        destination: t.dst.to_string(),
        source_port: if icmp { 0 } else { u32::from(t.sport) },
        destination_port: if icmp { 0 } else { u32::from(t.dport) },
        icmp_type: if icmp { u32::from(t.dport >> 8) } else { 0 },
        icmp_code: if icmp { u32::from(t.dport & 0xff) } else { 0 },
    }
}

/// An entry as the API's, with its time left computed at `now_ns` (the engine clock).
pub fn conntrack_entry(c: &ConnView, now_ns: u64) -> pb::ConntrackEntry {
    let left = c.expires_ns.saturating_sub(now_ns);
    pb::ConntrackEntry {
        family: family_pb(if c.original.src.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        }) as i32,
        protocol: u32::from(c.original.protocol),
        original: Some(conntrack_tuple(&c.original)),
        reply: Some(conntrack_tuple(&c.reply)),
        state: c.tcp_state.map(TcpState::name).unwrap_or_default().into(),
        seen_reply: c.seen_reply,
        expires_in: Some(prost_types::Duration {
            seconds: i64::try_from(left / 1_000_000_000).unwrap_or(i64::MAX),
            nanos: (left % 1_000_000_000) as i32,
        }),
    }
}

/// The table's counters as the API's.
pub fn conntrack_stats(ct: &Conntrack) -> pb::ConntrackStats {
    let s = ct.stats();
    pb::ConntrackStats {
        entries: s.entries,
        max_entries: ct.max_entries(),
        buckets: ct.buckets() as u64,
        new_total: s.new_total,
        early_drops: s.early_drops,
        insert_failed: s.insert_failed,
    }
}

#[cfg(test)]
mod tests;

/// A shadow's report as the API gives it: engine-clock times (ns since `clock` was made)
/// as timestamps on `clock`'s wall reading, `ends` (Unix ns) while it runs, a rule path as
/// `RULESET TABLE CHAIN N` (`... CHAIN policy`).
pub fn shadow_report(
    r: &vallum_engine::engine::ShadowReport,
    ends: Option<i64>,
    clock: &crate::clock::Clock,
) -> pb::ShadowReport {
    use vallum_engine::engine::ShadowEnd;
    // Engine ns -> Unix ns: the two readings of one clock.
    let offset = clock
        .unix_ns()
        .saturating_sub(i64::try_from(clock.now_ns()).unwrap_or(i64::MAX));
    let at = |ns: u64| timestamp(offset.saturating_add(i64::try_from(ns).unwrap_or(i64::MAX)));
    let verdict_of = |name: &str| match name {
        "ACCEPT" => pb::Verdict::Accept,
        "DROP" => pb::Verdict::Drop,
        "REJECT" => pb::Verdict::Reject,
        _ => pb::Verdict::Unspecified,
    };
    let step = |s: &Option<vallum_engine::eval::TraceStep>| {
        s.as_ref().map_or_else(String::new, |s| {
            let rule = s
                .rule
                .map_or_else(|| "policy".to_string(), |n| n.to_string());
            format!("{} {} {} {rule}", s.ruleset, s.table.name(), s.chain)
        })
    };
    pb::ShadowReport {
        name: format!("rulesets/{}/revisions/{}", r.ruleset, r.revision),
        running: r.ended.is_none(),
        started: Some(at(r.started_ns)),
        ends: ends.filter(|_| r.ended.is_none()).map(timestamp),
        ended: match r.ended {
            None => pb::ShadowEnd::Unspecified,
            Some(ShadowEnd::Ended) => pb::ShadowEnd::Ended,
            Some(ShadowEnd::Expired) => pb::ShadowEnd::Expired,
            Some(ShadowEnd::Committed) => pb::ShadowEnd::Committed,
            Some(ShadowEnd::Replaced) => pb::ShadowEnd::Replaced,
        } as i32,
        pairs: r
            .pairs
            .iter()
            .map(|p| pb::VerdictPairCount {
                active: verdict_of(p.active) as i32,
                shadow: verdict_of(p.shadow) as i32,
                packets: p.packets,
                bytes: p.bytes,
            })
            .collect(),
        flows: r
            .flows
            .iter()
            .map(|f| pb::ShadowFlow {
                family: family_pb(f.family) as i32,
                source: f.src.to_string(),
                destination: f.dst.to_string(),
                protocol: u32::from(f.protocol),
                source_port: u32::from(f.sport),
                destination_port: u32::from(f.dport),
                in_interface: f.in_iface.clone(),
                packets: f.packets,
                bytes: f.bytes,
                first_seen: Some(at(f.first_seen_ns)),
                last_seen: Some(at(f.last_seen_ns)),
                active_verdict: verdict_of(f.active) as i32,
                shadow_verdict: verdict_of(f.shadow) as i32,
                active_rule: step(&f.active_rule),
                shadow_rule: step(&f.shadow_rule),
            })
            .collect(),
        overflow_packets: r.overflow_packets,
        changed_packets: r.changed_packets(),
        changed_flows: r.changed_flows(),
        counters: r
            .counters
            .iter()
            .map(|c| pb::RuleCounter {
                ruleset: c.ruleset.to_string(),
                family: family_pb(c.family) as i32,
                table: c.table.name().to_string(),
                chain: c.chain.to_string(),
                rule: c.rule.unwrap_or(0),
                packets: c.packets,
                bytes: c.bytes,
                text: String::new(),
                nft_rule: 0,
            })
            .collect(),
    }
}
