//! `-m addrtype` through a real `vallumd`: the node's addresses from `--local-addresses`, or
//! read from the host's local routing table (rtnetlink) without it; traced verdicts follow
//! them; IPv4 ANYCAST applies (the local table's type), IPv6 ANYCAST, which needs a lookup in
//! the whole routing table, is refused by Apply with the type named.

use crate::support;

use support::{Daemon, reason, text_source};
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;

/// ufw's `ufw-not-local` chain, a broadcast skip and an address of eth0 only.
const UFW: &str = "*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ufw-not-local - [0:0]
-A INPUT -m addrtype --dst-type BROADCAST -j ACCEPT
-A INPUT -p tcp --dport 22 -m addrtype --dst-type LOCAL --limit-iface-in -j ACCEPT
-A INPUT -j ufw-not-local
-A ufw-not-local -m addrtype --dst-type LOCAL -j RETURN
-A ufw-not-local -m addrtype --dst-type MULTICAST -j RETURN
-A ufw-not-local -j DROP
-A INPUT -p tcp --dport 80 -j ACCEPT
COMMIT
";

fn apply(text: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: "ufw".into(),
        source: Some(text_source(text, false, "ufw.rules")),
        ..Default::default()
    }
}

fn packet(dst: &str, dport: u32, iface: &str) -> pb::PacketSpec {
    pb::PacketSpec {
        source: "192.0.2.1".into(),
        destination: dst.into(),
        protocol: "tcp".into(),
        source_port: 40000,
        destination_port: dport,
        tcp_flags: "S".into(),
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
async fn addrtype_follows_the_given_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &[
            "--local-addresses",
            "10.0.0.5@eth0,broadcast:10.0.0.255@eth0,127.0.0.0/8@lo",
        ],
    );
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    rs.apply(apply(UFW)).await.expect("ufw rules apply");
    for (dst, port, iface, want) in [
        ("10.0.0.255", 9, "eth0", "ACCEPT"),
        ("10.0.0.5", 22, "eth0", "ACCEPT"),
        // Local, but not an address of eth1: ssh is not let in, web is.
        ("10.0.0.5", 22, "eth1", "DROP"),
        ("10.0.0.5", 80, "eth1", "ACCEPT"),
        // Not local: ufw-not-local drops it.
        ("10.0.0.6", 80, "eth0", "DROP"),
        ("224.0.0.251", 80, "eth0", "ACCEPT"),
    ] {
        assert_eq!(
            verdict(&d, packet(dst, port, iface)).await,
            want,
            "{dst}:{port} on {iface}"
        );
    }

    // IPv4 ANYCAST is the local table's (Shorewall's Broadcast action drops it): applied;
    // no anycast route here, so the verdicts stay.
    rs.apply(apply(
        &UFW.replace("--dst-type MULTICAST", "--dst-type MULTICAST,ANYCAST"),
    ))
    .await
    .expect("IPv4 ANYCAST applies");
    assert_eq!(verdict(&d, packet("10.0.0.6", 80, "eth0")).await, "DROP");
    // IPv6 ANYCAST needs a lookup in the whole routing table: refused, naming it.
    let v6 = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
              -A INPUT -m addrtype --dst-type ANYCAST -j DROP\nCOMMIT\n";
    let e = rs
        .apply(pb::ApplyRequest {
            ruleset: "ufw6".into(),
            source: Some(text_source(v6, true, "ufw6.rules")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "UNSUPPORTED_EXTENSION", "{e:?}");
    let described: Vec<String> = e
        .get_error_details()
        .bad_request()
        .map(|b| {
            b.field_violations
                .iter()
                .map(|v| v.description.clone())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        described
            .iter()
            .any(|d| d.starts_with("ufw6.rules:5:") && d.contains("addrtype ANYCAST")),
        "{described:?}"
    );
}

#[tokio::test]
async fn addrtype_reads_the_hosts_addresses() {
    #[cfg(target_os = "linux")]
    if let Err(e) = vallum_server::host::local_addrs::read_host() {
        panic!("rtnetlink: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    d.rulesets()
        .await
        .apply(apply(UFW))
        .await
        .expect("ufw rules apply");
    // Every Linux host has loopback's local 127.0.0.0/8; TEST-NET-2 is no host's address.
    assert_eq!(verdict(&d, packet("127.0.0.1", 80, "lo")).await, "ACCEPT");
    assert_eq!(verdict(&d, packet("198.51.100.77", 80, "lo")).await, "DROP");
}
