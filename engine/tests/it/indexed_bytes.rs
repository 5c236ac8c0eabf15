//! `-m string` and `-m connlimit` decide alike in the linear walk, the TupleMerge index
//! (per-packet lookups and batched probes) and RFC tables: their rules go to the evaluator
//! (their observer has the packet's bytes and the connection table), never to the probe's
//! silent observer. One chain of 40 rules with both among filler rules; the same packets,
//! with their bytes, through each snapshot with its own connection table.

use std::sync::Arc;

use etherparse::PacketBuilder;
use vallum_engine::conntrack::{Conntrack, ConntrackConfig, Tracker};
use vallum_engine::model::Hook;
use vallum_engine::packet::parse::parse_ip;
use vallum_engine::packet::{Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, RFC_MAX_RULES, Snapshot, Verdict};

fn rules() -> String {
    let mut t =
        String::from("*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for i in 0..18 {
        t.push_str(&format!(
            "-A INPUT -s 10.{i}.0.0/16 -p tcp -m tcp --dport {} -j DROP\n",
            1000 + i
        ));
    }
    t.push_str("-A INPUT -p tcp -m tcp --dport 80 -m string --string \"evil\" --algo bm --to 200 -j DROP\n");
    t.push_str("-A INPUT -p tcp -m tcp --dport 22 --tcp-flags FIN,SYN,RST,ACK SYN -m connlimit --connlimit-above 2 --connlimit-mask 24 --connlimit-saddr -j REJECT --reject-with tcp-reset\n");
    for i in 0..18 {
        t.push_str(&format!(
            "-A INPUT -d 192.0.{i}.0/24 -p udp -m udp --dport {} -j DROP\n",
            2000 + i
        ));
    }
    t.push_str("-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp -m tcp --dport 80 -j ACCEPT\nCOMMIT\n");
    t
}

/// (bytes, packet) for a TCP SYN from `src:sport` to port `dport` with `payload`.
fn syn(src: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv4(src, [192, 0, 2, 1], 64)
        .tcp(sport, dport, 1, 65535)
        .syn()
        .write(&mut out, payload)
        .expect("builds");
    out
}

fn packets() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for i in 0..5u16 {
        v.push(syn([198, 51, 100, 7 + i as u8], 40000 + i, 22, b""));
        v.push(syn([198, 51, 100, 7], 41000 + i, 80, b"GET /evil HTTP/1.1"));
        v.push(syn([198, 51, 100, 7], 42000 + i, 80, b"GET /good HTTP/1.1"));
        v.push(syn([10, i as u8, 0, 1], 43000 + i, 1000 + i, b""));
    }
    v
}

fn run(snap: &Snapshot, bytes: &[Vec<u8>], batched: bool) -> Vec<Verdict> {
    let ct = Conntrack::new(ConntrackConfig::default()).expect("table");
    let base = Packet::from(PacketMeta {
        hook: Hook::Input,
        ..PacketMeta::default()
    });
    let parsed: Vec<Packet> = bytes
        .iter()
        .map(|b| parse_ip(b, base).expect("parses"))
        .collect();
    let mut metas: Vec<PacketMeta> = parsed.iter().map(|p| p.meta).collect();
    let mut facts: Vec<PacketFacts> = parsed.iter().map(|p| p.facts).collect();
    let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    let mut verdicts = vec![Verdict::Accept; metas.len()];
    // The engine's own tracker: a new entry joins the table only when its packet is accepted.
    let mut track = Tracker::new(&ct);
    if batched {
        snap.classify_batch(
            0,
            &mut metas,
            &mut facts,
            &mut verdicts,
            1,
            &mut Vec::new(),
            &slices,
            &mut track,
        );
    } else {
        for i in 0..metas.len() {
            snap.classify_batch(
                0,
                &mut metas[i..=i],
                &mut facts[i..=i],
                &mut verdicts[i..=i],
                1,
                &mut Vec::new(),
                &slices[i..=i],
                &mut track,
            );
        }
    }
    verdicts
}

#[test]
fn string_and_connlimit_decide_alike_in_every_classifier() {
    let rs = Arc::new(parse_ruleset("x", &rules(), &ParseOptions::default()).expect("parses"));
    let bytes = packets();
    let linear = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, Classifier::Linear)
        .expect("linear");
    let want = run(&linear, &bytes, false);
    // The string rule dropped the evil requests, connlimit refused the third /24 SYN on.
    let drops = want.iter().filter(|v| **v == Verdict::Drop).count();
    let rejects = want
        .iter()
        .filter(|v| matches!(v, Verdict::Reject(_)))
        .count();
    assert_eq!((drops, rejects), (5 + 5, 3), "{want:?}");
    for rfc_max_rules in [0, RFC_MAX_RULES] {
        let c = Classifier::TupleMerge {
            min_rules: 0,
            batch_min_bytes: 0,
            rfc_min_rules: 0,
            rfc_max_rules,
        };
        for batched in [false, true] {
            // A fresh snapshot each time: its connlimit lists live as long as it does.
            let indexed =
                Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, c).expect("indexed");
            if rfc_max_rules > 0 {
                assert!(indexed.memory_bytes().rfc_chains > 0, "no RFC tables built");
            }
            assert_eq!(
                run(&indexed, &bytes, batched),
                want,
                "rfc {rfc_max_rules} batched {batched}"
            );
        }
    }
}
