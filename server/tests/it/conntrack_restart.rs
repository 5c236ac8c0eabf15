//! The connection table across a vallumd restart (`conntrack_state`), in strict mode
//! (`--conntrack-tcp-loose false`, where nothing picks a flow up mid-stream): a TCP handshake
//! replayed from a capture makes an ESTABLISHED entry; after a graceful stop (SIGTERM) the next
//! vallumd, on the same database, has the entry ESTABLISHED and a mid-stream ACK of the flow is
//! ESTABLISHED and accepted (TracePacket looks it up in the table); after a kill -9 nothing is
//! saved, so the next start has an empty table and the same packet is INVALID and dropped.

use crate::support;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use support::{Daemon, poll, text_source};
use vallum_proto::v1 as pb;
use vallum_proto::v1::conntrack_service_client::ConntrackServiceClient;
use vallum_proto::v1::trace_service_client::TraceServiceClient;

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const SPORT: u16 = 40000;

/// Established and related in; new connections only by SYN to port 22.
const STRICT: &str = "*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -p tcp -m tcp --dport 22 --tcp-flags FIN,SYN,RST,ACK SYN -j ACCEPT
COMMIT
";

fn csum(b: &[u8]) -> u16 {
    let mut s: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An Ethernet + IPv4 + TCP frame with `flags` (no payload), checksums right.
fn frame(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut tcp = Vec::with_capacity(20);
    tcp.extend_from_slice(&sport.to_be_bytes());
    tcp.extend_from_slice(&dport.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    pseudo.extend_from_slice(&tcp);
    let c = csum(&pseudo);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 40, 0, 1, 0, 0, 64, 6, 0, 0];
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0];
    f.extend_from_slice(&ip);
    f.extend_from_slice(&tcp);
    f
}

/// A pcap (Ethernet) of the client's SYN, the server's SYN-ACK and the client's ACK.
fn handshake_pcap(path: &Path) {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    let mut out = Vec::new();
    for w in [
        0xa1b2_c3d4u32.to_le_bytes().as_slice(),
        &2u16.to_le_bytes(),
        &4u16.to_le_bytes(),
    ] {
        out.extend_from_slice(w);
    }
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in [
        frame(CLIENT, SERVER, SPORT, 22, SYN),
        frame(SERVER, CLIENT, 22, SPORT, SYN | ACK),
        frame(CLIENT, SERVER, SPORT, 22, ACK),
    ]
    .iter()
    .enumerate()
    {
        let len = u32::try_from(f.len()).unwrap();
        for w in [1_800_000_000u32, i as u32, len, len] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(f);
    }
    std::fs::write(path, out).unwrap();
}

/// The ESTABLISHED entries of the flow to port 22.
async fn established(d: &Daemon) -> usize {
    let mut ct = ConntrackServiceClient::new(d.channel().await);
    ct.list(pb::ListConntrackRequest {
        filter: Some(pb::ConntrackFilter {
            protocol: "tcp".into(),
            destination_port: 22,
            state: "ESTABLISHED".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("list")
    .into_inner()
    .entries
    .len()
}

/// (ct_state, verdict) of a mid-stream ACK|PSH of the flow, looked up in the table.
async fn mid_stream(d: &Daemon) -> (String, String) {
    let r = TraceServiceClient::new(d.channel().await)
        .trace_packet(pb::TracePacketRequest {
            packet: Some(pb::PacketSpec {
                family: pb::Family::Ipv4 as i32,
                hook: pb::Hook::Input as i32,
                source: CLIENT.to_string(),
                destination: SERVER.to_string(),
                protocol: "tcp".into(),
                source_port: u32::from(SPORT),
                destination_port: 22,
                tcp_flags: "PA".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("trace")
        .into_inner();
    let verdict = r
        .verdict()
        .as_str_name()
        .trim_start_matches("VERDICT_")
        .to_string();
    (r.ct_state, verdict)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn established_flows_survive_a_graceful_restart_in_strict_mode() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let pcap = dir.path().join("handshake.pcap");
    handshake_pcap(&pcap);
    let strict = ["--conntrack-tcp-loose", "false"];
    let source = format!("pcap:{}", pcap.display());

    let mut first = Daemon::start(
        &db,
        &[&strict[..], &["--source", &source, "--rate", "30"]].concat(),
    );
    first.wait_serving().await;
    first
        .rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: "host".into(),
            source: Some(text_source(STRICT, false, "host.rules")),
            ..Default::default()
        })
        .await
        .expect("apply");
    poll(
        "the replayed handshake is ESTABLISHED",
        200,
        Duration::from_millis(50),
        || async { (established(&first).await == 1).then_some(()) },
    )
    .await;
    assert!(first.terminate(), "a graceful stop exits 0");
    assert!(
        support::conntrack_state_file(&db).exists(),
        "the table was saved on the way out"
    );

    // No packet source now: only the restored table can know the flow.
    let mut second = Daemon::start(&db, &strict);
    second.wait_serving().await;
    assert_eq!(established(&second).await, 1, "restored ESTABLISHED");
    assert_eq!(
        mid_stream(&second).await,
        ("ESTABLISHED".to_owned(), "ACCEPT".to_owned()),
        "a mid-stream packet after the restart"
    );

    // kill -9 saves nothing (and the file was consumed at start): the table starts empty.
    second.kill9();
    let third = Daemon::start(&db, &strict);
    third.wait_serving().await;
    assert_eq!(established(&third).await, 0);
    assert_eq!(
        mid_stream(&third).await,
        ("INVALID".to_owned(), "DROP".to_owned()),
        "strict mode, no entry: INVALID"
    );
}
