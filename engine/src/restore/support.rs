//! Which iptables extensions the engine enforces, keeps for storage only, or does not know: the
//! table `docs/extensions.md` is generated from ([`support_markdown`]; the test
//! `tests/it/support_table.rs` fails when the file and this table differ).
//!
//! The rows are derived from what the parser does: every name [`super::extensions`] knows
//! (its typed matches and targets and its opaque lists) is loaded with `-m NAME` / `-j NAME`
//! in each family and classified by the model value it produces, so the table cannot drift from
//! the parser.

use crate::model::{Family, Match, TableKind, Target};

use super::extensions::{self, KNOWN_MATCHES, KNOWN_TARGETS, OPAQUE_MATCHES, OPAQUE_TARGETS};
use super::header_matches;
use super::lexer::Tok;
use super::rule::Ctx;

/// How the engine supports an extension in one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Parsed, printed as iptables-save and enforced in every table the engine runs (filter,
    /// raw); `note` names options that are only stored (refused by validation there).
    Enforced {
        /// Options that are stored only, or empty.
        note: &'static str,
    },
    /// Enforced as [`Support::Enforced`], decided from facts the kernel gives: with each
    /// packet (NFQUEUE's uid/gid, bridge ports, the NAT bits and original tuple of the
    /// kernel's conntrack entry) or about the host (its addresses and routes, read over
    /// rtnetlink). Packet sources without them (pcap, synthetic) decide as the note says.
    WithKernel {
        /// What the kernel gives, and what is stored only.
        note: &'static str,
    },
    /// Parsed and printed verbatim (or in iptables-save's canonical form) for the stored-only
    /// tables (nat, mangle, security); validation refuses it in filter and raw, naming it.
    StoredOnly,
    /// The family's iptables has no such extension: "Couldn't load match/target".
    Refused,
}

impl Support {
    /// Whether the engine runs it in filter and raw ([`Support::Enforced`] or
    /// [`Support::WithKernel`]).
    pub fn is_enforced(self) -> bool {
        matches!(self, Support::Enforced { .. } | Support::WithKernel { .. })
    }
}

/// Matches the engine decides from the kernel's facts ([`Support::WithKernel`]).
const WITH_KERNEL: &[&str] = &[
    "addrtype",
    "conntrack",
    "owner",
    "physdev",
    "pkttype",
    "rpfilter",
];

/// Matches kept opaque that the kernel's steering decides (`crate::kernel_decided`).
const KERNEL_DECIDED: &[&str] = &["policy"];

/// One row of the support table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupportRow {
    /// `true` for a target (`-j`), `false` for a match (`-m`).
    pub target: bool,
    /// The extension name.
    pub name: &'static str,
    /// In IPv4 (iptables).
    pub ipv4: Support,
    /// In IPv6 (ip6tables).
    pub ipv6: Support,
}

/// Options of enforced extensions that are only stored (validation refuses them in filter and
/// raw): the conntrack, set, rt and CT options the engine does not run.
fn note(target: bool, name: &str) -> &'static str {
    match (target, name) {
        (false, "conntrack") => {
            "with vallumd's `--nfqueue-facts-mark` (NFQUEUE), the kernel decides in filter every conntrack match with `--ctstatus`, `--ctexpire`, `--ctstate DNAT`/`SNAT` or a `--ctorig*`/`--ctrepl*` option, one mark bit per distinct expression (`vallum_engine::kernel_decided`); without it `--ctstatus` and `--ctexpire` are stored only; the tuples (`--ctorig*`, `--ctrepl*`, `--ctdir`) are the engine tracker's, which sees packets after the kernel's NAT, except `--ctorigdst`/`--ctorigdstport` of a connection the kernel DNATed, read from the kernel's entry (NFQUEUE's NFQA_CT; needs nf_conntrack_netlink, else they are the translated ones); `--ctrepl*` of an SNATed connection are the engine's"
        }
        (false, "set") => "`--match-set` is enforced; further options are stored only",
        (false, "rt") => "`--rt-0-res`, `--rt-0-addrs`, `--rt-0-not-strict` are stored only",
        (false, "addrtype") => {
            "IPv4: every type, from the node's local table (its anycast, multicast, unicast and reject routes too; BLACKHOLE, UNREACHABLE, PROHIBIT, THROW, NAT, XRESOLVE and UNSPEC never match, as in the kernel); IPv6: UNSPEC, UNICAST, LOCAL, MULTICAST; IPv6 ANYCAST and UNREACHABLE are decided by the kernel with vallumd's `--nfqueue-facts-mark` (`vallum_engine::kernel_decided`), refused in filter/raw without it"
        }
        (false, "rpfilter") => {
            "raw PREROUTING (mangle: stored only); decided against the node's routing rules and tables (`vallum_engine::fib`), read from the host over rtnetlink or given with `--routes`"
        }
        (false, "pkttype") => {
            "the class is derived from the destination address (multicast, limited or local-table broadcast, else unicast; sent and forwarded packets unicast), not from the frame's MAC: NFQUEUE does not give the destination MAC (validation warns)"
        }
        (false, "recent") => {
            "lists per ruleset kept across commits; 100 entries a list, 256 time stamps an entry (the kernel's defaults)"
        }
        (false, "hashlimit") => {
            "packet rates; byte rates (`b/s`) and `--hashlimit-rate-match` are stored only; tables per ruleset kept across commits"
        }
        (false, "string") => {
            "`--algo bm` and `kmp` (one searcher, the same answers); the bytes NFQUEUE hands (other sources and traces have none: `--string` is false)"
        }
        (false, "u32") => {
            "as xt_u32 over the bytes NFQUEUE hands (other sources and traces have none: `--u32` is false)"
        }
        (false, "sctp") => {
            "ports and `--chunk-types` (any/all/only, with flags) as xt_sctp; the chunks are read from the bytes NFQUEUE hands (other sources and traces have none: `--chunk-types` is false); a packet whose SCTP header or a chunk header is cut matches no rule where the kernel drops it"
        }
        (false, "connlimit") => {
            "the engine's conntrack entries, per rule as nf_conncount; NFQUEUE mode counts what vallumd tracked, not the kernel's table"
        }
        (false, "policy") => {
            "filter only, with vallumd's `--nfqueue-facts-mark` (NFQUEUE): the kernel's steering evaluates the match (the packet's IPsec state is the kernel's) and hands one mark bit per distinct expression (`vallum_engine::kernel_decided`); `--dir in` not at OUTPUT, `--dir out` not at INPUT; without the field refused in filter, stored elsewhere"
        }
        (false, "frag") => "`--fraglen` is stored and not compared, as the kernel's frag_mt6",
        (false, "connmark") => "never matches in raw (no conntrack entry before conntrack runs)",
        (true, "CONNMARK") => {
            "`--left-shift-mark`/`--right-shift-mark` are stored only; does nothing in raw (no conntrack entry yet)"
        }
        (false, "owner") => {
            "OUTPUT/POSTROUTING; uid/gid from NFQUEUE's NFQA_UID/NFQA_GID; user and group names looked up on vallumd's host at commit (as iptables at load) and kept as numbers; `--suppl-groups` stored only"
        }
        (false, "physdev") => {
            "bridge ports from NFQUEUE's NFQA_PHYSINDEV/NFQA_PHYSOUTDEV (bridged traffic with br_netfilter); pcap and synthetic packets carry none, so they are not bridged"
        }
        (true, "NFLOG") => {
            "counted, events handed to the caller like LOG events (vallumd has no consumer yet: validation warns)"
        }
        (true, "MARK") => "the mark goes back to the kernel with the NFQUEUE verdict",
        (true, "CT") => {
            "raw table; `--notrack` and `--zone`/`--zone-orig`/`--zone-reply` (the zone is part of the engine's conntrack key) are enforced; `--helper` is accepted with a warning (no ALG runs: expected connections are NEW, not RELATED); `--timeout`, `--ctevents`, `--expevents` are stored only"
        }
        (true, "REJECT") => "filter table only",
        (true, "NOTRACK") => "raw table only",
        _ => "",
    }
}

/// Why an extension (or a target's option) that real rulesets use is stored only, not
/// enforced: validation names it in its refusal and the support table prints it.
pub(crate) fn why_not_enforced(target: bool, name: &str) -> Option<&'static str> {
    Some(match (target, name) {
        (false, "hashlimit") => "byte rates and --hashlimit-rate-match are not enforced",
        (true, "CT --timeout") => "the engine's tracker has no timeout policies",
        (true, "CT --ctevents") | (true, "CT --expevents") => {
            "the engine's tracker sends no conntrack events"
        }
        _ => return None,
    })
}

/// Extensions collected as opaque options and then read into a typed match (`header_matches`,
/// `addrtype`).
fn typed_from_opaque(name: &str, family: Family) -> bool {
    matches!(
        name,
        "addrtype"
            | "recent"
            | "hashlimit"
            | "owner"
            | "connlimit"
            | "string"
            | "sctp"
            | "u32"
            | "rpfilter"
            | "pkttype"
            | "physdev"
    ) || header_matches::is_typed(name, family)
        || super::opaque::TYPED_MATCHES.contains(&name)
}

fn support_of_match(name: &'static str, family: Family) -> Support {
    let ctx = Ctx {
        family,
        table: TableKind::Filter,
        line: 1,
        set_exists: None,
        resolve_owner: None,
    };
    let tok = Tok {
        text: name,
        column: 1,
    };
    match extensions::new_match(name, &tok, &ctx) {
        Err(_) => Support::Refused,
        // Decided by the kernel's steering (`crate::kernel_decided`), kept opaque.
        Ok((Match::Opaque(_), _)) if KERNEL_DECIDED.contains(&name) => Support::WithKernel {
            note: note(false, name),
        },
        Ok((Match::Opaque(_), _)) if !typed_from_opaque(name, family) => Support::StoredOnly,
        Ok(_) if WITH_KERNEL.contains(&name) => Support::WithKernel {
            note: note(false, name),
        },
        Ok(_) => Support::Enforced {
            note: note(false, name),
        },
    }
}

fn support_of_target(name: &'static str, family: Family) -> Support {
    let tok = Tok {
        text: name,
        column: 1,
    };
    // NOTRACK and CT load only in raw, REJECT only in filter: either will do.
    let load = |table| {
        let ctx = Ctx {
            family,
            table,
            line: 1,
            set_exists: None,
            resolve_owner: None,
        };
        extensions::new_target(&tok, &ctx)
            .ok()
            .flatten()
            .map(|t| t.t)
    };
    match load(TableKind::Filter).or_else(|| load(TableKind::Raw)) {
        None => Support::Refused,
        Some(Target::Opaque(_)) if !super::opaque::TYPED_TARGETS.contains(&name) => {
            Support::StoredOnly
        }
        Some(_) => Support::Enforced {
            note: note(true, name),
        },
    }
}

/// Every extension the parser knows, matches then targets, each sorted by name.
pub fn support_table() -> Vec<SupportRow> {
    let mut matches: Vec<&'static str> = KNOWN_MATCHES
        .iter()
        .chain(OPAQUE_MATCHES)
        .copied()
        .collect();
    matches.sort_unstable();
    matches.dedup();
    let mut targets: Vec<&'static str> = KNOWN_TARGETS
        .iter()
        .chain(OPAQUE_TARGETS)
        .copied()
        .collect();
    targets.sort_unstable();
    targets.dedup();
    let m = matches.into_iter().map(|name| SupportRow {
        target: false,
        name,
        ipv4: support_of_match(name, Family::Ipv4),
        ipv6: support_of_match(name, Family::Ipv6),
    });
    let t = targets.into_iter().map(|name| SupportRow {
        target: true,
        name,
        ipv4: support_of_target(name, Family::Ipv4),
        ipv6: support_of_target(name, Family::Ipv6),
    });
    m.chain(t).collect()
}

fn cell(s: Support) -> &'static str {
    match s {
        Support::Enforced { .. } => "enforced",
        Support::WithKernel { .. } => "enforced, kernel's facts",
        Support::StoredOnly => "stored only",
        Support::Refused => "-",
    }
}

/// The text of `docs/extensions.md`.
pub fn support_markdown() -> String {
    let mut out = String::from(
        "# Extension support\n\n\
         Generated from the parser's own tables by `vallum_engine::restore::support_markdown`\n\
         (the test `engine/tests/it/support_table.rs` fails when this file differs; run it with\n\
         `VALLUM_BLESS=1` to rewrite it). Do not edit by hand.\n\n\
         - **enforced**: parsed with iptables 1.8.9's grammar, printed as iptables-save prints it,\n  \
         validated, and run by the engine in the tables it enforces (filter, raw).\n\
         - **enforced, kernel's facts**: enforced, decided from what the kernel gives with each\n  \
         packet (NFQUEUE's uid/gid, bridge ports, its conntrack entry's NAT bits and original\n  \
         tuple) or about the host (addresses, routes): see the note.\n\
         - **stored only**: parsed and printed (in iptables-save's canonical form where the\n  \
         engine knows it, otherwise verbatim) so that nat, mangle and security tables import and\n  \
         export faithfully; in filter or raw, validation refuses the rule with an error naming the\n  \
         extension (`UNSUPPORTED`), so nothing is accepted that would not be enforced.\n\
         - **-**: that family's iptables has no such extension; the parser refuses it\n  \
         (\"Couldn't load match\").\n\n\
         `addrtype` decides the types the node's local routing table and the address bits tell\n\
         (see `vallum_engine::node_addrs`): vallumd reads the host's local table (or takes\n\
         `--local-addresses`) and the packet path reads it without a lock. For IPv4 that is\n\
         every type: as the kernel's `inet_dev_addr_type`, an address's type is the type of the\n\
         local table's longest route (LOCAL, BROADCAST, ANYCAST, MULTICAST; UNICAST for a\n\
         `unicast` route, a reject route and no route), so BLACKHOLE, UNREACHABLE, PROHIBIT,\n\
         THROW, NAT, XRESOLVE and UNSPEC never match. IPv6 ANYCAST and UNREACHABLE need a lookup\n\
         in the whole routing table: with vallumd's `--nfqueue-facts-mark` the kernel decides\n\
         them (below); without it validation refuses them in filter and raw, naming them; nat\n\
         and mangle store them.\n\n\
         `rpfilter` (raw PREROUTING; mangle stores it) decides as the kernel's `ipt_rpfilter` /\n\
         `ip6t_rpfilter` against the node's routing rules and tables (`vallum_engine::fib`):\n\
         vallumd reads them from the host over rtnetlink with the addresses (every packet\n\
         source; in NFQUEUE mode they are the tables the kernel routes the packet with), or\n\
         takes `--routes`; with `--local-addresses` and no `--routes` it has none and\n\
         validation refuses rpfilter in raw. Honoured: loopback input, the DHCP/IGMP `0.0.0.0`\n\
         exceptions, local sources only with `--accept-local`, `--loose` (any device), the mark\n\
         with `--validmark` (for `fwmark` rules), IPv6 link-local sources (the input device's\n\
         routes only), policy rules (`from`, `to`, `fwmark`, `iif`, `oif`, `tos`, `not`,\n\
         `suppress_prefixlength`, `blackhole`/`unreachable`/`prohibit`, `throw` routes). Not\n\
         modelled (such a rule never matches, such a route is left out): VRFs (`l3mdev`),\n\
         `goto` rules, `ipproto`/port rules (the kernel's IPv6 flow carries the next header),\n\
         IPv4 routes with a TOS, IPv6 source-specific routes, nexthop objects (`nhid`).\n\n\
         `-m policy`, the conntrack matches that read the kernel's entry (`--ctstatus`,\n\
         `--ctexpire`, `--ctstate DNAT`/`SNAT`, `--ctorig*`, `--ctrepl*`) and IPv6 `-m addrtype`\n\
         with ANYCAST or UNREACHABLE are decided by the\n\
         kernel when vallumd runs with `--nfqueue-facts-mark` and the steering was installed\n\
         with `vallumctl dataplane install --facts-mark` (see `vallum_engine::kernel_decided`):\n\
         each distinct expression gets one bit of that mark field; the steering's\n\
         `VALLUM-FACTS-<HOOK>` chain sets it when the kernel's own match holds, before the\n\
         packet is queued, and the engine's rule reads the bit. A ruleset that needs more\n\
         distinct expressions than the field has bits is refused at the rule.\n\n\
         `pkttype` reads the packet's class from its destination address, because no packet\n\
         source gives the engine the frame's destination MAC (NFQUEUE sends only the source):\n\
         received packets (PREROUTING, INPUT) are multicast for a multicast destination,\n\
         broadcast for `255.255.255.255` or a `broadcast` address of the local table, else\n\
         unicast; sent and forwarded packets are unicast (the kernel's `PACKET_HOST`). This is\n\
         where it can differ from the kernel: a frame whose MAC and IP destinations disagree\n\
         (an L2 broadcast or multicast carrying a unicast IP, a unicast MAC carrying a\n\
         broadcast IP); validation warns on every pkttype rule that receives packets.\n\n\
         `recent` and `hashlimit` keep their tables per ruleset in the engine (not in the\n\
         kernel), across commits as conntrack does, while some rule names them; a ruleset that is\n\
         removed drops them. As in the kernel, a recent list keeps the mask of the rule that\n\
         created it and a hashlimit table the whole configuration of its first rule (rename it to\n\
         change a rate). Where the engine differs: a hashlimit entry expires exactly `expire` ms\n\
         after its last packet (the kernel's collector runs every `gcinterval` ms); a full\n\
         hashlimit table drops the entry that expires first where the kernel drops the packet;\n\
         ports of ESP/AH packets in a port mode are 0 (the kernel hashes their SPI); a trace is a\n\
         dry run for both: it reads the tables and changes nothing, so a rule after a `--set` of\n\
         the same packet does not see that time stamp.\n\n\
         `connlimit` counts, per rule and masked address, the connections whose packets reached\n\
         the rule (nf_conncount's lists) while the engine's conntrack table holds them and, for\n\
         TCP, not in TIME_WAIT or CLOSE; the packet's own connection counts. NFQUEUE mode asks\n\
         vallumd's own table, not the kernel's; a recompiled rule starts with empty lists (as an\n\
         `iptables-restore` does); see `vallum_engine::eval` (`eval/connlimit.rs`).\n\n\
         `string` searches the packet from its network header, as the kernel's\n\
         `skb_find_text`: a pattern matches when it lies wholly between `--from` and `--to` (one\n\
         that straddles `--to` does not). The bytes are the whole packet NFQUEUE hands vallumd;\n\
         the pcap replay and synthetic sources and a trace carry none, so there `--string` is\n\
         false and `! --string` true (`eval/string.rs`).\n\n\
         `physdev` reads the bridge ports NFQUEUE hands over for bridged IPv4/IPv6 (with\n\
         br_netfilter's `bridge-nf-call-iptables`): `NFQA_IFINDEX_PHYSINDEV` and\n\
         `PHYSOUTDEV`, names as for `-i`/`-o`; `vallumctl trace --physdev-in/--physdev-out`\n\
         sets them. Packets from pcap or the synthetic source carry none and are not bridged\n\
         (a rule whose every option is negated matches them, as in the kernel).\n\n\
         `-j CT --zone` puts the packet's connection in a conntrack zone of the engine's own\n\
         tracker: the zone id is part of the connection key in each direction, so the same\n\
         addresses and ports in two zones are two connections (Neutron's per-port zones).\n\
         The first `CT` or `NOTRACK` rule a packet meets decides, as xt_ct_target.\n\
         `-j CT --helper` is accepted with a warning: the engine runs no helper (ALG), and\n\
         vallumd does not attach the kernel's either, so the connections a helper would\n\
         expect (FTP data, TFTP, SIP media) are NEW, not RELATED: allow them by port, or keep\n\
         the helper in the kernel's own ruleset.\n\n",
    );
    for (target, title, flag) in [(false, "Matches", "-m"), (true, "Targets", "-j")] {
        out.push_str(&format!(
            "## {title}\n\n| `{flag}` | IPv4 | IPv6 | Notes |\n|---|---|---|---|\n"
        ));
        for r in support_table().iter().filter(|r| r.target == target) {
            let note = match (r.ipv4, r.ipv6) {
                (Support::Enforced { note } | Support::WithKernel { note }, _)
                | (_, Support::Enforced { note } | Support::WithKernel { note }) => note,
                _ => why_not_enforced(r.target, r.name).unwrap_or(""),
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                r.name,
                cell(r.ipv4),
                cell(r.ipv6),
                note
            ));
        }
        out.push('\n');
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_are_typed_and_opaque_names_are_not() {
        for r in support_table() {
            let known = if r.target {
                KNOWN_TARGETS.contains(&r.name)
            } else {
                KNOWN_MATCHES.contains(&r.name)
            };
            let enforced_somewhere = r.ipv4.is_enforced() || r.ipv6.is_enforced();
            let typed = if r.target {
                super::super::opaque::TYPED_TARGETS.contains(&r.name)
            } else {
                typed_from_opaque(r.name, Family::Ipv4) || typed_from_opaque(r.name, Family::Ipv6)
            };
            let by_kernel = !r.target && KERNEL_DECIDED.contains(&r.name);
            assert_eq!(
                enforced_somewhere,
                known || typed || by_kernel,
                "{}",
                r.name
            );
        }
    }
}
