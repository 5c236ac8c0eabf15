//! A simplified TCP state machine after nf_conntrack_proto_tcp (no window tracking), packed with
//! the entry's status bits into one `u64` so a transition is a single compare-and-swap.

use crate::model::tcp_flags::{ACK, FIN, RST, SYN};

const SEC: u64 = 1_000_000_000;

/// TCP connection states (nf_conntrack's names; CLOSE_WAIT is folded into [`TcpState::FinWait`]
/// because the tracker does not follow which side acknowledged the first FIN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TcpState {
    /// A SYN was seen, no SYN-ACK yet.
    SynSent = 1,
    /// The SYN-ACK was seen.
    SynRecv = 2,
    /// The handshake's final ACK was seen.
    Established = 3,
    /// One side sent a FIN.
    FinWait = 4,
    /// Both sides sent a FIN; waiting for the last ACK.
    LastAck = 5,
    /// The last ACK was seen.
    TimeWait = 6,
    /// A RST was seen.
    Close = 7,
}

impl TcpState {
    /// The idle timeout of this state in nanoseconds (nf_conntrack's defaults:
    /// `nf_conntrack_tcp_timeout_*`).
    pub fn timeout_ns(self) -> u64 {
        SEC * match self {
            TcpState::SynSent => 120,
            TcpState::SynRecv => 60,
            TcpState::Established => 5 * 24 * 3600,
            TcpState::FinWait => 120,
            TcpState::LastAck => 30,
            TcpState::TimeWait => 120,
            TcpState::Close => 10,
        }
    }

    /// Every state, in handshake order.
    pub const ALL: [TcpState; 7] = [
        TcpState::SynSent,
        TcpState::SynRecv,
        TcpState::Established,
        TcpState::FinWait,
        TcpState::LastAck,
        TcpState::TimeWait,
        TcpState::Close,
    ];

    /// The name `conntrack -L` prints (`SYN_SENT`, `ESTABLISHED`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait => "FIN_WAIT",
            TcpState::LastAck => "LAST_ACK",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Close => "CLOSE",
        }
    }

    /// The state named `name` (as [`TcpState::name`], ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<TcpState> {
        TcpState::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }

    fn from_bits(b: u8) -> Option<TcpState> {
        Some(match b {
            1 => TcpState::SynSent,
            2 => TcpState::SynRecv,
            3 => TcpState::Established,
            4 => TcpState::FinWait,
            5 => TcpState::LastAck,
            6 => TcpState::TimeWait,
            7 => TcpState::Close,
            _ => return None,
        })
    }
}

/// Bit of the status word: a packet in the reply direction was seen (IPS_SEEN_REPLY).
pub(crate) const SEEN_REPLY: u64 = 1 << 8;
/// Bits of the status word: the original / reply side sent a FIN.
const FIN_SEEN: [u64; 2] = [1 << 9, 1 << 10];
/// Every bit of the status word above the state byte.
pub(crate) const STATUS_BITS: u64 = SEEN_REPLY | FIN_SEEN[0] | FIN_SEEN[1];

/// The TCP state in a status word (`None` for other protocols).
pub(crate) fn state_of(word: u64) -> Option<TcpState> {
    TcpState::from_bits((word & 0xff) as u8)
}

/// A status word holding `state`, nothing else seen.
pub(crate) fn word(state: TcpState) -> u64 {
    state as u64
}

/// Whether a packet with `flags` may open a TCP entry: a SYN without ACK, RST or FIN.
pub(crate) fn opens(flags: u8) -> bool {
    flags & (SYN | ACK | RST | FIN) == SYN
}

/// Whether a packet with `flags` is picked up mid-stream when loose tracking is on: an ACK
/// without SYN, FIN or RST (PSH and URG allowed), the one case where nf_conntrack's
/// `tcp_conntracks[0][TCP_ACK_SET][sNO]` is ESTABLISHED; a FIN, RST or SYN-ACK with no entry
/// stays INVALID.
pub(crate) fn picks_up(flags: u8) -> bool {
    flags & (SYN | ACK | RST | FIN) == ACK
}

/// Timeout of an entry picked up mid-stream until a reply is seen, ns
/// (`nf_conntrack_tcp_timeout_unacknowledged`, 300 s).
pub(crate) const PICKUP_TIMEOUT_NS: u64 = 300 * SEC;

/// The outcome of one TCP packet on an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The new status word.
    To(u64),
    /// A SYN reopened a closed entry: the new word, and the packet counts as NEW.
    Reopen(u64),
    /// The packet does not fit the state: INVALID, the entry is unchanged.
    Invalid,
}

/// The status word after a packet with `flags` in direction `dir` (0 original, 1 reply).
pub(crate) fn step(old: u64, dir: usize, flags: u8) -> Step {
    let Some(st) = state_of(old) else {
        return Step::Invalid;
    };
    let seen = if dir == 1 { old | SEEN_REPLY } else { old };
    let with = |s: TcpState, extra: u64| Step::To((seen & !0xff) | s as u64 | extra);
    if flags & RST != 0 {
        return with(TcpState::Close, 0);
    }
    let f = flags & (SYN | ACK | FIN);
    match (st, dir) {
        (TcpState::SynSent, 0) if f == SYN => with(TcpState::SynSent, 0),
        (TcpState::SynSent, 1) if f == SYN | ACK || f == SYN => with(TcpState::SynRecv, 0),
        (TcpState::SynSent, _) => Step::Invalid,
        (TcpState::SynRecv, 0) if f == ACK => with(TcpState::Established, 0),
        (TcpState::SynRecv, 0) if f == ACK | FIN => with(TcpState::FinWait, FIN_SEEN[0]),
        (TcpState::SynRecv, 1) if f == SYN | ACK || f == ACK => with(TcpState::SynRecv, 0),
        // nf_conntrack: the original side's SYN-ACK in SYN_RECV (simultaneous open, where
        // the reply SYN led here) stays SYN_RECV; its retransmitted SYN is ignored (sIG).
        (TcpState::SynRecv, 0) if f == SYN | ACK || f == SYN => with(TcpState::SynRecv, 0),
        (TcpState::SynRecv, _) => Step::Invalid,
        // A SYN-ACK retransmitted by the server whose handshake ACK was lost after we saw it:
        // nf_conntrack ignores it (sIG) rather than marking it INVALID, so the client can
        // answer it again.
        (TcpState::Established, 1) if f == SYN | ACK => with(TcpState::Established, 0),
        (TcpState::Established, _) if f & SYN != 0 => Step::Invalid,
        (TcpState::Established, d) if f & FIN != 0 => with(TcpState::FinWait, FIN_SEEN[d]),
        (TcpState::Established, _) => with(TcpState::Established, 0),
        (TcpState::FinWait | TcpState::LastAck, _) if f & SYN != 0 => Step::Invalid,
        (TcpState::FinWait, d) if f & FIN != 0 && old & FIN_SEEN[d] == 0 => {
            with(TcpState::LastAck, FIN_SEEN[d])
        }
        (TcpState::FinWait, _) => with(TcpState::FinWait, 0),
        (TcpState::LastAck, _) if f == ACK => with(TcpState::TimeWait, 0),
        (TcpState::LastAck, _) => with(TcpState::LastAck, 0),
        (TcpState::TimeWait | TcpState::Close, 0) if opens(flags) => {
            Step::Reopen(word(TcpState::SynSent))
        }
        (TcpState::TimeWait | TcpState::Close, _) if f & SYN != 0 => Step::Invalid,
        (TcpState::TimeWait, _) => with(TcpState::TimeWait, 0),
        (TcpState::Close, _) => with(TcpState::Close, 0),
    }
}
