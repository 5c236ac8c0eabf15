//! The table's memory: an entry ([`Conn`]) with its two tagged chain links, a bucket array
//! ([`Buckets`]) with its lock-free walks (`find`, `scan`, `walk_originals`) and the unlink
//! its lock holders use, and the lock stripes. On the packet path: the walks take no lock,
//! allocate nothing (but `scan`'s result, a control-path call) and read no clock; every load
//! and store is ordered as the module docs of [`super`] argue.

use std::ptr;

use super::reclaim;
use super::tuple::Tuple;
use crate::model::CtZone;
use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Mutex, MutexGuard, Ordering};

/// One connection: both tuples, both chain links, its state.
pub(super) struct Conn {
    /// `tuple[0]` original, `tuple[1]` reply. Immutable.
    pub(super) tuple: [Tuple; 2],
    /// The zone (`-j CT --zone`): `zone.id(d)` is part of `tuple[d]`'s key. Immutable.
    pub(super) zone: CtZone,
    /// The next node in the chain of `tuple[d]`'s bucket (a tagged pointer, see [`tag`]).
    pub(super) next: [AtomicPtr<Conn>; 2],
    /// TCP state (low byte) and status bits ([`tcp::SEEN_REPLY`](super::tcp::SEEN_REPLY), FIN bits).
    pub(super) status: AtomicU64,
    /// Expiry time, in the caller's `now` nanoseconds.
    pub(super) timeout: AtomicU64,
    /// Set (under the bucket locks) when the entry is being deleted.
    pub(super) dying: AtomicBool,
    /// The connection mark (ct->mark, low 32 bits; `-m connmark`, `-j CONNMARK`). Relaxed
    /// loads and stores, as the kernel's READ_ONCE/WRITE_ONCE of ct->mark: a value of its
    /// own that orders no other memory.
    pub(super) mark: AtomicU64,
}

impl Conn {
    /// The hash of node `dir`: its tuple in its zone.
    pub(super) fn hash(&self, dir: usize) -> u64 {
        self.tuple[dir].hash_in(self.zone.id(dir))
    }
}

/// A link to node `dir` of `conn`: the pointer with `dir` in its low bit (`Conn` is 8-aligned).
pub(super) fn tag(conn: *mut Conn, dir: usize) -> *mut Conn {
    conn.map_addr(|a| a | dir)
}

/// The entry and node direction a link points at.
pub(super) fn untag(link: *mut Conn) -> (*mut Conn, usize) {
    (link.map_addr(|a| a & !1), link.addr() & 1)
}

/// One insert/delete lock and the counter it guards, on its own cache line(s) so that threads
/// working under different locks do not bounce a shared line.
#[repr(align(128))]
pub(super) struct Stripe {
    pub(super) lock: Mutex<()>,
    /// Entries inserted under this stripe's lock (the lower of an entry's two); written only
    /// by holders of `lock`. A statistic, summed by [`Conntrack::stats`](super::Conntrack::stats); `Relaxed`, it orders
    /// nothing.
    pub(super) new_total: AtomicU64,
}

/// A value alone on its cache line(s).
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

/// The locks of two buckets, taken lower index first.
pub(super) struct PairGuard<'a> {
    pub(super) _first: MutexGuard<'a, ()>,
    pub(super) _second: Option<MutexGuard<'a, ()>>,
    /// The index of the lower lock.
    pub(super) lower: usize,
}

/// One bucket array: the chain heads. Replaced as a whole by a resize.
pub(super) struct Buckets {
    pub(super) heads: Box<[AtomicPtr<Conn>]>,
    /// `heads.len() - 1` (the length is a power of two).
    pub(super) mask: usize,
}

impl Buckets {
    pub(super) fn new(n: usize) -> Buckets {
        Buckets {
            heads: (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect(),
            mask: n - 1,
        }
    }

    pub(super) fn index(&self, hash: u64) -> usize {
        hash as usize & self.mask
    }

    /// The live entry holding `t` in the chain of `hash`, and which of its tuples matched:
    /// the tuple and, in that direction, the zone id (`nf_ct_key_equal`'s
    /// `nf_ct_zone_equal`).
    pub(super) fn find<'g>(
        &self,
        t: &Tuple,
        zone: CtZone,
        hash: u64,
        _guard: &'g reclaim::Guard,
    ) -> Option<(&'g Conn, usize)> {
        // Acquire: pairs with the Release store that published the node (or re-linked it), so
        // the node's fields are visible before we read them.
        let mut link = self.heads[self.index(hash)].load(Ordering::Acquire);
        while !link.is_null() {
            let (p, dir) = untag(link);
            // SAFETY: `p` was reachable from a chain after we pinned `_guard` (we loaded it
            // from a bucket head or a node we reached that way), so it is not freed before the
            // guard drops; its construction happens-before this read (Acquire above).
            let conn: &'g Conn = unsafe { &*p };
            // Acquire on `dying`: pairs with the deleter's Release (module docs, "re-check").
            if conn.tuple[dir] == *t
                && conn.zone.id(dir) == zone.id(dir)
                && !conn.dying.load(Ordering::Acquire)
            {
                return Some((conn, dir));
            }
            link = conn.next[dir].load(Ordering::Acquire);
        }
        None
    }

    /// The live entries whose node is in `bucket` and that satisfy `pick` (each entry once per
    /// node in the bucket, so possibly twice when both its tuples hash here).
    pub(super) fn scan<'g>(
        &self,
        bucket: usize,
        _guard: &'g reclaim::Guard,
        mut pick: impl FnMut(&Conn) -> bool,
    ) -> Vec<&'g Conn> {
        let mut out = Vec::new();
        // Acquire: as in `find`.
        let mut link = self.heads[bucket].load(Ordering::Acquire);
        while !link.is_null() {
            let (p, dir) = untag(link);
            // SAFETY: as in `find`: reached from a chain while `_guard` is pinned.
            let conn: &'g Conn = unsafe { &*p };
            if !conn.dying.load(Ordering::Acquire) && pick(conn) {
                out.push(conn);
            }
            link = conn.next[dir].load(Ordering::Acquire);
        }
        out
    }

    /// Unlinks node `dir` of `target` from `bucket`'s chain. The caller holds its lock.
    pub(super) fn unlink(&self, bucket: usize, target: *mut Conn, dir: usize) {
        let want = tag(target, dir);
        let mut link: &AtomicPtr<Conn> = &self.heads[bucket];
        loop {
            // Acquire: the node we step onto may have been published by another writer under
            // this lock (the lock already orders that; Acquire keeps the argument local).
            let cur = link.load(Ordering::Acquire);
            if cur.is_null() {
                return;
            }
            let (p, d) = untag(cur);
            // SAFETY: reachable from the chain, which only lock holders change, and we hold
            // the lock; nodes are freed only after being unlinked and a grace period.
            let conn = unsafe { &*p };
            if cur == want {
                // Release: the successor was published before; readers reaching it through
                // this link must see its construction (module docs).
                link.store(conn.next[d].load(Ordering::Acquire), Ordering::Release);
                return;
            }
            link = &conn.next[d];
        }
    }

    /// Calls `f` on every live entry whose original node is in `bucket`.
    pub(super) fn walk_originals<'g>(
        &self,
        bucket: usize,
        _guard: &'g reclaim::Guard,
        mut f: impl FnMut(&'g Conn),
    ) {
        // Acquire: as in `find`.
        let mut link = self.heads[bucket].load(Ordering::Acquire);
        while !link.is_null() {
            let (p, dir) = untag(link);
            // SAFETY: as in `find`.
            let conn: &'g Conn = unsafe { &*p };
            if dir == 0 && !conn.dying.load(Ordering::Acquire) {
                f(conn);
            }
            link = conn.next[dir].load(Ordering::Acquire);
        }
    }
}
