//! `TraceService.TracePacket` says when it was a dry run for `-m limit`: a trace asks the
//! bucket without taking a token, so two traces of a 1-packet burst both match where the
//! packet path would limit the second; the response's `notes` says so, and is empty for a path
//! that asked no limit.

use crate::support;

use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const LIMITED: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    -A INPUT -p udp -m limit --limit 1/hour --limit-burst 1 -j ACCEPT\n\
    -A INPUT -p udp -j DROP\nCOMMIT\n";

#[tokio::test]
async fn trace_notes_a_limit_dry_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("v.db"), &["--source", "none"]);
    d.wait_serving().await;
    d.rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: "lim".into(),
            source: Some(text_source(LIMITED, false, "lim.rules")),
            ..Default::default()
        })
        .await
        .expect("apply");
    let mut tr = pb::trace_service_client::TraceServiceClient::new(d.channel().await);
    let spec = |protocol: &str| pb::PacketSpec {
        source: "198.51.100.7".into(),
        destination: "192.0.2.10".into(),
        protocol: protocol.into(),
        source_port: 40000,
        destination_port: 53,
        ..Default::default()
    };
    for _ in 0..2 {
        let t = tr
            .trace_packet(pb::TracePacketRequest {
                packet: Some(spec("udp")),
                ..Default::default()
            })
            .await
            .expect("trace")
            .into_inner();
        // Both match the limit rule: the trace took no token.
        assert_eq!(t.verdict(), pb::Verdict::Accept, "{t:#?}");
        assert_eq!(t.steps.len(), 1, "{t:#?}");
        assert_eq!(t.notes.len(), 1, "{t:#?}");
        assert!(t.notes[0].starts_with("dry run for -m limit"), "{t:#?}");
    }
    let t = tr
        .trace_packet(pb::TracePacketRequest {
            packet: Some(spec("tcp")),
            ..Default::default()
        })
        .await
        .expect("trace")
        .into_inner();
    assert!(t.notes.is_empty(), "no limit on this path: {t:#?}");
}
