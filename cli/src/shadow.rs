//! `vallumctl shadow`: RulesetService's ShadowRevision, GetShadowReport and EndShadow. A
//! stored revision classifies the live packets beside the active one for a while; the
//! report says what it would have changed (docs/operations.md "Try a change on live
//! traffic").

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;
use vallum_proto::v1::{
    EndShadowRequest, GetShadowReportRequest, ShadowEnd, ShadowReport, ShadowRevisionRequest,
};

use crate::args::{parse_duration, proto_duration, revision_arg};
use crate::connect::Svc;
use crate::error::CliError;
use crate::output::{Output, print};
use crate::view::{self, verdict};

/// Flags of `shadow`: start one (`shadow web/7 --for 10m`), or a subcommand.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ShadowArgs {
    #[command(subcommand)]
    pub command: Option<ShadowCommand>,
    #[command(flatten)]
    pub start: StartArgs,
}

/// Starting a shadow.
#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// The stored revision to shadow the active one with (RULESET/N or
    /// rulesets/RULESET/revisions/N).
    #[arg(value_parser = revision_arg, required = true)]
    pub revision: Option<String>,
    /// How long it runs (e.g. 10m; at most 24h).
    #[arg(long = "for", value_parser = parse_duration, required = true, env = "VALLUM_SHADOW_FOR", value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// Keep 1 in N differing packets for `monitor` (kind shadow); default 1.
    #[arg(
        long,
        env = "VALLUM_SHADOW_SAMPLE",
        value_name = "N",
        default_value_t = 1
    )]
    pub sample: u32,
    /// Rows of each core's table of differing flows (default 1024).
    #[arg(
        long,
        env = "VALLUM_SHADOW_MAX_FLOWS",
        value_name = "N",
        default_value_t = 1024
    )]
    pub max_flows: u32,
}

/// `shadow` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ShadowCommand {
    /// What the ruleset's shadow saw (running, or the last that ended): packets by verdict
    /// pair and the flows whose verdict would change.
    Report {
        /// The ruleset.
        ruleset: String,
    },
    /// End the ruleset's running shadow and print its last report.
    End {
        /// The ruleset.
        ruleset: String,
    },
}

/// Runs `shadow`.
pub async fn run(
    c: &mut RulesetServiceClient<Svc>,
    out: Output,
    args: &ShadowArgs,
) -> Result<(), CliError> {
    let r = match &args.command {
        Some(ShadowCommand::Report { ruleset }) => c
            .get_shadow_report(GetShadowReportRequest {
                ruleset: ruleset.clone(),
            })
            .await?
            .into_inner(),
        Some(ShadowCommand::End { ruleset }) => c
            .end_shadow(EndShadowRequest {
                ruleset: ruleset.clone(),
            })
            .await?
            .into_inner(),
        None => {
            let s = &args.start;
            c.shadow_revision(ShadowRevisionRequest {
                name: s.revision.clone().unwrap_or_default(),
                duration: proto_duration(s.duration),
                sample_one_in: s.sample,
                max_flows: s.max_flows,
            })
            .await?
            .into_inner()
        }
    };
    print(out, report_json(&r), || report_text(&r))
}

/// A shadow's end as a word (`ended`, `expired`, ...; empty while it runs).
pub fn ended(v: i32) -> &'static str {
    match ShadowEnd::try_from(v) {
        Ok(ShadowEnd::Unspecified) => "",
        Ok(ShadowEnd::Ended) => "ended",
        Ok(ShadowEnd::Expired) => "expired",
        Ok(ShadowEnd::Committed) => "committed",
        Ok(ShadowEnd::Replaced) => "replaced",
        Err(_) => "?",
    }
}

fn ts(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref().map_or_else(String::new, view::rfc3339)
}

/// Shadows the active revision of `ruleset` with `name` for `duration`, waits until the
/// server ended it (its timer checks every `--confirm-check-interval`), and returns the last
/// report (`ended` says whether it ran its time: EXPIRED).
pub async fn shadow_for(
    c: &mut RulesetServiceClient<Svc>,
    name: &str,
    ruleset: &str,
    duration: Duration,
) -> Result<ShadowReport, CliError> {
    c.shadow_revision(ShadowRevisionRequest {
        name: name.to_string(),
        duration: proto_duration(Some(duration)),
        sample_one_in: 0,
        max_flows: 0,
    })
    .await?;
    let start = tokio::time::Instant::now();
    loop {
        let left = duration.saturating_sub(start.elapsed());
        tokio::time::sleep(left.clamp(Duration::from_millis(100), Duration::from_secs(1))).await;
        let r = c
            .get_shadow_report(GetShadowReportRequest {
                ruleset: ruleset.to_string(),
            })
            .await?
            .into_inner();
        if !r.running || r.name != name {
            return Ok(r);
        }
    }
}

/// A shadow report as JSON.
pub fn report_json(r: &ShadowReport) -> Value {
    json!({
        "name": r.name,
        "running": r.running,
        "started": ts(&r.started),
        "ends": ts(&r.ends),
        "ended": ended(r.ended),
        "changed_packets": r.changed_packets,
        "changed_flows": r.changed_flows,
        "overflow_packets": r.overflow_packets,
        "pairs": r.pairs.iter().map(|p| json!({
            "active": verdict(p.active), "shadow": verdict(p.shadow),
            "packets": p.packets, "bytes": p.bytes,
        })).collect::<Vec<_>>(),
        "flows": r.flows.iter().map(|f| json!({
            "source": f.source, "destination": f.destination, "protocol": f.protocol,
            "source_port": f.source_port, "destination_port": f.destination_port,
            "in_interface": f.in_interface, "packets": f.packets, "bytes": f.bytes,
            "first_seen": ts(&f.first_seen), "last_seen": ts(&f.last_seen),
            "active_verdict": verdict(f.active_verdict),
            "shadow_verdict": verdict(f.shadow_verdict),
            "active_rule": f.active_rule, "shadow_rule": f.shadow_rule,
        })).collect::<Vec<_>>(),
    })
}

/// A shadow report as text: a head line, the verdict pairs, then a table of the flows.
pub fn report_text(r: &ShadowReport) -> String {
    let mut s = String::new();
    let state = if r.running {
        format!("running until {}", ts(&r.ends))
    } else {
        ended(r.ended).to_string()
    };
    let _ = writeln!(
        s,
        "shadow {} ({state}, started {}): {} packets in {} flows would change",
        r.name,
        ts(&r.started),
        r.changed_packets,
        r.changed_flows
    );
    for p in &r.pairs {
        let _ = writeln!(
            s,
            "  {:<6} -> {:<6} {:>12} packets {:>14} bytes",
            verdict(p.active),
            verdict(p.shadow),
            p.packets,
            p.bytes
        );
    }
    if r.overflow_packets > 0 {
        let _ = writeln!(
            s,
            "  ({} differing packets of flows past the table)",
            r.overflow_packets
        );
    }
    if !r.flows.is_empty() {
        let _ = writeln!(
            s,
            "{:<44} {:<6} {:>10} {:>12}  {:<15} RULE (active -> shadow)",
            "FLOW", "IN", "PACKETS", "BYTES", "VERDICT"
        );
        for f in &r.flows {
            let flow = format!(
                "{}:{} -> {}:{} proto {}",
                f.source, f.source_port, f.destination, f.destination_port, f.protocol
            );
            let _ = writeln!(
                s,
                "{flow:<44} {:<6} {:>10} {:>12}  {:<15} {} -> {}",
                f.in_interface,
                f.packets,
                f.bytes,
                format!(
                    "{} -> {}",
                    verdict(f.active_verdict),
                    verdict(f.shadow_verdict)
                ),
                if f.active_rule.is_empty() {
                    "-"
                } else {
                    &f.active_rule
                },
                if f.shadow_rule.is_empty() {
                    "-"
                } else {
                    &f.shadow_rule
                },
            );
        }
    }
    s
}
