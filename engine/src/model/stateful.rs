//! Matches that keep state between packets in named tables: `-m recent` (xt_recent) and,
//! later in this file, the other rate matches. The state itself lives in the compiled
//! snapshot (`snapshot/stateful.rs`); these are the plain rule values.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Family;

/// The most time stamps a `-m recent` entry can keep (xt_recent's `XT_RECENT_MAX_NSTAMPS`,
/// 65536 since Linux 6.10, 256 before); a `--hitcount` must be below it. An entry keeps as
/// many as its list needs ([`recent_stamps`]).
pub const RECENT_MAX_STAMPS: u32 = 65_536;

/// The time stamps an entry of a list keeps when the largest `--hitcount` of its rules is
/// `hitcount`: at least 256 (what every kernel keeps for a hitcount up to 255; the answers
/// are the same for any ring of at least `hitcount` stamps), else the power of two at or
/// above `hitcount`, as `recent_mt_check`'s `nstamps_max_mask`.
pub fn recent_stamps(hitcount: u32) -> usize {
    (hitcount.max(1) as usize).next_power_of_two().max(256)
}

/// Entries a `-m recent` list holds before the least recently seen one is dropped (xt_recent's
/// `ip_list_tot` module parameter, default 100).
pub const RECENT_LIST_TOT: usize = 100;

/// Longest `--name` of `-m recent`, in bytes (xt_recent's `XT_RECENT_NAME_LEN` is 200 with
/// the terminating NUL).
pub const RECENT_NAME_MAX: usize = 199;

/// What a `-m recent` rule does with its list (xt_recent's `XT_RECENT_SET` .. `_REMOVE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecentOp {
    /// `--set`: add the address (or add a time stamp to its entry); always matches.
    Set,
    /// `--rcheck`: the address is in the list (with `--seconds` / `--hitcount`: seen recently
    /// enough, often enough).
    Rcheck,
    /// `--update`: as `--rcheck`, and when it matches, add a time stamp.
    Update,
    /// `--remove`: the address is in the list, and its entry is removed.
    Remove,
}

impl RecentOp {
    /// The option as iptables-save prints it.
    pub fn option(self) -> &'static str {
        match self {
            RecentOp::Set => "--set",
            RecentOp::Rcheck => "--rcheck",
            RecentOp::Update => "--update",
            RecentOp::Remove => "--remove",
        }
    }
}

/// `-m recent` (xt_recent revision 1, as libxt_recent 1.8.9 writes it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecentMatch {
    /// `!` before the operation: the match's result is inverted (the list is still changed).
    pub negated: bool,
    /// The operation.
    pub op: RecentOp,
    /// `--seconds N`: only time stamps at most N seconds old count (0: not given).
    pub seconds: u32,
    /// `--reap`: drop the list's least recently seen entry when it is older than `seconds`.
    pub reap: bool,
    /// `--hitcount N`: at least N counted time stamps (0: not given; below
    /// [`RECENT_MAX_STAMPS`]).
    pub hitcount: u32,
    /// `--rttl`: the entry must also have been made by a packet of the same TTL.
    pub rttl: bool,
    /// `--name NAME` (default `DEFAULT`): the list; one list per name and ruleset, shared by
    /// IPv4 and IPv6 rules as the kernel's per-namespace tables are.
    pub name: String,
    /// `--mask ADDR` (default all ones of the family): the address is masked before it is
    /// looked up. The list keeps the mask of the rule that created it, as the kernel.
    pub mask: IpAddr,
    /// `--rdest`: the destination address (default `--rsource`: the source).
    pub dest: bool,
}

impl RecentMatch {
    /// `--set` on the list `DEFAULT`, as libxt_recent's defaults for `family`.
    pub fn new(op: RecentOp, family: Family) -> RecentMatch {
        RecentMatch {
            negated: false,
            op,
            seconds: 0,
            reap: false,
            hitcount: 0,
            rttl: false,
            name: "DEFAULT".into(),
            mask: full_mask(family),
            dest: false,
        }
    }

    /// What xt_recent's `recent_mt_check` and `xt_check_proc_name` refuse, as a reason; `None`
    /// when the kernel loads it.
    pub fn kernel_refusal(&self) -> Option<&'static str> {
        let modifiers = self.seconds != 0 || self.hitcount != 0 || self.rttl || self.reap;
        if matches!(self.op, RecentOp::Set | RecentOp::Remove) && modifiers {
            return Some(
                "--set and --remove take no --seconds, --hitcount, --rttl or --reap (the kernel refuses them)",
            );
        }
        if self.reap && self.seconds == 0 {
            return Some("--reap needs --seconds");
        }
        if self.hitcount >= RECENT_MAX_STAMPS {
            return Some("--hitcount is at most 65535 (xt_recent's XT_RECENT_MAX_NSTAMPS)");
        }
        let n = &self.name;
        if n.is_empty() || n.len() > RECENT_NAME_MAX {
            return Some("--name must be 1 to 199 bytes");
        }
        if n == "." || n == ".." || n.contains('/') {
            return Some(
                "--name may not be \".\", \"..\" or contain \"/\" (it names a /proc file)",
            );
        }
        if n.chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'')
        {
            return Some("--name may not contain blanks, quotes or control characters");
        }
        None
    }
}

/// All ones of the family's address width.
pub fn full_mask(family: Family) -> IpAddr {
    match family {
        Family::Ipv4 => IpAddr::V4(Ipv4Addr::BROADCAST),
        Family::Ipv6 => IpAddr::V6(Ipv6Addr::from(u128::MAX)),
    }
}

/// Time units of `--hashlimit-upto/-above` periods: microseconds (xt_hashlimit's
/// `XT_HASHLIMIT_SCALE_v2`, revisions 2 and 3).
pub const HASHLIMIT_SCALE: u64 = 1_000_000;

/// Longest `--hashlimit-name`, in bytes (`XT_HASHLIMIT_NAME_LEN` is 32 with the NUL).
pub const HASHLIMIT_NAME_MAX: usize = 31;

/// The largest `--hashlimit-burst` of a packet rate (libxt_hashlimit's
/// `XT_HASHLIMIT_BURST_MAX` for revisions 2 and 3, which iptables 1.8.9 loads).
pub const HASHLIMIT_BURST_MAX: u32 = 1_000_000;

/// `--hashlimit-mode` bits (our own numbering; printed in xt_hashlimit's order srcip,
/// srcport, dstip, dstport).
pub mod hashlimit_mode {
    /// `srcip`.
    pub const SRC_IP: u8 = 1;
    /// `srcport`.
    pub const SRC_PORT: u8 = 2;
    /// `dstip`.
    pub const DST_IP: u8 = 4;
    /// `dstport`.
    pub const DST_PORT: u8 = 8;
    /// The names, in print order, with their bits.
    pub const NAMES: [(&str, u8); 4] = [
        ("srcip", SRC_IP),
        ("srcport", SRC_PORT),
        ("dstip", DST_IP),
        ("dstport", DST_PORT),
    ];
}

/// `-m hashlimit` with a packet rate (xt_hashlimit revision 3, as libxt_hashlimit 1.8.9
/// writes it): a token bucket per hash key (the fields of `mode`, addresses masked), in a
/// named table. Byte rates (`--hashlimit-upto 4kb/s`) and `--hashlimit-rate-match` are kept
/// as an opaque match (stored only).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HashlimitMatch {
    /// `--hashlimit-above` (or `! --hashlimit-upto`): matches when the key is over its rate.
    pub above: bool,
    /// The period between two packets at the average rate, in microseconds
    /// ([`HASHLIMIT_SCALE`] per second divided by the rate, rounded down).
    pub avg: u64,
    /// `--hashlimit-burst` (default 5), 1 to [`HASHLIMIT_BURST_MAX`].
    pub burst: u32,
    /// `--hashlimit-mode` ([`hashlimit_mode`] bits; 0: one bucket for every packet).
    pub mode: u8,
    /// `--hashlimit-name` (mandatory): the table; one per (ruleset, family, name).
    pub name: String,
    /// `--hashlimit-htable-size` (0: the kernel's default).
    pub size: u32,
    /// `--hashlimit-htable-max`: most entries (0: the kernel's default, 8 times the size).
    pub max: u32,
    /// `--hashlimit-htable-gcinterval` in ms (default 1000).
    pub gc_interval: u32,
    /// `--hashlimit-htable-expire` in ms: an entry idle that long is dropped (default: the
    /// rate's unit, as written, in ms).
    pub expire: u32,
    /// `--hashlimit-srcmask`: prefix length of the source address in the key; `None` is the
    /// family's width (the default, which iptables-save does not print; the parser stores a
    /// written width as `None`).
    pub srcmask: Option<u8>,
    /// `--hashlimit-dstmask`, as `srcmask`.
    pub dstmask: Option<u8>,
}

/// `HZ * CREDITS_PER_JIFFY / XT_HASHLIMIT_SCALE_v2` of xt_hashlimit's `user2credits` for
/// revisions 2 and 3: `2^37 * 1000 / 10^6` with `CONFIG_HZ` 1000 and `2^39 * 250 / 10^6` with
/// 250 (the same number; the kernels distributions ship use one of the two).
const HASHLIMIT_CREDITS_PER_UNIT: u64 = 137_438_953;

/// xt_hashlimit's check "overflow, try lower" for a packet rate (`hashlimit_mt_check_common`):
/// `user2credits(avg * burst) < user2credits(avg)` in the kernel's wrapping 64-bit
/// arithmetic. It refuses some large bursts of slow rates (`1/day` with a burst of 1000000)
/// and not others (`1/hour` with the same burst), as the kernel does.
pub fn hashlimit_overflows(avg: u64, burst: u32) -> bool {
    let credits = |user: u64| user.wrapping_mul(HASHLIMIT_CREDITS_PER_UNIT);
    burst == 0 || credits(avg.wrapping_mul(u64::from(burst))) < credits(avg)
}

impl HashlimitMatch {
    /// What xt_hashlimit's `hashlimit_mt_check_common` refuses, as a reason.
    pub fn kernel_refusal(&self, family: Family) -> Option<&'static str> {
        let width = if family == Family::Ipv4 { 32 } else { 128 };
        if self.gc_interval == 0 || self.expire == 0 {
            return Some("--hashlimit-htable-gcinterval and -expire must not be 0");
        }
        if self.srcmask.unwrap_or(0) > width || self.dstmask.unwrap_or(0) > width {
            return Some("a mask is longer than the family's addresses");
        }
        if self.burst == 0 || self.burst > HASHLIMIT_BURST_MAX {
            return Some("--hashlimit-burst is 1 to 1000000");
        }
        if self.avg == 0 || self.avg > HASHLIMIT_SCALE * 86_400 {
            return Some("the rate is 1/day to 1000000/sec");
        }
        if hashlimit_overflows(self.avg, self.burst) {
            return Some(
                "the rate times --hashlimit-burst overflows the kernel's credits (xt_hashlimit: \"overflow, try lower\"); lower the burst or raise the rate",
            );
        }
        if self.mode & !0x0f != 0 {
            return Some("--hashlimit-mode holds unknown bits");
        }
        let n = &self.name;
        if n.is_empty() || n.len() > HASHLIMIT_NAME_MAX {
            return Some("--hashlimit-name must be 1 to 31 bytes");
        }
        if n == "." || n == ".." || n.contains('/') {
            return Some(
                "--hashlimit-name may not be \".\", \"..\" or contain \"/\" (it names a /proc file)",
            );
        }
        if n.chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'')
        {
            return Some("--hashlimit-name may not contain blanks, quotes or control characters");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this kernel (6.18, CONFIG_HZ 1000) answered with iptables-legacy-restore: `1/day`
    /// with a burst of 1000000 is refused ("overflow"), `1/hour` and faster are loaded.
    #[test]
    fn hashlimit_overflow_is_the_kernels() {
        let day = HASHLIMIT_SCALE * 86_400;
        assert!(hashlimit_overflows(day, 1_000_000));
        for unit in [3600, 60, 1] {
            assert!(
                !hashlimit_overflows(HASHLIMIT_SCALE * unit, 1_000_000),
                "{unit}"
            );
        }
        assert!(!hashlimit_overflows(HASHLIMIT_SCALE, 14_497));
        assert!(!hashlimit_overflows(1, 1_000_000), "1000000/sec");
        assert!(hashlimit_overflows(HASHLIMIT_SCALE, 0));
    }

    #[test]
    fn recent_stamps_follow_the_largest_hitcount() {
        assert_eq!(recent_stamps(0), 256);
        assert_eq!(recent_stamps(255), 256);
        assert_eq!(recent_stamps(256), 256);
        assert_eq!(recent_stamps(257), 512);
        assert_eq!(recent_stamps(348), 512);
        assert_eq!(recent_stamps(65_535), 65_536);
    }
}
