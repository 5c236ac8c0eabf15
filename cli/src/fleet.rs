//! `vallumctl fleet ...`: FleetService (served by a vallumd started with `--fleet-endpoints`).
//!
//! | command | does |
//! |---|---|
//! | `fleet apply NAME FILE [--selector S] [--priority N] [-m MSG] [--etag E] [--validate-only]` | validate as Apply, write to etcd |
//! | `fleet status NAME` | selected / applied / failed (with errors) / pending / stale nodes |
//! | `fleet wait NAME [--revision R] [--wait-timeout D]` | until every selected node ACKed (exit 0), one NACKed or the time is up (exit 1) |
//! | `fleet list` | the fleet rulesets |
//! | `fleet delete NAME [--etag E]` | delete from etcd; every node removes it |
//! | `fleet nodes` | live nodes, their labels and version |

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value, json};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use vallum_proto::v1::fleet_service_client::FleetServiceClient;
use vallum_proto::v1::{self as pb};

use crate::connect::Auth;
use crate::error::CliError;
use crate::input::with_file;
use crate::output::{Output, print};
use crate::rulesets::{SourceArgs, source};

/// The client type.
pub type Client = FleetServiceClient<InterceptedService<Channel, Auth>>;

/// `vallumctl fleet` subcommands.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Validate FILE exactly as `apply` does, then write it as fleet ruleset NAME.
    Apply {
        /// Ruleset name.
        name: String,
        /// iptables-restore file.
        file: PathBuf,
        /// Node selector: `k=v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined
        /// by commas; empty selects every node.
        #[arg(long, default_value = "")]
        selector: String,
        /// Priority among active rulesets (lower runs first).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Message.
        #[arg(long, short = 'm', default_value = "")]
        message: String,
        /// Only write if the fleet ruleset's etag still matches (`0`: only if new).
        #[arg(long)]
        etag: Option<String>,
        /// Check only; write nothing.
        #[arg(long)]
        validate_only: bool,
        /// Idempotency key.
        #[arg(long)]
        request_id: Option<String>,
        /// Write a ruleset with no rule and no DROP policy (refused otherwise, as `apply`).
        #[arg(long)]
        allow_empty: bool,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Rollout status of NAME: which selected nodes ACKed, NACKed, are pending or stale.
    Status {
        /// Ruleset name.
        name: String,
    },
    /// Wait until every selected live node ACKed the fleet revision (exit 0), or a node
    /// NACKed it, a later write replaced it, or the wait timed out (exit 1). Not bound by
    /// `--timeout`.
    Wait {
        /// Ruleset name.
        name: String,
        /// The fleet revision (default: the current one).
        #[arg(long, default_value_t = 0)]
        revision: i64,
        /// How long to wait, e.g. `60s`, `5m`.
        #[arg(long, default_value = "60s", value_parser = crate::args::parse_duration)]
        wait_timeout: std::time::Duration,
    },
    /// The fleet rulesets.
    List,
    /// Delete fleet ruleset NAME: every node removes it.
    Delete {
        /// Ruleset name.
        name: String,
        /// Only delete if the etag still matches.
        #[arg(long)]
        etag: Option<String>,
    },
    /// The live nodes.
    Nodes,
}

impl FleetCommand {
    /// Whether the command changes state.
    pub fn changes(&self) -> bool {
        match self {
            FleetCommand::Apply { validate_only, .. } => !validate_only,
            FleetCommand::Delete { .. } => true,
            FleetCommand::Status { .. }
            | FleetCommand::Wait { .. }
            | FleetCommand::List
            | FleetCommand::Nodes => false,
        }
    }
}

fn ruleset_json(r: &pb::FleetRuleset) -> Value {
    json!({
        "name": r.name,
        "fleet_revision": r.fleet_revision,
        "etag": r.etag,
        "selector": r.selector,
        "priority": r.priority,
        "message": r.message,
        "author": r.author,
        "write_time": r.write_time.as_ref().map(|t| t.seconds),
    })
}

fn status_json(s: &pb::NodeStatus) -> Value {
    json!({
        "node": s.node,
        "fleet_revision": s.fleet_revision,
        "result": if s.result == pb::NodeResult::Ack as i32 { "ACK" } else { "NACK" },
        "error": s.error,
        "local_revision": s.local_revision,
        "latency_seconds": s.latency_seconds,
    })
}

/// Runs one `fleet` subcommand.
///
/// Errors: the call's status, or a file that cannot be read.
pub async fn run(c: &mut Client, out: Output, cmd: &FleetCommand) -> Result<(), CliError> {
    match cmd {
        FleetCommand::Apply {
            name,
            file,
            selector,
            priority,
            message,
            etag,
            validate_only,
            request_id,
            allow_empty,
            source: args,
        } => {
            let r = c
                .put_ruleset(pb::PutFleetRulesetRequest {
                    name: name.clone(),
                    source: Some(source(file, args)?),
                    priority: *priority,
                    selector: selector.clone(),
                    message: message.clone(),
                    etag: etag.clone().unwrap_or_default(),
                    validate_only: *validate_only,
                    request_id: request_id.clone().unwrap_or_default(),
                    allow_empty: *allow_empty,
                })
                .await
                .map_err(with_file(file))?
                .into_inner();
            print(out, ruleset_json(&r), || {
                if *validate_only {
                    format!("fleet ruleset {name}: valid (nothing written)\n")
                } else {
                    format!(
                        "fleet ruleset {name}: fleet revision {} (etag {}), selector {:?}\n",
                        r.fleet_revision, r.etag, r.selector
                    )
                }
            })
        }
        FleetCommand::Status { name } => {
            let s = c
                .get_rollout_status(pb::GetRolloutStatusRequest { name: name.clone() })
                .await?
                .into_inner();
            let json = json!({
                "name": s.name,
                "fleet_revision": s.fleet_revision,
                "selected": s.selected,
                "applied": s.applied.iter().map(status_json).collect::<Vec<_>>(),
                "failed": s.failed.iter().map(status_json).collect::<Vec<_>>(),
                "pending": s.pending,
                "stale": s.stale.iter().map(status_json).collect::<Vec<_>>(),
            });
            print(out, json, || {
                let mut t = format!(
                    "fleet ruleset {} at fleet revision {}: {}/{} applied, {} failed, {} pending, {} stale\n",
                    s.name,
                    s.fleet_revision,
                    s.applied.len(),
                    s.selected.len(),
                    s.failed.len(),
                    s.pending.len(),
                    s.stale.len()
                );
                for a in &s.applied {
                    let _ = writeln!(
                        t,
                        "  {}  ACK   local revision {}  latency {:.3}s",
                        a.node, a.local_revision, a.latency_seconds
                    );
                }
                for f in &s.failed {
                    let _ = writeln!(t, "  {}  NACK  {}", f.node, f.error);
                }
                for p in &s.pending {
                    let _ = writeln!(t, "  {p}  PENDING");
                }
                for st in &s.stale {
                    let _ = writeln!(
                        t,
                        "  {}  STALE (node gone; last report fleet revision {})",
                        st.node, st.fleet_revision
                    );
                }
                t
            })
        }
        FleetCommand::Wait {
            name,
            revision,
            wait_timeout,
        } => {
            let mut stream = c
                .wait_rollout(pb::WaitRolloutRequest {
                    name: name.clone(),
                    fleet_revision: *revision,
                    timeout: Some(prost_types::Duration {
                        seconds: i64::try_from(wait_timeout.as_secs()).unwrap_or(i64::MAX),
                        nanos: i32::try_from(wait_timeout.subsec_nanos()).unwrap_or(0),
                    }),
                })
                .await?
                .into_inner();
            let mut last = None;
            while let Some(p) = stream.message().await? {
                let s = p.status.clone().unwrap_or_default();
                if out == Output::Text {
                    crate::write_stdout(&format!(
                        "{} fleet revision {}: {}/{} applied, {} failed, {} pending\n",
                        phase_name(p.phase),
                        s.fleet_revision,
                        s.applied.len(),
                        s.selected.len(),
                        s.failed.len(),
                        s.pending.len()
                    ));
                    for f in &s.failed {
                        crate::write_stdout(&format!("  {}  NACK  {}\n", f.node, f.error));
                    }
                }
                last = Some(p);
            }
            let last = last.unwrap_or_default();
            let s = last.status.clone().unwrap_or_default();
            if out == Output::Json {
                print(
                    out,
                    json!({
                        "name": s.name,
                        "phase": phase_name(last.phase),
                        "fleet_revision": s.fleet_revision,
                        "selected": s.selected,
                        "applied": s.applied.iter().map(status_json).collect::<Vec<_>>(),
                        "failed": s.failed.iter().map(status_json).collect::<Vec<_>>(),
                        "pending": s.pending,
                    }),
                    String::new,
                )?;
            }
            // The outcome as a status, for the exit code and the headline: a timeout exits 3
            // (DEADLINE_EXCEEDED), a NACK or a newer write 1.
            let what = format!(
                "fleet ruleset {name} at fleet revision {}",
                s.fleet_revision
            );
            match pb::RolloutPhase::try_from(last.phase) {
                Ok(pb::RolloutPhase::Done) => Ok(()),
                Ok(pb::RolloutPhase::TimedOut) => Err(tonic::Status::deadline_exceeded(format!(
                    "{what}: {} node(s) still pending after {wait_timeout:?}",
                    s.pending.len()
                ))
                .into()),
                Ok(pb::RolloutPhase::Failed) => Err(tonic::Status::failed_precondition(format!(
                    "{what}: NACKed by {}",
                    s.failed
                        .iter()
                        .map(|f| f.node.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .into()),
                _ => Err(tonic::Status::failed_precondition(format!(
                    "{what}: replaced by a later write before it was applied"
                ))
                .into()),
            }
        }
        FleetCommand::List => {
            let r = c
                .list_rulesets(pb::ListFleetRulesetsRequest {})
                .await?
                .into_inner();
            let json = Value::Array(r.rulesets.iter().map(ruleset_json).collect());
            print(out, json, || {
                let mut t = String::new();
                for r in &r.rulesets {
                    let _ = writeln!(
                        t,
                        "{}  fleet revision {}  selector {:?}  {}",
                        r.name, r.fleet_revision, r.selector, r.message
                    );
                }
                t
            })
        }
        FleetCommand::Delete { name, etag } => {
            let r = c
                .delete_ruleset(pb::DeleteFleetRulesetRequest {
                    name: name.clone(),
                    etag: etag.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            print(
                out,
                json!({"name": name, "fleet_revision": r.fleet_revision}),
                || {
                    format!(
                        "fleet ruleset {name}: deleted at fleet revision {}\n",
                        r.fleet_revision
                    )
                },
            )
        }
        FleetCommand::Nodes => {
            let r = c.list_nodes(pb::ListNodesRequest {}).await?.into_inner();
            let json = Value::Array(
                r.nodes
                    .iter()
                    .map(|n| {
                        json!({
                            "name": n.name,
                            "labels": n.labels,
                            "version": n.version,
                            "heartbeat_time": n.heartbeat_time.as_ref().map(|t| t.seconds),
                        })
                    })
                    .collect(),
            );
            print(out, json, || {
                let mut t = String::new();
                for n in &r.nodes {
                    let mut labels: Vec<String> =
                        n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    labels.sort();
                    let _ = writeln!(t, "{}  {}  vallumd {}", n.name, labels.join(","), n.version);
                }
                t
            })
        }
    }
}

fn phase_name(phase: i32) -> &'static str {
    match pb::RolloutPhase::try_from(phase) {
        Ok(pb::RolloutPhase::Progressing) => "PROGRESSING",
        Ok(pb::RolloutPhase::Done) => "DONE",
        Ok(pb::RolloutPhase::Failed) => "FAILED",
        Ok(pb::RolloutPhase::Superseded) => "SUPERSEDED",
        Ok(pb::RolloutPhase::TimedOut) => "TIMED_OUT",
        Ok(pb::RolloutPhase::Unspecified) | Err(_) => "UNKNOWN",
    }
}
