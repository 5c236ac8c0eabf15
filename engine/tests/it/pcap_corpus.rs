//! Reads the real captures in `../shared/data/pcap` (see its SOURCES.md) and checks packet counts,
//! parse results and distinct 5-tuples. Ignored unless asked for (`-- --include-ignored`); fails
//! when the folder is absent.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use vallum_engine::packet::Packet;
use vallum_engine::packet::pcap::read_capture;

/// `<repo>/../shared/data/pcap`, or `$VALLUM_SHARED_DATA/pcap`.
fn pcap_dir() -> PathBuf {
    std::env::var_os("VALLUM_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
        .join("pcap")
}

/// (file, packets, distinct 5-tuples (src, dst, proto, sport, dport), packets that do not parse).
/// Packet and 5-tuple counts are SOURCES.md's. The unparsed ones were checked by hand:
/// tcpreplay-test has 19 non-IP frames (16 MPLS, 1 ARP, 1 802.3, 1 loopback 0x9000),
/// ndpi-gnutella 22 ARP frames and
/// one 4-byte record (truncated).
const EXPECTED: &[(&str, usize, usize, usize)] = &[
    ("tcpreplay-test.pcap", 179, 43, 19),
    ("ndpi-gnutella.pcap", 3905, 937, 23),
    ("ndpi-synscan.pcap", 2011, 2002, 0),
];

#[test]
#[ignore = "needs ../shared/data"]
fn shared_captures() {
    let dir = pcap_dir();
    if !dir.is_dir() {
        panic!("shared captures: {} not found", dir.display());
    }
    for &(name, packets, tuples, unparsed) in EXPECTED {
        let path = dir.join(name);
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {}: {e}", path.display()));
        let pkts = read_capture(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut seen = HashSet::new();
        let mut errors: BTreeMap<String, usize> = BTreeMap::new();
        for p in &pkts {
            match p.parse(Packet::default()) {
                Ok(m) => {
                    seen.insert((m.src, m.dst, m.protocol, m.sport, m.dport));
                }
                Err(e) => *errors.entry(e.to_string()).or_default() += 1,
            }
        }
        let bad: usize = errors.values().sum();
        println!(
            "{name}: {} packets, {} 5-tuples, unparsed {errors:?}",
            pkts.len(),
            seen.len()
        );
        assert_eq!(pkts.len(), packets, "{name} packets");
        assert_eq!(seen.len(), tuples, "{name} 5-tuples");
        assert_eq!(bad, unparsed, "{name} unparsed");
    }
}
