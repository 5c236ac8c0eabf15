//! TraceService: `trace` (the verdict and rule path of one packet), `replay` (a capture
//! against the active rulesets and, optionally, a staged revision) and `monitor` (packet
//! events as they happen).

use std::path::PathBuf;

use tokio_stream::StreamExt;
use vallum_proto::v1::trace_service_client::TraceServiceClient;
use vallum_proto::v1::{
    self as pb, PacketSpec, ReplayCaptureRequest, TracePacketRequest, WatchPacketEventsRequest,
};

use crate::args::revision_arg;
use crate::connect::Svc;
use crate::error::CliError;
use crate::output::{Output, print, write_stdout};
use crate::view;

/// The client type.
pub type Client = TraceServiceClient<Svc>;

/// Flags of `trace`: the packet.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Source address.
    #[arg(long)]
    pub src: String,
    /// Destination address.
    #[arg(long)]
    pub dst: String,
    /// Protocol name or number.
    #[arg(long, default_value = "tcp")]
    pub proto: String,
    /// Source port.
    #[arg(long, default_value_t = 0)]
    pub sport: u16,
    /// Destination port.
    #[arg(long, default_value_t = 0)]
    pub dport: u16,
    /// TCP flags, letters of FSRPAU (e.g. S for a SYN).
    #[arg(long, default_value = "")]
    pub flags: String,
    /// Hook (any case).
    #[arg(long, value_enum, ignore_case = true, default_value = "input")]
    pub hook: HookArg,
    /// Input interface.
    #[arg(long = "in", default_value = "")]
    pub in_interface: String,
    /// Output interface.
    #[arg(long = "out", default_value = "")]
    pub out_interface: String,
    /// Layer-3 length, bytes.
    #[arg(long, default_value_t = 60)]
    pub length: u32,
    /// Conntrack state: NEW, ESTABLISHED, RELATED, INVALID, UNTRACKED; an empty value
    /// (`--ct-state ''`) looks the packet up in the connection table instead.
    #[arg(long, default_value = "NEW")]
    pub ct_state: String,
    /// Packet mark.
    #[arg(long, default_value_t = 0)]
    pub mark: u32,
    /// Ethernet source address (aa:bb:cc:dd:ee:ff), what `-m mac --mac-source` compares;
    /// without it the packet has no link-layer source and no `-m mac` rule matches.
    #[arg(long, default_value = "")]
    pub mac_source: String,
    /// For a bridged packet: the bridge port it came in on (`-m physdev --physdev-in`; `--in`
    /// is then the bridge). Without it and `--physdev-out` the packet is not bridged.
    #[arg(long, default_value = "")]
    pub physdev_in: String,
    /// For a bridged packet: the bridge port it goes out of (`--physdev-out`,
    /// `--physdev-is-bridged`).
    #[arg(long, default_value = "")]
    pub physdev_out: String,
    /// ICMP type.
    #[arg(long, default_value_t = 0)]
    pub icmp_type: u32,
    /// ICMP code.
    #[arg(long, default_value_t = 0)]
    pub icmp_code: u32,
    /// Evaluate against this staged revision instead of the active rulesets.
    #[arg(long, value_parser = revision_arg)]
    pub revision: Option<String>,
}

/// A netfilter hook on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HookArg {
    /// Before routing.
    Prerouting,
    /// For a local address.
    Input,
    /// Routed.
    Forward,
    /// Locally generated.
    Output,
    /// Leaving.
    Postrouting,
}

impl HookArg {
    /// The proto hook.
    pub fn to_pb(self) -> pb::Hook {
        match self {
            HookArg::Prerouting => pb::Hook::Prerouting,
            HookArg::Input => pb::Hook::Input,
            HookArg::Forward => pb::Hook::Forward,
            HookArg::Output => pb::Hook::Output,
            HookArg::Postrouting => pb::Hook::Postrouting,
        }
    }
}

/// A packet event kind on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    /// `-j LOG` hits.
    Log,
    /// Sampled dropped packets.
    Drop,
    /// Sampled packets the running shadow would decide differently (`vallumctl shadow`).
    Shadow,
}

/// Flags of `replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Capture file (pcap or pcapng).
    pub pcap: PathBuf,
    /// Staged revision to compare with the active rulesets.
    #[arg(long, value_parser = revision_arg)]
    pub revision: Option<String>,
    /// Hook to classify at (any case; default input).
    #[arg(long, value_enum, ignore_case = true)]
    pub hook: Option<HookArg>,
    /// Input interface name.
    #[arg(long = "in")]
    pub in_interface: Option<String>,
    /// Most changed flows to list.
    #[arg(long, default_value_t = 100)]
    pub max_flows: u32,
}

/// Runs `trace`.
pub async fn trace(c: &mut Client, out: Output, t: &TraceArgs) -> Result<(), CliError> {
    let revision = t.revision.clone().unwrap_or_default();
    let family = if t.src.contains(':') || t.dst.contains(':') {
        pb::Family::Ipv6
    } else {
        pb::Family::Ipv4
    };
    let r = c
        .trace_packet(TracePacketRequest {
            packet: Some(PacketSpec {
                family: family as i32,
                hook: t.hook.to_pb() as i32,
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
                physdev_in: t.physdev_in.clone(),
                physdev_out: t.physdev_out.clone(),
            }),
            revision,
            frame: Vec::new(),
            raw_ip: false,
        })
        .await?
        .into_inner();
    print(out, view::trace_json(&r), || view::trace_text(&r))
}

/// Runs `replay`.
pub async fn replay(c: &mut Client, out: Output, a: &ReplayArgs) -> Result<(), CliError> {
    let capture = std::fs::read(&a.pcap).map_err(|source| CliError::Read {
        path: a.pcap.clone(),
        source,
    })?;
    let r = c
        .replay_capture(ReplayCaptureRequest {
            capture,
            revision: a.revision.clone().unwrap_or_default(),
            hook: a.hook.map_or(pb::Hook::Unspecified, HookArg::to_pb) as i32,
            in_interface: a.in_interface.clone().unwrap_or_default(),
            max_flows: a.max_flows,
        })
        .await?
        .into_inner();
    print(out, view::replay_json(&r), || view::replay_text(&r))
}

/// Flags of `monitor`: the filters.
#[derive(Debug, clap::Args)]
pub struct MonitorArgs {
    /// Only this ruleset's LOG hits.
    #[arg(long)]
    pub ruleset: Option<String>,
    /// Only LOG hits of rules in this chain.
    #[arg(long)]
    pub chain: Option<String>,
    /// Only this kind (any case).
    #[arg(
        long,
        value_name = "KIND",
        value_enum,
        ignore_case = true,
        alias = "kind"
    )]
    pub verdict: Option<KindArg>,
    /// Only packets from or to this address or prefix (ADDR[/LEN]).
    #[arg(long, value_name = "ADDR[/LEN]")]
    pub address: Option<String>,
    /// Also sample one in N dropped packets (no LOG rule needed).
    #[arg(long, value_name = "N")]
    pub sample_drops: Option<u32>,
}

/// `monitor`: prints each packet event, one line (text) or one JSON object a line.
pub async fn monitor(c: &mut Client, out: Output, a: &MonitorArgs) -> Result<(), CliError> {
    let mut stream = c
        .watch_packet_events(WatchPacketEventsRequest {
            ruleset: a.ruleset.clone().unwrap_or_default(),
            chain: a.chain.clone().unwrap_or_default(),
            kind: match a.verdict {
                None => pb::PacketEventKind::Unspecified,
                Some(KindArg::Log) => pb::PacketEventKind::Log,
                Some(KindArg::Drop) => pb::PacketEventKind::Drop,
                Some(KindArg::Shadow) => pb::PacketEventKind::Shadow,
            } as i32,
            address: a.address.clone().unwrap_or_default(),
            sample_drops_one_in: a.sample_drops.unwrap_or(0),
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
    Ok(())
}
