//! Shared helpers of the test modules: one rule through parse/print ([`one_rule`]), seeded
//! generators with a fixed clock ([`seeded`]) and one packet through the engine's classify
//! entry ([`classify_one`]).

pub mod one_rule;
pub mod seeded;

use vallum_engine::conntrack::NoTracking;
use vallum_engine::packet::PacketMeta;
use vallum_engine::snapshot::{LogSink, Snapshot, Verdict};

/// Classifies one packet on `core` at `now` through the engine's one classify entry,
/// [`Snapshot::classify_batch`], as a batch of one, without conntrack and without bytes (the
/// packet keeps its `ct_state` unless a raw-table NOTRACK makes it UNTRACKED).
pub fn classify_one(
    snap: &Snapshot,
    core: usize,
    packet: &mut PacketMeta,
    now: u64,
    logs: &mut (impl LogSink + ?Sized),
) -> Verdict {
    let mut verdict = [Verdict::Accept];
    snap.classify_batch(
        core,
        std::slice::from_mut(packet),
        &mut verdict,
        now,
        logs,
        &[],
        &mut NoTracking,
    );
    verdict[0]
}
