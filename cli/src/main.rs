//! vallumctl: the command-line client of Vallum's gRPC API.
//!
//! Every flag has a `VALLUM_*` environment twin; `--output json` prints one JSON document (or,
//! for `watch`, one per line), and errors as one JSON object on stderr (usage errors too).
//! Exit codes are in [`error`]: 0 ok, 1 rejected, 2 usage, 3 server unavailable.

mod conntrack;
mod dataplane;
mod error;
mod fleet;
mod sets;
mod view;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use vallum_proto::v1::conntrack_service_client::ConntrackServiceClient;
use vallum_proto::v1::counter_service_client::CounterServiceClient;
use vallum_proto::v1::engine_service_client::EngineServiceClient;
use vallum_proto::v1::fleet_service_client::FleetServiceClient;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;
use vallum_proto::v1::set_service_client::SetServiceClient;
use vallum_proto::v1::trace_service_client::TraceServiceClient;
use vallum_proto::v1::{
    self as pb, ApplyRequest, CommitRevisionRequest, ConfirmCommitRequest, DeleteRulesetRequest,
    DiffRevisionsRequest, ExportFormat, ExportRevisionRequest, GetCountersRequest,
    GetStatusRequest, ListRevisionsRequest, ListRulesetsRequest, PacketSpec, ReplayCaptureRequest,
    RestoreText, RollbackRequest, RulesetSource, StageRevisionRequest, TracePacketRequest,
    ValidateRulesetRequest, WatchCommitsRequest, WatchPacketEventsRequest, ZeroCountersRequest,
};

use crate::error::{CliError, ClientReason, EXIT_OK};

/// Command-line client of the Vallum firewall service.
#[derive(Debug, Parser)]
#[command(
    name = "vallumctl",
    version,
    about = "Command-line client of vallumd, the Vallum firewall service"
)]
struct Cli {
    /// gRPC endpoint of vallumd (`https://` or any TLS flag turns TLS on).
    #[arg(
        long,
        global = true,
        env = "VALLUM_SERVER",
        default_value = "http://127.0.0.1:50051",
        value_parser = parse_server
    )]
    server: String,
    /// Bearer token sent as `authorization: Bearer TOKEN`.
    #[arg(long, global = true, env = "VALLUM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) that signed the server's certificate.
    #[arg(long, global = true, env = "VALLUM_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, global = true, env = "VALLUM_CERT", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS.
    #[arg(long, global = true, env = "VALLUM_KEY", value_name = "FILE")]
    key: Option<PathBuf>,
    /// Name to check in the server certificate (default: the host of --server).
    #[arg(long, global = true, env = "VALLUM_TLS_DOMAIN")]
    tls_domain: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', global = true, env = "VALLUM_OUTPUT", value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Deadline of each call, e.g. `30s`, `500ms`, `2m` (not for `watch`).
    #[arg(long, global = true, env = "VALLUM_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FamilyArg {
    Ipv4,
    Ipv6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    Save,
    Json,
}

/// Flags of commands that upload a ruleset file.
#[derive(Debug, clap::Args)]
struct SourceArgs {
    /// Family of lines without -4/-6.
    #[arg(long, value_enum, default_value_t = FamilyArg::Ipv4)]
    family: FamilyArg,
    /// An ip6tables-restore file stored in the same ruleset.
    #[arg(long, value_name = "FILE")]
    v6: Option<PathBuf>,
    /// As `iptables-restore --noflush`: the file changes the ruleset's active revision
    /// (tables it names are not flushed; `:CHAIN` lines flush or create chains) and the
    /// merged result is checked and stored.
    #[arg(long, short = 'n')]
    noflush: bool,
    /// As `iptables-restore --counters`: rules start with the file's `[p:b]` counters.
    #[arg(long, short = 'c')]
    counters: bool,
}

#[derive(Debug, clap::Args)]
struct ChangeArgs {
    /// Commit message.
    #[arg(long, short = 'm', default_value = "")]
    message: String,
    /// Only apply if the ruleset's etag still matches.
    #[arg(long)]
    etag: Option<String>,
    /// Idempotency key: a retry with the same id returns the first result.
    #[arg(long)]
    request_id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a ruleset file without storing it.
    Validate {
        /// iptables-restore file.
        file: PathBuf,
        /// Ruleset name (for set lookups and messages).
        #[arg(long, default_value = "validate")]
        ruleset: String,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Store a ruleset file as a new staged revision.
    Stage {
        /// Ruleset name.
        ruleset: String,
        /// iptables-restore file.
        file: PathBuf,
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        change: ChangeArgs,
        /// Priority among rulesets (lower runs first); stored on first stage.
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// Run every check, store nothing.
        #[arg(long)]
        validate_only: bool,
        /// Stage an empty ruleset (no rule, no DROP policy), refused otherwise.
        #[arg(long)]
        allow_empty: bool,
    },
    /// Make a staged revision active (RULESET/N or rulesets/RULESET/revisions/N).
    Commit {
        /// The revision.
        revision: String,
        /// Roll back automatically unless confirmed within this time (e.g. 30s).
        #[arg(long, value_parser = parse_duration)]
        confirm_within: Option<Duration>,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Confirm a commit made with --confirm-within.
    Confirm {
        /// The revision.
        revision: String,
    },
    /// Stage and commit a ruleset file in one call.
    Apply {
        /// Ruleset name.
        ruleset: String,
        /// iptables-restore file.
        file: PathBuf,
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        change: ChangeArgs,
        /// Priority among rulesets (lower runs first).
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// Roll back automatically unless confirmed within this time.
        #[arg(long, value_parser = parse_duration)]
        confirm_within: Option<Duration>,
        /// Apply an empty ruleset (no rule, no DROP policy: every rule gone), refused
        /// otherwise.
        #[arg(long)]
        allow_empty: bool,
    },
    /// Commit the content of an earlier revision again.
    Rollback {
        /// The revision whose content becomes active.
        revision: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// List the revisions of a ruleset.
    Revisions {
        /// Ruleset name.
        ruleset: String,
    },
    /// Rules added, removed and moved between two revisions.
    Diff {
        /// Older revision.
        from: String,
        /// Newer revision.
        to: String,
    },
    /// Print a revision as iptables-save text or JSON.
    Export {
        /// The revision.
        revision: String,
        /// Output format of the content.
        #[arg(long, value_enum, default_value_t = FormatArg::Save)]
        format: FormatArg,
        /// Include live counters ([packets:bytes]) if the revision is active.
        #[arg(long)]
        counters: bool,
    },
    /// Per-rule counters, laid out like `iptables -L -v -x -n`.
    Counters {
        /// Only this ruleset.
        ruleset: Option<String>,
        /// Zero the counters instead of printing them.
        #[arg(long)]
        zero: bool,
    },
    /// The verdict and rule path of one packet.
    Trace(TraceArgs),
    /// Replay a pcap/pcapng file against the active rulesets (and a staged revision).
    Replay {
        /// Capture file.
        pcap: PathBuf,
        /// Staged revision to compare with the active rulesets.
        #[arg(long)]
        revision: Option<String>,
        /// Hook to classify at (default INPUT).
        #[arg(long)]
        hook: Option<String>,
        /// Input interface name.
        #[arg(long = "in")]
        in_interface: Option<String>,
        /// Most changed flows to list.
        #[arg(long, default_value_t = 100)]
        max_flows: u32,
    },
    /// Engine status: cores, active revisions, barrier strategy.
    Status,
    /// Stream commit events as they happen.
    Watch {
        /// Only this ruleset.
        ruleset: Option<String>,
    },
    /// Stream packet events as they happen: `-j LOG` hits (text: the kernel's LOG line,
    /// as `dmesg` shows it, after the rule) and, with `--sample-drops N`, one in N dropped
    /// packets (the server raises N to at least 100 and caps samples at 100 a second), like
    /// `cilium monitor -t drop`. Ends on Ctrl-C.
    Monitor {
        /// Only this ruleset's LOG hits.
        #[arg(long)]
        ruleset: Option<String>,
        /// Only LOG hits of rules in this chain.
        #[arg(long)]
        chain: Option<String>,
        /// Only this kind: `log` or `drop`.
        #[arg(long, value_name = "KIND")]
        verdict: Option<String>,
        /// Only packets from or to this address or prefix (ADDR[/LEN]).
        #[arg(long, value_name = "ADDR[/LEN]")]
        address: Option<String>,
        /// Also sample one in N dropped packets (no LOG rule needed).
        #[arg(long, value_name = "N")]
        sample_drops: Option<u32>,
    },
    /// List rulesets.
    Rulesets,
    /// NFQUEUE steering rules of the current network namespace (runs iptables locally; no
    /// server).
    Dataplane {
        #[command(subcommand)]
        command: dataplane::DataplaneCommand,
    },
    /// Deactivate and delete a ruleset with its revisions.
    Delete {
        /// Ruleset name.
        ruleset: String,
        /// Only delete if the etag still matches.
        #[arg(long)]
        etag: Option<String>,
    },
    /// The connection table: list, delete, flush, stats (as conntrack-tools' `conntrack`).
    Conntrack {
        #[command(subcommand)]
        cmd: conntrack::ConntrackCmd,
    },
    /// ipset-style sets: create, add, del, list, show, flush, swap, destroy, import, save.
    Set {
        #[command(subcommand)]
        command: sets::SetCommand,
    },
    /// Fleet mode (a vallumd with --fleet-endpoints): apply, status, list, delete, nodes.
    Fleet {
        #[command(subcommand)]
        command: fleet::FleetCommand,
    },
}

#[derive(Debug, clap::Args)]
struct TraceArgs {
    /// Source address.
    #[arg(long)]
    src: String,
    /// Destination address.
    #[arg(long)]
    dst: String,
    /// Protocol name or number.
    #[arg(long, default_value = "tcp")]
    proto: String,
    /// Source port.
    #[arg(long, default_value_t = 0)]
    sport: u16,
    /// Destination port.
    #[arg(long, default_value_t = 0)]
    dport: u16,
    /// TCP flags, letters of FSRPAU (e.g. S for a SYN).
    #[arg(long, default_value = "")]
    flags: String,
    /// Hook: PREROUTING, INPUT, FORWARD, OUTPUT, POSTROUTING.
    #[arg(long, default_value = "INPUT")]
    hook: String,
    /// Input interface.
    #[arg(long = "in", default_value = "")]
    in_interface: String,
    /// Output interface.
    #[arg(long = "out", default_value = "")]
    out_interface: String,
    /// Layer-3 length, bytes.
    #[arg(long, default_value_t = 60)]
    length: u32,
    /// Conntrack state: NEW, ESTABLISHED, RELATED, INVALID, UNTRACKED; an empty value
    /// (`--ct-state ''`) looks the packet up in the connection table instead.
    #[arg(long, default_value = "NEW")]
    ct_state: String,
    /// Packet mark.
    #[arg(long, default_value_t = 0)]
    mark: u32,
    /// Ethernet source address (aa:bb:cc:dd:ee:ff), what `-m mac --mac-source` compares;
    /// without it the packet has no link-layer source and no `-m mac` rule matches.
    #[arg(long, default_value = "")]
    mac_source: String,
    /// ICMP type.
    #[arg(long, default_value_t = 0)]
    icmp_type: u32,
    /// ICMP code.
    #[arg(long, default_value_t = 0)]
    icmp_code: u32,
    /// Evaluate against this staged revision instead of the active rulesets.
    #[arg(long)]
    revision: Option<String>,
}

/// Parses `500ms`, `30s`, `5m`, `1h` or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 30s, 500ms, 5m, 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("unknown unit `{unit}` in `{s}` (ms, s, m, h)")),
    };
    Ok(d)
}

/// Checks `--server`: an `http://` or `https://` URL with a host (a usage error otherwise, before
/// any connection is tried).
fn parse_server(s: &str) -> Result<String, String> {
    let like = "a URL like http://HOST:PORT or https://HOST:PORT";
    let uri: http::Uri = s
        .parse()
        .map_err(|e| format!("`{s}` is not {like} ({e})"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => Ok(s.to_owned()),
        (Some(other), _) if other != "http" && other != "https" => {
            Err(format!("`{s}`: the scheme is `{other}`, not http or https"))
        }
        _ => Err(format!("`{s}` is not {like}")),
    }
}

/// Accepts `rulesets/R/revisions/N` or the short `R/N`.
fn revision_name(s: &str) -> Result<String, CliError> {
    if let Some(rest) = s.strip_prefix("rulesets/") {
        if let Some((r, n)) = rest.split_once("/revisions/") {
            if !r.is_empty() && n.parse::<u64>().is_ok() {
                return Ok(s.to_owned());
            }
        }
    } else if let Some((r, n)) = s.rsplit_once('/') {
        if !r.is_empty() && !r.contains('/') && n.parse::<u64>().is_ok() {
            return Ok(format!("rulesets/{r}/revisions/{n}"));
        }
    }
    Err(CliError::Argument(format!(
        "`{s}` is not a revision (RULESET/N or rulesets/RULESET/revisions/N)"
    )))
}

/// Adds the bearer token to every call.
#[derive(Clone)]
struct Auth(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Auth>;

struct Clients {
    rulesets: RulesetServiceClient<Svc>,
    counters: CounterServiceClient<Svc>,
    trace: TraceServiceClient<Svc>,
    engine: EngineServiceClient<Svc>,
    conntrack: ConntrackServiceClient<Svc>,
    sets: sets::Client,
    fleet: fleet::Client,
}

async fn connect(cli: &Cli, with_timeout: bool) -> Result<Clients, CliError> {
    let bad = |m: String| CliError::Connect {
        server: cli.server.clone(),
        message: m,
    };
    let mut ep = Endpoint::from_shared(cli.server.clone())
        .map_err(|e| CliError::Argument(format!("--server {}: {e}", cli.server)))?
        .connect_timeout(Duration::from_secs(5));
    if with_timeout {
        ep = ep.timeout(cli.timeout);
    }
    let tls = cli.server.starts_with("https://") || cli.ca.is_some() || cli.cert.is_some();
    if tls {
        let cfg = vallum_api::tls::client_config(
            cli.ca.as_deref(),
            cli.cert.as_deref(),
            cli.key.as_deref(),
            cli.tls_domain.as_deref(),
        )?;
        ep = ep.tls_config(cfg).map_err(|e| bad(error::chain(&e)))?;
    }
    let channel = ep.connect().await.map_err(|e| {
        if tls && error::is_plaintext_answer(&e) {
            let instead = match cli.server.strip_prefix("https://") {
                Some(rest) => format!("use http://{rest}"),
                None => "leave out --ca, --cert and --key".to_owned(),
            };
            bad(format!(
                "the server does not speak TLS (it answered the TLS handshake in plaintext); \
                 {instead}, or start vallumd with --tls-cert and --tls-key"
            ))
        } else {
            bad(error::chain(&e))
        }
    })?;
    let token = match &cli.token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| CliError::Argument("--token must be printable ASCII".to_owned()))?,
        ),
        None => None,
    };
    let auth = Auth(token);
    Ok(Clients {
        rulesets: RulesetServiceClient::with_interceptor(channel.clone(), auth.clone()),
        counters: CounterServiceClient::with_interceptor(channel.clone(), auth.clone()),
        trace: TraceServiceClient::with_interceptor(channel.clone(), auth.clone()),
        engine: EngineServiceClient::with_interceptor(channel.clone(), auth.clone()),
        conntrack: ConntrackServiceClient::with_interceptor(channel.clone(), auth.clone()),
        fleet: FleetServiceClient::with_interceptor(channel.clone(), auth.clone())
            .max_decoding_message_size(64 << 20),
        sets: SetServiceClient::with_interceptor(channel, auth).max_decoding_message_size(64 << 20),
    })
}

fn read_text(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })
}

fn source(file: &Path, args: &SourceArgs) -> Result<RulesetSource, CliError> {
    let content = read_text(file)?;
    let content_v6 = match &args.v6 {
        Some(p) => read_text(p)?,
        None => String::new(),
    };
    let family = match args.family {
        FamilyArg::Ipv4 => pb::Family::Ipv4,
        FamilyArg::Ipv6 => pb::Family::Ipv6,
    };
    Ok(RulesetSource {
        source: Some(pb::ruleset_source::Source::Text(RestoreText {
            content,
            family: family as i32,
            content_v6,
            filename: file.display().to_string(),
            noflush: args.noflush,
            counters: args.counters,
        })),
    })
}

fn proto_duration(d: Option<Duration>) -> Option<prost_types::Duration> {
    d.map(|d| prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    })
}

/// Attaches the local file to a status so its violations print as `FILE:LINE:COL`.
fn with_file(file: &Path) -> impl FnOnce(tonic::Status) -> CliError + '_ {
    move |status| CliError::Status {
        status,
        file: Some(file.to_owned()),
    }
}

fn print(output: Output, json: Value, text: impl FnOnce() -> String) -> Result<(), CliError> {
    match output {
        Output::Json => {
            let s =
                serde_json::to_string_pretty(&json).map_err(|e| CliError::Output(e.to_string()))?;
            write_stdout(&format!("{s}\n"));
        }
        Output::Text => write_stdout(&text()),
    }
    Ok(())
}

async fn run(cli: &Cli) -> Result<(), CliError> {
    if let Command::Dataplane { command } = &cli.command {
        let (json, text) = dataplane::run(command)?;
        return print(cli.output, json, || text);
    }
    let is_watch = matches!(
        cli.command,
        Command::Watch { .. }
            | Command::Monitor { .. }
            | Command::Fleet {
                command: fleet::FleetCommand::Wait { .. }
            }
    );
    let mut c = connect(cli, !is_watch).await?;
    let out = cli.output;
    match &cli.command {
        Command::Validate {
            file,
            ruleset,
            source: src,
        } => {
            let resp = c
                .rulesets
                .validate_ruleset(ValidateRulesetRequest {
                    ruleset: ruleset.clone(),
                    source: Some(source(file, src)?),
                })
                .await
                .map_err(with_file(file))?
                .into_inner();
            let path = file.display().to_string();
            let loc = |v: &pb::Violation| {
                let l = error::localize(&format!("{}: ", v.location), &path);
                l.trim_end_matches(": ").trim_end_matches(':').to_owned()
            };
            print(
                out,
                json!({
                    "valid": resp.valid,
                    "rule_count": resp.rule_count,
                    "violations": resp.violations.iter().map(|v| view::violation_json(v, &loc(v))).collect::<Vec<_>>(),
                }),
                || {
                    let mut s = String::new();
                    for v in &resp.violations {
                        s.push_str(&view::violation_text(v, &loc(v)));
                        s.push('\n');
                    }
                    if resp.valid {
                        s.push_str(&format!("{path}: valid, {} rules\n", resp.rule_count));
                    }
                    s
                },
            )?;
            if !resp.valid {
                return Err(CliError::Invalid);
            }
        }
        Command::Stage {
            ruleset,
            file,
            source: src,
            change,
            priority,
            validate_only,
            allow_empty,
        } => {
            let r = c
                .rulesets
                .stage_revision(StageRevisionRequest {
                    ruleset: ruleset.clone(),
                    source: Some(source(file, src)?),
                    message: change.message.clone(),
                    priority: *priority,
                    etag: change.etag.clone().unwrap_or_default(),
                    request_id: change.request_id.clone().unwrap_or_default(),
                    validate_only: *validate_only,
                    allow_empty: *allow_empty,
                })
                .await
                .map_err(with_file(file))?
                .into_inner();
            print(out, view::revision_json(&r), || {
                format!(
                    "staged {}\n{}",
                    view::revision_text(&r),
                    view::warnings_text(&r)
                )
            })?;
        }
        Command::Commit {
            revision,
            confirm_within,
            change,
        } => {
            let r = c
                .rulesets
                .commit_revision(CommitRevisionRequest {
                    name: revision_name(revision)?,
                    confirm_within: proto_duration(*confirm_within),
                    etag: change.etag.clone().unwrap_or_default(),
                    request_id: change.request_id.clone().unwrap_or_default(),
                    validate_only: false,
                })
                .await?
                .into_inner();
            print(out, view::commit_json(&r), || view::commit_text(&r))?;
        }
        Command::Confirm { revision } => {
            let r = c
                .rulesets
                .confirm_commit(ConfirmCommitRequest {
                    name: revision_name(revision)?,
                })
                .await?
                .into_inner();
            let rev = r.revision.unwrap_or_default();
            print(out, view::revision_json(&rev), || {
                format!("confirmed {}\n", view::revision_text(&rev))
            })?;
        }
        Command::Apply {
            ruleset,
            file,
            source: src,
            change,
            priority,
            confirm_within,
            allow_empty,
        } => {
            let r = c
                .rulesets
                .apply(ApplyRequest {
                    ruleset: ruleset.clone(),
                    source: Some(source(file, src)?),
                    message: change.message.clone(),
                    priority: *priority,
                    confirm_within: proto_duration(*confirm_within),
                    etag: change.etag.clone().unwrap_or_default(),
                    request_id: change.request_id.clone().unwrap_or_default(),
                    validate_only: false,
                    allow_empty: *allow_empty,
                })
                .await
                .map_err(with_file(file))?
                .into_inner();
            print(out, view::commit_json(&r), || view::commit_text(&r))?;
        }
        Command::Rollback { revision, change } => {
            let r = c
                .rulesets
                .rollback(RollbackRequest {
                    name: revision_name(revision)?,
                    message: change.message.clone(),
                    etag: change.etag.clone().unwrap_or_default(),
                    request_id: change.request_id.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            print(out, view::commit_json(&r), || view::commit_text(&r))?;
        }
        Command::Revisions { ruleset } => {
            let mut all = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = c
                    .rulesets
                    .list_revisions(ListRevisionsRequest {
                        ruleset: ruleset.clone(),
                        page_size: 100,
                        page_token: page_token.clone(),
                    })
                    .await?
                    .into_inner();
                all.extend(r.revisions);
                if r.next_page_token.is_empty() || r.next_page_token == page_token {
                    break;
                }
                page_token = r.next_page_token;
            }
            print(
                out,
                Value::Array(all.iter().map(view::revision_json).collect()),
                || all.iter().map(|r| view::revision_text(r) + "\n").collect(),
            )?;
        }
        Command::Diff { from, to } => {
            let r = c
                .rulesets
                .diff_revisions(DiffRevisionsRequest {
                    from: revision_name(from)?,
                    to: revision_name(to)?,
                })
                .await?
                .into_inner();
            print(out, view::diff_json(&r), || view::diff_text(&r))?;
        }
        Command::Export {
            revision,
            format,
            counters,
        } => {
            let r = c
                .rulesets
                .export_revision(ExportRevisionRequest {
                    name: revision_name(revision)?,
                    format: match format {
                        FormatArg::Save => ExportFormat::IptablesSave,
                        FormatArg::Json => ExportFormat::Json,
                    } as i32,
                    counters: *counters,
                })
                .await?
                .into_inner();
            // The content is already in the asked format; --output json wraps it.
            print(
                out,
                json!({"content": r.content, "content_type": r.content_type}),
                || r.content.clone(),
            )?;
        }
        Command::Counters { ruleset, zero } => {
            let ruleset = ruleset.clone().unwrap_or_default();
            if *zero {
                c.counters
                    .zero_counters(ZeroCountersRequest {
                        ruleset: ruleset.clone(),
                    })
                    .await?;
                print(out, json!({"zeroed": ruleset}), || {
                    "counters zeroed\n".to_owned()
                })?;
            } else {
                let r = c
                    .counters
                    .get_counters(GetCountersRequest { ruleset })
                    .await?
                    .into_inner();
                print(out, view::counters_json(&r.counters), || {
                    view::counters_text(&r.counters)
                })?;
            }
        }
        Command::Trace(t) => {
            let revision = match &t.revision {
                Some(r) => revision_name(r)?,
                None => String::new(),
            };
            let family = if t.src.contains(':') || t.dst.contains(':') {
                pb::Family::Ipv6
            } else {
                pb::Family::Ipv4
            };
            let r = c
                .trace
                .trace_packet(TracePacketRequest {
                    packet: Some(PacketSpec {
                        family: family as i32,
                        hook: t.hook.to_ascii_uppercase(),
                        source: t.src.clone(),
                        destination: t.dst.clone(),
                        protocol: t.proto.clone(),
                        source_port: u32::from(t.sport),
                        destination_port: u32::from(t.dport),
                        tcp_flags: t.flags.clone(),
                        icmp_type: t.icmp_type,
                        icmp_code: t.icmp_code,
                        length: t.length,
                        in_interface: t.in_interface.clone(),
                        out_interface: t.out_interface.clone(),
                        mark: t.mark,
                        ct_state: t.ct_state.to_ascii_uppercase(),
                        source_mac: t.mac_source.clone(),
                    }),
                    revision,
                    frame: Vec::new(),
                    raw_ip: false,
                })
                .await?
                .into_inner();
            print(out, view::trace_json(&r), || view::trace_text(&r))?;
        }
        Command::Replay {
            pcap,
            revision,
            hook,
            in_interface,
            max_flows,
        } => {
            let capture = std::fs::read(pcap).map_err(|source| CliError::Read {
                path: pcap.clone(),
                source,
            })?;
            let r = c
                .trace
                .replay_capture(ReplayCaptureRequest {
                    capture,
                    revision: match revision {
                        Some(r) => revision_name(r)?,
                        None => String::new(),
                    },
                    hook: hook.clone().unwrap_or_default(),
                    in_interface: in_interface.clone().unwrap_or_default(),
                    max_flows: *max_flows,
                })
                .await?
                .into_inner();
            print(out, view::replay_json(&r), || view::replay_text(&r))?;
        }
        Command::Status => {
            let r = c.engine.get_status(GetStatusRequest {}).await?.into_inner();
            print(out, view::status_json(&r), || view::status_text(&r))?;
        }
        Command::Watch { ruleset } => {
            let mut stream = c
                .rulesets
                .watch_commits(WatchCommitsRequest {
                    ruleset: ruleset.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            while let Some(ev) = stream.next().await {
                let ev = ev?;
                match out {
                    Output::Json => write_stdout(&format!("{}\n", view::event_json(&ev))),
                    Output::Text => write_stdout(&format!("{}\n", view::event_text(&ev))),
                }
            }
        }
        Command::Monitor {
            ruleset,
            chain,
            verdict,
            address,
            sample_drops,
        } => {
            let mut stream = c
                .trace
                .watch_packet_events(WatchPacketEventsRequest {
                    ruleset: ruleset.clone().unwrap_or_default(),
                    chain: chain.clone().unwrap_or_default(),
                    verdict: verdict.clone().unwrap_or_default(),
                    address: address.clone().unwrap_or_default(),
                    sample_drops_one_in: sample_drops.unwrap_or(0),
                })
                .await?
                .into_inner();
            while let Some(ev) = stream.next().await {
                let ev = ev?;
                match out {
                    Output::Json => write_stdout(&format!("{}\n", view::packet_event_json(&ev))),
                    Output::Text => write_stdout(&format!("{}\n", view::packet_event_text(&ev))),
                }
            }
        }
        Command::Rulesets => {
            let r = c
                .rulesets
                .list_rulesets(ListRulesetsRequest {})
                .await?
                .into_inner();
            print(
                out,
                Value::Array(r.rulesets.iter().map(view::ruleset_json).collect()),
                || view::rulesets_text(&r.rulesets),
            )?;
        }
        Command::Delete { ruleset, etag } => {
            c.rulesets
                .delete_ruleset(DeleteRulesetRequest {
                    name: format!("rulesets/{ruleset}"),
                    etag: etag.clone().unwrap_or_default(),
                })
                .await?;
            print(out, json!({"deleted": ruleset}), || {
                format!("deleted ruleset {ruleset}\n")
            })?;
        }
        // Handled above, before connecting.
        Command::Dataplane { .. } => {}
        Command::Conntrack { cmd } => conntrack::run(&mut c.conntrack, cmd, out).await?,
        Command::Set { command } => sets::run(&mut c.sets, out, command).await?,
        Command::Fleet { command } => fleet::run(&mut c.fleet, out, command).await?,
    }
    Ok(())
}

/// Prints an error to stderr: one line per violation not in the headline (as
/// `FILE:LINE:COL: message` when the error is about a local file), then `vallumctl: HEADLINE`;
/// with `-o json` one JSON object ([`error::Report::json`]).
fn report(e: &CliError, cli: &Cli) {
    let is_watch = matches!(cli.command, Command::Watch { .. } | Command::Monitor { .. });
    let r = e.report(error::Context {
        server: &cli.server,
        timeout: (!is_watch).then_some(cli.timeout),
        changes: changes(&cli.command),
    });
    match cli.output {
        Output::Json => eprintln!("{}", r.json()),
        Output::Text => {
            for l in &r.lines {
                eprintln!("{l}");
            }
            if !matches!(e, CliError::Invalid) || r.lines.is_empty() {
                eprintln!("vallumctl: {}", r.headline);
            }
        }
    }
}

/// After a call over `http://` failed in a way a TLS server causes ([`error::maybe_tls_peer`]):
/// whether the server answers a TLS handshake, so the message can say to use `https://`. One
/// connection attempt, only on that failure path.
async fn speaks_tls(cli: &Cli) -> bool {
    let Some(rest) = cli.server.strip_prefix("http://") else {
        return false;
    };
    let Ok(cfg) = vallum_api::tls::client_config(None, None, None, cli.tls_domain.as_deref())
    else {
        return false;
    };
    let Ok(ep) = Endpoint::from_shared(format!("https://{rest}")) else {
        return false;
    };
    let Ok(ep) = ep.connect_timeout(Duration::from_secs(2)).tls_config(cfg) else {
        return false;
    };
    match ep.connect().await {
        Ok(_) => error::tls_answered(Ok(())),
        Err(e) => error::tls_answered(Err(&e)),
    }
}

/// Whether a command may change state on the server (`set` and `conntrack` count as changing).
fn changes(c: &Command) -> bool {
    match c {
        Command::Stage { validate_only, .. } => !validate_only,
        Command::Counters { zero, .. } => *zero,
        Command::Fleet { command } => command.changes(),
        Command::Commit { .. }
        | Command::Confirm { .. }
        | Command::Apply { .. }
        | Command::Rollback { .. }
        | Command::Delete { .. }
        | Command::Conntrack { .. }
        | Command::Set { .. } => true,
        Command::Validate { .. }
        | Command::Revisions { .. }
        | Command::Diff { .. }
        | Command::Export { .. }
        | Command::Trace(_)
        | Command::Replay { .. }
        | Command::Status
        | Command::Watch { .. }
        | Command::Monitor { .. }
        | Command::Rulesets
        | Command::Dataplane { .. } => false,
    }
}

/// Prints a clap error: help and version to stdout; a usage error to stderr as clap words it,
/// or with `-o json` (or `VALLUM_OUTPUT=json`) as the JSON error object with reason `USAGE`.
/// Returns the exit code.
fn report_usage(e: &clap::Error) -> u8 {
    if !e.use_stderr() {
        let _ = e.print();
        return EXIT_OK;
    }
    let usage = ClientReason::Usage.info();
    if wants_json() {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or_default();
        let message = first.strip_prefix("error: ").unwrap_or(first);
        eprintln!(
            "{}",
            json!({
                "error": message,
                "exit_code": usage.exit_code,
                "violations": [],
                "reason": usage.name,
                "detail": text,
            })
        );
    } else {
        let _ = e.print();
    }
    usage.exit_code
}

/// Whether the command line (or `VALLUM_OUTPUT`) asks for `-o json`, read as far as it parses.
fn wants_json() -> bool {
    use clap::CommandFactory;
    Cli::command()
        .ignore_errors(true)
        .try_get_matches()
        .ok()
        .and_then(|m| m.get_one::<Output>("output").copied())
        == Some(Output::Json)
}

/// Writes to stdout. A closed pipe (`vallumctl ... | head`) ends the program quietly with
/// status 0, as Unix tools do, instead of `print!`'s panic.
fn write_stdout(s: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(s.as_bytes()).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(i32::from(EXIT_OK));
        }
        eprintln!("vallumctl: cannot write to stdout: {e}");
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return ExitCode::from(report_usage(&e)),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vallumctl: cannot start the runtime: {e}");
            return ExitCode::from(ClientReason::Local.info().exit_code);
        }
    };
    match rt.block_on(run(&cli)) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => {
            let e = match e {
                e if error::maybe_tls_peer(&e) && rt.block_on(speaks_tls(&cli)) => {
                    CliError::Connect {
                        server: cli.server.clone(),
                        message: format!(
                            "the server speaks TLS; use {}",
                            cli.server.replacen("http://", "https://", 1)
                        ),
                    }
                }
                e => e,
            };
            report(&e, &cli);
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("3x").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn revision_names() {
        assert_eq!(revision_name("web/3").unwrap(), "rulesets/web/revisions/3");
        assert_eq!(
            revision_name("rulesets/web/revisions/3").unwrap(),
            "rulesets/web/revisions/3"
        );
        assert!(revision_name("web").is_err());
        assert!(revision_name("web/x").is_err());
        assert!(revision_name("a/b/3").is_err());
    }

    #[test]
    fn servers() {
        assert!(parse_server("http://127.0.0.1:50051").is_ok());
        assert!(parse_server("https://vallum.example:443").is_ok());
        assert!(parse_server("http://[::1]:50051").is_ok());
        assert!(parse_server("not-a-url").is_err());
        assert!(parse_server("127.0.0.1:50051").is_err());
        assert!(parse_server("ftp://h:1").is_err());
        assert!(parse_server("").is_err());
    }

    #[test]
    fn clap_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
