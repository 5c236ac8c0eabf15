//! Match and target extensions: option parsing, the checks iptables and the kernel make, and
//! canonical values (so that printing and re-parsing gives the same model).
//!
//! This file holds the one list of extension names the parser knows ([`KNOWN_MATCHES`],
//! [`KNOWN_TARGETS`], [`OPAQUE_MATCHES`], [`OPAQUE_TARGETS`]); `super::support` loads each
//! name through the parser and derives from what it produces the table of which extensions are
//! enforced, stored only, or refused (`docs/extensions.md`, checked by
//! `tests/it/support_table.rs`). The code is in three files:
//!
//! - `extensions/values.rs`: value parsers (numbers, ports, addresses, protocols, names of
//!   flags, states, ICMP types, rates, marks, MACs) with iptables' grammar for each;
//! - `extensions/matches.rs`: `-m NAME` and its options ([`new_match`], [`match_option`],
//!   [`finish_match`]);
//! - `extensions/targets.rs`: `-j NAME` and its options ([`new_target`], [`target_option`],
//!   [`finish_target`]).
//!
//! Known extensions (model variants): matches tcp, udp, multiport, icmp, icmp6, conntrack,
//! state, iprange, set, comment, mark, length, limit, mac, and the IP-header matches ttl, hl,
//! tos, dscp, ecn, ah, frag, rt, ipv6header (collected like opaque options, then read by
//! `super::header_matches`); targets ACCEPT, DROP, RETURN, REJECT, LOG, NOTRACK, CT. Other
//! extensions iptables ships are kept as [`Opaque`](crate::model::Opaque) with their options
//! verbatim, except those `super::opaque` rewrites into iptables-save's form (statistic, MARK,
//! CONNMARK, TOS, DSCP, CLASSIFY, connmark); a name that is no extension at all is an error
//! ("Couldn't load match").
//!
//! Parse time only: nothing here is on the packet path.

mod matches;
mod targets;
mod values;

pub(crate) use matches::{
    MatchState, finish_match, is_opaque, match_option, new_match, opaque_option,
};
pub(crate) use targets::{
    PendingTarget, REJECT_NAMES, finish_target, new_target, opaque_target_option, target_option,
};
pub(crate) use values::{
    CT_STATE_NAMES, TCP_FLAG_NAMES, parse_addr, parse_net, parse_port, parse_protocol, parse_range,
    parse_uint, port_range, proto_extension, protocol_name, rate_unit_name, service_port,
};

use super::ParseError;
use super::ParseErrorKind as K;
use super::rule::{Args, Ctx};

/// Options an extension already saw: bit `k` is the option with key `k`. Keys are numbered per
/// extension; options that exclude each other (`--syn`, `--tcp-flags`) share one.
pub(super) type Seen = u32;

/// Match extensions with their own [`Match`] variant from the start of parsing (`new_match`);
/// `header_matches` adds those read from opaque options at the end of the line.
pub(crate) const KNOWN_MATCHES: &[&str] = &[
    "tcp",
    "udp",
    "multiport",
    "icmp",
    "icmp6",
    "conntrack",
    "state",
    "iprange",
    "set",
    "comment",
    "mark",
    "length",
    "limit",
    "mac",
];

/// Target extensions with their own [`Target`] variant (`new_target`).
pub(crate) const KNOWN_TARGETS: &[&str] = &[
    "ACCEPT", "DROP", "RETURN", "REJECT", "LOG", "NFLOG", "NOTRACK", "CT",
];

/// Match extensions iptables 1.8.11 ships that the engine keeps as [`Match::Opaque`] (or
/// reads into a typed match in `header_matches`).
pub(crate) const OPAQUE_MATCHES: &[&str] = &[
    "addrtype",
    "ah",
    "bpf",
    "cgroup",
    "cluster",
    "connbytes",
    "connlabel",
    "connlimit",
    "connmark",
    "cpu",
    "dccp",
    "devgroup",
    "dscp",
    "dst",
    "ecn",
    "esp",
    "eui64",
    "frag",
    "hashlimit",
    "hbh",
    "helper",
    "hl",
    "ipcomp",
    "ipv6header",
    "ipvs",
    "mh",
    "nfacct",
    "osf",
    "owner",
    "physdev",
    "pkttype",
    "policy",
    "quota",
    "rateest",
    "realm",
    "recent",
    "rpfilter",
    "rt",
    "sctp",
    "socket",
    "statistic",
    "string",
    "tcpmss",
    "time",
    "tos",
    "ttl",
    "u32",
    "udplite",
];

/// Target extensions iptables 1.8.11 ships that the engine keeps as [`Target::Opaque`].
pub(crate) const OPAQUE_TARGETS: &[&str] = &[
    "AUDIT",
    "CHECKSUM",
    "CLASSIFY",
    "CLUSTERIP",
    "CONNMARK",
    "CONNSECMARK",
    "DNAT",
    "DNPT",
    "DSCP",
    "ECN",
    "HL",
    "HMARK",
    "IDLETIMER",
    "LED",
    "MARK",
    "MASQUERADE",
    "NETMAP",
    "NFQUEUE",
    "QUEUE",
    "RATEEST",
    "REDIRECT",
    "SECMARK",
    "SET",
    "SNAT",
    "SNPT",
    "SYNPROXY",
    "TCPMSS",
    "TCPOPTSTRIP",
    "TEE",
    "TOS",
    "TPROXY",
    "TRACE",
    "TTL",
    "ULOG",
];

/// Opaque extensions that iptables refuses without any option (each `.t` file has a bare
/// `-m NAME;;FAIL` / `-j NAME;;FAIL` line for them).
pub(super) const OPAQUE_NEEDS_OPTION: &[&str] = &[
    "addrtype",
    "connbytes",
    "connlimit",
    "hashlimit",
    "helper",
    "hl",
    "pkttype",
    "quota",
    "string",
    "ttl",
    "DNAT",
    "SNAT",
    "TCPMSS",
];

/// Whether a name is a target (user chains may not be named like one).
pub(crate) fn is_target_name(name: &str) -> bool {
    KNOWN_TARGETS.contains(&name) || OPAQUE_TARGETS.contains(&name)
}

/// Records the option with key `key` (a bit number of [`Seen`]); `Err` when given twice or
/// negated where it cannot be.
pub(super) fn once(
    seen: &mut Seen,
    key: usize,
    negated: bool,
    negatable: bool,
    args: &Args<'_, '_>,
    ctx: &Ctx<'_>,
    opt: &str,
) -> Result<(), ParseError> {
    let t = &args.opt_token();
    if negated && !negatable {
        return Err(ctx.err(t, K::BadNegation));
    }
    if *seen & (1 << key) != 0 {
        return Err(ctx.err(t, K::DuplicateOption(opt.to_string())));
    }
    *seen |= 1 << key;
    Ok(())
}
