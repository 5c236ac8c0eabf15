//! Named state of stateful matches: the lists of `-m recent` (xt_recent), one per (ruleset,
//! name), shared by every rule that names it, IPv4 and IPv6 alike, as the kernel's tables
//! are shared by the rules of one network namespace.
//!
//! The state lives outside the chain bodies, behind an `Arc` that compiled rules hold, and a
//! snapshot keeps the map of its rulesets' tables ([`NamedState`]): a build starts from the
//! previous snapshot's map (the tables of the rulesets it still has), so a list keeps its
//! entries across commits, as conntrack does, and a shared or spliced chain body holds the
//! same tables as the rules compiled afresh. A ruleset that is removed drops its lists. A
//! list no rule names any more is kept while its ruleset is (the kernel frees it with its last
//! rule; a rule that names it again then finds its old entries here).
//!
//! Packet path: one mutex per list (the kernel takes one spinlock, `recent_lock`, for all of
//! them); a list holds at most [`RECENT_LIST_TOT`] entries of at most [`RECENT_MAX_STAMPS`]
//! time stamps, so the work under it is bounded. Nothing allocates once an entry exists (a
//! new entry allocates its stamp array; the least recently seen one is dropped when the list
//! is full).

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::model::{RECENT_LIST_TOT, RECENT_MAX_STAMPS, RecentMatch, RecentOp};
use crate::packet::PacketMeta;

use super::HashMap;
use crate::model::Hook;

/// One `-m recent` list: the mask of the rule that created it (as `recent_mt_check`: a list
/// keeps its first rule's mask) and its entries.
#[derive(Debug)]
pub(super) struct RecentTable {
    /// As the kernel's `union nf_inet_addr`: an IPv4 mask in the first 4 bytes.
    mask: [u8; 16],
    list: Mutex<RecentList>,
}

#[derive(Debug, Default)]
struct RecentList {
    /// At most [`RECENT_LIST_TOT`]; order is irrelevant, `seen` orders them (the LRU list).
    entries: Vec<RecentEntry>,
    /// Sequence number of the last touch, for `seen`.
    tick: u64,
}

#[derive(Debug)]
struct RecentEntry {
    v6: bool,
    /// Masked address, as `nf_inet_addr` bytes.
    addr: [u8; 16],
    ttl: u8,
    /// Ring of time stamps (ns); the first `nstamps` are valid.
    stamps: Box<[u64]>,
    nstamps: usize,
    /// Next slot to write, 1..=RECENT_MAX_STAMPS after a write (xt_recent's `index`).
    index: usize,
    /// LRU position: larger is more recent.
    seen: u64,
}

/// The `nf_inet_addr` bytes of an address.
fn inet_bytes(a: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(v) => b[..4].copy_from_slice(&v.octets()),
        IpAddr::V6(v) => b = v.octets(),
    }
    b
}

impl RecentTable {
    fn new(mask: IpAddr) -> RecentTable {
        RecentTable {
            mask: inet_bytes(mask),
            list: Mutex::new(RecentList::default()),
        }
    }

    /// Entries in the list (tests and diagnostics).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecentList> {
        // A panic under the lock leaves the list consistent (every update is a few plain
        // writes), so a poisoned lock is used as it is.
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A compiled `-m recent`.
#[derive(Debug, Clone)]
pub(super) struct CRecent {
    table: Arc<RecentTable>,
    negated: bool,
    op: RecentOp,
    /// `--seconds` in ns (0: not given).
    window_ns: u64,
    reap: bool,
    hitcount: u32,
    rttl: bool,
    dest: bool,
}

impl CRecent {
    /// Whether the rule matches `p` at `now`, as xt_recent's `recent_mt`. With `apply` false
    /// (a trace) the list is read and not changed: the answer is what the packet would get.
    pub(super) fn matches(&self, p: &PacketMeta, now: u64, apply: bool) -> bool {
        let addr = if self.dest { p.dst } else { p.src };
        let v6 = addr.is_ipv6();
        let mut key = inet_bytes(addr);
        for (k, m) in key.iter_mut().zip(self.table.mask) {
            *k &= m;
        }
        // "use TTL as seen before forwarding": a forwarded packet (an output device and no
        // local socket) has had its TTL decremented once already.
        let ttl = if matches!(p.hook, Hook::Forward | Hook::Postrouting) {
            p.ttl.wrapping_add(1)
        } else {
            p.ttl
        };
        let want_ttl = if self.rttl { ttl } else { 0 };
        let mut ret = self.negated;
        let mut list = self.table.lock();
        let found = list.entries.iter().position(|e| {
            e.v6 == v6 && e.addr == key && (want_ttl == e.ttl || want_ttl == 0 || e.ttl == 0)
        });
        let Some(at) = found else {
            if self.op != RecentOp::Set {
                return ret;
            }
            if apply {
                list.insert(v6, key, ttl, now);
            }
            return !ret;
        };
        let time = now.saturating_sub(self.window_ns);
        match self.op {
            RecentOp::Set => ret = !ret,
            RecentOp::Remove => {
                if apply {
                    list.entries.swap_remove(at);
                }
                return !ret;
            }
            RecentOp::Rcheck | RecentOp::Update => {
                let e = &list.entries[at];
                let mut hits = 0u32;
                for &s in &e.stamps[..e.nstamps] {
                    if self.window_ns != 0 && time > s {
                        continue;
                    }
                    hits += 1;
                    if self.hitcount == 0 || hits >= self.hitcount {
                        ret = !ret;
                        break;
                    }
                }
            }
        }
        let update = self.op == RecentOp::Set || (self.op == RecentOp::Update && ret);
        if !apply {
            return ret;
        }
        let mut at = Some(at);
        if self.reap {
            at = list.reap(time, at, self.op == RecentOp::Update && ret);
        }
        if let (true, Some(at)) = (update, at) {
            list.touch(at, now, ttl);
        }
        ret
    }
}

impl RecentList {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// `recent_entry_init`: drops the least recently seen entry when the list is full.
    fn insert(&mut self, v6: bool, addr: [u8; 16], ttl: u8, now: u64) {
        if self.entries.len() >= RECENT_LIST_TOT {
            if let Some(oldest) = self.oldest() {
                self.entries.swap_remove(oldest);
            }
        }
        let mut stamps = vec![0u64; RECENT_MAX_STAMPS as usize].into_boxed_slice();
        stamps[0] = now;
        let seen = self.next_tick();
        self.entries.push(RecentEntry {
            v6,
            addr,
            ttl,
            stamps,
            nstamps: 1,
            index: 1,
            seen,
        });
    }

    fn oldest(&self) -> Option<usize> {
        (0..self.entries.len()).min_by_key(|&i| self.entries[i].seen)
    }

    /// `recent_entry_update` (and the TTL the packet had).
    fn touch(&mut self, at: usize, now: u64, ttl: u8) {
        let seen = self.next_tick();
        let e = &mut self.entries[at];
        e.index &= RECENT_MAX_STAMPS as usize - 1;
        e.stamps[e.index] = now;
        e.index += 1;
        e.nstamps = e.nstamps.max(e.index);
        e.ttl = ttl;
        e.seen = seen;
    }

    /// `recent_entry_reap`: removes the least recently seen entry when its last time stamp is
    /// older than `time`, unless it is `working` and about to be updated. Returns where
    /// `working` is afterwards (`None`: it was the one removed).
    fn reap(&mut self, time: u64, working: Option<usize>, update: bool) -> Option<usize> {
        let oldest = self.oldest()?;
        if Some(oldest) == working && update {
            return working;
        }
        let e = &self.entries[oldest];
        if time > e.stamps[e.index - 1] {
            let last = self.entries.len() - 1;
            self.entries.swap_remove(oldest);
            return match working {
                Some(w) if w == oldest => None,
                Some(w) if w == last => Some(oldest),
                w => w,
            };
        }
        working
    }
}

/// The named tables of one snapshot's rulesets, by (ruleset, name). Commit path only.
#[derive(Debug, Default, Clone)]
pub(super) struct NamedState {
    recent: HashMap<(Arc<str>, String), Arc<RecentTable>>,
}

impl NamedState {
    /// The tables of `prev` whose ruleset is among `rulesets`: a build's starting point.
    pub(super) fn kept(prev: &NamedState, rulesets: &[Arc<str>]) -> NamedState {
        NamedState {
            recent: prev
                .recent
                .iter()
                .filter(|((rs, _), _)| rulesets.contains(rs))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The compiled form of `m` in ruleset `ruleset`, with its list (found, or created with
    /// the rule's mask).
    pub(super) fn recent(&mut self, ruleset: &Arc<str>, m: &RecentMatch) -> CRecent {
        let table = self
            .recent
            .entry((ruleset.clone(), m.name.clone()))
            .or_insert_with(|| Arc::new(RecentTable::new(m.mask)))
            .clone();
        CRecent {
            table,
            negated: m.negated,
            op: m.op,
            window_ns: u64::from(m.seconds) * 1_000_000_000,
            reap: m.reap,
            hitcount: m.hitcount,
            rttl: m.rttl,
            dest: m.dest,
        }
    }

    /// Entries of ruleset `ruleset`'s recent list `name` (tests).
    #[cfg(test)]
    pub(super) fn recent_len(&self, ruleset: &str, name: &str) -> Option<usize> {
        self.recent
            .iter()
            .find(|((r, n), _)| &**r == ruleset && n == name)
            .map(|(_, t)| t.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Family;

    fn packet(src: &str) -> PacketMeta {
        PacketMeta {
            src: src.parse().expect("address"),
            hook: Hook::Input,
            ttl: 64,
            ..PacketMeta::default()
        }
    }

    /// A reap that removes the oldest entry while the packet's own entry sits last in the
    /// vector (swap_remove moves it) still updates the packet's entry, not another one.
    #[test]
    fn reap_keeps_track_of_the_working_entry() {
        let mut named = NamedState::default();
        let rs: Arc<str> = Arc::from("r");
        let set = named.recent(&rs, &RecentMatch::new(RecentOp::Set, Family::Ipv4));
        let mut update = RecentMatch::new(RecentOp::Update, Family::Ipv4);
        update.seconds = 10;
        update.reap = true;
        update.hitcount = 2;
        let update = named.recent(&rs, &update);
        let s = 1_000_000_000;
        assert!(set.matches(&packet("10.0.0.1"), 0, true));
        assert!(set.matches(&packet("10.0.0.2"), 5 * s, true));
        assert!(set.matches(&packet("10.0.0.3"), 6 * s, true));
        assert_eq!(named.recent_len("r", "DEFAULT"), Some(3));
        // 10.0.0.3 (last in the vector) has one stamp; at 11 s 10.0.0.1 (first) is reaped.
        assert!(!update.matches(&packet("10.0.0.3"), 11 * s, true));
        assert_eq!(named.recent_len("r", "DEFAULT"), Some(2));
        assert!(set.matches(&packet("10.0.0.3"), 12 * s, true));
        assert!(
            update.matches(&packet("10.0.0.3"), 13 * s, true),
            "3 stamps"
        );
        // 10.0.0.2 kept its single stamp: a dry run says no, and changes nothing.
        assert!(!update.matches(&packet("10.0.0.2"), 13 * s, false));
        assert_eq!(named.recent_len("r", "DEFAULT"), Some(2));
        assert_eq!(named.recent_len("r", "other"), None);
    }
}
