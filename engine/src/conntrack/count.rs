//! What `-m connlimit` asks the table about a connection it remembered
//! ([`Conntrack::liveness`]): nf_conncount keeps its own lists of original tuples and, when
//! it counts, looks each one up in conntrack (`find_or_evict`, `already_closed`). A lookup is
//! lock-free, as [`Conntrack::peek`].

use super::{Conntrack, Ordering, PROTO_TCP, TcpState, Tuple, reclaim, tcp};
use crate::model::CtZone;

/// The state of a remembered connection, as nf_conncount sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// No live entry holds the tuple (never confirmed, expired or deleted): forget it.
    Absent,
    /// The entry lives but is a TCP connection in TIME_WAIT or CLOSE (`already_closed`): it
    /// no longer counts.
    Closed,
    /// The entry lives and counts.
    Live,
}

impl Conntrack {
    /// Whether a live entry of `zone` holds `t` (as either of its tuples) at `now` (ns), and
    /// whether it still counts for `-m connlimit`. A lookup only; an expired entry is absent.
    pub fn liveness(&self, t: &Tuple, zone: CtZone, now: u64) -> Liveness {
        let guard = reclaim::pin();
        match self.lookup(t, zone, &guard) {
            // Relaxed: both words are self-contained values (as in `peek_entry`).
            Some((conn, _)) if conn.timeout.load(Ordering::Relaxed) > now => {
                let status = conn.status.load(Ordering::Relaxed);
                let closed = conn.tuple[0].protocol == PROTO_TCP
                    && matches!(
                        tcp::state_of(status),
                        Some(TcpState::TimeWait | TcpState::Close)
                    );
                if closed {
                    Liveness::Closed
                } else {
                    Liveness::Live
                }
            }
            _ => Liveness::Absent,
        }
    }
}
