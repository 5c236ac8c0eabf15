//! A request fuzzer for the whole gRPC surface, against a real `vallumd` (loopback ephemeral
//! port, temporary database).
//!
//! Every RPC of every service in `proto/vallum/v1/vallum.proto` and `fleet.proto` gets random
//! and mutated requests from `support/fuzz_gen.rs` (grammar-aware iptables-restore and `ipset
//! save` text, `-s`/`-d` address lists up to 2,000 x 2,000, EditRuleset commands, structured
//! rulesets, names, packet specs, frames, pcap/pcapng captures), sent one at a time.
//! FleetService needs fleet mode: when `etcd` is installed, vallumd runs against one of its own
//! (node labels `fuzz=node`; every fleet selector the fuzzer writes starts with `fuzz=never`,
//! so fleet writes never reach this node's state); without etcd the fleet RPCs are left out and
//! the first line says so.
//!
//! vallumd runs under a memory ceiling (`VALLUM_FUZZ_MEMORY_MIB`, default 1024): a memory
//! cgroup of its own when the test can make one (root), else `RLIMIT_AS` at three times it. A
//! request whose memory is not bounded gets vallumd killed, which is a crash of the run.
//! After each request the test checks:
//! - the process is still up (a crash is recorded with its request; vallumd is restarted on
//!   the same database and the run goes on, so one run can find several defects);
//! - the answer came within `VALLUM_FUZZ_STALL_SECS` (default 60 s; a stall is recorded);
//! - grpc.health.v1 says SERVING;
//! - a refused request (any error status), a read-only RPC and a `validate_only` request
//!   changed nothing: rulesets, revisions, the active revisions' exported texts, the counters'
//!   rule lists, GetStatus's active revisions and rule count, the sets with their `ipset save`
//!   text, the conntrack statistics, compared before and after;
//! - vallumd's peak resident memory (VmHWM in /proc/PID/status) stays under
//!   `VALLUM_FUZZ_MAX_RSS_MIB` (default 1024 MiB; requests are at most 1 MiB, see `FLAGS`);
//! - no answer is INTERNAL, UNKNOWN or DATA_LOSS, and a request over `--max-request-bytes` is
//!   RESOURCE_EXHAUSTED (these "wrong outcomes" are printed; they fail the test only with
//!   `VALLUM_FUZZ_STRICT=1`, since today's main still has some, see issue #13).
//!
//! Budget and reproduction (environment):
//! - `VALLUM_FUZZ_SECS` (default 12) and `VALLUM_FUZZ_REQUESTS` (default none): it stops at
//!   whichever comes first;
//! - `VALLUM_FUZZ_SEED` (default a fixed seed; `random` for one from the clock): the seed is
//!   printed; the generators never look at answers, so the same seed sends the same requests;
//! - `VALLUM_FUZZ_ONLY=Apply,TracePacket`: only these RPCs;
//! - `VALLUM_FUZZ_DEEP_MAX` (default 20000): longest line of chain jumps generated (past the
//!   ~12,000 at which a recursive depth check overflowed a worker's stack, issue #13 defect 1);
//!   `VALLUM_FUZZ_CHAINS_MAX` (default 20000): most chains in a flat ruleset;
//! - `VALLUM_FUZZ_VALLUMD=PATH`: fuzz another vallumd binary (e.g. a release build).
//!
//! It ends with a line `grpc fuzz: N requests (per RPC ok/err ...), C crashes, ..., seed S`.

use crate::support;
use crate::support::etcd;
use crate::support::fuzz_gen;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fuzz_gen::{Caps, Rng};
use support::{Daemon, RawCodec};
use tonic::transport::Channel;
use tonic::{Code, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::conntrack_service_client::ConntrackServiceClient;
use vallum_proto::v1::counter_service_client::CounterServiceClient;
use vallum_proto::v1::engine_service_client::EngineServiceClient;
use vallum_proto::v1::fleet_service_client::FleetServiceClient;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;
use vallum_proto::v1::set_service_client::SetServiceClient;
use vallum_proto::v1::trace_service_client::TraceServiceClient;

/// `--max-request-bytes` of the fuzzed vallumd: 1 MiB keeps the biggest requests quick on a
/// debug build; a few requests go over it on purpose.
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// vallumd's flags besides `--listen`, `--db`, `--metrics-listen`: small limits so that the
/// fuzzer reaches them (rulesets, revisions kept) and two cores.
const FLAGS: &[&str] = &[
    "--cores",
    "2",
    "--max-request-bytes",
    "1048576",
    "--max-rulesets",
    "24",
    "--max-revisions-kept",
    "6",
    "--conntrack-max",
    "4096",
    // Mutations over TCP without tokens; never the host's default socket.
    "--insecure-no-auth",
    "--socket",
    "none",
];

// === the RPCs ===

/// All RPCs, a client of each service.
#[derive(Clone)]
struct Clients {
    ch: Channel,
    rs: RulesetServiceClient<Channel>,
    counters: CounterServiceClient<Channel>,
    trace: TraceServiceClient<Channel>,
    engine: EngineServiceClient<Channel>,
    ct: ConntrackServiceClient<Channel>,
    sets: SetServiceClient<Channel>,
    fleet: FleetServiceClient<Channel>,
}

impl Clients {
    fn new(ch: Channel) -> Clients {
        const M: usize = 64 << 20;
        Clients {
            ch: ch.clone(),
            rs: RulesetServiceClient::new(ch.clone()).max_decoding_message_size(M),
            counters: CounterServiceClient::new(ch.clone()).max_decoding_message_size(M),
            trace: TraceServiceClient::new(ch.clone()).max_decoding_message_size(M),
            engine: EngineServiceClient::new(ch.clone()).max_decoding_message_size(M),
            ct: ConntrackServiceClient::new(ch.clone()).max_decoding_message_size(M),
            sets: SetServiceClient::new(ch.clone()).max_decoding_message_size(M),
            fleet: FleetServiceClient::new(ch).max_decoding_message_size(M),
        }
    }
}

/// Declares [`Req`] (one variant per RPC), [`RPCS`] (their names) and `Req::send`.
macro_rules! rpcs {
    ($( $var:ident => $client:ident . $method:ident ( $ty:ty ) ; )*) => {
        /// One request of one RPC, or raw bytes sent to one RPC's path.
        #[derive(Clone, Debug)]
        enum Req { $( $var($ty), )* Raw(RawReq) }

        /// Every RPC, named as in the .proto.
        const RPCS: &[&str] = &[ $( stringify!($var), )* ];

        impl Req {
            fn name(&self) -> &'static str {
                match self { $( Req::$var(_) => stringify!($var), )* Req::Raw(_) => "Raw" }
            }

            /// `/vallum.v1.Service/Method`.
            fn path(&self) -> String {
                match self {
                    $( Req::$var(_) => grpc_path(stringify!($var), stringify!($client)), )*
                    Req::Raw(q) => q.path.clone(),
                }
            }

            /// The protobuf encoding of the request.
            fn encode(&self) -> Vec<u8> {
                match self {
                    $( Req::$var(q) => prost::Message::encode_to_vec(q), )*
                    Req::Raw(q) => q.bytes.clone(),
                }
            }

            /// Sends the request; the answer's content is not needed (state is compared
            /// through [`snapshot`]).
            async fn send(self, c: &mut Clients) -> Result<(), Status> {
                match self {
                    $( Req::$var(q) => c.$client.$method(q).await.map(|_| ()), )*
                    Req::Raw(q) => send_raw(c.ch.clone(), q).await,
                }
            }
        }
    };
}

/// The HTTP/2 path of RPC `var` (a [`RPCS`] name) of the client field `client`.
fn grpc_path(var: &str, client: &str) -> String {
    let service = match client {
        "rs" => "RulesetService",
        "counters" => "CounterService",
        "trace" => "TraceService",
        "engine" => "EngineService",
        "ct" => "ConntrackService",
        "fleet" => "FleetService",
        _ => "SetService",
    };
    let method = (var.strip_prefix("Conntrack"))
        .or_else(|| var.strip_prefix("Fleet"))
        .unwrap_or(var);
    format!("/vallum.v1.{service}/{method}")
}

/// Raw protobuf bytes for one RPC: a typed request's encoding, mutated.
#[derive(Clone, Debug)]
struct RawReq {
    /// The RPC the bytes were made for.
    rpc: &'static str,
    path: String,
    /// What was done to the encoding.
    how: &'static str,
    /// Whether the RPC mutates (so a success may change the state).
    write: bool,
    bytes: Vec<u8>,
}

async fn send_raw(ch: Channel, q: RawReq) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(ch).max_decoding_message_size(64 << 20);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    let path = http::uri::PathAndQuery::try_from(q.path.as_str())
        .map_err(|e| Status::invalid_argument(format!("path: {e}")))?;
    if q.rpc == "WatchCommits" {
        // A server stream: the headers are the answer (the stream would wait for commits).
        return grpc
            .server_streaming(tonic::Request::new(q.bytes), path, RawCodec)
            .await
            .map(|_| ());
    }
    grpc.unary(tonic::Request::new(q.bytes), path, RawCodec)
        .await
        .map(|_| ())
}

/// A typed request's encoding mutated: a byte of a text made invalid UTF-8, truncated,
/// bytes flipped, an unknown field, a field repeated, a length made huge, or noise.
fn raw(r: &mut Rng, typed: &Req) -> Req {
    let mut b = typed.encode();
    let how = match r.below(7) {
        0 => {
            // Inside a run of printable ASCII (most likely a string field): 0xff.
            let runs: Vec<usize> = (0..b.len().saturating_sub(3))
                .filter(|&i| b[i..i + 3].iter().all(|c| c.is_ascii_graphic()))
                .collect();
            if runs.is_empty() {
                b.push(0xff);
            } else {
                let i = runs[r.below(runs.len())] + 1;
                b[i] = *r.pick(&[&0xffu8, &0xc0, &0x80, &0xed]);
            }
            "invalid UTF-8 in a text"
        }
        1 => {
            let n = r.below(b.len() + 1);
            b.truncate(n);
            "truncated"
        }
        2 => {
            fuzz_gen::mutate_bytes(r, &mut b);
            "bytes flipped"
        }
        3 => {
            // Field 99, varint; then field 100, length-delimited.
            b.extend_from_slice(&[0x98, 0x06, 0x01, 0xa2, 0x06, 0x03, b'a', b'b', b'c']);
            "unknown fields"
        }
        4 => {
            let copy = b.clone();
            b.extend_from_slice(&copy);
            "every field twice"
        }
        5 => {
            // Field 1 as length-delimited with a length far past the end.
            b.splice(0..0, [0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]);
            "a length past the end"
        }
        _ => {
            b = (0..r.small(64)).map(|_| r.below(256) as u8).collect();
            "noise"
        }
    };
    Req::Raw(RawReq {
        rpc: typed.name(),
        path: typed.path(),
        how,
        write: typed.is_write(),
        bytes: b,
    })
}

rpcs! {
    ValidateRuleset => rs.validate_ruleset(pb::ValidateRulesetRequest);
    StageRevision => rs.stage_revision(pb::StageRevisionRequest);
    CommitRevision => rs.commit_revision(pb::CommitRevisionRequest);
    ConfirmCommit => rs.confirm_commit(pb::ConfirmCommitRequest);
    Apply => rs.apply(pb::ApplyRequest);
    EditRuleset => rs.edit_ruleset(pb::EditRulesetRequest);
    Rollback => rs.rollback(pb::RollbackRequest);
    GetRuleset => rs.get_ruleset(pb::GetRulesetRequest);
    ListRulesets => rs.list_rulesets(pb::ListRulesetsRequest);
    DeleteRuleset => rs.delete_ruleset(pb::DeleteRulesetRequest);
    UpdateRuleset => rs.update_ruleset(pb::UpdateRulesetRequest);
    ListRevisions => rs.list_revisions(pb::ListRevisionsRequest);
    GetRevision => rs.get_revision(pb::GetRevisionRequest);
    DiffRevisions => rs.diff_revisions(pb::DiffRevisionsRequest);
    ExportRevision => rs.export_revision(pb::ExportRevisionRequest);
    WatchCommits => rs.watch_commits(pb::WatchCommitsRequest);
    GetCounters => counters.get_counters(pb::GetCountersRequest);
    ZeroCounters => counters.zero_counters(pb::ZeroCountersRequest);
    TracePacket => trace.trace_packet(pb::TracePacketRequest);
    ReplayCapture => trace.replay_capture(pb::ReplayCaptureRequest);
    GetStatus => engine.get_status(pb::GetStatusRequest);
    ConntrackList => ct.list(pb::ListConntrackRequest);
    ConntrackDelete => ct.delete(pb::DeleteConntrackRequest);
    ConntrackFlush => ct.flush(pb::FlushConntrackRequest);
    ConntrackGetStats => ct.get_stats(pb::GetConntrackStatsRequest);
    CreateSet => sets.create_set(pb::CreateSetRequest);
    DestroySet => sets.destroy_set(pb::DestroySetRequest);
    AddElements => sets.add_elements(pb::AddElementsRequest);
    DeleteElements => sets.delete_elements(pb::DeleteElementsRequest);
    ListSets => sets.list_sets(pb::ListSetsRequest);
    GetSet => sets.get_set(pb::GetSetRequest);
    FlushSet => sets.flush_set(pb::FlushSetRequest);
    SwapSets => sets.swap_sets(pb::SwapSetsRequest);
    ImportIpsetSave => sets.import_ipset_save(pb::ImportIpsetSaveRequest);
    ExportIpsetSave => sets.export_ipset_save(pb::ExportIpsetSaveRequest);
    FleetPutRuleset => fleet.put_ruleset(pb::PutFleetRulesetRequest);
    FleetGetRuleset => fleet.get_ruleset(pb::GetFleetRulesetRequest);
    FleetListRulesets => fleet.list_rulesets(pb::ListFleetRulesetsRequest);
    FleetDeleteRuleset => fleet.delete_ruleset(pb::DeleteFleetRulesetRequest);
    FleetGetRolloutStatus => fleet.get_rollout_status(pb::GetRolloutStatusRequest);
    FleetListNodes => fleet.list_nodes(pb::ListNodesRequest);
}

impl Req {
    /// Whether this is a mutating RPC (`validate_only` or not).
    /// The RPC's name, or `Raw(RPC: how)` for raw bytes.
    fn label(&self) -> String {
        match self {
            Req::Raw(q) => format!("Raw({}: {})", q.rpc, q.how),
            _ => self.name().to_string(),
        }
    }

    fn is_write(&self) -> bool {
        if let Req::Raw(q) = self {
            return q.write;
        }
        self.may_change()
            || matches!(
                self,
                Req::StageRevision(_)
                    | Req::CommitRevision(_)
                    | Req::Apply(_)
                    | Req::EditRuleset(_)
                    | Req::UpdateRuleset(_)
                    | Req::FleetPutRuleset(_)
                    | Req::FleetDeleteRuleset(_)
            )
    }

    /// Whether a successful answer may change the state (a mutation that is not
    /// `validate_only`).
    fn may_change(&self) -> bool {
        match self {
            Req::StageRevision(q) => !q.validate_only,
            Req::UpdateRuleset(q) => !q.validate_only,
            Req::CommitRevision(q) => !q.validate_only,
            Req::Apply(q) => !q.validate_only,
            Req::EditRuleset(q) => !q.validate_only,
            Req::Raw(q) => q.write,
            // Fleet rulesets select no node of this vallumd (see `fleet_selector`): a write
            // to etcd changes nothing here.
            Req::FleetPutRuleset(_)
            | Req::FleetDeleteRuleset(_)
            | Req::FleetGetRuleset(_)
            | Req::FleetListRulesets(_)
            | Req::FleetGetRolloutStatus(_)
            | Req::FleetListNodes(_) => false,
            Req::ConfirmCommit(_)
            | Req::Rollback(_)
            | Req::DeleteRuleset(_)
            | Req::ZeroCounters(_)
            | Req::ConntrackDelete(_)
            | Req::ConntrackFlush(_)
            | Req::CreateSet(_)
            | Req::DestroySet(_)
            | Req::AddElements(_)
            | Req::DeleteElements(_)
            | Req::FlushSet(_)
            | Req::SwapSets(_)
            | Req::ImportIpsetSave(_) => true,
            Req::ValidateRuleset(_)
            | Req::GetRuleset(_)
            | Req::ListRulesets(_)
            | Req::ListRevisions(_)
            | Req::GetRevision(_)
            | Req::DiffRevisions(_)
            | Req::ExportRevision(_)
            | Req::WatchCommits(_)
            | Req::GetCounters(_)
            | Req::TracePacket(_)
            | Req::ReplayCapture(_)
            | Req::GetStatus(_)
            | Req::ConntrackList(_)
            | Req::ConntrackGetStats(_)
            | Req::ListSets(_)
            | Req::GetSet(_)
            | Req::ExportIpsetSave(_) => false,
        }
    }
}

fn request_id(r: &mut Rng) -> String {
    match r.below(10) {
        0 => "id-1".into(),
        1 => "id-2".into(),
        2 => format!("id-{}", r.next()),
        3 => fuzz_gen::weird_name(r),
        _ => String::new(),
    }
}

fn etag(r: &mut Rng) -> String {
    match r.below(30) {
        0 => "W/\"1\"".into(),
        1 => fuzz_gen::weird_name(r),
        2 => "0".into(),
        _ => String::new(),
    }
}

/// A fleet selector (or canary selector) that never selects the fuzzed node (labels
/// `fuzz=node`): its first requirement is `fuzz=never`, then random requirements, some
/// malformed.
fn fleet_selector(r: &mut Rng) -> String {
    let rest = match r.below(6) {
        0 => String::new(),
        1 => ",role in (web,db)".into(),
        2 => ",!gpu,zone!=a".into(),
        3 => format!(",{}", fuzz_gen::weird_name(r)),
        4 => format!(",{}", fuzz_gen::random_text(r, 30)),
        _ => ",k=".into(),
    };
    format!("fuzz=never{rest}")
}

fn priority(r: &mut Rng) -> i32 {
    *r.pick(&[&0i32, &0, &10, &-10, &100, &i32::MAX, &i32::MIN])
}

fn message(r: &mut Rng) -> String {
    match r.below(10) {
        0 => "m".repeat(100_000),
        1 => fuzz_gen::weird_name(r),
        _ => fuzz_gen::random_text(r, 40),
    }
}

/// One request of RPC `rpc` (an index into [`RPCS`]).
fn generate(r: &mut Rng, rpc: &str, caps: &Caps) -> Req {
    use fuzz_gen::{revision_name, ruleset_name, set_name};
    match rpc {
        "ValidateRuleset" => Req::ValidateRuleset(pb::ValidateRulesetRequest {
            ruleset: ruleset_name(r),
            source: fuzz_gen::source(r, caps),
        }),
        "StageRevision" => Req::StageRevision(pb::StageRevisionRequest {
            ruleset: ruleset_name(r),
            source: fuzz_gen::source(r, caps),
            message: message(r),
            priority: priority(r),
            etag: etag(r),
            request_id: request_id(r),
            validate_only: r.chance(300),
            allow_empty: r.chance(100),
        }),
        "CommitRevision" => Req::CommitRevision(pb::CommitRevisionRequest {
            name: revision_name(r),
            confirm_within: fuzz_gen::confirm_within(r),
            etag: etag(r),
            request_id: request_id(r),
            validate_only: r.chance(300),
        }),
        "ConfirmCommit" => Req::ConfirmCommit(pb::ConfirmCommitRequest {
            name: revision_name(r),
            etag: etag(r),
            request_id: request_id(r),
        }),
        "UpdateRuleset" => Req::UpdateRuleset(pb::UpdateRulesetRequest {
            ruleset: (!r.chance(20)).then(|| pb::Ruleset {
                name: ruleset_name(r),
                priority: priority(r),
                etag: etag(r),
                ..Default::default()
            }),
            update_mask: (!r.chance(100)).then(|| prost_types::FieldMask {
                paths: (0..r.small(3))
                    .map(|_| {
                        r.pick(&["priority", "*", "", "name", "etag", "x.y", "Priority"])
                            .to_string()
                    })
                    .collect(),
            }),
            request_id: request_id(r),
            validate_only: r.chance(300),
        }),
        "Apply" => Req::Apply(pb::ApplyRequest {
            ruleset: ruleset_name(r),
            source: fuzz_gen::source(r, caps),
            message: message(r),
            priority: priority(r),
            confirm_within: fuzz_gen::confirm_within(r),
            etag: etag(r),
            request_id: request_id(r),
            validate_only: r.chance(300),
            allow_empty: r.chance(100),
            durability: *r.pick(&[&0i32, &0, &1, &2, &9]),
        }),
        "EditRuleset" => Req::EditRuleset(pb::EditRulesetRequest {
            ruleset: ruleset_name(r),
            edits: (0..r.small(4))
                .map(|_| pb::RuleCommand {
                    family: *r.pick(&[&0i32, &1, &1, &2, &99, &-1]),
                    table: r
                        .pick(&[
                            "", "", "filter", "nat", "mangle", "raw", "security", "bogus",
                        ])
                        .to_string(),
                    args: fuzz_gen::edit_args(r),
                })
                .collect(),
            etag: etag(r),
            request_id: request_id(r),
            validate_only: r.chance(300),
            message: message(r),
            durability: *r.pick(&[&0i32, &0, &1, &2, &9]),
        }),
        "FleetPutRuleset" => Req::FleetPutRuleset(pb::PutFleetRulesetRequest {
            name: ruleset_name(r),
            source: fuzz_gen::source(r, caps),
            priority: priority(r),
            selector: fleet_selector(r),
            message: message(r),
            etag: r
                .pick(&["", "", "0", "1", "x", "-1", "99999999999999999999"])
                .to_string(),
            validate_only: r.chance(300),
            request_id: request_id(r),
            allow_empty: r.chance(100),
            canary: if r.chance(200) {
                fleet_selector(r)
            } else {
                String::new()
            },
        }),
        "FleetGetRuleset" => Req::FleetGetRuleset(pb::GetFleetRulesetRequest {
            name: ruleset_name(r),
        }),
        "FleetListRulesets" => Req::FleetListRulesets(pb::ListFleetRulesetsRequest {
            page_size: *r.pick(&[&0u32, &1, &2, &u32::MAX]),
            page_token: r.pick(&["", "", "x", "00"]).to_string(),
        }),
        "FleetDeleteRuleset" => Req::FleetDeleteRuleset(pb::DeleteFleetRulesetRequest {
            name: ruleset_name(r),
            etag: r.pick(&["", "", "0", "x"]).to_string(),
        }),
        "FleetGetRolloutStatus" => Req::FleetGetRolloutStatus(pb::GetRolloutStatusRequest {
            name: ruleset_name(r),
        }),
        "FleetListNodes" => Req::FleetListNodes(pb::ListNodesRequest {
            page_size: *r.pick(&[&0u32, &1, &u32::MAX]),
            page_token: r.pick(&["", "", "x"]).to_string(),
        }),
        "Rollback" => Req::Rollback(pb::RollbackRequest {
            name: revision_name(r),
            message: message(r),
            etag: etag(r),
            request_id: request_id(r),
        }),
        "GetRuleset" => Req::GetRuleset(pb::GetRulesetRequest {
            name: ruleset_name(r),
        }),
        "ListRulesets" => Req::ListRulesets(pb::ListRulesetsRequest::default()),
        "DeleteRuleset" => Req::DeleteRuleset(pb::DeleteRulesetRequest {
            // Deleting is rare, or the fuzzer would mostly meet empty state.
            name: if r.chance(300) {
                ruleset_name(r)
            } else {
                fuzz_gen::weird_name(r)
            },
            etag: etag(r),
            request_id: request_id(r),
        }),
        "ListRevisions" => Req::ListRevisions(pb::ListRevisionsRequest {
            ruleset: ruleset_name(r),
            page_size: *r.pick(&[&0u32, &1, &2, &1000, &1001, &u32::MAX]),
            page_token: r
                .pick(&["", "", "1", "3", "0", "-1", "x", "18446744073709551616"])
                .to_string(),
        }),
        "GetRevision" => Req::GetRevision(pb::GetRevisionRequest {
            name: revision_name(r),
        }),
        "DiffRevisions" => Req::DiffRevisions(pb::DiffRevisionsRequest {
            base: revision_name(r),
            target: revision_name(r),
        }),
        "ExportRevision" => Req::ExportRevision(pb::ExportRevisionRequest {
            name: revision_name(r),
            format: *r.pick(&[&0i32, &1, &2, &3, &-1]),
            counters: r.chance(500),
        }),
        "WatchCommits" => Req::WatchCommits(pb::WatchCommitsRequest {
            ruleset: if r.chance(500) {
                String::new()
            } else {
                ruleset_name(r)
            },
            start_after: *r.pick(&[&0u64, &0, &0, &1, &u64::MAX]),
        }),
        "GetCounters" => Req::GetCounters(pb::GetCountersRequest {
            ruleset: if r.chance(300) {
                String::new()
            } else {
                ruleset_name(r)
            },
            page_size: *r.pick(&[&0u32, &1, &10, &u32::MAX]),
            page_token: if r.chance(100) {
                "not-a-token".into()
            } else {
                String::new()
            },
        }),
        "ZeroCounters" => Req::ZeroCounters(pb::ZeroCountersRequest {
            ruleset: if r.chance(300) {
                String::new()
            } else {
                ruleset_name(r)
            },
            ..Default::default()
        }),
        "TracePacket" => {
            let (frame, raw_ip) = if r.chance(400) {
                fuzz_gen::frame(r)
            } else {
                (Vec::new(), r.chance(50))
            };
            Req::TracePacket(pb::TracePacketRequest {
                // Now and then neither packet nor frame.
                packet: ((frame.is_empty() && r.chance(970)) || r.chance(100))
                    .then(|| fuzz_gen::packet_spec(r)),
                revision: if r.chance(700) {
                    String::new()
                } else {
                    revision_name(r)
                },
                frame,
                raw_ip,
            })
        }
        "ReplayCapture" => Req::ReplayCapture(pb::ReplayCaptureRequest {
            capture: fuzz_gen::capture(r, caps.request_bytes),
            revision: if r.chance(600) {
                String::new()
            } else {
                revision_name(r)
            },
            hook: *r.pick(&[&0i32, &2, &3, &4, &1, &99]),
            in_interface: r.pick(&["", "eth0", "lo", "a b"]).to_string(),
            max_flows: *r.pick(&[&0u32, &1, &100, &u32::MAX]),
        }),
        "GetStatus" => Req::GetStatus(pb::GetStatusRequest {}),
        "ConntrackList" => Req::ConntrackList(pb::ListConntrackRequest {
            filter: fuzz_gen::conntrack_filter(r),
            page_size: *r.pick(&[&0u32, &1, &10_000, &10_001, &u32::MAX]),
            page_token: if r.chance(100) {
                "00".into()
            } else {
                String::new()
            },
        }),
        "ConntrackDelete" => Req::ConntrackDelete(pb::DeleteConntrackRequest {
            filter: fuzz_gen::conntrack_filter(r),
            request_id: request_id(r),
        }),
        "ConntrackFlush" => Req::ConntrackFlush(pb::FlushConntrackRequest {
            request_id: request_id(r),
        }),
        "ConntrackGetStats" => Req::ConntrackGetStats(pb::GetConntrackStatsRequest {}),
        "CreateSet" => Req::CreateSet(pb::CreateSetRequest {
            name: set_name(r),
            r#type: r
                .pick(&[
                    "hash:ip",
                    "hash:net",
                    "hash:ip,port",
                    "hash:net,port",
                    "hash:mac",
                    "",
                    "HASH:IP",
                ])
                .to_string(),
            family: *r.pick(&[&0i32, &1, &2, &3]),
            hashsize: *r.pick(&[&0u32, &64, &1024, &3, &u32::MAX]),
            maxelem: *r.pick(&[&0u32, &16, &65536, &u32::MAX]),
            timeout: match r.below(6) {
                0 => Some(0),
                1 => Some(100_000),
                2 => Some(u32::MAX),
                _ => None,
            },
            counters: r.chance(300),
            exist: r.chance(300),
            request_id: request_id(r),
        }),
        "DestroySet" => Req::DestroySet(pb::DestroySetRequest {
            name: if r.chance(400) {
                set_name(r)
            } else {
                fuzz_gen::weird_name(r)
            },
            etag: etag(r),
            request_id: request_id(r),
        }),
        "AddElements" => {
            let set = set_name(r);
            let ty = fuzz_gen::set_type(&set);
            Req::AddElements(pb::AddElementsRequest {
                set,
                elements: (0..r.small(40))
                    .map(|_| fuzz_gen::set_element(r, ty))
                    .collect(),
                exist: r.chance(300),
                etag: etag(r),
                request_id: request_id(r),
            })
        }
        "DeleteElements" => {
            let set = set_name(r);
            let ty = fuzz_gen::set_type(&set);
            Req::DeleteElements(pb::DeleteElementsRequest {
                set,
                elements: (0..r.small(20))
                    .map(|_| fuzz_gen::set_element(r, ty))
                    .collect(),
                exist: r.chance(300),
                etag: etag(r),
                request_id: request_id(r),
            })
        }
        "ListSets" => Req::ListSets(pb::ListSetsRequest::default()),
        "GetSet" => Req::GetSet(pb::GetSetRequest {
            name: set_name(r),
            page_size: *r.pick(&[&0u32, &1, &10, &u32::MAX]),
            page_token: r.pick(&["", "", "1", "5", "-1", "x"]).to_string(),
        }),
        "FlushSet" => Req::FlushSet(pb::FlushSetRequest {
            name: if r.chance(300) {
                set_name(r)
            } else {
                fuzz_gen::weird_name(r)
            },
            etag: etag(r),
            request_id: request_id(r),
        }),
        "SwapSets" => Req::SwapSets(pb::SwapSetsRequest {
            name: set_name(r),
            other_name: set_name(r),
            etag: etag(r),
            other_etag: etag(r),
            request_id: request_id(r),
        }),
        "ImportIpsetSave" => Req::ImportIpsetSave(pb::ImportIpsetSaveRequest {
            text: fuzz_gen::ipset_text(r, caps.request_bytes),
            filename: if r.chance(100) {
                fuzz_gen::weird_name(r)
            } else {
                String::new()
            },
            request_id: request_id(r),
        }),
        "ExportIpsetSave" => Req::ExportIpsetSave(pb::ExportIpsetSaveRequest {
            name: if r.chance(400) {
                String::new()
            } else {
                set_name(r)
            },
        }),
        other => unreachable!("no generator for {other}"),
    }
}

/// A request over `--max-request-bytes` (it must be refused with RESOURCE_EXHAUSTED).
fn too_large(r: &mut Rng) -> Req {
    let n = MAX_REQUEST_BYTES + 1 + r.below(MAX_REQUEST_BYTES);
    let text = format!("*filter\n{}COMMIT\n", "# padding\n".repeat(n / 10));
    match r.below(4) {
        0 => Req::ValidateRuleset(pb::ValidateRulesetRequest {
            ruleset: "fz0".into(),
            source: Some(support::text_source(&text, false, "")),
        }),
        1 => Req::Apply(pb::ApplyRequest {
            ruleset: "fz1".into(),
            source: Some(support::text_source(&text, false, "")),
            ..Default::default()
        }),
        2 => Req::ImportIpsetSave(pb::ImportIpsetSaveRequest {
            text,
            filename: String::new(),
            ..Default::default()
        }),
        _ => Req::ReplayCapture(pb::ReplayCaptureRequest {
            capture: text.into_bytes(),
            ..Default::default()
        }),
    }
}

// === state ===

fn snap_err(what: &str, e: &Status) -> String {
    format!("{what}: error {:?} {}", e.code(), e.message())
}

/// What a refused request must not change, one line per fact. The parts are asked for at
/// once (each on its own clone of the channel).
async fn snapshot(c: &Clients) -> Vec<String> {
    let (mut counters, mut engine, mut sets, mut sets2, mut ct) = (
        c.counters.clone(),
        c.engine.clone(),
        c.sets.clone(),
        c.sets.clone(),
        c.ct.clone(),
    );
    let (rulesets, counters, status, sets, save, ct) = tokio::join!(
        rulesets_snapshot(c.rs.clone()),
        counters.get_counters(pb::GetCountersRequest::default()),
        engine.get_status(pb::GetStatusRequest {}),
        sets.list_sets(pb::ListSetsRequest::default()),
        sets2.export_ipset_save(pb::ExportIpsetSaveRequest::default()),
        ct.get_stats(pb::GetConntrackStatsRequest {}),
    );
    let mut out = rulesets;
    match counters {
        Err(e) => out.push(snap_err("GetCounters", &e)),
        Ok(x) => out.extend(x.into_inner().counters.iter().map(|c| format!("{c:?}"))),
    }
    match status {
        Err(e) => out.push(snap_err("GetStatus", &e)),
        Ok(x) => {
            let x = x.into_inner();
            out.push(format!("engine active {:?} rules {}", x.active, x.rules));
        }
    }
    match sets {
        Err(e) => out.push(snap_err("ListSets", &e)),
        Ok(x) => out.extend(x.into_inner().sets.iter().map(|s| format!("{s:?}"))),
    }
    match save {
        Err(e) => out.push(snap_err("ExportIpsetSave", &e)),
        // Timeouts count down: keep the elements, drop the seconds left.
        Ok(x) => out.extend(x.into_inner().text.lines().map(strip_timeout)),
    }
    match ct {
        Err(e) => out.push(snap_err("ConntrackGetStats", &e)),
        Ok(x) => {
            let x = x.into_inner();
            out.push(format!(
                "conntrack entries {} new {}",
                x.entries, x.new_total
            ));
        }
    }
    out
}

/// Every ruleset, its revisions and its active revision's text.
async fn rulesets_snapshot(mut rs: RulesetServiceClient<Channel>) -> Vec<String> {
    let list = match rs.list_rulesets(pb::ListRulesetsRequest::default()).await {
        Err(e) => return vec![snap_err("ListRulesets", &e)],
        Ok(l) => l.into_inner().rulesets,
    };
    let parts = list.into_iter().map(|set| {
        let mut rs = rs.clone();
        async move {
            let mut out = vec![format!("{set:?}")];
            let mut token = String::new();
            for _ in 0..100 {
                let q = pb::ListRevisionsRequest {
                    ruleset: set.name.clone(),
                    page_size: 100,
                    page_token: token.clone(),
                };
                match rs.list_revisions(q).await {
                    Err(e) => {
                        out.push(snap_err("ListRevisions", &e));
                        break;
                    }
                    Ok(p) => {
                        let p = p.into_inner();
                        out.extend(p.revisions.iter().map(|v| format!("{v:?}")));
                        if p.next_page_token.is_empty() {
                            break;
                        }
                        token = p.next_page_token;
                    }
                }
            }
            if set.active_revision > 0 {
                let q = pb::ExportRevisionRequest {
                    name: format!("{}/revisions/{}", set.name, set.active_revision),
                    format: pb::ExportFormat::IptablesSave as i32,
                    counters: false,
                };
                match rs.export_revision(q).await {
                    Err(e) => out.push(snap_err("ExportRevision", &e)),
                    Ok(x) => out.extend(x.into_inner().content.lines().map(String::from)),
                }
            }
            out
        }
    });
    futures_util::future::join_all(parts)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// `add s 10.0.0.1 timeout 99` -> `add s 10.0.0.1 timeout`.
fn strip_timeout(line: &str) -> String {
    let mut out = Vec::new();
    let mut words = line.split(' ').peekable();
    while let Some(w) = words.next() {
        out.push(w);
        if w == "timeout" && words.peek().is_some() && line.starts_with("add ") {
            words.next();
        }
    }
    out.join(" ")
}

/// Why a request that was accepted should have been refused (issue #13's list), given the
/// state before it.
fn must_refuse(req: &Req, before: &[String]) -> Option<&'static str> {
    let bare = |n: &str| n.strip_prefix("rulesets/").unwrap_or(n).to_string();
    let exists = |n: &str| {
        let line = format!("Ruleset {{ name: \"rulesets/{}\",", bare(n));
        before.iter().any(|l| l.starts_with(&line))
    };
    let dots = |n: &str| matches!(bare(n).as_str(), "." | "..");
    match req {
        Req::TracePacket(q) if q.packet.is_none() && q.frame.is_empty() => {
            Some("a trace with neither packet nor frame must be INVALID_ARGUMENT")
        }
        Req::Apply(q) if dots(&q.ruleset) => Some("`.` and `..` are not ruleset names"),
        Req::StageRevision(q) if dots(&q.ruleset) => Some("`.` and `..` are not ruleset names"),
        Req::GetCounters(q) if !q.ruleset.is_empty() && !exists(&q.ruleset) => {
            Some("counters of a missing ruleset must be NOT_FOUND")
        }
        Req::ZeroCounters(q) if !q.ruleset.is_empty() && !exists(&q.ruleset) => {
            Some("zeroing a missing ruleset's counters must be NOT_FOUND")
        }
        Req::CreateSet(q) if q.name.starts_with('-') => {
            Some("a set named `-...` cannot be named by any rule")
        }
        _ => None,
    }
}

/// The first difference of two snapshots, as `-old` / `+new` lines.
fn first_diff(a: &[String], b: &[String]) -> Option<String> {
    let i = a.iter().zip(b).position(|(x, y)| x != y);
    let i = match i {
        Some(i) => i,
        None if a.len() == b.len() => return None,
        None => a.len().min(b.len()),
    };
    Some(format!(
        "-{}\n+{}",
        a.get(i).map_or("(none)", String::as_str),
        b.get(i).map_or("(none)", String::as_str)
    ))
}

// === the process ===

/// How every vallumd of a run is started: fleet mode (with the etcd's URL) and the memory
/// ceiling.
struct Setup {
    fleet: Option<String>,
    ceiling: Ceiling,
}

/// Starts the fuzzed vallumd with the harness ([`Daemon::spawn`]): `VALLUM_FUZZ_VALLUMD` names
/// another binary when set; [`FLAGS`], fleet mode per `setup`, and the memory ceiling (set
/// before exec, or the cgroup entered right after the spawn). Killed on drop.
fn start(db: &Path, setup: &Setup) -> Daemon {
    let bin = std::env::var_os("VALLUM_FUZZ_VALLUMD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vallumd")));
    let mut cmd = support::command_of(&bin);
    cmd.arg("--db").arg(db).args(FLAGS);
    if let Some(url) = &setup.fleet {
        cmd.args(["--fleet-endpoints", url, "--node-name", "fuzz-node"])
            .args(["--node-labels", "fuzz=node"]);
    }
    setup.ceiling.limit(&mut cmd);
    Daemon::spawn(cmd, |child| setup.ceiling.enter(child.id()))
}

/// VmRSS and VmHWM of process `pid`, KiB.
fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let l = s.lines().find(|l| l.starts_with(name))?;
        l.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The memory ceiling of every fuzzed vallumd (`VALLUM_FUZZ_MEMORY_MIB`, default 1024): a
/// memory cgroup of its own when this process can make one (root; cgroup v2 `memory.max`, or
/// v1 `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`), else `RLIMIT_AS` at three
/// times the ceiling (address space counts reservations too). A request whose memory is not
/// bounded then gets vallumd killed or aborted: a crash the run reports, not a slow pass.
struct Ceiling {
    bytes: u64,
    cgroup: Option<PathBuf>,
}

impl Ceiling {
    fn new(bytes: u64) -> Ceiling {
        Ceiling {
            bytes,
            cgroup: memory_cgroup(bytes),
        }
    }

    /// How the ceiling is kept, for the run's first line.
    fn describe(&self) -> String {
        match &self.cgroup {
            Some(d) => format!("{} MiB (cgroup {})", self.bytes >> 20, d.display()),
            None => format!("{} MiB x 3 of address space (RLIMIT_AS)", self.bytes >> 20),
        }
    }

    /// Without a cgroup: `RLIMIT_AS` in the child before exec.
    fn limit(&self, cmd: &mut Command) {
        if self.cgroup.is_some() {
            return;
        }
        use std::os::unix::process::CommandExt;
        let bytes = self.bytes.saturating_mul(3);
        // SAFETY: runs in the forked child before exec and only calls setrlimit(2), which is
        // async-signal-safe; nothing is allocated or locked.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Moves process `pid` into the cgroup, if there is one.
    fn enter(&self, pid: u32) {
        if let Some(d) = &self.cgroup {
            std::fs::write(d.join("cgroup.procs"), pid.to_string())
                .unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        }
    }
}

impl Drop for Ceiling {
    fn drop(&mut self) {
        if let Some(d) = &self.cgroup {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A memory cgroup below this process's own, limited to `bytes`, or `None` when one cannot be
/// made (not root, no memory controller there).
fn memory_cgroup(bytes: u64) -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let name = format!("vallum-fuzz-{}", std::process::id());
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let (dir, files): (PathBuf, &[&str]) = if v2 {
        let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        (
            Path::new("/sys/fs/cgroup")
                .join(path.trim_start_matches('/'))
                .join(name),
            &["memory.max", "memory.swap.max"],
        )
    } else {
        let path = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p))?;
        (
            Path::new("/sys/fs/cgroup/memory")
                .join(path.trim_start_matches('/'))
                .join(name),
            &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
        )
    };
    std::fs::create_dir(&dir).ok()?;
    // The first file is the limit itself; the second (no swap past it) may be absent.
    if std::fs::write(dir.join(files[0]), bytes.to_string()).is_err() {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    let swap = if v2 { 0 } else { bytes };
    let _ = std::fs::write(dir.join(files[1]), swap.to_string());
    Some(dir)
}

async fn health(ch: Channel) -> Result<i32, Status> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let r = HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    Ok(r.into_inner().status)
}

/// Waits until health says SERVING (at most `tries` x 50 ms).
async fn wait_serving(ch: &Channel, tries: usize) -> bool {
    use tonic_health::pb::health_check_response::ServingStatus;
    for _ in 0..tries {
        if matches!(health(ch.clone()).await, Ok(s) if s == ServingStatus::Serving as i32) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

// === the run ===

fn env_num(name: &str) -> Option<f64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: {e} (a number)")),
    )
}

/// A request's Debug text with runs of one character over 16 written `c×N`, cut to `max`
/// bytes (requests may be ~1 MiB).
fn short(req: &Req, max: usize) -> String {
    let full = format!("{req:?}");
    let mut s = String::new();
    let mut chars = full.chars().peekable();
    while let Some(ch) = chars.next() {
        let mut run = 1;
        while chars.peek() == Some(&ch) {
            chars.next();
            run += 1;
        }
        if run > 16 {
            let _ = write!(s, "{ch}×{run}");
        } else {
            s.extend(std::iter::repeat_n(ch, run));
        }
    }
    if s.len() > max {
        let mut i = max;
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        let total = s.len();
        s.truncate(i);
        let _ = write!(s, "... ({total} bytes)");
    }
    s
}

#[derive(Default)]
struct Tally {
    ok: u64,
    err: BTreeMap<String, u64>,
}

/// One finding: what happened, at which request, the request (cut) and where it was saved.
struct Finding {
    kind: &'static str,
    index: u64,
    rpc: String,
    detail: String,
    request: String,
    saved: Option<PathBuf>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_fuzz() {
    let seed: u64 = match std::env::var("VALLUM_FUZZ_SEED").ok().as_deref() {
        None | Some("") => 0x5eed_0013,
        Some("random") => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
        Some(s) => s
            .parse()
            .unwrap_or_else(|e| panic!("VALLUM_FUZZ_SEED={s:?}: {e}")),
    };
    let secs = env_num("VALLUM_FUZZ_SECS");
    let max_requests = env_num("VALLUM_FUZZ_REQUESTS").map(|n| n as u64);
    let secs = match (secs, max_requests) {
        (None, Some(_)) => None,
        (s, _) => Some(s.unwrap_or(12.0)),
    };
    let stall = Duration::from_secs_f64(env_num("VALLUM_FUZZ_STALL_SECS").unwrap_or(60.0));
    let max_rss_kib = (env_num("VALLUM_FUZZ_MAX_RSS_MIB").unwrap_or(1024.0) * 1024.0) as u64;
    let memory_mib = env_num("VALLUM_FUZZ_MEMORY_MIB").unwrap_or(1024.0);
    let strict = std::env::var("VALLUM_FUZZ_STRICT").is_ok_and(|v| v == "1");
    let caps = Caps {
        deep_max: env_num("VALLUM_FUZZ_DEEP_MAX").map_or(20_000, |n| n as usize),
        chains_max: env_num("VALLUM_FUZZ_CHAINS_MAX").map_or(20_000, |n| n as usize),
        request_bytes: MAX_REQUEST_BYTES - 64 * 1024,
    };
    let mut only: Vec<&'static str> = match std::env::var("VALLUM_FUZZ_ONLY") {
        Ok(v) if !v.is_empty() => {
            v.split(',')
                .map(|n| {
                    *RPCS.iter().find(|r| **r == n.trim()).unwrap_or_else(|| {
                        panic!("VALLUM_FUZZ_ONLY: no RPC {n:?} (one of {RPCS:?})")
                    })
                })
                .collect()
        }
        _ => RPCS.to_vec(),
    };
    // The RPCs that take rich input come up more often.
    let mut weighted: Vec<&'static str> = only
        .iter()
        .flat_map(|rpc| {
            let w = match *rpc {
                "ValidateRuleset" | "Apply" | "StageRevision" | "EditRuleset" => 5,
                "FleetPutRuleset" => 3,
                "TracePacket" | "ReplayCapture" | "ImportIpsetSave" | "AddElements" => 3,
                "CommitRevision" | "Rollback" | "DeleteElements" | "CreateSet" => 2,
                _ => 1,
            };
            std::iter::repeat_n(*rpc, w)
        })
        .collect();
    println!(
        "grpc fuzz: seed {seed} (VALLUM_FUZZ_SEED), budget {secs:?} s / {max_requests:?} requests, caps {caps:?}"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("fuzz.db");
    let save_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("grpc-fuzz");
    // FleetService needs fleet mode, and fleet mode an etcd: without one the fleet RPCs are
    // left out (said on the first line).
    let wants_fleet = only.iter().any(|r| r.starts_with("Fleet"));
    let etcd = (wants_fleet && etcd::etcd_bin().is_some()).then(etcd::EtcdServer::start);
    if etcd.is_none() {
        only.retain(|r| !r.starts_with("Fleet"));
        weighted.retain(|r| !r.starts_with("Fleet"));
    }
    let setup = Setup {
        fleet: etcd.as_ref().map(etcd::EtcdServer::url),
        ceiling: Ceiling::new((memory_mib * 1024.0 * 1024.0) as u64),
    };
    println!(
        "grpc fuzz: memory ceiling {}, fleet {}",
        setup.ceiling.describe(),
        if etcd.is_some() {
            "on (etcd)"
        } else {
            "off (no etcd: FleetService not fuzzed)"
        }
    );
    let mut daemon = start(&db, &setup);
    let mut ch = daemon.channel().await;
    assert!(wait_serving(&ch, 400).await, "vallumd never became SERVING");
    let mut c = Clients::new(ch.clone());

    // A little valid state to start from: rulesets and sets that requests will meet.
    let mut r = Rng(seed);
    for s in fuzz_gen::SETS {
        let ty = fuzz_gen::set_type(s);
        let _ = c
            .sets
            .create_set(pb::CreateSetRequest {
                name: s.to_string(),
                r#type: ty.into(),
                ..Default::default()
            })
            .await;
    }
    for rs in fuzz_gen::RULESETS {
        let text = fuzz_gen::valid_text(&mut r);
        c.rs.apply(pb::ApplyRequest {
            ruleset: rs.to_string(),
            source: Some(support::text_source(&text, false, "seed.rules")),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("seed apply of {rs}: {e:?}\n{text}"));
    }

    let mut tallies: BTreeMap<&'static str, Tally> = BTreeMap::new();
    let mut findings: Vec<Finding> = Vec::new();
    let mut wrong_seen: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut before = snapshot(&c).await;
    let mut peak_hwm = 0u64;
    let mut crashes = 0u64;
    let started = Instant::now();
    let (mut t_send, mut t_check) = (Duration::ZERO, Duration::ZERO);
    let mut n = 0u64;
    loop {
        if max_requests.is_some_and(|m| n >= m)
            || secs.is_some_and(|s| started.elapsed().as_secs_f64() >= s)
            || crashes >= 5
        {
            break;
        }
        // Now and then a burst of concurrent requests (races between commits, deletes and
        // set changes): checked for crashes and health only, then the state is taken anew.
        if n >= only.len() as u64 && r.chance(15) {
            let burst: Vec<Req> = (0..8)
                .map(|_| {
                    let rpc = weighted[r.below(weighted.len())];
                    generate(&mut r, rpc, &caps)
                })
                .collect();
            let index = n;
            n += burst.len() as u64;
            let sends = burst.iter().cloned().map(|q| {
                let mut c = c.clone();
                async move { tokio::time::timeout(stall, q.send(&mut c)).await }
            });
            let answers = futures_util::future::join_all(sends).await;
            for (q, a) in burst.iter().zip(&answers) {
                let t = tallies.entry(q.name()).or_default();
                match a {
                    Ok(Ok(())) => t.ok += 1,
                    Ok(Err(e)) => *t.err.entry(format!("{:?}", e.code())).or_default() += 1,
                    Err(_) => *t.err.entry("stall".into()).or_default() += 1,
                }
            }
            let serving = wait_serving(&ch, 10).await;
            if !serving {
                for _ in 0..40 {
                    if daemon.exited().is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let stalled = answers.iter().any(|a| a.is_err());
            let exited = daemon.exited();
            if exited.is_some() || !serving || stalled {
                let kind = if exited.is_some() {
                    "crash"
                } else if stalled {
                    "stall"
                } else {
                    "not serving"
                };
                let paths: Vec<Option<PathBuf>> = burst
                    .iter()
                    .enumerate()
                    .map(|(k, q)| save(&save_dir, seed, index + k as u64, q))
                    .collect();
                let detail = format!(
                    "in a burst of {} concurrent requests ({exited:?})",
                    burst.len()
                );
                eprintln!("grpc fuzz: {kind} at requests {index}..{}: {detail}", n);
                findings.push(Finding {
                    kind,
                    index,
                    rpc: burst.iter().map(Req::name).collect::<Vec<_>>().join(","),
                    detail,
                    request: burst
                        .iter()
                        .map(|q| short(q, 200))
                        .collect::<Vec<_>>()
                        .join("\n    "),
                    saved: paths.into_iter().flatten().next(),
                });
                if exited.is_some() {
                    crashes += 1;
                    daemon = start(&db, &setup);
                    ch = daemon.channel().await;
                    c = Clients::new(ch.clone());
                }
                if !wait_serving(&ch, 2400).await {
                    break;
                }
            }
            before = snapshot(&c).await;
            continue;
        }
        // Each RPC once first (typed), then by weight.
        let first = only.get(n as usize).copied();
        let over_limit = first.is_none() && r.chance(5);
        let req = if over_limit {
            too_large(&mut r)
        } else {
            let rpc = first.unwrap_or_else(|| weighted[r.below(weighted.len())]);
            let typed = generate(&mut r, rpc, &caps);
            if first.is_none() && r.chance(80) {
                raw(&mut r, &typed)
            } else {
                typed
            }
        };
        let index = n;
        n += 1;
        let rpc = req.name();
        let label = req.label();
        let may_change = req.may_change();
        let is_write = req.is_write();
        let kept = req.clone();
        let t0 = Instant::now();
        let answer = tokio::time::timeout(stall, req.send(&mut c)).await;
        t_send += t0.elapsed();
        let record = |kind: &'static str, detail: String, findings: &mut Vec<Finding>| {
            let saved = save(&save_dir, seed, index, &kept);
            eprintln!("grpc fuzz: {kind} at request {index} ({label}): {detail}");
            findings.push(Finding {
                kind,
                index,
                rpc: label.clone(),
                detail,
                request: short(&kept, 600),
                saved,
            });
        };
        let tally = tallies.entry(rpc).or_default();
        let outcome = match answer {
            Err(_) => {
                record(
                    "stall",
                    format!("no answer within {stall:?}"),
                    &mut findings,
                );
                None
            }
            Ok(Ok(())) => {
                tally.ok += 1;
                Some(Ok(()))
            }
            Ok(Err(e)) => {
                *tally.err.entry(format!("{:?}", e.code())).or_default() += 1;
                Some(Err(e))
            }
        };

        // Health SERVING? (A few tries: a connection that an h2 error closed reconnects.)
        // When it is not, give a dying process a moment to be seen as exited.
        let serving = outcome.is_some() && wait_serving(&ch, 10).await;
        if !serving {
            for _ in 0..40 {
                if daemon.exited().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // The process is up?
        if let Some(status) = daemon.exited() {
            crashes += 1;
            record(
                "crash",
                format!("vallumd exited with {status}"),
                &mut findings,
            );
            daemon = start(&db, &setup);
            ch = daemon.channel().await;
            assert!(
                wait_serving(&ch, 400).await,
                "restarted vallumd never became SERVING"
            );
            c = Clients::new(ch.clone());
            before = snapshot(&c).await;
            continue;
        }
        if outcome.is_none() {
            // Stalled: wait until it serves again, take the state as it is now.
            if !wait_serving(&ch, 2400).await {
                record("not serving", "after a stall".into(), &mut findings);
                break;
            }
            before = snapshot(&c).await;
            continue;
        }
        if !serving {
            let h = health(ch.clone()).await;
            record(
                "not serving",
                format!("health answered {h:?}"),
                &mut findings,
            );
            if !wait_serving(&ch, 400).await {
                break;
            }
        }
        // Memory bounded?
        if let Some((_rss, hwm)) = memory_kib(daemon.pid()) {
            if hwm > max_rss_kib && peak_hwm <= max_rss_kib {
                record(
                    "memory",
                    format!("VmHWM {} MiB > {} MiB", hwm / 1024, max_rss_kib / 1024),
                    &mut findings,
                );
            }
            peak_hwm = peak_hwm.max(hwm);
        }
        // Wrong outcomes: a status that says "bug" (or an unbounded or raw message), an
        // acceptance of what must be refused.
        let wrong: Option<String> = match &outcome {
            Some(Err(e)) => {
                let m = e.message();
                if matches!(e.code(), Code::Internal | Code::Unknown | Code::DataLoss) {
                    Some(format!(
                        "{:?}: {}",
                        e.code(),
                        m.chars().take(32).collect::<String>()
                    ))
                } else if over_limit && e.code() != Code::ResourceExhausted {
                    Some(format!("over the size limit but {:?}", e.code()))
                } else if e.code() == Code::ResourceExhausted && support::reason(e).is_empty() {
                    Some(format!(
                        "ResourceExhausted without a reason: {}",
                        m.chars().take(32).collect::<String>()
                    ))
                } else if m.len() > 4096 {
                    Some(format!("{:?} with a message over 4 KiB", e.code()))
                } else if m.contains('\0') {
                    Some(format!("{:?} with a NUL byte in its message", e.code()))
                } else {
                    None
                }
            }
            Some(Ok(())) if over_limit => {
                Some("a request over --max-request-bytes was accepted".into())
            }
            Some(Ok(())) => must_refuse(&kept, &before).map(|why| format!("accepted, but {why}")),
            None => None,
        };
        if let Some(class) = wrong {
            let detail = match &outcome {
                Some(Err(e)) => format!(
                    "{class} ({:?}: {})",
                    e.code(),
                    e.message().chars().take(160).collect::<String>()
                ),
                _ => class.clone(),
            };
            // One class per RPC (all raw requests together) and kind of answer.
            let seen = wrong_seen.entry((rpc.to_string(), class)).or_default();
            *seen += 1;
            if *seen <= 2 {
                record("wrong outcome", detail, &mut findings);
            }
        }
        // State unchanged unless a mutation succeeded? Checked after every mutating RPC and
        // every 5th read-only one (a snapshot costs more than most requests).
        let changed = matches!(outcome, Some(Ok(()))) && may_change;
        if !is_write && index % 5 != 0 {
            continue;
        }
        let t0 = Instant::now();
        let after = snapshot(&c).await;
        t_check += t0.elapsed();
        if !changed && let Some(d) = first_diff(&before, &after) {
            let what = match &outcome {
                Some(Err(e)) => format!("refused with {:?} but changed the state", e.code()),
                _ => "a read-only or validate_only request changed the state".into(),
            };
            record("state changed", format!("{what}:\n{d}"), &mut findings);
        }
        before = after;
    }

    let elapsed = started.elapsed().as_secs_f64();
    let mut per_rpc = String::new();
    for (rpc, t) in &tallies {
        let errs: u64 = t.err.values().sum();
        let _ = write!(per_rpc, "{rpc} {}/{errs}", t.ok);
        if !t.err.is_empty() {
            let codes: Vec<String> = t.err.iter().map(|(c, n)| format!("{c}:{n}")).collect();
            let _ = write!(per_rpc, " [{}]", codes.join(" "));
        }
        per_rpc.push_str(", ");
    }
    let count = |k: &str| findings.iter().filter(|f| f.kind == k).count();
    let wrong_total: u64 = wrong_seen.values().sum();
    println!(
        "grpc fuzz: {n} requests in {elapsed:.1} s (ok/err per RPC: {per_rpc}), {} crashes, {} stalls, {} not serving, {} state changes, {} memory, {wrong_total} wrong outcomes, peak VmHWM {} MiB, seed {seed} ({:.1} s in requests, {:.1} s comparing state)",
        count("crash"),
        count("stall"),
        count("not serving"),
        count("state changed"),
        count("memory"),
        peak_hwm / 1024,
        t_send.as_secs_f64(),
        t_check.as_secs_f64(),
    );
    for f in &findings {
        println!(
            "  {} at request {} ({}): {}\n    request: {}\n    saved: {:?}\n    replay: VALLUM_FUZZ_SEED={seed} VALLUM_FUZZ_REQUESTS={}",
            f.kind,
            f.index,
            f.rpc,
            f.detail,
            f.request,
            f.saved,
            f.index + 1
        );
    }
    if !wrong_seen.is_empty() {
        println!("wrong outcomes by RPC and answer:");
        for ((rpc, answer), count) in &wrong_seen {
            println!("  {count:5} {rpc}: {answer}");
        }
    }
    let fatal: Vec<&Finding> = findings
        .iter()
        .filter(|f| strict || f.kind != "wrong outcome")
        .collect();
    assert!(
        fatal.is_empty(),
        "grpc fuzz found {} defects (seed {seed}); see above",
        fatal.len()
    );
    for rpc in &only {
        assert!(
            tallies.contains_key(rpc) || n < only.len() as u64,
            "{rpc} was never called in {n} requests"
        );
    }
}

/// Writes the whole request (Debug form) under `dir`; the path, when it could be written.
fn save(dir: &Path, seed: u64, index: u64, req: &Req) -> Option<PathBuf> {
    std::fs::create_dir_all(dir).ok()?;
    let p = dir.join(format!("seed{seed}-req{index}-{}.txt", req.name()));
    std::fs::write(&p, format!("{req:#?}\n")).ok()?;
    Some(p)
}
