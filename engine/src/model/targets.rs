//! The `-j`/`-g` targets: [`Target`] and the options of LOG, NFLOG, REJECT, CONNMARK and CT.
//! Plain data, on both paths.

use super::{CtZoneSpec, MarkValue, Opaque, OpaqueOption, SetDir};

/// What a rule does when all its matches hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// No `-j`: the rule only counts.
    None,
    /// `-j ACCEPT`.
    Accept,
    /// `-j DROP`.
    Drop,
    /// `-j RETURN`.
    Return,
    /// `-j REJECT [--reject-with TYPE]`: a final drop that answers with an ICMP error or TCP RST.
    Reject(RejectWith),
    /// `-j CHAIN`: call a user chain; RETURN or its end comes back here.
    Jump(String),
    /// `-g CHAIN`: continue in a user chain; its end returns to this chain's caller.
    Goto(String),
    /// `-j LOG`: emit a log event and continue with the next rule.
    Log(LogTarget),
    /// `-j NFLOG`: emit a log event for netlink log group `group` (xt_NFLOG) and continue;
    /// the engine hands it to its caller as it hands LOG events ([`crate::snapshot::LogEvent`]
    /// with `nflog_group`).
    Nflog(NflogTarget),
    /// `-j NOTRACK` (raw table): mark the packet untracked and continue.
    Notrack,
    /// `-j CT` (raw table): `--notrack` as NOTRACK; otherwise a conntrack template (its
    /// zone) for the tracker.
    Ct(CtTarget),
    /// `-j MARK --set-xmark VALUE/MASK` (xt_MARK revision 2): the packet mark becomes
    /// `(mark & !mask) ^ value`, and the next rule runs. `--set-mark V[/M]` is `V/(V|M)`,
    /// `--and-mark V` is `0/!V`, `--or-mark V` is `V/V`, `--xor-mark V` is `V/0`, as
    /// libxt_MARK reads them; iptables-save prints `--set-xmark`.
    Mark(MarkValue),
    /// `-j CONNMARK` (xt_CONNMARK revision 1): changes the conntrack entry's mark or the packet
    /// mark, and the next rule runs. A packet without an entry (INVALID, UNTRACKED, or in the
    /// raw table) is left as it is, as connmark_tg.
    Connmark(ConnmarkTarget),
    /// nft's `KEY vmap @MAP` on a named verdict map: the verdict of the element the packet's
    /// key finds in engine set `map` (a verdict map, [`crate::sets::verdict`]); no element:
    /// the next rule runs. The map's elements change without a commit (as `nft add element`).
    /// Only the nft front end makes it ([`crate::nft::lower()`]); no iptables syntax has it.
    Vmap(VmapTarget),
    /// A target extension the engine does not implement, kept verbatim.
    Opaque(Opaque),
}

/// A [`Target::Vmap`]: the map, how the packet's key is read, and where its chain verdicts go.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VmapTarget {
    /// The engine set (a verdict map), as [`SetMatch::name`](super::SetMatch).
    pub map: String,
    /// How the key is read from the packet, one flag per dimension (as [`super::SetMatch`]).
    pub dirs: Vec<SetDir>,
    /// The chains an element's `jump NAME` / `goto NAME` can reach: the model chains named
    /// `chain_prefix` + NAME (the nft table's chains, `ip kube-proxy ` + NAME).
    pub chain_prefix: String,
}

/// The answer of `-j REJECT`. IPv4 names are `icmp-*`, IPv6 names `icmp6-*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectWith {
    /// icmp-net-unreachable / icmp6-no-route.
    NetUnreachable,
    /// icmp-host-unreachable / icmp6-addr-unreachable.
    HostUnreachable,
    /// icmp-port-unreachable / icmp6-port-unreachable (the default).
    PortUnreachable,
    /// icmp-proto-unreachable (IPv4 only).
    ProtoUnreachable,
    /// icmp-net-prohibited (IPv4 only).
    NetProhibited,
    /// icmp-host-prohibited (IPv4 only).
    HostProhibited,
    /// icmp-admin-prohibited / icmp6-adm-prohibited.
    AdminProhibited,
    /// tcp-reset.
    TcpReset,
    /// icmp6-policy-fail (IPv6 only).
    PolicyFail,
    /// icmp6-reject-route (IPv6 only).
    RejectRoute,
}

impl RejectWith {
    /// Every answer, in [`RejectWith::code`] order (code 1 first).
    pub const ALL: [RejectWith; 10] = [
        RejectWith::NetUnreachable,
        RejectWith::HostUnreachable,
        RejectWith::PortUnreachable,
        RejectWith::ProtoUnreachable,
        RejectWith::NetProhibited,
        RejectWith::HostProhibited,
        RejectWith::AdminProhibited,
        RejectWith::TcpReset,
        RejectWith::PolicyFail,
        RejectWith::RejectRoute,
    ];

    /// The answer's number, 1 to 10 (its place in [`RejectWith::ALL`]; 0 is "no answer"): what
    /// vallumd writes into the packet mark's reject field when it hands a REJECT back to the
    /// kernel's own REJECT rules (NFQUEUE, `vallumctl dataplane install --reject-mark`), so it
    /// fits 4 bits.
    pub fn code(self) -> u8 {
        match self {
            RejectWith::NetUnreachable => 1,
            RejectWith::HostUnreachable => 2,
            RejectWith::PortUnreachable => 3,
            RejectWith::ProtoUnreachable => 4,
            RejectWith::NetProhibited => 5,
            RejectWith::HostProhibited => 6,
            RejectWith::AdminProhibited => 7,
            RejectWith::TcpReset => 8,
            RejectWith::PolicyFail => 9,
            RejectWith::RejectRoute => 10,
        }
    }

    /// The answer of [`RejectWith::code`] `code`; `None` for 0 and above 10.
    pub fn from_code(code: u8) -> Option<RejectWith> {
        RejectWith::ALL
            .get(usize::from(code).checked_sub(1)?)
            .copied()
    }

    /// The `--reject-with` name iptables-save prints for this answer in `family`
    /// (`icmp-port-unreachable`, `icmp6-adm-prohibited`, `tcp-reset`); `None` where that
    /// family's REJECT has no such answer (`icmp-proto-unreachable` in IPv6, `icmp6-policy-fail`
    /// in IPv4).
    pub fn name(self, family: super::Family) -> Option<&'static str> {
        let v6 = family == super::Family::Ipv6;
        Some(match self {
            RejectWith::NetUnreachable if v6 => "icmp6-no-route",
            RejectWith::NetUnreachable => "icmp-net-unreachable",
            RejectWith::HostUnreachable if v6 => "icmp6-addr-unreachable",
            RejectWith::HostUnreachable => "icmp-host-unreachable",
            RejectWith::PortUnreachable if v6 => "icmp6-port-unreachable",
            RejectWith::PortUnreachable => "icmp-port-unreachable",
            RejectWith::ProtoUnreachable if !v6 => "icmp-proto-unreachable",
            RejectWith::NetProhibited if !v6 => "icmp-net-prohibited",
            RejectWith::HostProhibited if !v6 => "icmp-host-prohibited",
            RejectWith::AdminProhibited if v6 => "icmp6-adm-prohibited",
            RejectWith::AdminProhibited => "icmp-admin-prohibited",
            RejectWith::TcpReset => "tcp-reset",
            RejectWith::PolicyFail if v6 => "icmp6-policy-fail",
            RejectWith::RejectRoute if v6 => "icmp6-reject-route",
            _ => return None,
        })
    }
}

/// `-j LOG` options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogTarget {
    /// `--log-prefix` (at most 29 bytes).
    pub prefix: Option<String>,
    /// `--log-level` as a syslog number 0..=7 (printed as a number, as iptables-save does).
    pub level: Option<u8>,
    /// `--log-tcp-sequence`, `--log-tcp-options`, `--log-ip-options`, `--log-uid`,
    /// `--log-macdecode` as written, in iptables' print order.
    pub flags: Vec<String>,
}

/// What `-j CONNMARK` does (xt_connmark's `XT_CONNMARK_SET`, `_SAVE`, `_RESTORE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnmarkTarget {
    /// `--set-xmark VALUE/MASK` (also `--set-mark`, `--and-mark`, `--or-mark`, `--xor-mark`
    /// as for MARK): `ctmark = (ctmark & !mask) ^ value`.
    Set(MarkValue),
    /// `--save-mark --nfmask N --ctmask C`: `ctmark = (ctmark & !C) ^ (mark & N)`.
    Save {
        /// Bits of the packet mark copied.
        nfmask: u32,
        /// Bits of the connection mark replaced.
        ctmask: u32,
    },
    /// `--restore-mark --nfmask N --ctmask C`: `mark = (mark & !N) ^ (ctmark & C)`.
    Restore {
        /// Bits of the packet mark replaced.
        nfmask: u32,
        /// Bits of the connection mark copied.
        ctmask: u32,
    },
}

/// `-j NFLOG` options (xt_nflog_info), as iptables-save prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NflogTarget {
    /// `--nflog-group` (0-65535; 0, the default, is not printed).
    pub group: u16,
    /// `--nflog-prefix` (at most 63 bytes).
    pub prefix: Option<String>,
    /// `--nflog-range N` (0, the default, is not printed; superseded by `--nflog-size`).
    pub range: u32,
    /// `--nflog-size N`: bytes of the packet copied to the log (XT_NFLOG_F_COPY_LEN).
    pub size: Option<u32>,
    /// `--nflog-threshold` (packets queued in the kernel before a send; 0, the default, is
    /// not printed).
    pub threshold: u16,
}

/// `-j CT` options. Without `--notrack` the rule attaches a conntrack template to the
/// packet, as xt_ct_target: the first CT or NOTRACK rule a packet meets decides (a later one
/// finds the template and does nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtTarget {
    /// `--notrack`.
    pub notrack: bool,
    /// `--zone`, `--zone-orig`, `--zone-reply` (`None`: zone 0, which iptables-save omits).
    pub zone: Option<CtZoneSpec>,
    /// Every other option (`--helper`, `--timeout`, `--ctevents`, `--expevents`) in
    /// libxt_CT's print order, its value canonical.
    pub other: Vec<OpaqueOption>,
}

#[cfg(test)]
mod tests {
    use super::RejectWith;
    use crate::model::Family;

    /// The codes round-trip, and the names are the parser's printed ones for each family.
    #[test]
    fn reject_codes_and_names() {
        for (i, w) in RejectWith::ALL.iter().enumerate() {
            assert_eq!(usize::from(w.code()), i + 1);
            assert_eq!(RejectWith::from_code(w.code()), Some(*w));
        }
        assert_eq!(RejectWith::from_code(0), None);
        assert_eq!(RejectWith::from_code(11), None);
        for (n4, n6, w) in crate::restore::extensions::REJECT_NAMES {
            assert_eq!(w.name(Family::Ipv4), n4.first().copied(), "{w:?}");
            assert_eq!(w.name(Family::Ipv6), n6.first().copied(), "{w:?}");
        }
    }
}
