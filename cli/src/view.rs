//! Output of vallumctl: JSON views of API messages (`--output json`) and text renderings,
//! including the `iptables -L -v -x -n`-like counters table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};
use vallum_proto::v1::{
    CommitEvent, CommitOutcome, CommitPhases, CommitResult, DiffRevisionsResponse, Family,
    GetStatusResponse, Hook, PacketEvent, PacketEventKind, ReplayCaptureResponse, Revision,
    RevisionState, RuleCounter, Ruleset, Severity, TracePacketResponse, TraceStepOutcome, Verdict,
    VerdictTotals, Violation,
};

/// A timestamp as `{"seconds", "nanos", "rfc3339"}` (RFC 3339 in UTC, e.g.
/// `2030-03-17T17:46:40Z`).
fn ts(t: Option<&prost_types::Timestamp>) -> Value {
    match t {
        Some(t) => json!({"seconds": t.seconds, "nanos": t.nanos, "rfc3339": rfc3339(t)}),
        None => Value::Null,
    }
}

/// RFC 3339 in UTC, whole seconds (`2030-03-17T17:46:40Z`); the raw seconds when out of range.
pub fn rfc3339(t: &prost_types::Timestamp) -> String {
    match jiff::Timestamp::new(t.seconds, 0) {
        Ok(t) => t.to_string(),
        Err(_) => format!("unix time {}", t.seconds),
    }
}

/// `by DEADLINE (in 59s)`: the deadline in RFC 3339 (UTC) and how long is left at `now`,
/// rounded to the second (`passed 3s ago` once it has passed).
pub fn deadline_text(d: &prost_types::Timestamp, now: jiff::Timestamp) -> String {
    let at = rfc3339(d);
    let left = match jiff::Timestamp::new(d.seconds, d.nanos.clamp(0, 999_999_999)) {
        Ok(t) => t.duration_since(now),
        Err(_) => return format!("by {at}"),
    };
    let left = left.round(jiff::Unit::Second).unwrap_or(left);
    if left.is_negative() {
        format!("by {at} (passed {:#} ago)", left.abs())
    } else {
        format!("by {at} (in {left:#})")
    }
}

/// `ipv4`, `ipv6` or `unspecified`.
pub fn family(f: i32) -> &'static str {
    match Family::try_from(f) {
        Ok(Family::Ipv4) => "ipv4",
        Ok(Family::Ipv6) => "ipv6",
        _ => "unspecified",
    }
}

fn state(s: i32) -> &'static str {
    match RevisionState::try_from(s) {
        Ok(RevisionState::Staged) => "staged",
        Ok(RevisionState::Active) => "active",
        Ok(RevisionState::Superseded) => "superseded",
        Ok(RevisionState::Rejected) => "rejected",
        Ok(RevisionState::PendingConfirm) => "pending-confirm",
        _ => "unspecified",
    }
}

fn severity(s: i32) -> &'static str {
    match Severity::try_from(s) {
        Ok(Severity::Warning) => "warning",
        _ => "error",
    }
}

fn outcome(o: i32) -> &'static str {
    match CommitOutcome::try_from(o) {
        // The words of vallum_commits_total{outcome} (docs/operations.md, "Commit outcomes").
        Ok(CommitOutcome::Committed) => "committed",
        Ok(CommitOutcome::Confirmed) => "confirmed",
        Ok(CommitOutcome::RolledBack) => "rolled_back",
        Ok(CommitOutcome::Reverted) => "reverted",
        Ok(CommitOutcome::Refused) => "refused",
        Ok(CommitOutcome::Failed) => "failed",
        _ => "unspecified",
    }
}

/// A violation as JSON.
pub fn violation_json(v: &Violation, location: &str) -> Value {
    json!({
        "severity": severity(v.severity),
        "location": location,
        "path": v.path,
        "message": v.message,
        "reason": v.reason,
    })
}

/// `LOCATION: SEVERITY: MESSAGE [REASON]`.
pub fn violation_text(v: &Violation, location: &str) -> String {
    let mut s = format!("{location}: {}: {}", severity(v.severity), v.message);
    if !v.path.is_empty() {
        let _ = write!(s, " (in {})", v.path);
    }
    s
}

/// A revision as JSON.
pub fn revision_json(r: &Revision) -> Value {
    json!({
        "name": r.name,
        "ruleset": r.ruleset,
        "number": r.number,
        "parent": r.parent,
        "digest": r.digest,
        "author": r.author,
        "message": r.message,
        "create_time": ts(r.create_time.as_ref()),
        "state": state(r.state),
        "rule_count": r.rule_count,
        "warnings": r.warnings.iter().map(|w| violation_json(w, &w.location)).collect::<Vec<_>>(),
    })
}

/// One line about a revision.
pub fn revision_text(r: &Revision) -> String {
    let mut s = format!(
        "{}  {}  {} rules  digest {}",
        r.name,
        state(r.state),
        r.rule_count,
        short(&r.digest)
    );
    if !r.message.is_empty() {
        let _ = write!(s, "  \"{}\"", r.message);
    }
    s
}

/// Revisions as a table: revision, state, rules, create time (RFC 3339, UTC), author, digest
/// and message, one line each under a header; `-` for a missing time or author.
pub fn revisions_text(rs: &[Revision]) -> String {
    let rows: Vec<[String; 7]> = rs
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                state(r.state).to_owned(),
                r.rule_count.to_string(),
                r.create_time
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), rfc3339),
                if r.author.is_empty() {
                    "-".to_owned()
                } else {
                    r.author.clone()
                },
                short(&r.digest).to_owned(),
                r.message.clone(),
            ]
        })
        .collect();
    let header = [
        "REVISION", "STATE", "RULES", "CREATED", "AUTHOR", "DIGEST", "MESSAGE",
    ]
    .map(String::from);
    let mut widths = [0usize; 7];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut s = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i == 2 {
                let _ = write!(line, "{cell:>w$}  ");
            } else {
                let _ = write!(line, "{cell:<w$}  ");
            }
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s
}

/// A revision's warnings, one `  LOCATION: warning: MESSAGE` line each.
pub fn warnings_text(r: &Revision) -> String {
    let mut s = String::new();
    for w in &r.warnings {
        let _ = writeln!(s, "  {}", violation_text(w, &w.location));
    }
    s
}

fn short(d: &str) -> &str {
    d.get(..12).unwrap_or(d)
}

/// A `google.protobuf.Duration` in nanoseconds (absent or negative: 0).
pub fn ns(d: Option<&prost_types::Duration>) -> u64 {
    d.map_or(0, |d| {
        let s = u64::try_from(d.seconds).unwrap_or(0);
        let n = u64::try_from(d.nanos).unwrap_or(0);
        s.saturating_mul(1_000_000_000).saturating_add(n)
    })
}

/// Phases as JSON: nanoseconds per phase (`validate_ns` ...), the figures `vallumctl` has
/// always printed.
fn phases_json(p: Option<&CommitPhases>) -> Value {
    match p {
        Some(p) => json!({
            "validate_ns": ns(p.validate.as_ref()), "compile_ns": ns(p.compile.as_ref()),
            "persist_ns": ns(p.persist.as_ref()), "publish_ns": ns(p.publish.as_ref()),
            "quiesce_ns": ns(p.quiesce.as_ref()), "carry_ns": ns(p.carry.as_ref()),
            "total_ns": ns(p.total.as_ref()), "cores_waited": p.cores_waited,
        }),
        None => Value::Null,
    }
}

fn phases_text(p: &CommitPhases) -> String {
    let us = |d: &Option<prost_types::Duration>| ns(d.as_ref()) as f64 / 1e3;
    format!(
        "total {:.1} µs (validate {:.1}, compile {:.1}, persist {:.1}, publish {:.1}, quiesce {:.1}, carry {:.1}; {} cores waited)",
        us(&p.total),
        us(&p.validate),
        us(&p.compile),
        us(&p.persist),
        us(&p.publish),
        us(&p.quiesce),
        us(&p.carry),
        p.cores_waited
    )
}

/// A verdict's iptables name (`ACCEPT`, `DROP`, `REJECT`; `-` when unset).
pub fn verdict(v: i32) -> &'static str {
    match Verdict::try_from(v) {
        Ok(Verdict::Accept) => "ACCEPT",
        Ok(Verdict::Drop) => "DROP",
        Ok(Verdict::Reject) => "REJECT",
        Ok(Verdict::Unspecified) | Err(_) => "-",
    }
}

/// A hook's chain name (`PREROUTING` ... `POSTROUTING`; `-` when unset).
pub fn hook(h: i32) -> &'static str {
    match Hook::try_from(h) {
        Ok(Hook::Prerouting) => "PREROUTING",
        Ok(Hook::Input) => "INPUT",
        Ok(Hook::Forward) => "FORWARD",
        Ok(Hook::Output) => "OUTPUT",
        Ok(Hook::Postrouting) => "POSTROUTING",
        Ok(Hook::Unspecified) | Err(_) => "-",
    }
}

/// A trace step's outcome as the words `vallumctl trace` prints (`CONTINUE`, `POLICY_DROP`).
pub fn step_outcome(o: i32) -> &'static str {
    use TraceStepOutcome as T;
    match T::try_from(o) {
        Ok(T::Continue) => "CONTINUE",
        Ok(T::Jump) => "JUMP",
        Ok(T::Goto) => "GOTO",
        Ok(T::Return) => "RETURN",
        Ok(T::Accept) => "ACCEPT",
        Ok(T::Drop) => "DROP",
        Ok(T::Reject) => "REJECT",
        Ok(T::PolicyAccept) => "POLICY_ACCEPT",
        Ok(T::PolicyDrop) => "POLICY_DROP",
        Ok(T::Unspecified) | Err(_) => "-",
    }
}

/// A packet event's kind (`LOG`, `DROP`; `-` when unset).
pub fn event_kind(k: i32) -> &'static str {
    match PacketEventKind::try_from(k) {
        Ok(PacketEventKind::Log) => "LOG",
        Ok(PacketEventKind::Drop) => "DROP",
        Ok(PacketEventKind::Unspecified) | Err(_) => "-",
    }
}

/// A commit result as JSON.
pub fn commit_json(c: &CommitResult) -> Value {
    json!({
        "revision": c.revision.as_ref().map(revision_json),
        "phases": phases_json(c.phases.as_ref()),
        "confirm_deadline": ts(c.confirm_deadline.as_ref()),
        "etag": c.etag,
    })
}

/// A commit result as text.
pub fn commit_text(c: &CommitResult) -> String {
    let mut s = String::new();
    if let Some(r) = &c.revision {
        let _ = writeln!(s, "committed {}", revision_text(r));
    }
    if let Some(r) = &c.revision {
        s.push_str(&warnings_text(r));
    }
    if let Some(p) = &c.phases {
        let _ = writeln!(s, "  {}", phases_text(p));
    }
    if let Some(d) = &c.confirm_deadline {
        let confirm = match &c.revision {
            Some(r) => {
                let ruleset = r.ruleset.strip_prefix("rulesets/").unwrap_or(&r.ruleset);
                format!("vallumctl confirm {ruleset}/{}", r.number)
            }
            None => "vallumctl confirm".to_owned(),
        };
        let _ = writeln!(
            s,
            "  confirm {} or it is rolled back: {confirm}",
            deadline_text(d, jiff::Timestamp::now())
        );
    }
    s
}

/// A ruleset as JSON.
pub fn ruleset_json(r: &Ruleset) -> Value {
    json!({
        "name": r.name, "priority": r.priority, "etag": r.etag,
        "active_revision": r.active_revision, "latest_revision": r.latest_revision,
        "update_time": ts(r.update_time.as_ref()),
    })
}

/// Rulesets as an aligned text table.
pub fn rulesets_text(rs: &[Ruleset]) -> String {
    let mut s = format!(
        "{:<24} {:>8} {:>7} {:>7}  {}\n",
        "NAME", "PRIORITY", "ACTIVE", "LATEST", "UPDATED"
    );
    for r in rs {
        let name = r.name.strip_prefix("rulesets/").unwrap_or(&r.name);
        let updated = r
            .update_time
            .as_ref()
            .map_or_else(|| "-".to_owned(), rfc3339);
        let _ = writeln!(
            s,
            "{:<24} {:>8} {:>7} {:>7}  {updated}",
            name, r.priority, r.active_revision, r.latest_revision
        );
    }
    s
}

/// A diff as JSON.
pub fn diff_json(d: &DiffRevisionsResponse) -> Value {
    Value::Array(
        d.chains
            .iter()
            .map(|c| {
                json!({
                    "family": family(c.family), "table": c.table, "chain": c.chain,
                    "added": c.added, "removed": c.removed,
                    "moved": c.moved.iter().map(|m| json!({
                        "rule": m.rule, "from_position": m.from_position, "to_position": m.to_position,
                    })).collect::<Vec<_>>(),
                    "policy_change": c.policy_change,
                })
            })
            .collect(),
    )
}

/// A diff as text: per chain, `+ rule`, `- rule`, `~ rule (from -> to)`.
pub fn diff_text(d: &DiffRevisionsResponse) -> String {
    let mut s = String::new();
    for c in &d.chains {
        let _ = writeln!(s, "{} {}/{}:", family(c.family), c.table, c.chain);
        if !c.policy_change.is_empty() {
            let _ = writeln!(s, "  policy {}", c.policy_change);
        }
        for r in &c.removed {
            let _ = writeln!(s, "  - {r}");
        }
        for r in &c.added {
            let _ = writeln!(s, "  + {r}");
        }
        for m in &c.moved {
            let _ = writeln!(
                s,
                "  ~ {} (#{} -> #{})",
                m.rule, m.from_position, m.to_position
            );
        }
    }
    s
}

/// Counters as JSON.
pub fn counters_json(cs: &[RuleCounter]) -> Value {
    Value::Array(
        cs.iter()
            .map(|c| {
                json!({
                    "ruleset": c.ruleset, "family": family(c.family), "table": c.table,
                    "chain": c.chain, "rule": c.rule, "packets": c.packets, "bytes": c.bytes,
                    "text": c.text, "nft_rule": c.nft_rule,
                })
            })
            .collect(),
    )
}

/// The columns of one rule, taken from its canonical text.
#[derive(Debug, Default, PartialEq, Eq)]
struct Columns {
    target: String,
    prot: String,
    opt: String,
    inp: String,
    out: String,
    source: String,
    destination: String,
    rest: Vec<String>,
}

/// The words of rule text as the engine's tokenizer splits them
/// (`vallum_engine::restore::tokenize`, iptables-restore's rules): each word's unquoted text,
/// to compare with flags, and its source text (quotes kept), to print. A text with an
/// unterminated quote (never sent by vallumd, whose rule text is canonical) is one word.
fn words(text: &str) -> Vec<(String, String)> {
    let Ok(tokens) = vallum_engine::restore::tokenize(text) else {
        return vec![(text.to_owned(), text.to_owned())];
    };
    let starts: Vec<usize> = tokens
        .iter()
        .map(|t| t.column.saturating_sub(1) as usize)
        .collect();
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let end = starts.get(i + 1).copied().unwrap_or(text.len());
            let source = text
                .get(starts[i]..end)
                .unwrap_or_default()
                .trim_end_matches([' ', '\t', '\r', '\n']);
            (t.text.to_string(), source.to_owned())
        })
        .collect()
}

fn columns(text: &str, fam: &str) -> Columns {
    let any = if fam == "ipv6" { "::/0" } else { "0.0.0.0/0" };
    let mut c = Columns {
        target: String::new(),
        prot: "all".into(),
        opt: if fam == "ipv6" {
            "   ".into()
        } else {
            "--".into()
        },
        inp: "*".into(),
        out: "*".into(),
        source: any.into(),
        destination: any.into(),
        rest: Vec::new(),
    };
    let w = words(text);
    let mut i = 0;
    let mut neg = false;
    while i < w.len() {
        let word = w[i].0.as_str();
        let bang = if neg { "!" } else { "" };
        let next = w.get(i + 1).map(|(_, source)| source.clone());
        let slot = match word {
            "!" => {
                neg = true;
                i += 1;
                continue;
            }
            "-p" | "--protocol" => Some(&mut c.prot),
            "-s" | "--source" => Some(&mut c.source),
            "-d" | "--destination" => Some(&mut c.destination),
            "-i" | "--in-interface" => Some(&mut c.inp),
            "-o" | "--out-interface" => Some(&mut c.out),
            "-j" | "--jump" | "-g" | "--goto" => Some(&mut c.target),
            "-f" | "--fragment" => {
                c.opt = if neg { "!f" } else { "-f" }.into();
                neg = false;
                i += 1;
                continue;
            }
            _ => None,
        };
        match (slot, next) {
            (Some(slot), Some(v)) => {
                *slot = format!("{bang}{v}");
                // Options after the target (e.g. `--reject-with`) stay in the rest.
                i += 2;
            }
            _ => {
                if neg {
                    c.rest.push("!".into());
                }
                c.rest.push(w[i].1.clone());
                i += 1;
            }
        }
        neg = false;
    }
    c
}

/// One row of `counters`; `num` is the `--line-numbers` column (`%-4s ` as iptables prints it).
fn row(num: Option<&str>, pkts: &str, bytes: &str, c: &Columns) -> String {
    let mut line = match num {
        Some(n) => format!("{n:<4} "),
        None => String::new(),
    };
    let _ = write!(
        line,
        "{:>8} {:>10} {:<10} {:<4} {:<3} {:<6} {:<6} {:<19} {:<19}",
        pkts, bytes, c.target, c.prot, c.opt, c.inp, c.out, c.source, c.destination
    );
    if !c.rest.is_empty() {
        line.push(' ');
        line.push_str(&c.rest.join(" "));
    }
    line.trim_end().to_owned() + "\n"
}

/// Counters as `iptables -L -v -x -n` prints them: per ruleset and table a heading, per chain
/// `Chain NAME (policy P N packets, M bytes)` (builtin) or `Chain NAME (N references)` (user
/// chain), then one row per rule: pkts bytes target prot opt in out source destination and the
/// remaining options of the rule text. With `line_numbers`, each row starts with the rule's
/// number in its chain (a `num` column, as `iptables -L --line-numbers`). An nft ruleset's
/// table (`nft`) has rows of pkts, bytes, the nft rule's position in its nft chain (`nft`:
/// what it enforces; one nft rule may be several engine rules) and its nft text.
pub fn counters_text(cs: &[RuleCounter], line_numbers: bool) -> String {
    // (ruleset, family, table) -> chain -> (policy, rules), in first-seen order of chains.
    type Chains<'a> = Vec<(&'a str, Option<&'a RuleCounter>, Vec<&'a RuleCounter>)>;
    let mut tables: BTreeMap<(&str, &str, &str), Chains<'_>> = BTreeMap::new();
    for c in cs {
        let chains = tables
            .entry((c.ruleset.as_str(), family(c.family), c.table.as_str()))
            .or_default();
        let idx = match chains.iter().position(|(n, _, _)| *n == c.chain) {
            Some(i) => i,
            None => {
                chains.push((c.chain.as_str(), None, Vec::new()));
                chains.len() - 1
            }
        };
        if c.rule == 0 {
            chains[idx].1 = Some(c);
        } else {
            chains[idx].2.push(c);
        }
    }
    let mut s = String::new();
    for ((ruleset, fam, table), chains) in &tables {
        let _ = writeln!(s, "# ruleset {ruleset}, table {table} ({fam})");
        let targets: Vec<String> = chains
            .iter()
            .flat_map(|(_, _, rules)| rules.iter().map(|r| columns(&r.text, fam).target))
            .collect();
        for (name, policy, rules) in chains {
            match policy {
                Some(p) => {
                    let _ = writeln!(
                        s,
                        "Chain {name} (policy {} {} packets, {} bytes)",
                        p.text, p.packets, p.bytes
                    );
                }
                None => {
                    let refs = targets.iter().filter(|t| t == name).count();
                    let _ = writeln!(s, "Chain {name} ({refs} references)");
                }
            }
            if *table == "nft" {
                nft_rows(&mut s, rules, line_numbers);
                continue;
            }
            let header = Columns {
                target: "target".into(),
                prot: "prot".into(),
                opt: "opt".into(),
                inp: "in".into(),
                out: "out".into(),
                source: "source".into(),
                destination: "destination".into(),
                rest: Vec::new(),
            };
            s.push_str(&row(
                line_numbers.then_some("num"),
                "pkts",
                "bytes",
                &header,
            ));
            let mut rules = rules.clone();
            rules.sort_by_key(|r| r.rule);
            for r in rules {
                let num = r.rule.to_string();
                s.push_str(&row(
                    line_numbers.then_some(num.as_str()),
                    &r.packets.to_string(),
                    &r.bytes.to_string(),
                    &columns(&r.text, fam),
                ));
            }
            s.push('\n');
        }
    }
    s
}

/// The rows of an nft chain's rules (see [`counters_text`]): pkts, bytes, the nft rule's
/// position and its nft text.
fn nft_rows(s: &mut String, rules: &[&RuleCounter], line_numbers: bool) {
    let num = |n: &str| match line_numbers {
        true => format!("{n:<4} "),
        false => String::new(),
    };
    let _ = writeln!(
        s,
        "{}{:>8} {:>10} {:>4}  rule",
        num("num"),
        "pkts",
        "bytes",
        "nft"
    );
    let mut rules = rules.to_vec();
    rules.sort_by_key(|r| r.rule);
    for r in rules {
        let _ = writeln!(
            s,
            "{}{:>8} {:>10} {:>4}  {}",
            num(&r.rule.to_string()),
            r.packets,
            r.bytes,
            r.nft_rule,
            r.text
        );
    }
    s.push('\n');
}

/// A trace as JSON.
pub fn trace_json(t: &TracePacketResponse) -> Value {
    json!({
        "verdict": verdict(t.verdict),
        "ct_state": t.ct_state,
        "notes": t.notes,
        "steps": t.steps.iter().map(|s| json!({
            "ruleset": s.ruleset, "family": family(s.family), "table": s.table, "chain": s.chain,
            "rule": s.rule, "outcome": step_outcome(s.outcome), "text": s.text,
        })).collect::<Vec<_>>(),
    })
}

/// A trace as text: one line per step, then the verdict.
pub fn trace_text(t: &TracePacketResponse) -> String {
    let mut s = String::new();
    for st in &t.steps {
        let at = if st.rule == 0 {
            format!("{}/{} policy", st.table, st.chain)
        } else {
            format!("{}/{}#{}", st.table, st.chain, st.rule)
        };
        let _ = writeln!(
            s,
            "{:<28} {:<14} [{} {}] {}",
            at,
            step_outcome(st.outcome),
            st.ruleset,
            family(st.family),
            st.text
        );
    }
    let _ = writeln!(s, "verdict: {}", verdict(t.verdict));
    if !t.ct_state.is_empty() {
        let _ = writeln!(s, "ct_state: {}", t.ct_state);
    }
    for n in &t.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

fn totals_json(t: Option<&VerdictTotals>) -> Value {
    match t {
        Some(t) => {
            json!({"accepted": t.accepted, "dropped": t.dropped, "rejected": t.rejected, "unparsed": t.unparsed})
        }
        None => Value::Null,
    }
}

/// A replay as JSON.
pub fn replay_json(r: &ReplayCaptureResponse) -> Value {
    json!({
        "packets": r.packets,
        "active": totals_json(r.active.as_ref()),
        "staged": totals_json(r.staged.as_ref()),
        "changed_flows": r.changed_flows.iter().map(|f| json!({
            "family": family(f.family), "source": f.source, "destination": f.destination,
            "protocol": f.protocol, "source_port": f.source_port,
            "destination_port": f.destination_port, "packets": f.packets,
            "active_verdict": verdict(f.active_verdict),
            "staged_verdict": verdict(f.staged_verdict),
        })).collect::<Vec<_>>(),
    })
}

/// A replay as text.
pub fn replay_text(r: &ReplayCaptureResponse) -> String {
    let mut s = format!("{} packets\n", r.packets);
    for (name, t) in [("active", &r.active), ("staged", &r.staged)] {
        if let Some(t) = t {
            let _ = writeln!(
                s,
                "{name:<7} accepted {}  dropped {}  rejected {}  unparsed {}",
                t.accepted, t.dropped, t.rejected, t.unparsed
            );
        }
    }
    if !r.changed_flows.is_empty() {
        let _ = writeln!(s, "changed flows:");
        for f in &r.changed_flows {
            let _ = writeln!(
                s,
                "  {} {}:{} -> {}:{} proto {}  {} packets  {} -> {}",
                family(f.family),
                f.source,
                f.source_port,
                f.destination,
                f.destination_port,
                f.protocol,
                f.packets,
                verdict(f.active_verdict),
                verdict(f.staged_verdict)
            );
        }
    }
    s
}

/// Engine status as JSON.
pub fn status_json(st: &GetStatusResponse) -> Value {
    json!({
        "cores": st.cores.iter().map(|c| json!({"core": c.core, "generation": c.generation, "packets": c.packets})).collect::<Vec<_>>(),
        "active": st.active.iter().map(|a| json!({"ruleset": a.ruleset, "revision": a.revision, "priority": a.priority})).collect::<Vec<_>>(),
        "barrier_strategy": st.barrier_strategy,
        "barrier_fallback": st.barrier_fallback,
        "packet_source": st.packet_source,
        "version": st.version,
        "rules": st.rules,
        "not_loaded": st.not_loaded.iter().map(|n| json!({"ruleset": n.ruleset, "revision": n.revision, "error": n.error, "time": ts(n.time.as_ref())})).collect::<Vec<_>>(),
        "kernel_tables": st.kernel_tables.iter().map(|k| json!({"family": k.family, "table": k.table, "drift": k.drift, "detail": k.detail})).collect::<Vec<_>>(),
    })
}

/// Engine status as text.
pub fn status_text(st: &GetStatusResponse) -> String {
    let mut s = format!(
        "version {}  barrier {}{}  source {}  rules {}\n",
        st.version,
        st.barrier_strategy,
        if st.barrier_fallback.is_empty() {
            String::new()
        } else {
            format!(" (fallback: {})", st.barrier_fallback)
        },
        st.packet_source,
        st.rules
    );
    let _ = writeln!(s, "active:");
    for a in &st.active {
        let _ = writeln!(
            s,
            "  {:<24} revision {:<6} priority {}",
            a.ruleset, a.revision, a.priority
        );
    }
    if !st.not_loaded.is_empty() {
        let _ = writeln!(s, "NOT LOADED (stored as active, not enforced):");
        for n in &st.not_loaded {
            let since = n.time.as_ref().map_or_else(|| "-".to_owned(), rfc3339);
            let _ = writeln!(
                s,
                "  {:<24} revision {:<6} since {since}  {}",
                n.ruleset, n.revision, n.error
            );
        }
    }
    if !st.kernel_tables.is_empty() {
        let _ = writeln!(s, "kernel tables (vallumd --kernel-tables):");
        for k in &st.kernel_tables {
            let state = if k.drift { "DRIFT" } else { "in sync" };
            let _ = write!(s, "  {:<5} {:<9} {state}", k.family, k.table);
            if !k.detail.is_empty() {
                let _ = write!(s, ": {}", k.detail);
            }
            s.push('\n');
        }
    }
    let _ = writeln!(s, "{:>5} {:>20} {:>20}", "CORE", "GENERATION", "PACKETS");
    for c in &st.cores {
        let _ = writeln!(s, "{:>5} {:>20} {:>20}", c.core, c.generation, c.packets);
    }
    s
}

/// A commit event as JSON.
pub fn event_json(e: &CommitEvent) -> Value {
    json!({
        "sequence": e.sequence, "revision": e.revision, "outcome": outcome(e.outcome),
        "phases": phases_json(e.phases.as_ref()), "error": e.error, "time": ts(e.time.as_ref()),
    })
}

/// A commit event as one line.
pub fn event_text(e: &CommitEvent) -> String {
    let at = e.time.as_ref().map_or_else(|| "-".to_owned(), rfc3339);
    let mut s = format!("{at} {} {}", outcome(e.outcome), e.revision);
    if let Some(p) = &e.phases {
        let _ = write!(s, "  {}", phases_text(p));
    }
    if !e.error.is_empty() {
        let _ = write!(s, "  error: {}", e.error);
    }
    s
}

/// A packet event (`vallumctl monitor -o json`): one object a line with every field of
/// `PacketEvent`, `family` as `ipv4`/`ipv6` and `time` as [`ts`].
pub fn packet_event_json(e: &PacketEvent) -> Value {
    let family = match Family::try_from(e.family) {
        Ok(Family::Ipv6) => "ipv6",
        _ => "ipv4",
    };
    json!({
        "kind": event_kind(e.kind), "time": ts(e.time.as_ref()), "ruleset": e.ruleset, "table": e.table,
        "chain": e.chain, "rule": e.rule, "log_prefix": e.log_prefix, "log_level": e.log_level,
        "line": e.line, "family": family, "hook": hook(e.hook), "source": e.source,
        "destination": e.destination, "protocol": e.protocol, "source_port": e.source_port,
        "destination_port": e.destination_port, "in_interface": e.in_interface,
        "out_interface": e.out_interface, "length": e.length, "lost_before": e.lost_before,
    })
}

/// A packet event as one line: time, kind, the rule (`ruleset/table/chain#n`, LOG only),
/// then the kernel-format line; a note first when events were lost before it.
pub fn packet_event_text(e: &PacketEvent) -> String {
    let mut s = String::new();
    if e.lost_before > 0 {
        let _ = writeln!(s, "... {} events lost (reading too slowly)", e.lost_before);
    }
    let time = e.time.as_ref().map(rfc3339).unwrap_or_default();
    let _ = write!(s, "{time} {}", event_kind(e.kind));
    if e.kind == PacketEventKind::Log as i32 {
        let _ = write!(s, " {}/{}/{}#{}", e.ruleset, e.table, e.chain, e.rule);
    }
    let _ = write!(s, "  {}", e.line.trim_end());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_counters_print_the_nft_rule_and_its_text() {
        let c = |rule: u32, nft_rule: u32, text: &str, packets: u64| RuleCounter {
            ruleset: "web".into(),
            family: vallum_proto::v1::Family::Ipv4 as i32,
            table: "nft".into(),
            chain: "inet filter input".into(),
            rule,
            packets,
            bytes: packets * 60,
            text: text.into(),
            nft_rule,
        };
        let out = counters_text(
            &[
                c(0, 0, "DROP", 4),
                c(2, 3, "tcp dport 80 accept", 2),
                c(1, 1, "ip saddr @allowed tcp dport 22 accept", 7),
            ],
            true,
        );
        assert_eq!(
            out,
            "# ruleset web, table nft (ipv4)\n\
             Chain inet filter input (policy DROP 4 packets, 240 bytes)\n\
             num      pkts      bytes  nft  rule\n\
             1           7        420    1  ip saddr @allowed tcp dport 22 accept\n\
             2           2        120    3  tcp dport 80 accept\n\n"
        );
        assert_eq!(counters_json(&[c(2, 3, "x", 1)])[0]["nft_rule"], 3);
    }

    #[test]
    fn deadlines_are_rfc3339_with_time_left() {
        let d = prost_types::Timestamp {
            seconds: 1_900_000_000,
            nanos: 0,
        };
        let now = |s: i64, ns: i32| jiff::Timestamp::new(s, ns).unwrap();
        assert_eq!(rfc3339(&d), "2030-03-17T17:46:40Z");
        assert_eq!(
            deadline_text(&d, now(1_900_000_000 - 60, 0)),
            "by 2030-03-17T17:46:40Z (in 1m)"
        );
        assert_eq!(
            deadline_text(&d, now(1_900_000_000 - 90, 400_000_000)),
            "by 2030-03-17T17:46:40Z (in 1m 30s)"
        );
        assert_eq!(
            deadline_text(&d, now(1_900_000_003, 0)),
            "by 2030-03-17T17:46:40Z (passed 3s ago)"
        );
        let far = prost_types::Timestamp {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert_eq!(
            deadline_text(&far, now(0, 0)),
            format!("by unix time {}", i64::MAX)
        );
    }

    #[test]
    fn events_and_rulesets_carry_rfc3339_times() {
        let t = prost_types::Timestamp {
            seconds: 1_900_000_000,
            nanos: 5,
        };
        let e = CommitEvent {
            revision: "rulesets/web/revisions/2".into(),
            outcome: CommitOutcome::Committed as i32,
            time: Some(t),
            ..Default::default()
        };
        assert_eq!(
            event_text(&e),
            "2030-03-17T17:46:40Z committed rulesets/web/revisions/2"
        );
        let r = Ruleset {
            name: "rulesets/web".into(),
            update_time: Some(t),
            ..Default::default()
        };
        let text = rulesets_text(&[r]);
        assert!(text.lines().next().unwrap().ends_with("UPDATED"), "{text}");
        assert!(text.contains("2030-03-17T17:46:40Z"), "{text}");
    }

    #[test]
    fn splits_rule_text_into_columns() {
        let c = columns(
            "-s 10.0.0.0/8 ! -i eth0 -p tcp -m tcp --dport 22 -m comment --comment \"ssh in\" -j ACCEPT",
            "ipv4",
        );
        assert_eq!(c.source, "10.0.0.0/8");
        assert_eq!(c.inp, "!eth0");
        assert_eq!(c.prot, "tcp");
        assert_eq!(c.target, "ACCEPT");
        assert_eq!(
            c.rest,
            [
                "-m",
                "tcp",
                "--dport",
                "22",
                "-m",
                "comment",
                "--comment",
                "\"ssh in\""
            ]
        );
        let c = columns("-j REJECT --reject-with icmp-port-unreachable", "ipv6");
        assert_eq!(c.source, "::/0");
        assert_eq!(c.rest, ["--reject-with", "icmp-port-unreachable"]);
        let c = columns("! -f -j DROP", "ipv4");
        assert_eq!(c.opt, "!f");
        // The engine's tokenizer: a quoted `"!"` negates (as iptables), a word keeps its
        // quotes and escapes when printed, tabs separate.
        let c = columns(
            "\"!\" -s 10.0.0.1\t-m comment --comment \"say \\\"hi\\\"\" -j ACCEPT",
            "ipv4",
        );
        assert_eq!(c.source, "!10.0.0.1");
        assert_eq!(c.rest, ["-m", "comment", "--comment", "\"say \\\"hi\\\"\""]);
        // An unterminated quote (not canonical text) is kept whole, not dropped.
        let c = columns("-m comment --comment \"open", "ipv4");
        assert_eq!(c.rest, ["-m comment --comment \"open"]);
    }
}
