//! `-m sctp` (xt_sctp): the plain rule value, as libxt_sctp (iptables 1.8.9) builds
//! `struct xt_sctp_info`. The packet test is `eval/sctp.rs`.

use super::{Neg, PortRange};

/// The chunk types `--chunk-types` names, in libxt_sctp's table order (a flag's chunk type is
/// its index in this table, see [`SctpFlag`]), with each type's number and flag letters (bit
/// 7 first; `-` is no flag).
pub const SCTP_CHUNK_NAMES: [(&str, u8, &str); 22] = [
    ("DATA", 0, "----IUBE"),
    ("INIT", 1, "--------"),
    ("INIT_ACK", 2, "--------"),
    ("SACK", 3, "--------"),
    ("HEARTBEAT", 4, "--------"),
    ("HEARTBEAT_ACK", 5, "--------"),
    ("ABORT", 6, "-------T"),
    ("SHUTDOWN", 7, "--------"),
    ("SHUTDOWN_ACK", 8, "--------"),
    ("ERROR", 9, "--------"),
    ("COOKIE_ECHO", 10, "--------"),
    ("COOKIE_ACK", 11, "--------"),
    ("ECN_ECNE", 12, "--------"),
    ("ECN_CWR", 13, "--------"),
    ("SHUTDOWN_COMPLETE", 14, "-------T"),
    ("I_DATA", 64, "----IUBE"),
    ("RE_CONFIG", 130, "--------"),
    ("PAD", 132, "--------"),
    ("ASCONF", 193, "--------"),
    ("ASCONF_ACK", 128, "--------"),
    ("FORWARD_TSN", 192, "--------"),
    ("I_FORWARD_TSN", 194, "--------"),
];

/// Most chunk types with flags in one rule (`XT_NUM_SCTP_FLAGS`).
pub const SCTP_MAX_FLAGS: usize = 4;

/// How `--chunk-types` compares the packet's chunks with its list (`SCTP_CHUNK_MATCH_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SctpChunkMode {
    /// `any`: some chunk of the packet is listed (and its flags fit).
    Any,
    /// `all`: every listed type is among the packet's chunks (with fitting flags).
    All,
    /// `only`: every chunk of the packet is listed (and its flags fit).
    Only,
}

impl SctpChunkMode {
    /// The word iptables-save prints.
    pub fn name(self) -> &'static str {
        match self {
            SctpChunkMode::Any => "any",
            SctpChunkMode::All => "all",
            SctpChunkMode::Only => "only",
        }
    }
}

/// One `TYPE:flags` of `--chunk-types` (`struct xt_sctp_flag_info`): a chunk of type
/// `chunk_type` fits when `flags & mask == flag`. As libxt_sctp, `chunk_type` is the index
/// of the name in [`SCTP_CHUNK_NAMES`], which is the type number for DATA, ABORT and
/// SHUTDOWN_COMPLETE but not for I_DATA (index 15): the kernel then compares the flags of
/// chunk type 15.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SctpFlag {
    /// The chunk type the kernel compares (see above).
    pub chunk_type: u8,
    /// The flag bits that must be set.
    pub flag: u8,
    /// The flag bits compared.
    pub mask: u8,
}

/// `[!] --chunk-types MODE LIST`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SctpChunks {
    /// `!` before `--chunk-types`.
    pub negated: bool,
    /// `any`, `all` or `only`.
    pub mode: SctpChunkMode,
    /// The listed chunk types, bit `t % 32` of word `t / 32` (the kernel's `chunkmap`).
    pub map: [u32; 8],
    /// The flags of the listed types, at most [`SCTP_MAX_FLAGS`].
    pub flags: Vec<SctpFlag>,
}

impl SctpChunks {
    /// Whether chunk type `t` is listed.
    pub fn has(&self, t: u8) -> bool {
        self.map[usize::from(t / 32)] & (1 << (t % 32)) != 0
    }
}

/// `-m sctp` (needs `-p sctp`): ports of the SCTP common header and the packet's chunks, as
/// xt_sctp's `sctp_mt`. Printed as `sctp_save`: `[!] --sport N[:M]`, `[!] --dport N[:M]`,
/// `[!] --chunk-types MODE LIST`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SctpMatch {
    /// `[!] --sport` / `--source-port` (kept when it is the full range: iptables-save prints
    /// it).
    pub sport: Option<Neg<PortRange>>,
    /// `[!] --dport` / `--destination-port`.
    pub dport: Option<Neg<PortRange>>,
    /// `[!] --chunk-types`.
    pub chunks: Option<SctpChunks>,
}
