//! The TupleMerge classifier, alone and with RFC tables, against the linear walk (the
//! reference), on ClassBench sets.
//!
//! Every rule set is translated with mixed targets (ACCEPT, DROP and rules without a target,
//! which match and continue), so the index is asked for "the next match after rule k" as
//! often as for the first match. For each header the two snapshots must give the same
//! [`Trace`](vallum_engine::snapshot::Trace): verdict and every matched rule in order.
//! Headers: the CutSplit traces where they exist, and random headers drawn near rule
//! boundaries (prefix edges and port range endpoints, each +-1) for every set.
//!
//! Every test needs ../shared/data/classbench, so each is ignored unless asked for, and fails
//! when it is absent. `cargo test -p vallum-engine --test it -- classify_diff:: --include-ignored
//! --skip million_boundary_headers` runs the default sizes; `million_boundary_headers` draws 1M
//! boundary headers per 1k set (run it with `--release -- --ignored million_boundary_headers`).

use std::sync::Arc;

use vallum_engine::conntrack::NoTracking;
use vallum_engine::model::Target;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, RFC_MAX_RULES, Snapshot, Verdict};

use crate::classbench;

use classbench::{Filter, Header};

use crate::support::seeded;
use seeded::Rng;

/// An address at or next to the edges of a prefix, or inside it.
fn near_prefix(rng: &mut Rng, (addr, len): (u32, u8)) -> u32 {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let lo = addr & mask;
    let hi = lo | !mask;
    match rng.below(6) {
        0 => lo,
        1 => hi,
        2 => lo.wrapping_sub(1),
        3 => hi.wrapping_add(1),
        _ => lo | (rng.next() as u32 & !mask),
    }
}

fn near_range(rng: &mut Rng, (lo, hi): (u16, u16)) -> u16 {
    match rng.below(6) {
        0 => lo,
        1 => hi,
        2 => lo.wrapping_sub(1),
        3 => hi.wrapping_add(1),
        _ => lo + (rng.next() % (u64::from(hi - lo) + 1)) as u16,
    }
}

/// A header whose fields sit near the boundaries of (usually) one random rule; each field
/// comes from another rule one time in four, so headers also fall between rules.
fn boundary_header(rng: &mut Rng, filters: &[Filter]) -> Header {
    let base = rng.below(filters.len());
    let pick = |rng: &mut Rng| {
        if rng.below(4) == 0 {
            filters[rng.below(filters.len())]
        } else {
            filters[base]
        }
    };
    let (s, d, sp, dp, pr) = (pick(rng), pick(rng), pick(rng), pick(rng), pick(rng));
    Header {
        src: near_prefix(rng, s.src),
        dst: near_prefix(rng, d.dst),
        sport: near_range(rng, sp.sport),
        dport: near_range(rng, dp.dport),
        proto: match (rng.below(5), pr.proto) {
            (0, _) => [1, 6, 17, 47][rng.below(4)],
            (_, Some(p)) => p,
            (_, None) => [1, 6, 17][rng.below(3)],
        },
    }
}

/// Mixed targets: every 7th rule has no target (matches and continues), every 5th drops.
fn target(i: usize) -> Target {
    if i % 7 == 3 {
        Target::None
    } else if i % 5 == 1 {
        Target::Drop
    } else {
        Target::Accept
    }
}

/// The linear snapshot and the indexed one, with RFC tables up to `rfc_max_rules` rules.
fn snapshots(name: &str, filters: &[Filter], rfc_max_rules: u32) -> (Snapshot, Snapshot) {
    let rs = Arc::new(classbench::to_ruleset_with(name, filters, target).expect("translate"));
    let linear = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, Classifier::Linear)
        .expect("compile linear");
    let indexed = Snapshot::compile_with(
        &[rs],
        &NoSets,
        1,
        Classifier::TupleMerge {
            min_rules: 0,
            batch_min_bytes: 0,
            rfc_min_rules: 0,
            rfc_max_rules,
        },
    )
    .expect("compile indexed");
    (linear, indexed)
}

/// Compares both snapshots on `headers`; panics with the first difference.
fn compare(
    name: &str,
    linear: &Snapshot,
    indexed: &Snapshot,
    headers: impl Iterator<Item = Header>,
) {
    let mut n = 0usize;
    for h in headers {
        let p = classbench::to_packet(&h);
        let want = linear.trace(&p, 0);
        let got = indexed.trace(&p, 0);
        assert_eq!(got, want, "{name}: header {h:?} (#{n})");
        n += 1;
    }
    assert!(n > 0, "{name}: no headers");
}

/// Reads a set (and its trace, if given); panics when ../shared/data/classbench is absent.
fn load(set: &str, trace: Option<&str>) -> (Vec<Filter>, Vec<Header>) {
    let Some(dir) = classbench::data_dir() else {
        panic!("{set}: ../shared/data/classbench not found");
    };
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).expect("read classbench file");
    let filters = classbench::parse_filters(&read(set)).expect("parse filters");
    let headers = trace.map_or_else(Vec::new, |t| {
        classbench::parse_trace(&read(t)).expect("parse trace")
    });
    (filters, headers)
}

fn check_set(set: &str, trace: Option<&str>, trace_limit: usize, random: usize) {
    let (filters, headers) = load(set, trace);
    // TupleMerge alone, then with RFC tables (built for the 1k sets only).
    for rfc in [0, RFC_MAX_RULES] {
        let (linear, indexed) = snapshots(set, &filters, rfc);
        if rfc > 0 && filters.len() <= 1100 {
            assert_eq!(
                indexed.memory_bytes().rfc_chains,
                1,
                "{set}: no RFC tables built"
            );
        }
        let name = format!("{set} (rfc_max_rules {rfc})");
        if !headers.is_empty() {
            compare(
                &name,
                &linear,
                &indexed,
                headers.iter().take(trace_limit).copied(),
            );
        }
        let mut rng = Rng(0x5eed ^ filters.len() as u64);
        compare(
            &name,
            &linear,
            &indexed,
            (0..random).map(|_| boundary_header(&mut rng, &filters)),
        );
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn cutsplit_1k_sets_with_traces() {
    for set in ["acl", "fw", "ipc"] {
        let path = format!("cutsplit/{set}_1k");
        check_set(&path, Some(&format!("{path}_trace")), usize::MAX, 20_000);
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn cutsplit_fw_10k_with_trace() {
    check_set(
        "cutsplit/fw_10k",
        Some("cutsplit/fw_10k_trace"),
        5_000,
        5_000,
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn neurocuts_1k_sets_near_boundaries() {
    for set in ["acl1", "fw1", "ipc1"] {
        check_set(&format!("neurocuts/{set}_1k"), None, 0, 100_000);
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn neurocuts_10k_sets_near_boundaries() {
    for set in ["acl1", "fw1", "ipc1"] {
        check_set(&format!("neurocuts/{set}_10k"), None, 0, 5_000);
    }
}

/// Batched classification ([`Snapshot::classify_batch`], without and with RFC tables) against
/// the per-packet index and the linear walk: every verdict equal, and every counter equal afterwards (with the mixed
/// targets, the counters record every rule that matched, including those that continue).
/// Batches are cut at 64, 1, 37 and 200 packets in turn.
fn check_batched(set: &str, trace: Option<&str>, trace_limit: usize, random: usize) {
    let (filters, headers) = load(set, trace);
    let (linear, single) = snapshots(set, &filters, 0);
    let (_, batched) = snapshots(set, &filters, 0);
    let (_, batched_rfc) = snapshots(set, &filters, RFC_MAX_RULES);
    let mut rng = Rng(0xba7c ^ filters.len() as u64);
    let packets: Vec<_> = headers
        .iter()
        .take(trace_limit)
        .copied()
        .chain((0..random).map(|_| boundary_header(&mut rng, &filters)))
        .map(|h| classbench::to_packet(&h))
        .collect();
    let mut logs = Vec::new();
    let (mut at, mut round) = (0, 0);
    while at < packets.len() {
        let cut = [64, 1, 37, 200][round % 4];
        let chunk = &packets[at..(at + cut).min(packets.len())];
        let mut buf = chunk.to_vec();
        let mut verdicts = vec![Verdict::Accept; buf.len()];
        assert_eq!(
            batched.classify_batch(
                0,
                &mut buf,
                &mut [],
                &mut verdicts,
                0,
                &mut logs,
                &[],
                &mut NoTracking
            ),
            chunk.len()
        );
        let mut buf = chunk.to_vec();
        let mut verdicts_rfc = vec![Verdict::Accept; buf.len()];
        assert_eq!(
            batched_rfc.classify_batch(
                0,
                &mut buf,
                &mut [],
                &mut verdicts_rfc,
                0,
                &mut logs,
                &[],
                &mut NoTracking
            ),
            chunk.len()
        );
        for (i, p) in chunk.iter().enumerate() {
            let (mut a, mut b) = (*p, *p);
            let want = crate::support::classify_one(&linear, 0, &mut a, 0, &mut logs);
            assert_eq!(
                crate::support::classify_one(&single, 0, &mut b, 0, &mut logs),
                want,
                "{set}: {p:?}"
            );
            assert_eq!(
                verdicts[i],
                want,
                "{set}: batched, packet #{}: {p:?}",
                at + i
            );
            assert_eq!(
                verdicts_rfc[i],
                want,
                "{set}: batched with RFC tables, packet #{}: {p:?}",
                at + i
            );
        }
        at += chunk.len();
        round += 1;
    }
    let counters = linear.counters();
    assert_eq!(single.counters(), counters, "{set}: per-packet counters");
    assert_eq!(batched.counters(), counters, "{set}: batched counters");
    assert_eq!(
        batched_rfc.counters(),
        counters,
        "{set}: batched counters with RFC tables"
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn batched_equals_per_packet_and_linear() {
    check_batched(
        "cutsplit/acl_1k",
        Some("cutsplit/acl_1k_trace"),
        20_000,
        5_000,
    );
    for set in ["acl1", "fw1", "ipc1"] {
        check_batched(&format!("neurocuts/{set}_1k"), None, 0, 20_000);
        check_batched(&format!("neurocuts/{set}_10k"), None, 0, 5_000);
    }
}

#[test]
#[ignore = "1M headers per set: run with --release -- --ignored"]
fn million_boundary_headers() {
    for set in ["acl1", "fw1", "ipc1"] {
        check_set(&format!("neurocuts/{set}_1k"), None, 0, 1_000_000);
        check_set(&format!("neurocuts/{set}_10k"), None, 0, 1_000_000);
    }
}
