//! `-m rpfilter` and `-m pkttype` through a real `vallumd`: the routing view from `--routes`
//! (refused without one when the addresses are given by flag), traced verdicts that follow
//! it; pkttype against the given broadcast addresses.

use crate::support;

use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const RULES: &str = "*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -m rpfilter --invert -j DROP
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m pkttype --pkt-type broadcast -j DROP
COMMIT
";

fn apply(text: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: "rpf".into(),
        source: Some(text_source(text, false, "rpf.rules")),
        ..Default::default()
    }
}

fn packet(src: &str, dst: &str, iface: &str) -> pb::PacketSpec {
    pb::PacketSpec {
        source: src.into(),
        destination: dst.into(),
        protocol: "udp".into(),
        source_port: 40000,
        destination_port: 53,
        in_interface: iface.into(),
        ..Default::default()
    }
}

async fn verdict(d: &Daemon, p: pb::PacketSpec) -> String {
    pb::trace_service_client::TraceServiceClient::new(d.channel().await)
        .trace_packet(pb::TracePacketRequest {
            packet: Some(p),
            ..Default::default()
        })
        .await
        .expect("trace")
        .into_inner()
        .verdict()
        .as_str_name()
        .trim_start_matches("VERDICT_")
        .to_string()
}

#[tokio::test]
async fn rpfilter_follows_the_given_routes() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &[
            "--local-addresses",
            "10.0.0.5@eth0,broadcast:10.0.0.255@eth0",
            "--routes",
            "0.0.0.0/0@eth0,192.168.1.0/24@eth1,local:10.0.0.5@eth0",
        ],
    );
    d.wait_serving().await;
    d.rulesets().await.apply(apply(RULES)).await.expect("apply");
    for (src, dst, iface, want) in [
        ("8.8.8.8", "10.0.0.5", "eth0", "ACCEPT"),
        // Spoofed: 8.8.8.8 routes out of eth0.
        ("8.8.8.8", "10.0.0.5", "eth1", "DROP"),
        ("192.168.1.7", "10.0.0.5", "eth1", "ACCEPT"),
        // Our own address as the source.
        ("10.0.0.5", "10.0.0.5", "eth0", "DROP"),
        ("10.0.0.5", "10.0.0.5", "lo", "ACCEPT"),
        // A valid source to the subnet broadcast: pkttype broadcast.
        ("8.8.8.8", "10.0.0.255", "eth0", "DROP"),
    ] {
        assert_eq!(
            verdict(&d, packet(src, dst, iface)).await,
            want,
            "{src} -> {dst} on {iface}"
        );
    }
}

#[tokio::test]
async fn rpfilter_without_a_routing_view_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--local-addresses", "10.0.0.5@eth0"],
    );
    d.wait_serving().await;
    let e = d.rulesets().await.apply(apply(RULES)).await.unwrap_err();
    assert!(
        format!("{e:?}").contains("--routes") && format!("{e:?}").contains("rpf.rules:4:"),
        "{e:?}"
    );
}
