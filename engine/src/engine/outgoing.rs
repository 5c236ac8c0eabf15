//! The engine's outgoing queue ("Publish now, retire later" in the module docs of
//! [`crate::engine`]): the snapshots that publishes replaced, each retired once every core that
//! was mid-batch at its publish has passed a quiescent point, and the counter carry that waits
//! for those cores. [`Engine::settle`] drains it off the commit's path.

use std::collections::VecDeque;

use crate::dataplane::{Retired, Unpublished};
use crate::snapshot::Snapshot;

use super::Engine;

/// What [`Engine::settle`] did: the outgoing snapshots it retired and what waiting for them
/// cost.
#[derive(Debug, Default)]
pub struct Settled {
    /// The snapshots retired, oldest first, unreachable by any core: drop them.
    pub retired: Vec<Retired<Snapshot>>,
    /// Time spent waiting for cores that were mid-batch at their publish, ns.
    pub quiesce_ns: u64,
    /// Time spent carrying counters (a pending carry), ns.
    pub carry_ns: u64,
    /// Cores that were mid-batch at the publishes of the retired snapshots (summed).
    pub cores_waited: usize,
    /// Counter slots carried by a pending carry this finished.
    pub carried: usize,
}

/// A snapshot replaced by a publish and not yet retired (the engine's outgoing queue).
pub(super) struct Outgoing {
    pub(super) old: Unpublished<Snapshot>,
    /// The carry into the snapshot that replaced `old` (the active one: only the newest
    /// outgoing snapshot can have one) still to run once no core can write `old`.
    pub(super) carry: Option<PendingCarry>,
}

/// A carry that waits for the cores (module docs, "Publish now, retire later").
pub(super) struct PendingCarry {
    /// Whether [`Snapshot::carry_from`] reads the old snapshot's counts (fresh cells).
    pub(super) counts: bool,
    /// The rulesets whose model counters start ([`Prepared`]'s `start_counters`).
    pub(super) start_counters: Vec<String>,
}

impl Settled {
    /// Adds `other`'s costs and counts (not its snapshots) to these.
    fn absorb(&mut self, other: Settled) {
        self.quiesce_ns += other.quiesce_ns;
        self.carry_ns += other.carry_ns;
        self.cores_waited += other.cores_waited;
        self.carried += other.carried;
        self.retired.extend(other.retired);
    }
}

impl Engine {
    /// Finishes the pending carry of the newest outgoing snapshot, if it has one: waits for
    /// the cores that were mid-batch at its publish, then carries its counters into the active
    /// snapshot and starts the counters its commit set. Callers hold the `outgoing` lock, so
    /// no publish replaces the active snapshot meanwhile.
    pub(super) fn finish_carry(&self, outgoing: &mut VecDeque<Outgoing>) -> Settled {
        let mut done = Settled::default();
        let Some(last) = outgoing.back_mut() else {
            return done;
        };
        let Some(carry) = last.carry.take() else {
            return done;
        };
        let t0 = self.clock.now_ns();
        (self.dataplane.quiescence()).wait(last.old.grace(), &self.dataplane.backoff());
        let t1 = self.clock.now_ns();
        let old = last.old.get();
        // No core writes `old` any more (the wait): its totals are final. `with_active`: the
        // snapshot that replaced `old` (only the newest outgoing snapshot has a carry).
        done.carried = self.dataplane.with_active(|new| {
            let carried = if carry.counts { new.carry_from(old) } else { 0 };
            new.start_counters(&carry.start_counters);
            carried
        });
        done.quiesce_ns = t1.saturating_sub(t0);
        done.carry_ns = self.clock.now_ns().saturating_sub(t1);
        done
    }

    /// Retires the outgoing snapshots (module docs, "Publish now, retire later"): for each,
    /// oldest first, waits until no core that was mid-batch at its publish can still read it
    /// (without holding the queue's lock, so publishes go on meanwhile), finishes its pending
    /// carry and hands it back. Returns when the queue is empty; run it off the commit's path
    /// (a blocking thread) after each publish, and drop what it returns there too.
    pub fn settle(&self) -> Settled {
        let mut settled = Settled::default();
        loop {
            let grace = {
                let mut outgoing = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
                self.retire_quiescent(&mut outgoing, &mut settled);
                match outgoing.front() {
                    None => return settled,
                    Some(o) => o.old.grace().clone(),
                }
            };
            let t = self.clock.now_ns();
            (self.dataplane.quiescence()).wait(&grace, &self.dataplane.backoff());
            settled.quiesce_ns += self.clock.now_ns().saturating_sub(t);
        }
    }

    /// Retires outgoing snapshots from the front of the queue for as long as no core can reach
    /// them any more (a look at the generations, never a wait), into `settled`; the newest one's
    /// pending carry is finished first (its grace is over: that waits for nothing).
    pub(super) fn retire_quiescent(
        &self,
        outgoing: &mut VecDeque<Outgoing>,
        settled: &mut Settled,
    ) {
        while outgoing.front().is_some_and(|o| o.old.is_quiescent()) {
            if outgoing.len() == 1 {
                let last = self.finish_carry(outgoing);
                settled.absorb(last);
            }
            if let Some(o) = outgoing.pop_front() {
                settled.cores_waited += o.old.cores_waited();
                settled.retired.push(o.old.retire());
            }
        }
    }

    /// Runs `f` on the active snapshot once its counters are complete: an outgoing
    /// snapshot's pending carry is finished first, and no publish happens until `f` returns.
    pub(super) fn with_counted<R>(&self, f: impl FnOnce(&Snapshot) -> R) -> R {
        let mut outgoing = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        self.finish_carry(&mut outgoing);
        self.dataplane.with_active(f)
    }
}
