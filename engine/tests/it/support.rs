//! Shared helpers of the test modules: one rule through parse/print ([`one_rule`]), seeded
//! generators with a fixed clock ([`seeded`]), one packet through the engine's classify
//! entry ([`classify_one`]) and whole packets through a worker ([`process_packets`]).

pub mod one_rule;
pub mod seeded;

use vallum_engine::conntrack::NoTracking;
use vallum_engine::engine::{Batch, EngineWorker};
use vallum_engine::packet::{Packet, PacketFacts, PacketMeta};
use vallum_engine::snapshot::{LogSink, Snapshot, Verdict};

/// A packet [`classify_one`] takes: a [`Packet`] (hot part and facts), or a [`PacketMeta`]
/// alone (no facts known).
pub trait OnePacket {
    /// The hot part and the facts as a batch of one holds them.
    fn parts(&mut self) -> (&mut PacketMeta, &mut [PacketFacts]);
}

impl OnePacket for PacketMeta {
    fn parts(&mut self) -> (&mut PacketMeta, &mut [PacketFacts]) {
        (self, &mut [])
    }
}

impl OnePacket for Packet {
    fn parts(&mut self) -> (&mut PacketMeta, &mut [PacketFacts]) {
        (&mut self.meta, std::slice::from_mut(&mut self.facts))
    }
}

/// Classifies one packet on `core` at `now` through the engine's one classify entry,
/// [`Snapshot::classify_batch`], as a batch of one, without conntrack and without bytes (the
/// packet keeps its `ct_state` unless a raw-table NOTRACK makes it UNTRACKED).
pub fn classify_one(
    snap: &Snapshot,
    core: usize,
    packet: &mut impl OnePacket,
    now: u64,
    logs: &mut (impl LogSink + ?Sized),
) -> Verdict {
    let mut verdict = [Verdict::Accept];
    let (meta, facts) = packet.parts();
    snap.classify_batch(
        core,
        std::slice::from_mut(meta),
        facts,
        &mut verdict,
        now,
        logs,
        &[],
        &mut NoTracking,
    );
    verdict[0]
}

/// Runs `packets` (hot part and facts) through `w` at `now` as one batch
/// ([`EngineWorker::process`] with the facts beside the batch), writing `verdicts` and each
/// packet as it came back (its `ct_state`, marks, zone); returns the number processed.
pub fn process_packets(
    w: &mut EngineWorker<'_>,
    packets: &mut [Packet],
    verdicts: &mut [Verdict],
    now: u64,
) -> usize {
    let mut metas: Vec<PacketMeta> = packets.iter().map(|p| p.meta).collect();
    let mut facts: Vec<PacketFacts> = packets.iter().map(|p| p.facts).collect();
    let batch = Batch {
        facts: &mut facts,
        ..Batch::new(&mut metas, verdicts)
    };
    let (n, _) = w.process(batch, now);
    for ((p, meta), facts) in packets.iter_mut().zip(metas).zip(facts) {
        *p = Packet { meta, facts };
    }
    n
}
