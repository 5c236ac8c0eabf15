//! Unit tests of the engine's commit protocol and workers (`engine.rs`).

use std::cell::RefCell;
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::packet::PacketMeta;
use crate::restore::{ParseOptions, parse};
use crate::sets::NoSets;
use crate::snapshot::Verdict;

thread_local! {
    /// Run (once) by a compile on this thread, inside [`Dataplane::with_base`].
    static COMPILE_HOOK: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
}

/// Called by [`Engine::compile`] just before it compiles.
pub(super) fn compile_hook() {
    if let Some(hook) = COMPILE_HOOK.with(|h| h.borrow_mut().take()) {
        hook();
    }
}

struct Zero;

impl Clock for Zero {
    fn now_ns(&self) -> u64 {
        0
    }
}

/// A counter read and a trace while a 100k-rule commit compiles return without waiting
/// for the compile: the compile is held (by the hook, inside `with_base`) until they have
/// returned. Were they behind the compile's lock, the hook would wait in vain and fail the
/// commit (after 300 s, only so that the test fails instead of hanging).
#[test]
fn a_counter_read_during_a_compile_does_not_wait_for_it() {
    let engine = Arc::new(Engine::new(
        EngineConfig {
            cores: 2,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(Zero),
    ));
    let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..100_000u32 {
        let [_, a, b, c] = i.to_be_bytes();
        text.push_str(&format!("-A INPUT -s 10.{a}.{b}.{c}/32 -j DROP\n"));
    }
    text.push_str("COMMIT\n");
    let tables = parse(&text, &ParseOptions::default()).unwrap().tables;
    let ruleset = Ruleset {
        name: "big".into(),
        priority: 0,
        tables,
    };
    let (in_compile, compiling) = mpsc::channel();
    let (read_done, read_returned) = mpsc::channel::<()>();
    let committer = std::thread::spawn({
        let engine = engine.clone();
        move || {
            COMPILE_HOOK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    in_compile.send(()).unwrap();
                    assert!(
                        read_returned.recv_timeout(Duration::from_secs(300)).is_ok(),
                        "the counter read waited for the compile"
                    );
                }))
            });
            engine.commit(Change::Put(ruleset), &NoSets)
        }
    });
    compiling.recv().unwrap();
    // Before the commit: the empty snapshot.
    assert!(engine.counters().iter().all(|c| c.packets == 0));
    let packet = PacketMeta::default();
    assert_eq!(engine.trace(&packet, 0).verdict, Verdict::Accept);
    read_done.send(()).unwrap();
    let committed = match committer.join() {
        Ok(r) => r.unwrap(),
        Err(p) => std::panic::resume_unwind(p),
    };
    assert_eq!(committed.report.rules, 100_000);
}

fn ruleset(name: &str, priority: i32, rules: &str) -> Ruleset {
    let text = format!("*filter\n:INPUT ACCEPT [0:0]\n{rules}COMMIT\n");
    Ruleset {
        name: name.into(),
        priority,
        tables: parse(&text, &ParseOptions::default()).unwrap().tables,
    }
}

fn engine() -> Engine {
    Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(Zero),
    )
}

/// A packet whose bytes were cut short of what the snapshot's rules read is left out of
/// the batch (no counter, verdict untouched, marked skipped); a cut packet with enough
/// bytes, and every packet that is not cut, is classified and counted; the snapshot's
/// copy range comes back, and follows a commit.
#[test]
fn packets_copied_short_of_the_rules_are_skipped() {
    let engine = engine();
    engine
        .commit(
            Change::Put(ruleset(
                "s",
                0,
                "-A INPUT -p udp -m string --string abc --algo bm --to 1000 -j DROP
",
            )),
            &NoSets,
        )
        .unwrap();
    let mut w = engine.worker(0).unwrap();
    let udp = PacketMeta {
        protocol: 17,
        len: 1200,
        ..PacketMeta::default()
    };
    let mut whole = vec![0u8; 1200];
    whole[900..903].copy_from_slice(b"abc");
    let mut packets = [udp; 3];
    let bytes: [&[u8]; 3] = [&whole[..256], &whole, &whole[..1000]];
    let cut = [true, false, true];
    let mut verdicts = [Verdict::Accept; 3];
    let mut skipped = [false; 3];
    let (n, range) = w.process(
        Batch {
            packets: &mut packets,
            facts: &mut [],
            verdicts: &mut verdicts,
            bytes: &bytes,
            cut: &cut,
            skipped: &mut skipped,
        },
        0,
    );
    assert_eq!((n, range), (3, 1000));
    assert_eq!(skipped, [true, false, false]);
    assert_eq!(verdicts[0], Verdict::Accept);
    assert_eq!(verdicts[1..], [Verdict::Drop, Verdict::Drop]);
    let rule = engine
        .counters()
        .into_iter()
        .find(|c| c.rule == Some(1))
        .unwrap();
    assert_eq!((rule.packets, rule.bytes), (2, 2400));
    assert_eq!(engine.core_packets(), vec![2]);
    // Headers-only rules: 256 bytes are enough for every packet.
    drop(w);
    engine
        .commit(
            Change::Put(ruleset(
                "s",
                0,
                "-A INPUT -p udp -j DROP
",
            )),
            &NoSets,
        )
        .unwrap();
    let mut w = engine.worker(0).unwrap();
    let (_, range) = w.process(
        Batch {
            packets: &mut packets,
            facts: &mut [],
            verdicts: &mut verdicts,
            bytes: &bytes,
            cut: &cut,
            skipped: &mut skipped,
        },
        0,
    );
    assert_eq!(range, crate::snapshot::copy_range::HEADER_BYTES);
    assert_eq!(skipped, [false; 3]);
    assert_eq!(verdicts, [Verdict::Drop; 3]);
}

/// A ruleset's number changes at publish, with what runs: not at validate or compile
/// time, not for a prepare that is dropped or stale; a put of the same name drops it
/// until numbered again, a remove drops it, and an unrelated commit keeps it.
#[test]
fn revisions_change_at_publish() {
    let e = engine();
    let at = |rev, priority| ActiveRevision {
        revision: rev,
        priority,
    };
    let mut p = e
        .prepare(Change::Put(ruleset("web", 5, "")), &NoSets)
        .unwrap();
    assert!(p.set_revision("web", 1));
    assert!(!p.set_revision("db", 1), "not active after the change");
    assert_eq!(e.revision("web"), None, "not before publish");
    e.publish(p).unwrap();
    assert_eq!(e.revision("web"), Some(at(1, 5)));

    // Dropped and stale prepares change nothing.
    let mut dropped = e
        .prepare(
            Change::Put(ruleset("web", 5, "-A INPUT -j DROP\n")),
            &NoSets,
        )
        .unwrap();
    dropped.set_revision("web", 2);
    drop(dropped);
    let mut stale = e
        .prepare(
            Change::Put(ruleset("web", 5, "-A INPUT -j DROP\n")),
            &NoSets,
        )
        .unwrap();
    stale.set_revision("web", 2);
    let mut other = e
        .prepare(Change::Put(ruleset("db", -1, "")), &NoSets)
        .unwrap();
    other.set_revision("db", 7);
    e.publish(other).unwrap();
    assert!(matches!(e.publish(stale), Err(CommitError::Stale)));
    assert_eq!(
        e.revisions(),
        BTreeMap::from([("db".to_string(), at(7, -1)), ("web".to_string(), at(1, 5))])
    );

    // A put without a number: the old number does not stay with the new content.
    e.commit(
        Change::Put(ruleset("web", 5, "-A INPUT -j DROP\n")),
        &NoSets,
    )
    .unwrap();
    assert_eq!(e.revision("web"), None);
    assert_eq!(e.priority("web"), Some(5));
    e.commit(Change::Remove("db".into()), &NoSets).unwrap();
    assert!(e.revisions().is_empty());
    assert_eq!(e.priority("db"), None);
}

/// Each commit validates each ruleset it changes once; a refused one too, and
/// [`Engine::validate`] once per call.
#[test]
fn a_commit_validates_each_changed_ruleset_once() {
    let e = engine();
    e.commit(Change::Put(ruleset("web", 0, "")), &NoSets)
        .unwrap();
    assert_eq!(e.validations(), 1);
    e.commit(
        Change::ReplaceAll(vec![ruleset("web", 0, ""), ruleset("db", 1, "")]),
        &NoSets,
    )
    .unwrap();
    assert_eq!(e.validations(), 3);
    e.commit(Change::Remove("db".into()), &NoSets).unwrap();
    assert_eq!(e.validations(), 3, "a remove validates nothing");
    // A loop of jumps: parses, does not validate.
    let text = "*filter\n:INPUT ACCEPT [0:0]\n:x - [0:0]\n-A INPUT -j x\n-A x -j x\nCOMMIT\n";
    let bad = Ruleset {
        name: "web".into(),
        priority: 0,
        tables: parse(text, &ParseOptions::default()).unwrap().tables,
    };
    assert!(!e.validate(&bad, &NoSets).is_empty());
    assert_eq!(e.validations(), 4);
    assert!(matches!(
        e.validate_change(Change::Put(bad), &NoSets),
        Err(CommitError::Invalid(_))
    ));
    assert_eq!(e.validations(), 5);
}
