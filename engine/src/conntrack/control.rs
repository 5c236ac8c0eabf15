//! The control path of [`Conntrack`]: expiry and growth ([`Conntrack::gc`]), an explicit
//! [`Conntrack::resize`], listing, deleting and flushing entries, the statistics, and freeing
//! every entry when the table is dropped. Called off the packet path (a gc or resize takes
//! every lock it needs, a growth all of them); these calls allocate (lists, a new bucket
//! array) and read no clock (`now` is passed in).

use super::buckets::{Buckets, Conn, untag};
use super::{ConnView, Conntrack, ConntrackError, ConntrackStats, reclaim, tcp};
use crate::sync::{MutexGuard, Ordering};

impl Conntrack {
    /// Deletes up to all expired entries in the next `budget` buckets (round robin over the
    /// table); returns how many it deleted. When this call completes a sweep of the whole
    /// table, it then grows the table (doubling the buckets) if it holds more entries than
    /// buckets and is below its largest size. Call it periodically
    /// with the current `now` (ns), off the packet path: a growth waits for every lock and
    /// lookups wait for it.
    pub fn gc(&self, now: u64, budget: usize) -> usize {
        let guard = reclaim::pin();
        let (_, table) = self.begin(&guard);
        let budget = budget.min(table.heads.len());
        let start = self.gc_cursor.fetch_add(budget as u64, Ordering::Relaxed) as usize;
        let mut n = 0;
        for i in 0..budget {
            let bucket = start.wrapping_add(i) & table.mask;
            for conn in table.scan(bucket, &guard, |c| c.timeout.load(Ordering::Relaxed) <= now) {
                n += usize::from(self.delete_conn(conn, &guard));
            }
        }
        // Grow at the end of a sweep over the whole array, when the expired entries it found
        // are gone and the count is what the live flows need.
        let buckets = table.heads.len();
        let swept = (start & table.mask) + budget >= buckets;
        if swept
            && self.entries.0.load(Ordering::Relaxed) > buckets as u64
            && buckets < self.max_buckets
        {
            self.resize(buckets * 2)
                .unwrap_or_else(|e| unreachable!("doubling below the maximum: {e}"));
        }
        n
    }

    /// The most entries the table admits (`max_entries` of its [`ConntrackConfig`](super::ConntrackConfig)).
    pub fn max_entries(&self) -> u64 {
        self.max_entries
    }

    /// The current number of buckets.
    pub fn buckets(&self) -> usize {
        let guard = reclaim::pin();
        self.begin(&guard).1.heads.len()
    }

    /// Rehashes every entry into `buckets` buckets (rounded up to a power of two), as
    /// `nf_conntrack_hash_resize` (the `nf_conntrack_buckets` sysctl); returns the new count.
    /// Takes every lock; lookups wait until it is done. Shrinking is allowed.
    ///
    /// Errors: [`ConntrackError::Buckets`] when `buckets` is 0 or above 2^62.
    pub fn resize(&self, buckets: usize) -> Result<usize, ConntrackError> {
        let n = buckets
            .checked_next_power_of_two()
            .filter(|&n| buckets > 0 && n <= 1 << 62)
            .ok_or(ConntrackError::Buckets(buckets))?;
        let guard = reclaim::pin();
        // Every lock, in index order (writers take at most two, lower first: no cycle).
        let locks: Vec<MutexGuard<'_, ()>> = self
            .locks
            .iter()
            .map(|s| {
                s.lock
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            })
            .collect();
        // Relaxed: only resizers store `table` and `generation`, and they hold every lock.
        let old_p = self.table.load(Ordering::Relaxed);
        // SAFETY: the current array is live (only a resizer retires it, and we are the one).
        let old = unsafe { &*old_p };
        if old.heads.len() == n {
            return Ok(n);
        }
        let generation = self.generation.load(Ordering::Relaxed);
        // Relaxed: the Release link stores below order it before any reader that sees them
        // (`resized_since`).
        self.generation.store(generation + 1, Ordering::Relaxed);
        let new = Buckets::new(n);
        for head in old.heads.iter() {
            loop {
                // Relaxed: we hold every lock, so no other thread writes links.
                let link = head.load(Ordering::Relaxed);
                if link.is_null() {
                    break;
                }
                let (p, dir) = untag(link);
                // SAFETY: reachable from a chain of the current array, which only lock
                // holders change; entries are retired only after being unlinked.
                let conn = unsafe { &*p };
                // Release (all three): a reader that reaches a node through one of these links
                // must see the node's construction and its links (as in `unlink`). Unlink
                // from the old head first, then point the node into the new array only: a
                // walk that follows it stays in the new array, whose chains end.
                head.store(conn.next[dir].load(Ordering::Relaxed), Ordering::Release);
                let to = &new.heads[new.index(conn.hash(dir))];
                conn.next[dir].store(to.load(Ordering::Relaxed), Ordering::Release);
                to.store(link, Ordering::Release);
            }
        }
        self.table
            .store(Box::into_raw(Box::new(new)), Ordering::Release);
        // Release: pairs with `begin`'s Acquire: a reader that sees the even generation sees
        // the new array and every moved link.
        self.generation.store(generation + 2, Ordering::Release);
        drop(locks);
        // SAFETY: `old_p` came from Box::into_raw and is no longer reachable: the pointer was
        // replaced above, under every lock, and only this resize retires it.
        unsafe { self.retired_tables.retire(&guard, old_p) };
        Ok(n)
    }

    /// Every live entry (including expired ones not yet collected), each once.
    pub fn list(&self) -> Vec<ConnView> {
        let guard = reclaim::pin();
        loop {
            let (generation, table) = self.begin(&guard);
            let mut out = Vec::new();
            for bucket in 0..table.heads.len() {
                table.walk_originals(bucket, &guard, |c| out.push(view(c)));
            }
            if !self.resized_since(generation) {
                return out;
            }
        }
    }

    /// Deletes every entry for which `filter` returns true; returns how many.
    pub fn delete(&self, filter: impl Fn(&ConnView) -> bool) -> usize {
        let guard = reclaim::pin();
        let mut n = 0;
        loop {
            let (generation, table) = self.begin(&guard);
            for bucket in 0..table.heads.len() {
                let mut hits = Vec::new();
                table.walk_originals(bucket, &guard, |c| {
                    if filter(&view(c)) {
                        hits.push(c);
                    }
                });
                for c in hits {
                    n += usize::from(self.delete_conn(c, &guard));
                }
            }
            // A resize during the walk may have hidden entries from it: walk again.
            if !self.resized_since(generation) {
                return n;
            }
        }
    }

    /// Deletes every entry; returns how many.
    pub fn flush(&self) -> usize {
        self.delete(|_| true)
    }

    /// The counters.
    pub fn stats(&self) -> ConntrackStats {
        ConntrackStats {
            entries: self.entries.0.load(Ordering::Relaxed),
            new_total: self
                .locks
                .iter()
                .map(|s| s.new_total.load(Ordering::Relaxed))
                .sum(),
            early_drops: self.early_drops.load(Ordering::Relaxed),
            insert_failed: self.insert_failed.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Conntrack {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or writer is left; the current array came from
        // Box::into_raw and is not retired (only replaced arrays are).
        let table = unsafe { Box::from_raw(self.table.load(Ordering::Relaxed)) };
        // Collect first, free after the whole walk: an entry's reply node may sit in a chain
        // walked after the one holding its original node, so freeing on the way would make
        // that later walk read freed memory.
        let mut linked = Vec::new();
        for head in table.heads.iter() {
            let mut link = head.load(Ordering::Relaxed);
            while !link.is_null() {
                let (p, dir) = untag(link);
                // SAFETY: `&mut self`: no reader or writer is left; every linked entry is live
                // (none is freed before this walk ends).
                link = unsafe { &*p }.next[dir].load(Ordering::Relaxed);
                if dir == 0 {
                    linked.push(p);
                }
            }
        }
        for p in linked {
            // SAFETY: each linked entry has exactly one original node, so it is collected and
            // freed once; it came from Box::into_raw and is not retired (retired entries are
            // unlinked), and the walk that read it is over.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

fn view(c: &Conn) -> ConnView {
    let status = c.status.load(Ordering::Relaxed);
    ConnView {
        original: c.tuple[0],
        reply: c.tuple[1],
        zone: c.zone,
        tcp_state: tcp::state_of(status),
        seen_reply: status & tcp::SEEN_REPLY != 0,
        expires_ns: c.timeout.load(Ordering::Relaxed),
        mark: c.mark.load(Ordering::Relaxed) as u32,
    }
}
