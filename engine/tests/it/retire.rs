//! Publish now, retire later (`Engine::publish` returns before the cores that were mid-batch
//! moved on; `Engine::settle` retires): counters stay exact across back-to-back commits while
//! workers on other threads decide packets without pause, including the commits whose
//! snapshot gets fresh counter cells (the carry that must wait for the cores).
//!
//! `cargo test -p vallum-engine --test it -- retire::`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use vallum_engine::engine::{Change, Engine};
use vallum_engine::model::{Family, Hook};
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Snapshot, Verdict};

use crate::support::seeded;

/// Rules replaced by every commit (each takes a new counter slot), so the shared cells run
/// out of slots every ten commits or so and a snapshot gets fresh ones.
const CHURN: usize = 100;

/// The ruleset of commit `k`: INPUT accepts TCP port 80 in its first rule (the one whose
/// count the test follows: every packet sent matches it), policy DROP; then `CHURN` rules
/// that differ from every other commit's, a few more or less by commit (a fresh cell set is
/// sized to its snapshot, so the sets' capacities tell them apart).
fn text(k: usize) -> String {
    let mut t = String::from("*filter\n:INPUT DROP [0:0]\n");
    t.push_str("-A INPUT -p tcp --dport 80 -j ACCEPT\n");
    for i in 0..CHURN + k % 7 {
        t.push_str(&format!(
            "-A INPUT -p udp --dport {} -m comment --comment c{k}-{i} -j ACCEPT\n",
            1000 + i
        ));
    }
    t.push_str("COMMIT\n");
    t
}

fn http() -> PacketMeta {
    PacketMeta {
        family: Family::Ipv4,
        hook: Hook::Input,
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.9".parse().unwrap(),
        protocol: 6,
        sport: 40000,
        dport: 80,
        len: 100,
        ..PacketMeta::default()
    }
}

/// (packets, bytes) of INPUT's rule 1.
fn kept(engine: &Engine) -> (u64, u64) {
    engine
        .counters()
        .iter()
        .find(|c| &*c.chain == "INPUT" && c.rule == Some(1))
        .map(|c| (c.packets, c.bytes))
        .expect("INPUT rule 1 is counted")
}

/// The capacity of a snapshot's counter cells (from its debug form), which changes when a
/// snapshot got fresh cells.
fn capacity(s: &Snapshot) -> String {
    let debug = format!("{s:?}");
    let at = debug.find("capacity").expect("cells in debug form");
    debug[at..].split(',').next().unwrap().to_string()
}

/// Sets its flag when dropped (also when the test thread unwinds).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[test]
fn counters_are_exact_across_back_to_back_commits_under_traffic() {
    let cores = 2;
    let engine = seeded::engine(cores);
    let opts = ParseOptions::default();
    let parse = |k: usize| parse_ruleset("host", &text(k), &opts).unwrap();
    drop(engine.commit(Change::Put(parse(0)), &NoSets).unwrap());
    let stop = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let capacities = Mutex::new(BTreeSet::new());
    let note = |retired: &[vallum_engine::dataplane::Retired<Snapshot>]| {
        let mut c = capacities.lock().unwrap();
        for r in retired {
            c.insert(capacity(r));
        }
    };

    std::thread::scope(|s| {
        let workers: Vec<_> = (0..cores)
            .map(|core| {
                let (engine, stop, sent) = (&engine, &stop, &sent);
                s.spawn(move || {
                    let mut w = engine.worker(core).unwrap();
                    let mut verdicts = [Verdict::Drop; 8];
                    while !stop.load(Ordering::Relaxed) {
                        let mut packets = [http(); 8];
                        w.process_batch(&mut packets, &mut verdicts, 0);
                        assert!(verdicts.iter().all(|v| *v == Verdict::Accept));
                        sent.fetch_add(8, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Retires concurrently with the commits, as vallumd's blocking thread does.
        let settler = {
            let (engine, stop, note) = (&engine, &stop, &note);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let settled = engine.settle();
                    note(&settled.retired);
                    std::thread::yield_now();
                }
            })
        };

        // A failed assertion below stops the threads too, so the test fails instead of hanging.
        let _stop = StopOnDrop(&stop);
        let mut last = (0, 0);
        for k in 1..=60 {
            let prepared = engine.prepare(Change::Put(parse(k)), &NoSets).unwrap();
            let published = engine.publish(prepared).unwrap();
            note(&published.retired);
            if k % 2 == 0 {
                // Never a count lost (it would go down) while carries are pending.
                let now = kept(&engine);
                assert!(
                    now >= last,
                    "commit {k}: INPUT rule 1 went {last:?} -> {now:?}"
                );
                last = now;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        settler.join().unwrap();
    });
    let settled = engine.settle();
    note(&settled.retired);
    let packets = sent.load(Ordering::Relaxed);
    assert!(packets > 0, "no traffic");
    // Exact: every packet sent counted once, none lost in a carry, none carried twice.
    assert_eq!(kept(&engine), (packets, packets * 100));
    // The fresh-cell commits happened (their carry waited for the cores).
    let capacities = capacities.into_inner().unwrap();
    assert!(capacities.len() >= 3, "cell sets seen: {capacities:?}");
}

/// Commit `k` of the guarantee test: INPUT accepts TCP ports 1000..=1000+k, policy DROP.
fn ports_upto(k: usize) -> String {
    let mut t = String::from("*filter\n:INPUT DROP [0:0]\n");
    for p in 0..=k {
        t.push_str(&format!("-A INPUT -p tcp --dport {} -j ACCEPT\n", 1000 + p));
    }
    t.push_str("COMMIT\n");
    t
}

/// What `Engine::publish` promises when it returns (and so what vallumd's answer means): a
/// batch that begins after the return runs the new rules. Workers on other threads decide
/// packets without pause; after each publish `k` returns the committer says so (a Release
/// store), and every batch a worker begins after it saw that (an Acquire load before the batch)
/// must accept port 1000+k, which only rulesets k and later accept.
#[test]
fn every_batch_that_begins_after_publish_returns_runs_the_new_rules() {
    let cores = 2;
    let engine = seeded::engine(cores);
    let opts = ParseOptions::default();
    let parse = |k: usize| parse_ruleset("host", &ports_upto(k), &opts).unwrap();
    drop(engine.commit(Change::Put(parse(0)), &NoSets).unwrap());
    let published = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let commits = 100;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..cores)
            .map(|core| {
                let (engine, published, done) = (&engine, &published, &done);
                s.spawn(move || {
                    let mut w = engine.worker(core).unwrap();
                    let mut batches = 0u64;
                    while !done.load(Ordering::Acquire) {
                        // Acquire: pairs with the committer's Release store after publish k
                        // returned; this batch begins after that return.
                        let k = published.load(Ordering::Acquire);
                        let mut p = [PacketMeta {
                            dport: 1000 + k as u16,
                            ..http()
                        }];
                        let mut v = [Verdict::Drop];
                        w.process_batch(&mut p, &mut v, 0);
                        assert_eq!(v[0], Verdict::Accept, "port {} after publish {k}", 1000 + k);
                        batches += 1;
                    }
                    batches
                })
            })
            .collect();
        let _stop = StopOnDrop(&done);
        for k in 1..=commits {
            let prepared = engine.prepare(Change::Put(parse(k)), &NoSets).unwrap();
            drop(engine.publish(prepared).unwrap());
            published.store(k as u64, Ordering::Release);
            if k % 10 == 0 {
                drop(engine.settle());
            }
        }
        done.store(true, Ordering::Release);
        for w in workers {
            assert!(w.join().unwrap() > 0, "a worker ran no batch");
        }
    });
    drop(engine.settle());
}
