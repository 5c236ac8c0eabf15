//! How many bytes of each packet, from its IP header on, the active rules can read: what a
//! packet source that copies packets out of the kernel (NFQUEUE's copy range) must copy so
//! that every decision is the one the whole packet would get.
//!
//! The classifier itself reads only headers: the IP header, IPv6 extension headers, the
//! transport header (TCP with its options: `--tcp-option`, conntrack's window scaling), the
//! IP and transport headers an ICMP error quotes (conntrack's RELATED), and what `-j LOG`
//! prints (`--log-ip-options`, `--log-tcp-options`) and packet events keep (128 bytes).
//! [`HEADER_BYTES`] covers all of them for IPv4 (at most 60 + 8 + 60 + 8 = 136 bytes) and for
//! IPv6 with up to 150 bytes of extension headers; a packet whose headers run past the copy
//! is the source's to notice (see `Snapshot::copy_range`). `-m length` and the counters use
//! the length field of the IP header, not the bytes copied. What reads past the headers:
//! `-m string` (up to its `--to` offset), `-j NFLOG` (the packet, for the log), and any
//! extension the engine keeps verbatim ([`Match::Opaque`], [`Target::Opaque`]): for those
//! the range is the whole packet, [`MAX_COPY_RANGE`].

use crate::model::{Match, Rule, Ruleset, Target};

/// Bytes that hold every header the classifier reads (see the module docs).
pub const HEADER_BYTES: u32 = 256;

/// The largest copy range (NFQUEUE's `NFQNL_MAX_COPY_RANGE`): the whole packet.
pub const MAX_COPY_RANGE: u32 = 0xffff;

/// The bytes of each packet, from its IP header on, that the rules of `rulesets` can read:
/// [`HEADER_BYTES`], or more for `-m string` (its `--to` offset: the kernel's
/// `skb_find_text` searches `[from, to)`), and [`MAX_COPY_RANGE`] for `-j NFLOG`, `-m sctp
/// --chunk-types`, `-m u32` and for
/// extensions kept verbatim. A pure function of the rules; at most [`MAX_COPY_RANGE`].
///
/// Each chain's figure is kept with its rule chunks ([`crate::model::RuleList`]), so a commit
/// that shares chunks with the model before it reads only the rules of the chunks it changed
/// (and one cached figure per other chunk), not every rule.
pub fn copy_range<'a>(rulesets: impl IntoIterator<Item = &'a Ruleset>) -> u32 {
    rulesets
        .into_iter()
        .flat_map(|rs| rs.tables.iter().flat_map(|t| &t.chains))
        .map(|c| c.rules.packet_reads())
        .fold(HEADER_BYTES, u32::max)
        .min(MAX_COPY_RANGE)
}

/// The bytes of a packet, from its IP header on, that `rule` reads beyond what
/// [`HEADER_BYTES`] covers: 0 for a rule that reads only headers, `--to` for `-m string`,
/// [`MAX_COPY_RANGE`] for `-j NFLOG`, `-m sctp --chunk-types`, `-m u32` and extensions kept
/// verbatim (see [`copy_range`]).
pub(crate) fn rule_reads(rule: &Rule) -> u32 {
    if matches!(rule.target, Target::Nflog(_) | Target::Opaque(_)) {
        return MAX_COPY_RANGE;
    }
    rule.matches
        .iter()
        .map(|m| match m {
            Match::String(s) => u32::from(s.to),
            // xt_sctp reads chunk headers to the end of the packet.
            Match::Sctp(s) if s.chunks.is_some() => MAX_COPY_RANGE,
            // xt_u32 reads anywhere in the packet.
            Match::U32(_) | Match::Opaque(_) => MAX_COPY_RANGE,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::{ParseOptions, parse};

    fn range(text: &str) -> u32 {
        let tables = parse(text, &ParseOptions::default()).expect("parse").tables;
        let rs = Ruleset {
            name: "t".into(),
            priority: 0,
            tables,
        };
        copy_range([&rs])
    }

    #[test]
    fn headers_only_rules_need_the_headers() {
        assert_eq!(copy_range([]), HEADER_BYTES);
        let text = "*filter\n:INPUT DROP [0:0]\n\
            -A INPUT -p tcp -m tcp --dport 22 --tcp-option 2 -j ACCEPT\n\
            -A INPUT -m length --length 1000:65535 -j DROP\n\
            -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
            -A INPUT -j LOG --log-ip-options --log-tcp-options\nCOMMIT\n";
        assert_eq!(range(text), HEADER_BYTES);
    }

    #[test]
    fn string_reads_to_its_to_offset() {
        let bounded = "*filter\n:INPUT ACCEPT [0:0]\n\
            -A INPUT -m string --string abc --algo bm --to 1000 -j DROP\nCOMMIT\n";
        assert_eq!(range(bounded), 1000);
        let near = "*filter\n:INPUT ACCEPT [0:0]\n\
            -A INPUT -m string --string abc --algo bm --to 40 -j DROP\nCOMMIT\n";
        assert_eq!(range(near), HEADER_BYTES);
        let whole = "*filter\n:INPUT ACCEPT [0:0]\n\
            -A INPUT -m string --string abc --algo kmp -j DROP\nCOMMIT\n";
        assert_eq!(range(whole), MAX_COPY_RANGE);
    }

    #[test]
    fn nflog_and_unknown_extensions_need_the_whole_packet() {
        let nflog = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j NFLOG --nflog-group 3\nCOMMIT\n";
        assert_eq!(range(nflog), MAX_COPY_RANGE);
    }
}
