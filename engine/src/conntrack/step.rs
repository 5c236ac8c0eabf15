//! Conntrack's two steps on the packet path, as a value the worker holds: the lookup between a
//! hook's raw-table chains and the others (netfilter priority -200), and the confirmation of a
//! new connection after the packet's verdict. The chain walk calls them through [`Track`]
//! (`Snapshot::classify_batch`, `Snapshot::trace_tracked`); [`Tracker`] is the engine's, and
//! [`NoTracking`] (or a closure, for tests and dry runs) stands in when conntrack is off.

use super::{Conntrack, CtVerdict, Unconfirmed};
use crate::model::ct_state;
use crate::packet::{PacketFacts, PacketMeta};
use crate::snapshot::Verdict;

/// What the chain walk asks of connection tracking (whose table lives for `'t`), per packet, in this order: [`Track::lookup`]
/// once, between the raw-table chains and the others; [`Track::decided`] once, with the
/// verdict, before the next packet of the batch is looked up (so a packet sees the state every
/// earlier packet of its batch left).
pub trait Track<'t> {
    /// Sets the packet's conntrack facts (`ct_state`, `ct_mark`, `ct_reply`); `Some` is a
    /// final verdict (DROP when the table has no room for a new connection). `f` is the
    /// packet's facts (its zone, the header an ICMP error embeds).
    fn lookup(&mut self, p: &mut PacketMeta, f: &PacketFacts, now: u64) -> Option<Verdict>;

    /// After the verdict `v`: what the packet's verdict finally is (a new connection joins the
    /// table here when accepted; DROP when the table is full then).
    #[inline]
    fn decided(&mut self, _p: &mut PacketMeta, _f: &PacketFacts, v: Verdict, _now: u64) -> Verdict {
        v
    }

    /// The table `-m connlimit` counts in; `None` without one (a connlimit rule then counts
    /// only the packet's own connection).
    #[inline]
    fn table(&self) -> Option<&'t Conntrack> {
        None
    }
}

/// Conntrack off: every packet keeps the `ct_state` it came with.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTracking;

impl Track<'_> for NoTracking {
    #[inline]
    fn lookup(&mut self, _: &mut PacketMeta, _: &PacketFacts, _: u64) -> Option<Verdict> {
        None
    }
}

/// A closure as the lookup step (no confirmation, no table): for dry runs (a trace's
/// [`Conntrack::peek_into`]) and tests that set the state themselves.
impl<F: FnMut(&mut PacketMeta, &PacketFacts) -> Option<Verdict>> Track<'_> for F {
    #[inline]
    fn lookup(&mut self, p: &mut PacketMeta, f: &PacketFacts, _: u64) -> Option<Verdict> {
        self(p, f)
    }
}

/// The engine's tracking of one worker's packets against the shared table: lookup with
/// [`Conntrack::track_unconfirmed`], confirmation with [`Conntrack::confirm`] when the packet
/// was accepted (as nf_conntrack confirms at the last hook), and the write-back of a
/// connection mark the rules changed (`-j CONNMARK`, as the kernel's target writes ct->mark:
/// a confirmed entry at once, a new one carries it into `confirm`).
pub struct Tracker<'a> {
    table: &'a Conntrack,
    /// The new connection of the packet between its lookup and its verdict.
    unconfirmed: Option<Unconfirmed>,
    /// The entry's mark as the lookup found it, for a packet of a confirmed entry.
    found_mark: Option<u32>,
}

impl std::fmt::Debug for Tracker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("unconfirmed", &self.unconfirmed.is_some())
            .field("found_mark", &self.found_mark)
            .finish_non_exhaustive()
    }
}

impl<'a> Tracker<'a> {
    /// Tracks packets against `table`.
    pub fn new(table: &'a Conntrack) -> Tracker<'a> {
        Tracker {
            table,
            unconfirmed: None,
            found_mark: None,
        }
    }

    /// The table.
    pub fn conntrack(&self) -> &'a Conntrack {
        self.table
    }
}

fn has_entry(state: u8) -> bool {
    state & (ct_state::INVALID | ct_state::UNTRACKED) == 0
}

impl<'a> Track<'a> for Tracker<'a> {
    #[inline]
    fn lookup(&mut self, p: &mut PacketMeta, f: &PacketFacts, now: u64) -> Option<Verdict> {
        let (v, u) = self.table.track_unconfirmed(p, f, now);
        self.found_mark = (u.is_none() && has_entry(p.ct_state)).then_some(p.ct_mark);
        self.unconfirmed = u;
        (v == CtVerdict::TableFull).then_some(Verdict::Drop)
    }

    #[inline]
    fn decided(&mut self, p: &mut PacketMeta, f: &PacketFacts, v: Verdict, now: u64) -> Verdict {
        if let Some(m) = self.found_mark.take() {
            if m != p.ct_mark {
                self.table.set_mark(p, f, p.ct_mark);
            }
        }
        match (self.unconfirmed.take(), v) {
            (Some(u), Verdict::Accept) => match self.table.confirm(u, p, now) {
                CtVerdict::TableFull => {
                    p.ct_state = CtVerdict::TableFull.ct_state();
                    Verdict::Drop
                }
                _ => v,
            },
            _ => v,
        }
    }

    #[inline]
    fn table(&self) -> Option<&'a Conntrack> {
        Some(self.table)
    }
}
