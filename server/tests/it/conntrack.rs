//! End-to-end tests of the connection table against real `vallumd` processes: a stateful
//! ruleset and a replayed real capture (`../shared/data/pcap/tcpreplay-test.pcap`: the test is
//! ignored unless asked for, and fails when it is absent) fill the table; ConntrackService lists with filters, deletes
//! exactly the matching entries and flushes; `/metrics` agrees with the list; `vallumctl
//! conntrack` prints `conntrack -L` lines and JSON; with `--conntrack-max 0` every call is
//! FAILED_PRECONDITION and no conntrack metric is exported.
//!
//! The capture is replayed in a loop, so the table is read once it is steady (every core has
//! replayed the whole capture twice, and one more loop moved nothing): within the test's few seconds no
//! entry expires (the shortest timeout is 10 s for a TCP CLOSE entry, refreshed each loop), so a
//! steady table changes only through the calls the test makes, until the replay re-creates what
//! they deleted.

use crate::support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use support::{Daemon, reason, shared_data, text_source};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;
use vallum_proto::v1::conntrack_service_client::ConntrackServiceClient;

/// Stateful INPUT policy: established/related in, invalid out, new TCP/UDP/ICMP in.
const STATEFUL: &str = "*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A INPUT -p tcp --syn -j ACCEPT
-A INPUT -p udp -j ACCEPT
-A INPUT -p icmp -j ACCEPT
COMMIT
";

async fn scrape(addr: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: vallumd\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// The value of the unlabelled sample `name` in a text exposition.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, v) = l.rsplit_once(' ')?;
        let series_name = series.split('{').next()?;
        (series_name == name).then(|| v.parse().ok())?
    })
}

type Key = (i32, u32, String, String, u32, u32, u32);

/// An entry's identity: family, protocol and original tuple.
fn key(e: &pb::ConntrackEntry) -> Key {
    let o = e.original.clone().unwrap_or_default();
    (
        e.family,
        e.protocol,
        o.source,
        o.destination,
        o.source_port,
        o.destination_port,
        o.icmp_type,
    )
}

async fn list(c: &mut ConntrackServiceClient<Channel>, f: pb::ConntrackFilter) -> Vec<Key> {
    let r = c
        .list(pb::ListConntrackRequest {
            filter: Some(f),
            page_size: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.matched, r.entries.len() as u64, "under the default limit");
    r.entries.iter().map(key).collect()
}

async fn stats(c: &mut ConntrackServiceClient<Channel>) -> pb::ConntrackStats {
    c.get_stats(pb::GetConntrackStatsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Packets each core has classified.
async fn core_packets(d: &Daemon) -> Vec<u64> {
    let mut e = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let st = e
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    st.cores.iter().map(|c| c.packets).collect()
}

/// Waits until every core has replayed the whole capture (`loop_packets` packets) `loops` more
/// times than when called.
async fn replayed(d: &Daemon, loop_packets: u64, loops: u64) {
    let start = core_packets(d).await;
    for _ in 0..1200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = core_packets(d).await;
        if now
            .iter()
            .zip(&start)
            .all(|(n, s)| *n >= s + loops * loop_packets)
        {
            return;
        }
    }
    panic!("the replay did not advance {loops} loops of {loop_packets} packets in 120 s");
}

/// A steady table: measured by replay progress, not by wall-clock time (a loaded machine may
/// stall the replay for seconds). After two whole loops of the capture on every core since
/// the call, every flow of the capture has its entry (a flow whose first packets a core's
/// starting offset skipped is opened in its second loop); the table is steady once one more
/// whole loop leaves the entry count and the entries created unchanged.
async fn steady(
    c: &mut ConntrackServiceClient<Channel>,
    d: &Daemon,
    loop_packets: u64,
) -> pb::ConntrackStats {
    replayed(d, loop_packets, 2).await;
    let mut last = stats(c).await;
    for _ in 0..20 {
        replayed(d, loop_packets, 1).await;
        let s = stats(c).await;
        if (s.entries, s.new_total) == (last.entries, last.new_total) && s.entries > 0 {
            return s;
        }
        last = s;
    }
    panic!("the table never became steady: {last:?}");
}

fn vallumctl(addr: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(support::vallumctl())
        .args(["--server", &format!("http://{addr}")])
        .args(args)
        .env_remove("VALLUM_SERVER")
        .env_remove("VALLUM_TOKEN")
        .env_remove("VALLUM_OUTPUT")
        .output()
        .expect("run vallumctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs ../shared/data"]
async fn list_filter_delete_flush_and_metrics() {
    let Some(data) = shared_data() else {
        panic!("conntrack e2e: ../shared/data not found");
    };
    let pcap = data.join("pcap/tcpreplay-test.pcap");
    if !pcap.is_file() {
        panic!("conntrack e2e: {} not found", pcap.display());
    }
    // Packets of the capture the pcap source replays (those that parse as IP).
    let loop_packets = vallum_engine::packet::pcap::read_capture(&std::fs::read(&pcap).unwrap())
        .unwrap()
        .iter()
        .filter(|p| p.parse(vallum_server::host::sources::base_packet()).is_ok())
        .count() as u64;
    let dir = tempfile::tempdir().unwrap();
    let source = format!("pcap:{}", pcap.display());
    let d = Daemon::start(&dir.path().join("v.db"), &["--source", &source]);
    d.wait_serving().await;
    d.rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: "host".into(),
            source: Some(text_source(STATEFUL, false, "host.rules")),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut c = ConntrackServiceClient::new(d.channel().await);

    // A steady table: List, GetStats and /metrics agree.
    let st = steady(&mut c, &d, loop_packets).await;
    let all = list(&mut c, pb::ConntrackFilter::default()).await;
    println!("steady table: {st:?}");
    assert_eq!(all.len() as u64, st.entries, "{st:?}");
    assert!(all.len() >= 10, "{all:?}");
    assert_eq!((st.max_entries, st.buckets), (262_144, 65_536));
    assert_eq!((st.early_drops, st.insert_failed), (0, 0));
    let body = scrape(&d.metrics_addr).await;
    assert_eq!(
        sample(&body, "vallum_conntrack_entries"),
        Some(st.entries as f64)
    );
    assert_eq!(sample(&body, "vallum_conntrack_max"), Some(262_144.0));
    assert_eq!(
        sample(&body, "vallum_conntrack_new_total"),
        Some(st.new_total as f64)
    );
    assert_eq!(
        sample(&body, "vallum_conntrack_early_drops_total"),
        Some(0.0)
    );
    assert_eq!(
        sample(&body, "vallum_conntrack_insert_failed_total"),
        Some(0.0)
    );
    assert!(st.new_total >= st.entries);

    // Filters: each answer is exactly the entries of the full list that satisfy it.
    let proto = |k: &Key, p: u32| k.1 == p;
    let udp = list(
        &mut c,
        pb::ConntrackFilter {
            protocol: "udp".into(),
            ..Default::default()
        },
    )
    .await;
    let want: Vec<Key> = all.iter().filter(|k| proto(k, 17)).cloned().collect();
    assert!(!want.is_empty(), "the capture has UDP flows");
    assert_eq!(sorted(&udp), sorted(&want));
    let tcp = all.iter().filter(|k| proto(k, 6)).count();
    assert!(tcp > 0, "the capture has TCP flows");
    // A /24 of some entry's source, and one of its destination ports.
    let first = all
        .iter()
        .find(|k| k.0 == pb::Family::Ipv4 as i32)
        .unwrap()
        .clone();
    let net = format!("{}/24", first.2);
    let in_net = |a: &str| {
        let a: std::net::Ipv4Addr = a.parse().unwrap();
        let n: std::net::Ipv4Addr = first.2.parse().unwrap();
        a.octets()[..3] == n.octets()[..3]
    };
    let by_net = list(
        &mut c,
        pb::ConntrackFilter {
            family: pb::Family::Ipv4 as i32,
            source: net.clone(),
            ..Default::default()
        },
    )
    .await;
    let want: Vec<Key> = all
        .iter()
        .filter(|k| k.0 == pb::Family::Ipv4 as i32 && in_net(&k.2))
        .cloned()
        .collect();
    assert_eq!(sorted(&by_net), sorted(&want));
    let v6 = list(
        &mut c,
        pb::ConntrackFilter {
            family: pb::Family::Ipv6 as i32,
            ..Default::default()
        },
    )
    .await;
    let want: Vec<Key> = all
        .iter()
        .filter(|k| k.0 == pb::Family::Ipv6 as i32)
        .cloned()
        .collect();
    assert_eq!(sorted(&v6), sorted(&want));

    // Bad filters: INVALID_ARGUMENT with field paths, every bad field listed.
    let e = c
        .list(pb::ListConntrackRequest {
            filter: Some(pb::ConntrackFilter {
                source: "10.0.0.0/33".into(),
                protocol: "bogus".into(),
                state: "LISTEN".into(),
                destination_port: 70_000,
                ..Default::default()
            }),
            page_size: 0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(reason(&e), "INVALID_ARGUMENT");
    let fields: BTreeSet<String> = e
        .get_details_bad_request()
        .unwrap()
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    assert_eq!(
        fields,
        BTreeSet::from([
            "filter.source".to_owned(),
            "filter.protocol".to_owned(),
            "filter.state".to_owned(),
            "filter.destination_port".to_owned()
        ])
    );
    let e = c
        .list(pb::ListConntrackRequest {
            filter: Some(pb::ConntrackFilter {
                family: pb::Family::Ipv6 as i32,
                source: "10.0.0.1".into(),
                ..Default::default()
            }),
            page_size: 0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        e.get_details_bad_request().unwrap().field_violations[0].field,
        "filter.source"
    );
    let e = c
        .delete(pb::DeleteConntrackRequest {
            filter: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.get_details_bad_request().unwrap().field_violations[0].field,
        "filter"
    );
    // A page size cuts the list but not the count.
    let r = c
        .list(pb::ListConntrackRequest {
            filter: None,
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.entries.len(), r.matched), (2, all.len() as u64));
    // Pages of one: every entry once; a token used with another filter is refused.
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .list(pb::ListConntrackRequest {
                filter: None,
                page_size: 1,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.entries.len() <= 1);
        paged.extend(r.entries.iter().map(key));
        if r.next_page_token.is_empty() {
            break;
        }
        if paged.len() == 1 {
            let e = c
                .list(pb::ListConntrackRequest {
                    filter: Some(pb::ConntrackFilter {
                        protocol: "udp".into(),
                        ..Default::default()
                    }),
                    page_size: 1,
                    page_token: r.next_page_token.clone(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert_eq!(
                e.get_details_bad_request().unwrap().field_violations[0].field,
                "page_token"
            );
        }
        token = r.next_page_token;
    }
    let mut sorted = all.clone();
    sorted.sort();
    let mut got = paged.clone();
    got.sort();
    assert_eq!(got, sorted, "every entry once over the pages");

    // Trace looks the packet up without changing the table: an ACK of an established TCP
    // flow is ESTABLISHED (accepted by rule 1), an ACK nobody opened NEW (picked up
    // mid-stream, as nf_conntrack_tcp_loose=1) and dropped by the policy (rule 3 wants a SYN).
    let est = list(
        &mut c,
        pb::ConntrackFilter {
            protocol: "tcp".into(),
            state: "established".into(),
            ..Default::default()
        },
    )
    .await;
    let mut tr = pb::trace_service_client::TraceServiceClient::new(d.channel().await);
    let ack = |k: &Key, sport: u32| pb::PacketSpec {
        family: k.0,
        source: k.2.clone(),
        destination: k.3.clone(),
        protocol: "tcp".into(),
        source_port: sport,
        destination_port: k.5,
        tcp_flags: "A".into(),
        ..Default::default()
    };
    let trace = |p: pb::PacketSpec| pb::TracePacketRequest {
        packet: Some(p),
        ..Default::default()
    };
    if let Some(k) = est.first() {
        let t = tr
            .trace_packet(trace(ack(k, k.4)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (
                t.verdict().as_str_name().trim_start_matches("VERDICT_"),
                t.ct_state.as_str()
            ),
            ("ACCEPT", "ESTABLISHED")
        );
        let t = tr
            .trace_packet(trace(ack(k, 9)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (
                t.verdict().as_str_name().trim_start_matches("VERDICT_"),
                t.ct_state.as_str()
            ),
            ("DROP", "NEW")
        );
        // Given a state, no lookup.
        let mut given = ack(k, 9);
        given.ct_state = "ESTABLISHED".into();
        let t = tr.trace_packet(trace(given)).await.unwrap().into_inner();
        assert_eq!(
            (
                t.verdict().as_str_name().trim_start_matches("VERDICT_"),
                t.ct_state.as_str()
            ),
            ("ACCEPT", "ESTABLISHED")
        );
    } else {
        panic!("no ESTABLISHED TCP entry in {all:?}");
    }
    assert_eq!(
        stats(&mut c).await.new_total,
        st.new_total,
        "trace created nothing"
    );

    // vallumctl, on the same steady table: one `conntrack -L` line per entry, JSON too.
    let (code, out, err) = vallumctl(&d.addr, &["conntrack", "list", "-p", "udp"]);
    assert_eq!(code, 0, "{err}");
    let n_udp = all.iter().filter(|k| proto(k, 17)).count();
    assert_eq!(out.lines().count(), n_udp, "{out}");
    assert!(
        out.lines()
            .all(|l| l.starts_with("ipv4     2 udp      17 ") || l.starts_with("ipv6     10 udp")),
        "{out}"
    );
    assert!(
        err.contains(&format!("{n_udp} flow entries have been shown.")),
        "{err}"
    );
    let (code, out, _) = vallumctl(&d.addr, &["-o", "json", "conntrack", "list"]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["entries"].as_array().unwrap().len(), all.len());
    assert_eq!(j["matched"], all.len() as u64);
    let (code, out, _) = vallumctl(&d.addr, &["conntrack", "stats"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&format!("entries={} max=262144 ", all.len())),
        "{out}"
    );
    let (code, _, err) = vallumctl(&d.addr, &["conntrack", "list", "--src", "nope"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("filter.source"), "{err}");
    let (code, _, err) = vallumctl(&d.addr, &["conntrack", "delete"]);
    assert_eq!(code, 1, "{err}");

    // Delete by filter: exactly the matching entries of the steady table go; every other
    // entry is still there right after.
    let n = c
        .delete(pb::DeleteConntrackRequest {
            filter: Some(pb::ConntrackFilter {
                protocol: "udp".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .deleted;
    // At least the steady table's UDP entries. Not exactly: the replay keeps running, and a
    // UDP flow deleted early in the walk can be opened again by its reply-direction packet,
    // whose tuple hashes to a bucket the walk has not reached yet (the engine's own tests
    // check exact counts on a quiet table).
    assert!(
        n as usize >= n_udp,
        "deleted {n}, steady table had {n_udp} UDP entries"
    );
    let after = list(&mut c, pb::ConntrackFilter::default()).await;
    let after: BTreeSet<Key> = after.into_iter().collect();
    for k in all.iter().filter(|k| !proto(k, 17)) {
        assert!(after.contains(k), "{k:?} was deleted by a UDP-only filter");
    }

    // Flush: everything present goes (at least every non-UDP entry of the steady table);
    // the replay then re-creates the flows, as new entries.
    let before = stats(&mut c).await;
    let (code, out, err) = vallumctl(&d.addr, &["conntrack", "flush"]);
    assert_eq!(code, 0, "{err}");
    let flushed: u64 = out
        .trim()
        .rsplit_once('(')
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(flushed as usize >= all.len() - n_udp, "{out}");
    let st2 = steady(&mut c, &d, loop_packets).await;
    assert!(
        st2.new_total >= before.new_total + (all.len() - n_udp) as u64,
        "flushed flows are created again: {before:?} -> {st2:?}"
    );
    let body = scrape(&d.metrics_addr).await;
    assert_eq!(
        sample(&body, "vallum_conntrack_new_total"),
        Some(st2.new_total as f64)
    );
}

fn sorted(v: &[Key]) -> Vec<Key> {
    let mut v = v.to_vec();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conntrack_off_is_a_failed_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &["--conntrack-max", "0"]);
    d.wait_serving().await;
    let mut c = ConntrackServiceClient::new(d.channel().await);
    let e = c
        .list(pb::ListConntrackRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&e), "FAILED_PRECONDITION");
    let e = c
        .flush(pb::FlushConntrackRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let body = scrape(&d.metrics_addr).await;
    assert_eq!(sample(&body, "vallum_conntrack_entries"), None);
    let (code, _, err) = vallumctl(&d.addr, &["conntrack", "stats"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("conntrack is off"), "{err}");
}
