//! `vallumctl fleet ...`: FleetService (served by a vallumd started with `--fleet-endpoints`).
//!
//! | command | does |
//! |---|---|
//! | `fleet apply NAME FILE [--selector S] [--priority N] [-m MSG] [--etag E] [--validate-only]` | validate as Apply, write to etcd |
//! | `fleet status NAME` | selected / applied / failed (with errors) / pending / stale nodes |
//! | `fleet wait NAME [--revision R] [--wait-timeout D] [--allow-no-nodes]` | until every selected node ACKed (exit 0), one NACKed, it selects no live node (exit 1) or the time is up (exit 3) |
//! | `fleet rollout NAME FILE --canary S [--selector S] [--timeout D]` | canary nodes first, wait for their ACKs, stop on a NACK; then every selected node |
//! | `fleet list` | the fleet rulesets |
//! | `fleet delete NAME [--etag E]` | delete from etcd; every node removes it |
//! | `fleet nodes` | live nodes, their labels and version |

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

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
use crate::pages::{PAGE_SIZE, all_pages};
use crate::rulesets::{SourceArgs, source};
use crate::view;

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
    /// NACKed it, a later write replaced it, or it selects no live node (exit 1), or the
    /// wait timed out (exit 3). Not bound by `--timeout`.
    Wait {
        /// Ruleset name.
        name: String,
        /// The fleet revision (default: the current one).
        #[arg(long, default_value_t = 0)]
        revision: i64,
        /// How long to wait, e.g. `60s`, `5m`.
        #[arg(long, default_value = "60s", value_parser = crate::args::parse_duration)]
        wait_timeout: std::time::Duration,
        /// Succeed when the revision selects no live node (0/0 applied); without it that is
        /// NO_NODES (exit 1): nothing was rolled out.
        #[arg(long)]
        allow_no_nodes: bool,
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
    /// Roll FILE out as fleet ruleset NAME in two steps: first only to the selected nodes
    /// that the canary selector also matches (the others keep the content they enforce),
    /// waiting for every one of them to ACK; then to every selected node, waiting again.
    /// Stops at the canary step on a NACK (exit 1, the NACKs reported; the non-canary nodes
    /// untouched) and when a step's wait passes `--timeout` (exit 3). `--timeout` bounds
    /// each step's wait (and each call).
    Rollout {
        /// Ruleset name.
        name: String,
        /// iptables-restore file.
        file: PathBuf,
        /// The canary selector (same syntax as --selector); must match at least one live
        /// selected node.
        #[arg(long)]
        canary: String,
        /// Node selector of the full rollout; empty selects every node.
        #[arg(long, default_value = "")]
        selector: String,
        /// Priority among active rulesets (lower runs first).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Message.
        #[arg(long, short = 'm', default_value = "")]
        message: String,
        /// Only start if the fleet ruleset's etag still matches (`0`: only if new).
        #[arg(long)]
        etag: Option<String>,
        /// Write a ruleset with no rule and no DROP policy (refused otherwise, as `apply`).
        #[arg(long)]
        allow_empty: bool,
        #[command(flatten)]
        source: SourceArgs,
    },
}

impl FleetCommand {
    /// Whether the command changes state.
    pub fn changes(&self) -> bool {
        match self {
            FleetCommand::Apply { validate_only, .. } => !validate_only,
            FleetCommand::Delete { .. } | FleetCommand::Rollout { .. } => true,
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
        "latency_seconds": view::ns(s.latency.as_ref()) as f64 / 1e9,
        "phases_ns": s.phases.as_ref().map(|p| json!({
            "validate": view::ns(p.validate.as_ref()),
            "compile": view::ns(p.compile.as_ref()),
            "persist": view::ns(p.persist.as_ref()),
            "publish": view::ns(p.publish.as_ref()),
            "quiesce": view::ns(p.quiesce.as_ref()),
            "total": view::ns(p.total.as_ref()),
        })),
    })
}

/// Runs one `fleet` subcommand; `timeout` is `--timeout` (for `rollout`, each step's wait).
///
/// Errors: the call's status, or a file that cannot be read.
pub async fn run(
    c: &mut Client,
    out: Output,
    cmd: &FleetCommand,
    timeout: Duration,
) -> Result<(), CliError> {
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
                    canary: String::new(),
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
                "canary": s.canary,
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
                if !s.canary.is_empty() {
                    let _ = writeln!(t, "  canary phase: only nodes matching {:?}", s.canary);
                }
                for a in &s.applied {
                    let _ = writeln!(
                        t,
                        "  {}  ACK   local revision {}  latency {:.3}s",
                        a.node,
                        a.local_revision,
                        view::ns(a.latency.as_ref()) as f64 / 1e9
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
            allow_no_nodes,
        } => {
            let last = wait(c, out, name, *revision, *wait_timeout, *allow_no_nodes).await?;
            if out == Output::Json {
                print(out, progress_json(&last), String::new)?;
            }
            outcome(name, &last, *wait_timeout, "")
        }
        FleetCommand::Rollout {
            name,
            file,
            canary,
            selector,
            priority,
            message,
            etag,
            allow_empty,
            source: args,
        } => {
            let put = |canary: &str, etag: String| -> Result<_, CliError> {
                let mut r = tonic::Request::new(pb::PutFleetRulesetRequest {
                    name: name.clone(),
                    source: Some(source(file, args)?),
                    priority: *priority,
                    selector: selector.clone(),
                    message: message.clone(),
                    etag,
                    allow_empty: *allow_empty,
                    canary: canary.to_string(),
                    ..Default::default()
                });
                r.set_timeout(timeout);
                Ok(r)
            };
            // Step 1: the canary.
            let first = c
                .put_ruleset(put(canary, etag.clone().unwrap_or_default())?)
                .await
                .map_err(with_file(file))?
                .into_inner();
            if out == Output::Text {
                crate::write_stdout(&format!(
                    "canary {canary:?}: fleet revision {} (the other nodes keep {})\n",
                    first.fleet_revision,
                    keep(first.previous_revision)
                ));
            }
            let step1 = wait(c, out, name, first.fleet_revision, timeout, false).await?;
            let s1 = step1.status.clone().unwrap_or_default();
            let done1 = step1.phase == pb::RolloutPhase::Done as i32;
            let none1 = step1.phase == pb::RolloutPhase::NoNodes as i32;
            let stopped = if none1 || (done1 && s1.selected.is_empty()) {
                Some(Err(tonic::Status::failed_precondition(format!(
                    "fleet ruleset {name}: the canary selector {canary:?} selects no live node among {selector:?}; rollout stopped (the other nodes keep {})",
                    keep(first.previous_revision)
                ))
                .into()))
            } else if !done1 {
                let note = format!(
                    " at the canary step; rollout stopped (the other nodes keep {})",
                    keep(first.previous_revision)
                );
                Some(outcome(name, &step1, timeout, &note))
            } else {
                None
            };
            if let Some(result) = stopped {
                if out == Output::Json {
                    print(
                        out,
                        json!({"name": name, "step": "canary", "canary": progress_json(&step1)}),
                        String::new,
                    )?;
                }
                return result;
            }
            // Step 2: every selected node, only if nobody wrote meanwhile.
            let full = c
                .put_ruleset(put("", first.etag.clone())?)
                .await
                .map_err(with_file(file))?
                .into_inner();
            if out == Output::Text {
                crate::write_stdout(&format!(
                    "canary ACKed by {} node(s); every selected node: fleet revision {}\n",
                    s1.applied.len(),
                    full.fleet_revision
                ));
            }
            let step2 = wait(c, out, name, full.fleet_revision, timeout, false).await?;
            if out == Output::Json {
                print(
                    out,
                    json!({
                        "name": name,
                        "step": "full",
                        "canary": progress_json(&step1),
                        "full": progress_json(&step2),
                    }),
                    String::new,
                )?;
            }
            outcome(name, &step2, timeout, "")
        }
        FleetCommand::List => {
            let rulesets = all_pages!(
                |token| c
                    .list_rulesets(pb::ListFleetRulesetsRequest {
                        page_size: PAGE_SIZE,
                        page_token: token.clone(),
                    })
                    .await?,
                rulesets
            );
            let json = Value::Array(rulesets.iter().map(ruleset_json).collect());
            print(out, json, || {
                let mut t = String::new();
                for r in &rulesets {
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
            let nodes = all_pages!(
                |token| c
                    .list_nodes(pb::ListNodesRequest {
                        page_size: PAGE_SIZE,
                        page_token: token.clone(),
                    })
                    .await?,
                nodes
            );
            let json = Value::Array(
                nodes
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
                for n in &nodes {
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

/// "fleet revision N" or, for 0, "nothing" (the ruleset was new to them).
fn keep(previous: i64) -> String {
    if previous > 0 {
        format!("fleet revision {previous}")
    } else {
        "nothing (the ruleset is new to them)".into()
    }
}

/// Follows WaitRollout of `name` at `revision` (0: the current one) for at most `timeout`,
/// printing each progress line in text mode; returns the last message.
async fn wait(
    c: &mut Client,
    out: Output,
    name: &str,
    revision: i64,
    timeout: Duration,
    allow_no_nodes: bool,
) -> Result<pb::RolloutProgress, CliError> {
    let mut stream = c
        .wait_rollout(pb::WaitRolloutRequest {
            name: name.to_string(),
            fleet_revision: revision,
            timeout: Some(prost_types::Duration {
                seconds: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(timeout.subsec_nanos()).unwrap_or(0),
            }),
            allow_no_nodes,
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
    Ok(last.unwrap_or_default())
}

fn progress_json(p: &pb::RolloutProgress) -> Value {
    let s = p.status.clone().unwrap_or_default();
    json!({
        "name": s.name,
        "phase": phase_name(p.phase),
        "fleet_revision": s.fleet_revision,
        "canary": s.canary,
        "selected": s.selected,
        "applied": s.applied.iter().map(status_json).collect::<Vec<_>>(),
        "failed": s.failed.iter().map(status_json).collect::<Vec<_>>(),
        "pending": s.pending,
    })
}

/// The outcome of a wait as a status, for the exit code and the headline (`note` appended):
/// DONE is success, a timeout exits 3 (DEADLINE_EXCEEDED), a NACK, a newer write or no
/// selected live node 1.
fn outcome(
    name: &str,
    last: &pb::RolloutProgress,
    timeout: Duration,
    note: &str,
) -> Result<(), CliError> {
    let s = last.status.clone().unwrap_or_default();
    let what = format!(
        "fleet ruleset {name} at fleet revision {}",
        s.fleet_revision
    );
    match pb::RolloutPhase::try_from(last.phase) {
        Ok(pb::RolloutPhase::Done) => Ok(()),
        Ok(pb::RolloutPhase::TimedOut) => Err(tonic::Status::deadline_exceeded(format!(
            "{what}: {} node(s) still pending after {timeout:?}{note}",
            s.pending.len()
        ))
        .into()),
        Ok(pb::RolloutPhase::NoNodes) => Err(tonic::Status::failed_precondition(format!(
            "{what}: selects no live node, so nothing was rolled out{note} (`fleet nodes` lists the live nodes and their labels; --allow-no-nodes accepts this)"
        ))
        .into()),
        Ok(pb::RolloutPhase::Failed) => Err(tonic::Status::failed_precondition(format!(
            "{what}: NACKed by {}{note}",
            s.failed
                .iter()
                .map(|f| f.node.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into()),
        _ => Err(tonic::Status::failed_precondition(format!(
            "{what}: replaced by a later write before it was applied{note}"
        ))
        .into()),
    }
}

fn phase_name(phase: i32) -> &'static str {
    match pb::RolloutPhase::try_from(phase) {
        Ok(pb::RolloutPhase::Progressing) => "PROGRESSING",
        Ok(pb::RolloutPhase::Done) => "DONE",
        Ok(pb::RolloutPhase::Failed) => "FAILED",
        Ok(pb::RolloutPhase::Superseded) => "SUPERSEDED",
        Ok(pb::RolloutPhase::TimedOut) => "TIMED_OUT",
        Ok(pb::RolloutPhase::NoNodes) => "NO_NODES",
        Ok(pb::RolloutPhase::Unspecified) | Err(_) => "UNKNOWN",
    }
}
