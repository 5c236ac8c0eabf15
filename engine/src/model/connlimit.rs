//! `-m connlimit` (xt_connlimit revision 1 with nf_conncount): the plain rule value. The
//! per-rule lists of connections live in the compiled snapshot (`eval/connlimit.rs`).

/// `-m connlimit`, as libxt_connlimit 1.8.9 writes it (`connlimit_save`): matches when the
/// number of the rule's connections that share the packet's masked address is above
/// [`ConnlimitMatch::limit`] (`--connlimit-above`) or at most it (`--connlimit-upto`).
///
/// What counts (as nf_conncount): the connections (conntrack original tuples) whose packets
/// reached this rule, grouped by the packet's source address (`--connlimit-saddr`, the
/// default) or destination address (`--connlimit-daddr`) masked to `prefix` bits, while their
/// conntrack entry lives and, for TCP, is not in TIME_WAIT or CLOSE; the packet's own
/// connection counts too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnlimitMatch {
    /// `N` of `--connlimit-above N` / `--connlimit-upto N` (0 to 2^32-1).
    pub limit: u32,
    /// `--connlimit-upto` (or `! --connlimit-above`): matches when the count is at most
    /// `limit` (xt_connlimit's `XT_CONNLIMIT_INVERT`); `false`: above it.
    pub upto: bool,
    /// `--connlimit-mask LEN`: prefix length of the grouping address (default: the family's
    /// width, 32 or 128).
    pub prefix: u8,
    /// `--connlimit-daddr`: group by destination address (`XT_CONNLIMIT_DADDR`); `false`:
    /// `--connlimit-saddr`, by source.
    pub daddr: bool,
}

impl ConnlimitMatch {
    /// Whether a count of `connections` makes the rule match (`connlimit_mt`:
    /// `(connections > limit) ^ invert`).
    pub fn decides(&self, connections: u64) -> bool {
        (connections > u64::from(self.limit)) != self.upto
    }
}
