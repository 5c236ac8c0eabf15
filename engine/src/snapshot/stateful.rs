//! Named state of stateful matches: the lists of `-m recent` (xt_recent), one per (ruleset,
//! name), shared by every rule that names it, IPv4 and IPv6 alike, as the kernel's tables
//! are shared by the rules of one network namespace; and the hash tables of `-m hashlimit`
//! (xt_hashlimit), one per (ruleset, family, name), which keep the configuration of the rule
//! that created them (mode, masks, rate, burst, expiry, size), as `htable_find_get` does: a
//! later rule of the same name, also after a commit, uses the table's configuration and only
//! its own `--hashlimit-upto` / `-above`. A table no rule names after a commit is dropped
//! (the kernel frees it with its last rule), so a renamed or changed rate takes effect once
//! no rule holds the old table.
//!
//! The state lives outside the chain bodies, behind an `Arc` that compiled rules hold, and a
//! snapshot keeps the map of its rulesets' tables ([`NamedState`]): a build starts from the
//! previous snapshot's map (the tables of the rulesets it still has), so a list keeps its
//! entries across commits, as conntrack does, and a shared or spliced chain body holds the
//! same tables as the rules compiled afresh. A ruleset that is removed drops its tables, and
//! a build keeps only the tables some rule of the new snapshot holds ([`NamedState::held`]).
//!
//! Packet path: one mutex per list (the kernel takes one spinlock, `recent_lock`, for all of
//! them); a list holds at most [`RECENT_LIST_TOT`] entries of at most [`recent_stamps`] of
//! its rules' largest `--hitcount` time stamps (256, or up to 65536 for a larger hitcount, as
//! the kernel's `nstamps_max_mask`), so the work under it is bounded. Nothing allocates once an entry exists (a
//! new entry allocates its stamp array; the least recently seen one is dropped when the list
//! is full).

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::model::{
    Family, HashlimitMatch, Hook, RECENT_LIST_TOT, RecentMatch, RecentOp, hashlimit_mode,
    recent_stamps,
};
use crate::packet::PacketMeta;

use super::{CMatch, HashMap};

/// One `-m recent` list: the mask of the rule that created it (as `recent_mt_check`: a list
/// keeps its first rule's mask) and its entries.
#[derive(Debug)]
pub(crate) struct RecentTable {
    /// The list's name (its key with the ruleset).
    pub(crate) name: String,
    /// As the kernel's `union nf_inet_addr`: an IPv4 mask in the first 4 bytes.
    pub(crate) mask: [u8; 16],
    pub(crate) list: Mutex<RecentList>,
}

#[derive(Debug, Default)]
pub(crate) struct RecentList {
    /// At most [`RECENT_LIST_TOT`]; order is irrelevant, `seen` orders them (the LRU list).
    pub(crate) entries: Vec<RecentEntry>,
    /// Time stamps each entry keeps, a power of two ([`recent_stamps`]).
    pub(crate) stamps: usize,
    /// Sequence number of the last touch, for `seen`.
    pub(crate) tick: u64,
}

#[derive(Debug)]
pub(crate) struct RecentEntry {
    pub(crate) v6: bool,
    /// Masked address, as `nf_inet_addr` bytes.
    pub(crate) addr: [u8; 16],
    pub(crate) ttl: u8,
    /// Ring of time stamps (ns); the first `nstamps` are valid.
    pub(crate) stamps: Box<[u64]>,
    pub(crate) nstamps: usize,
    /// Next slot to write, 1..=`stamps.len()` after a write (xt_recent's `index`).
    pub(crate) index: usize,
    /// LRU position: larger is more recent.
    pub(crate) seen: u64,
}

/// The `nf_inet_addr` bytes of an address.
pub(crate) fn inet_bytes(a: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(v) => b[..4].copy_from_slice(&v.octets()),
        IpAddr::V6(v) => b = v.octets(),
    }
    b
}

impl RecentTable {
    fn new(name: &str, mask: IpAddr, hitcount: u32) -> RecentTable {
        RecentTable {
            name: name.to_string(),
            mask: inet_bytes(mask),
            list: Mutex::new(RecentList {
                stamps: recent_stamps(hitcount),
                ..RecentList::default()
            }),
        }
    }

    /// A rule with `hitcount` names the list: as `recent_mt_check`, a list whose entries keep
    /// too few time stamps for it is flushed and keeps enough from then on.
    fn fit(&self, hitcount: u32) {
        let need = recent_stamps(hitcount);
        let mut list = self.lock();
        if need > list.stamps {
            list.entries.clear();
            list.stamps = need;
        }
    }

    /// Entries in the list (tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
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
pub(crate) struct CRecent {
    pub(crate) table: Arc<RecentTable>,
    pub(crate) negated: bool,
    pub(crate) op: RecentOp,
    /// `--seconds` in ns (0: not given).
    pub(crate) window_ns: u64,
    pub(crate) reap: bool,
    pub(crate) hitcount: u32,
    pub(crate) rttl: bool,
    pub(crate) dest: bool,
}

impl CRecent {
    /// Whether the rule matches `p` at `now`, as xt_recent's `recent_mt`. With `apply` false
    /// (a trace) the list is read and not changed: the answer is what the packet would get.
    pub(crate) fn matches(&self, p: &PacketMeta, now: u64, apply: bool) -> bool {
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
        let mut stamps = vec![0u64; self.stamps].into_boxed_slice();
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
        e.index &= e.stamps.len() - 1;
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

/// The kernel's default `--hashlimit-htable-max` when none is given: 8 times the default
/// size, which is 8192 buckets on a host with more than 1 GiB of memory.
pub(crate) const HASHLIMIT_DEFAULT_MAX: usize = 8 * 8192;

/// One `-m hashlimit` table: the configuration of the rule that created it and a token
/// bucket per key.
#[derive(Debug)]
pub(crate) struct HashTable {
    pub(crate) name: String,
    pub(crate) family: Family,
    pub(crate) mode: u8,
    /// Address masks of the key, as `u128` (IPv4 in the low 32 bits).
    pub(crate) srcmask: u128,
    pub(crate) dstmask: u128,
    /// ns between two packets at the average rate.
    pub(crate) interval_ns: u64,
    /// `(burst - 1) * interval_ns`.
    pub(crate) burst_ns: u64,
    pub(crate) expire_ns: u64,
    pub(crate) max: usize,
    pub(crate) entries: Mutex<HashMap<HashKey, Bucket>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct HashKey {
    pub(crate) src: u128,
    pub(crate) dst: u128,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    /// Theoretical arrival time of the next conforming packet (the GCRA form of the token
    /// bucket, as `-m limit`'s `TokenBucket`): the bucket is full at 0.
    pub(crate) tat: u64,
    /// Dropped when `now` passes this (xt_hashlimit's `expires`, refreshed by every packet).
    pub(crate) expires: u64,
}

/// The prefix mask of `len` bits of a `width`-bit address, as a `u128` in the low bits.
pub(crate) fn prefix(len: u8, width: u8) -> u128 {
    let all = if width == 32 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    match len {
        0 => 0,
        l if l >= width => all,
        l => all & !(all >> l),
    }
}

pub(crate) fn addr_u128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

/// The protocols whose first 4 transport bytes are ports (xt_hashlimit's
/// `proto_ports_offset` 0: TCP, UDP, DCCP, SCTP, UDP-Lite).
pub(crate) fn has_ports(p: &PacketMeta) -> bool {
    matches!(p.protocol, 6 | 17 | 33 | 132 | 136) && !p.fragment
}

impl HashTable {
    fn new(m: &HashlimitMatch, family: Family) -> HashTable {
        let width = if family == Family::Ipv4 { 32 } else { 128 };
        let interval_ns = m.avg.saturating_mul(1000);
        HashTable {
            name: m.name.clone(),
            family,
            mode: m.mode,
            srcmask: prefix(m.srcmask.unwrap_or(width), width),
            dstmask: prefix(m.dstmask.unwrap_or(width), width),
            interval_ns,
            burst_ns: interval_ns.saturating_mul(u64::from(m.burst.max(1) - 1)),
            expire_ns: u64::from(m.expire) * 1_000_000,
            max: match m.max {
                0 => HASHLIMIT_DEFAULT_MAX,
                n => n as usize,
            },
            entries: Mutex::new(HashMap::default()),
        }
    }

    /// `hashlimit_init_dst`: the fields of the table's mode; ports of a protocol without
    /// ports are 0.
    fn key(&self, p: &PacketMeta) -> HashKey {
        let m = self.mode;
        let ports = has_ports(p);
        let pick = |bit: u8, v: u128| if m & bit != 0 { v } else { 0 };
        let port = |bit: u8, v: u16| if m & bit != 0 && ports { v } else { 0 };
        HashKey {
            src: pick(hashlimit_mode::SRC_IP, addr_u128(p.src) & self.srcmask),
            dst: pick(hashlimit_mode::DST_IP, addr_u128(p.dst) & self.dstmask),
            sport: port(hashlimit_mode::SRC_PORT, p.sport),
            dport: port(hashlimit_mode::DST_PORT, p.dport),
        }
    }

    /// Whether a packet of `key` conforms to the rate at `now` (taking its token when
    /// `apply`).
    fn conforms(&self, key: HashKey, now: u64, apply: bool) -> bool {
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let live = map.get(&key).copied().filter(|b| b.expires >= now);
        let tat = live.map_or(0, |b| b.tat);
        let ok = tat.saturating_sub(self.burst_ns) <= now;
        if !apply {
            return ok;
        }
        if !map.contains_key(&key) && map.len() >= self.max {
            // The kernel's garbage collector would have dropped the expired entries; when
            // none has expired, the kernel refuses a new entry and drops the packet (a
            // hotdrop), where the engine drops the entry that expires first instead
            // (docs/extensions.md).
            map.retain(|_, b| b.expires >= now);
            if map.len() >= self.max {
                if let Some(k) = map.iter().min_by_key(|(_, b)| b.expires).map(|(k, _)| *k) {
                    map.remove(&k);
                }
            }
        }
        let tat = if ok {
            tat.max(now).saturating_add(self.interval_ns)
        } else {
            tat
        };
        map.insert(
            key,
            Bucket {
                tat,
                expires: now.saturating_add(self.expire_ns),
            },
        );
        ok
    }
}

/// A compiled `-m hashlimit`: the table and the rule's own direction.
#[derive(Debug, Clone)]
pub(crate) struct CHashlimit {
    pub(crate) table: Arc<HashTable>,
    pub(crate) above: bool,
}

impl CHashlimit {
    /// As `hashlimit_mt_common` for a packet rate: under the rate matches `--hashlimit-upto`,
    /// over it `--hashlimit-above`. With `apply` false (a trace) no token is taken.
    pub(crate) fn matches(&self, p: &PacketMeta, now: u64, apply: bool) -> bool {
        let key = self.table.key(p);
        self.table.conforms(key, now, apply) != self.above
    }

    /// Whether the key reads the port bytes (a cut transport header then hotdrops).
    pub(crate) fn reads_ports(&self, p: &PacketMeta) -> bool {
        self.table.mode & (hashlimit_mode::SRC_PORT | hashlimit_mode::DST_PORT) != 0 && has_ports(p)
    }
}

/// The named tables of one snapshot's rulesets. Commit path only.
#[derive(Debug, Default, Clone)]
pub(crate) struct NamedState {
    /// By (ruleset, name).
    pub(crate) recent: HashMap<(Arc<str>, String), Arc<RecentTable>>,
    /// By (ruleset, family, name).
    pub(crate) hashlimit: HashMap<(Arc<str>, Family, String), Arc<HashTable>>,
}

impl NamedState {
    /// The tables of `prev` whose ruleset is among `rulesets`: a build's starting point.
    pub(crate) fn kept(prev: &NamedState, rulesets: &[Arc<str>]) -> NamedState {
        NamedState {
            recent: prev
                .recent
                .iter()
                .filter(|((rs, _), _)| rulesets.contains(rs))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            hashlimit: prev
                .hashlimit
                .iter()
                .filter(|((rs, _, _), _)| rulesets.contains(rs))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The tables the given compiled matches hold, each with the name of its ruleset: what a
    /// snapshot keeps for the next build.
    pub(crate) fn held<'a>(
        matches: impl Iterator<Item = (&'a Arc<str>, &'a CMatch)>,
    ) -> NamedState {
        let mut s = NamedState::default();
        for (rs, m) in matches {
            match m {
                CMatch::Recent(r) => {
                    s.recent
                        .entry((rs.clone(), r.table.name.clone()))
                        .or_insert_with(|| r.table.clone());
                }
                CMatch::Hashlimit(h) => {
                    let t = &h.table;
                    s.hashlimit
                        .entry((rs.clone(), t.family, t.name.clone()))
                        .or_insert_with(|| t.clone());
                }
                _ => {}
            }
        }
        s
    }

    /// The compiled form of `m` in ruleset `ruleset` and `family`, with its table (found, or
    /// created with this rule's configuration).
    pub(crate) fn hashlimit(
        &mut self,
        ruleset: &Arc<str>,
        family: Family,
        m: &HashlimitMatch,
    ) -> CHashlimit {
        let table = self
            .hashlimit
            .entry((ruleset.clone(), family, m.name.clone()))
            .or_insert_with(|| Arc::new(HashTable::new(m, family)))
            .clone();
        CHashlimit {
            table,
            above: m.above,
        }
    }

    /// The compiled form of `m` in ruleset `ruleset`, with its list (found, or created with
    /// the rule's mask).
    pub(crate) fn recent(&mut self, ruleset: &Arc<str>, m: &RecentMatch) -> CRecent {
        let table = self
            .recent
            .entry((ruleset.clone(), m.name.clone()))
            .or_insert_with(|| Arc::new(RecentTable::new(&m.name, m.mask, m.hitcount)))
            .clone();
        table.fit(m.hitcount);
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
    pub(crate) fn recent_len(&self, ruleset: &str, name: &str) -> Option<usize> {
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

    /// A `--hitcount` above 255 (the kernel loads up to 65535 since Linux 6.10) counts every
    /// time stamp: the list keeps as many as its largest hitcount needs, and a rule that
    /// needs more than the list keeps flushes it, as `recent_mt_check`.
    #[test]
    fn hitcounts_above_255_count_every_stamp() {
        let mut named = NamedState::default();
        let rs: Arc<str> = Arc::from("r");
        let set = named.recent(&rs, &RecentMatch::new(RecentOp::Set, Family::Ipv4));
        assert!(set.matches(&packet("10.0.0.1"), 0, true));
        let mut check = RecentMatch::new(RecentOp::Rcheck, Family::Ipv4);
        check.hitcount = 348;
        // Naming the list with a larger hitcount flushed it.
        let check = named.recent(&rs, &check);
        assert_eq!(named.recent_len("r", "DEFAULT"), Some(0));
        for i in 0..347 {
            assert!(set.matches(&packet("10.0.0.1"), i, true));
        }
        assert!(!check.matches(&packet("10.0.0.1"), 400, true), "347 stamps");
        assert!(set.matches(&packet("10.0.0.1"), 401, true));
        assert!(check.matches(&packet("10.0.0.1"), 402, true), "348 stamps");
        // A smaller hitcount keeps the list as it is.
        let mut small = RecentMatch::new(RecentOp::Rcheck, Family::Ipv4);
        small.hitcount = 3;
        let small = named.recent(&rs, &small);
        assert_eq!(named.recent_len("r", "DEFAULT"), Some(1));
        assert!(small.matches(&packet("10.0.0.1"), 403, true));
    }
}
