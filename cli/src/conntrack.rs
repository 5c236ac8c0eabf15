//! `vallumctl conntrack list|delete|flush|stats`: the engine's connection table through
//! `vallum.v1.ConntrackService`, printed like conntrack-tools' `conntrack -L -o extended`:
//!
//! ```text
//! ipv4     2 tcp      6 431999 ESTABLISHED src=10.0.0.2 dst=10.0.0.1 sport=40000 dport=22 src=10.0.0.1 dst=10.0.0.2 sport=22 dport=40000
//! ipv4     2 udp      17 29 src=10.0.0.1 dst=192.0.2.53 sport=5353 dport=53 [UNREPLIED] src=192.0.2.53 dst=10.0.0.1 sport=53 dport=5353
//! ```
//!
//! Field by field: family name and number (AF_INET 2, AF_INET6 10), protocol name and number,
//! seconds until the entry expires, the TCP state, the original tuple, `[UNREPLIED]` when no
//! reply was seen, the reply tuple. ICMP tuples print `type=` and `code=` instead of ports.
//! Like `conntrack`, the count line (`N flow entries have been shown.`) goes to stderr, so the
//! entries alone can be piped.

use std::fmt::Write as _;

use serde_json::{Value, json};
use vallum_proto::v1::conntrack_service_client::ConntrackServiceClient;
use vallum_proto::v1::{
    self as pb, ConntrackFilter, DeleteConntrackRequest, FlushConntrackRequest,
    GetConntrackStatsRequest, ListConntrackRequest,
};

use crate::args::FamilyArg;
use crate::connect::Svc;
use crate::error::CliError;
use crate::output::{Output, print};
use crate::pages::PAGE_SIZE;

/// `vallumctl conntrack ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ConntrackCmd {
    /// List connection-table entries (as `conntrack -L`), optionally filtered.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Most entries to show (0: all; vallumctl reads them page by page).
        #[arg(long, default_value_t = 0)]
        limit: u64,
    },
    /// Delete the entries that match the filter (as `conntrack -D`); at least one filter.
    Delete {
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Delete every entry (as `conntrack -F`).
    Flush,
    /// Table size and counters (as `conntrack -S` / `-C`).
    Stats,
}

/// Filters on an entry's original direction, named as conntrack-tools' options.
#[derive(Debug, Default, clap::Args)]
pub struct FilterArgs {
    /// Family.
    #[arg(short = 'f', long, value_enum)]
    family: Option<FamilyArg>,
    /// Protocol name or number (tcp, udp, icmp, ipv6-icmp, 47, ...).
    #[arg(short = 'p', long = "proto")]
    proto: Option<String>,
    /// Original source address or prefix (10.0.0.0/8).
    #[arg(short = 's', long = "src", visible_alias = "orig-src")]
    src: Option<String>,
    /// Original destination address or prefix.
    #[arg(short = 'd', long = "dst", visible_alias = "orig-dst")]
    dst: Option<String>,
    /// Original source port.
    #[arg(long = "sport", visible_alias = "orig-port-src")]
    sport: Option<u16>,
    /// Original destination port.
    #[arg(long = "dport", visible_alias = "orig-port-dst")]
    dport: Option<u16>,
    /// TCP state: SYN_SENT, SYN_RECV, ESTABLISHED, FIN_WAIT, LAST_ACK, TIME_WAIT, CLOSE.
    #[arg(long)]
    state: Option<String>,
}

impl FilterArgs {
    fn to_pb(&self) -> ConntrackFilter {
        ConntrackFilter {
            family: match self.family {
                None => pb::Family::Unspecified,
                Some(FamilyArg::Ipv4) => pb::Family::Ipv4,
                Some(FamilyArg::Ipv6) => pb::Family::Ipv6,
            } as i32,
            protocol: self.proto.clone().unwrap_or_default(),
            source: self.src.clone().unwrap_or_default(),
            destination: self.dst.clone().unwrap_or_default(),
            source_port: self.sport.map_or(0, u32::from),
            destination_port: self.dport.map_or(0, u32::from),
            state: self
                .state
                .as_deref()
                .map(str::to_ascii_uppercase)
                .unwrap_or_default(),
        }
    }
}

/// The entries that match `filter`, page by page, at most `limit` (0: all), with the
/// server's count of all matching entries (from the first page).
async fn list_all(
    client: &mut ConntrackServiceClient<Svc>,
    filter: pb::ConntrackFilter,
    limit: u64,
) -> Result<pb::ListConntrackResponse, CliError> {
    let mut all = pb::ListConntrackResponse::default();
    let mut token = String::new();
    loop {
        let left = match limit {
            0 => PAGE_SIZE,
            n => {
                u32::try_from(n - all.entries.len() as u64).map_or(PAGE_SIZE, |l| l.min(PAGE_SIZE))
            }
        };
        let r = client
            .list(ListConntrackRequest {
                filter: Some(filter.clone()),
                page_size: left,
                page_token: token.clone(),
            })
            .await?
            .into_inner();
        if token.is_empty() {
            all.matched = r.matched;
        }
        all.entries.extend(r.entries);
        if limit != 0 && all.entries.len() as u64 >= limit {
            break;
        }
        match crate::pages::next(&token, r.next_page_token)? {
            Some(t) => token = t,
            None => break,
        }
    }
    Ok(all)
}

/// Runs one `conntrack` subcommand.
pub async fn run(
    client: &mut ConntrackServiceClient<Svc>,
    cmd: &ConntrackCmd,
    out: Output,
) -> Result<(), CliError> {
    match cmd {
        ConntrackCmd::List { filter, limit } => {
            let r = list_all(client, filter.to_pb(), *limit).await?;
            print(out, list_json(&r), || {
                r.entries.iter().map(entry_line).collect::<String>()
            })?;
            if out == Output::Text {
                let shown = r.entries.len();
                if (shown as u64) < r.matched {
                    eprintln!(
                        "{shown} flow entries have been shown ({} matched; --limit cut the list).",
                        r.matched
                    );
                } else {
                    eprintln!("{shown} flow entries have been shown.");
                }
            }
        }
        ConntrackCmd::Delete { filter } => {
            let r = client
                .delete(DeleteConntrackRequest {
                    filter: Some(filter.to_pb()),
                    ..Default::default()
                })
                .await?
                .into_inner();
            print(out, json!({"deleted": r.deleted}), || {
                format!("{} flow entries have been deleted.\n", r.deleted)
            })?;
        }
        ConntrackCmd::Flush => {
            let r = client
                .flush(FlushConntrackRequest::default())
                .await?
                .into_inner();
            print(out, json!({"deleted": r.deleted}), || {
                format!(
                    "connection tracking table has been emptied ({} flow entries deleted).\n",
                    r.deleted
                )
            })?;
        }
        ConntrackCmd::Stats => {
            let s = client
                .get_stats(GetConntrackStatsRequest {})
                .await?
                .into_inner();
            print(out, stats_json(&s), || stats_text(&s))?;
        }
    }
    Ok(())
}

/// conntrack-tools' protocol names.
fn proto_name(p: u32) -> &'static str {
    match p {
        1 => "icmp",
        6 => "tcp",
        17 => "udp",
        33 => "dccp",
        47 => "gre",
        58 => "icmpv6",
        132 => "sctp",
        136 => "udplite",
        _ => "unknown",
    }
}

fn is_icmp(p: u32) -> bool {
    p == 1 || p == 58
}

fn tuple_text(s: &mut String, t: Option<&pb::ConntrackTuple>, protocol: u32) {
    let Some(t) = t else { return };
    let _ = write!(s, "src={} dst={} ", t.source, t.destination);
    if is_icmp(protocol) {
        let _ = write!(s, "type={} code={} ", t.icmp_type, t.icmp_code);
    } else if t.source_port != 0 || t.destination_port != 0 {
        let _ = write!(s, "sport={} dport={} ", t.source_port, t.destination_port);
    }
}

/// One entry as a `conntrack -L -o extended` line.
pub fn entry_line(e: &pb::ConntrackEntry) -> String {
    let (fam, num) = if e.family == pb::Family::Ipv6 as i32 {
        ("ipv6", 10)
    } else {
        ("ipv4", 2)
    };
    let secs = e.expires_in.as_ref().map_or(0, |d| d.seconds.max(0));
    let mut s = format!(
        "{fam:<8} {num} {:<8} {} {secs} ",
        proto_name(e.protocol),
        e.protocol
    );
    if !e.state.is_empty() {
        let _ = write!(s, "{} ", e.state);
    }
    tuple_text(&mut s, e.original.as_ref(), e.protocol);
    if !e.seen_reply {
        s.push_str("[UNREPLIED] ");
    }
    tuple_text(&mut s, e.reply.as_ref(), e.protocol);
    let mut line = s.trim_end().to_owned();
    line.push('\n');
    line
}

fn tuple_json(t: Option<&pb::ConntrackTuple>, protocol: u32) -> Value {
    let Some(t) = t else { return Value::Null };
    if is_icmp(protocol) {
        json!({"src": t.source, "dst": t.destination, "type": t.icmp_type, "code": t.icmp_code})
    } else {
        json!({"src": t.source, "dst": t.destination, "sport": t.source_port, "dport": t.destination_port})
    }
}

/// One entry as JSON.
pub fn entry_json(e: &pb::ConntrackEntry) -> Value {
    json!({
        "family": if e.family == pb::Family::Ipv6 as i32 { "ipv6" } else { "ipv4" },
        "protocol": proto_name(e.protocol),
        "protocol_number": e.protocol,
        "timeout": e.expires_in.as_ref().map_or(0, |d| d.seconds.max(0)),
        "state": if e.state.is_empty() { Value::Null } else { json!(e.state) },
        "original": tuple_json(e.original.as_ref(), e.protocol),
        "reply": tuple_json(e.reply.as_ref(), e.protocol),
        "seen_reply": e.seen_reply,
    })
}

fn list_json(r: &pb::ListConntrackResponse) -> Value {
    json!({
        "entries": r.entries.iter().map(entry_json).collect::<Vec<_>>(),
        "matched": r.matched,
    })
}

fn stats_json(s: &pb::ConntrackStats) -> Value {
    json!({
        "entries": s.entries,
        "max_entries": s.max_entries,
        "buckets": s.buckets,
        "new": s.new_total,
        "early_drop": s.early_drops,
        "insert_failed": s.insert_failed,
    })
}

fn stats_text(s: &pb::ConntrackStats) -> String {
    format!(
        "entries={} max={} buckets={} new={} early_drop={} insert_failed={}\n",
        s.entries, s.max_entries, s.buckets, s.new_total, s.early_drops, s.insert_failed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src: &str, dst: &str, sp: u32, dp: u32) -> Option<pb::ConntrackTuple> {
        Some(pb::ConntrackTuple {
            source: src.into(),
            destination: dst.into(),
            source_port: sp,
            destination_port: dp,
            ..Default::default()
        })
    }

    #[test]
    fn lines_look_like_conntrack_l() {
        let tcp = pb::ConntrackEntry {
            family: pb::Family::Ipv4 as i32,
            protocol: 6,
            original: tuple("10.0.0.2", "10.0.0.1", 40000, 22),
            reply: tuple("10.0.0.1", "10.0.0.2", 22, 40000),
            state: "ESTABLISHED".into(),
            seen_reply: true,
            expires_in: Some(prost_types::Duration {
                seconds: 431_999,
                nanos: 5,
            }),
        };
        assert_eq!(
            entry_line(&tcp),
            "ipv4     2 tcp      6 431999 ESTABLISHED src=10.0.0.2 dst=10.0.0.1 sport=40000 dport=22 src=10.0.0.1 dst=10.0.0.2 sport=22 dport=40000\n"
        );
        let ping = pb::ConntrackEntry {
            family: pb::Family::Ipv6 as i32,
            protocol: 58,
            original: Some(pb::ConntrackTuple {
                source: "2001:db8::1".into(),
                destination: "2001:db8::2".into(),
                icmp_type: 128,
                ..Default::default()
            }),
            reply: Some(pb::ConntrackTuple {
                source: "2001:db8::2".into(),
                destination: "2001:db8::1".into(),
                icmp_type: 129,
                ..Default::default()
            }),
            expires_in: Some(prost_types::Duration {
                seconds: 29,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert_eq!(
            entry_line(&ping),
            "ipv6     10 icmpv6   58 29 src=2001:db8::1 dst=2001:db8::2 type=128 code=0 [UNREPLIED] src=2001:db8::2 dst=2001:db8::1 type=129 code=0\n"
        );
        let j = entry_json(&ping);
        assert_eq!(j["original"]["type"], 128);
        assert_eq!(j["state"], Value::Null);
    }
}
