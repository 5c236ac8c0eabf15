//! A text form of the connection table that outlives the process, so that established flows
//! stay ESTABLISHED across a restart of the program that owns the table (vallumd saves it on a
//! graceful stop and restores it at start; a kill -9 saves nothing).
//!
//! [`Conntrack::save`] writes [`HEADER`], then one line per live entry:
//!
//! ```text
//! PROTO SRC DST SPORT DPORT STATUS LEFT_MS
//! 6 10.0.0.2 10.0.0.1 40000 22 0x103 431999000
//! ```
//!
//! the original tuple (protocol number, addresses, ports or ICMP `type << 8 | code` in DPORT),
//! the status word in hex (TCP state in the low byte, bit 8 a reply was seen, bits 9-10 the
//! FINs) and the milliseconds left before the entry expires. The reply tuple is derived again.
//! An entry in a conntrack zone other than 0 (`-j CT --zone`) has an eighth field,
//! `zone=ID`, `zone-orig=ID` or `zone-reply=ID` (as `-j CT` names the directions).
//!
//! [`Conntrack::restore`] parses the whole text before it inserts anything (a bad line is an
//! error at its `LINE:COL` and changes nothing), then inserts each entry with its time left
//! minus the time the table was away (`elapsed_ns`, measured by the caller on a wall clock),
//! never more than its state's own timeout (a text cannot make an entry live longer than
//! tracking would have); entries whose time ran out are skipped. Entries already in the table
//! are kept as they are, and `max_entries` holds as for tracked packets. Time and memory are
//! linear in the text.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::ptr;

use super::tuple::{PROTO_TCP, Tuple};
use super::{Conn, Conntrack, Insert, reclaim, tcp, timeout_of};
use crate::model::CtZone;
use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// The first line of a saved table (its version).
pub const HEADER: &str = "# vallum conntrack v1";

const MS: u64 = 1_000_000;

/// A saved table that cannot be restored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PersistError {
    /// A line that is not an entry (or a first line that is not [`HEADER`]); 1-based line
    /// and column of the offending field.
    #[error("{line}:{column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong, naming the field.
        message: String,
    },
}

/// What [`Conntrack::restore`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Entries inserted.
    pub restored: usize,
    /// Entries whose time ran out while the table was away.
    pub expired: usize,
    /// Entries whose tuple the table already held (kept as they are).
    pub present: usize,
    /// Entries refused because the table was full.
    pub full: usize,
}

/// One parsed entry.
struct Saved {
    tuple: Tuple,
    zone: CtZone,
    status: u64,
    left_ns: u64,
}

impl Conntrack {
    /// The table as text (module docs), entries live at `now` (ns) only, in bucket order.
    pub fn save(&self, now: u64) -> String {
        let mut out = String::with_capacity(64 * (self.stats().entries as usize + 1));
        out.push_str(HEADER);
        out.push('\n');
        for (t, zone, status, expires) in self.words() {
            if expires <= now {
                continue;
            }
            // Rounded up: an entry saved with 0.4 ms left is not lost to the rounding.
            let left_ms = (expires - now).div_ceil(MS);
            let _ = write!(
                out,
                "{} {} {} {} {} {status:#x} {left_ms}",
                t.protocol, t.src, t.dst, t.sport, t.dport
            );
            if zone.id != 0 {
                let name = match zone.dirs {
                    CtZone::ORIG => "zone-orig",
                    CtZone::REPLY => "zone-reply",
                    _ => "zone",
                };
                let _ = write!(out, " {name}={}", zone.id);
            }
            out.push('\n');
        }
        out
    }

    /// Every live entry's original tuple, status word and expiry, each once (as
    /// [`Conntrack::list`]).
    fn words(&self) -> Vec<(Tuple, CtZone, u64, u64)> {
        let guard = reclaim::pin();
        loop {
            let (generation, table) = self.begin(&guard);
            let mut out = Vec::new();
            for bucket in 0..table.heads.len() {
                table.walk_originals(bucket, &guard, |c| {
                    out.push((
                        c.tuple[0],
                        c.zone,
                        c.status.load(Ordering::Relaxed),
                        c.timeout.load(Ordering::Relaxed),
                    ))
                });
            }
            if !self.resized_since(generation) {
                return out;
            }
        }
    }

    /// Restores a [`Conntrack::save`] text at `now` (ns), `elapsed_ns` after it was saved.
    ///
    /// Errors: [`PersistError::Syntax`] for a missing or unknown header, a field that does not
    /// parse, addresses of two families, a status word with bits no state has; nothing is
    /// inserted then.
    pub fn restore(&self, text: &str, now: u64, elapsed_ns: u64) -> Result<Restored, PersistError> {
        let entries = parse(text)?;
        let mut r = Restored::default();
        let guard = reclaim::pin();
        for e in entries {
            let cap = timeout_of(e.tuple.protocol, e.status);
            let Some(left) = e.left_ns.checked_sub(elapsed_ns).filter(|&l| l > 0) else {
                r.expired += 1;
                continue;
            };
            let reply = e.tuple.reply();
            let conn = Box::new(Conn {
                tuple: [e.tuple, reply],
                zone: e.zone,
                next: [
                    AtomicPtr::new(ptr::null_mut()),
                    AtomicPtr::new(ptr::null_mut()),
                ],
                status: AtomicU64::new(e.status),
                timeout: AtomicU64::new(now.saturating_add(left.min(cap))),
                dying: AtomicBool::new(false),
                // The connection mark is not in the saved form (yet): restored entries start
                // at 0.
                mark: AtomicU64::new(0),
            });
            let hashes = [e.tuple.hash_in(e.zone.id(0)), reply.hash_in(e.zone.id(1))];
            match self.insert(conn, hashes, now, &guard) {
                Insert::Done => r.restored += 1,
                Insert::Clash(..) => r.present += 1,
                Insert::Full => r.full += 1,
            }
        }
        Ok(r)
    }
}

fn parse(text: &str) -> Result<Vec<Saved>, PersistError> {
    let mut lines = text.lines().enumerate();
    let err = |line: usize, column: usize, message: String| PersistError::Syntax {
        line: line + 1,
        column,
        message,
    };
    match lines.next() {
        Some((_, HEADER)) => {}
        Some((i, l)) => {
            return Err(err(
                i,
                1,
                format!("expected {HEADER:?}, found {}", crate::echo::quoted(l)),
            ));
        }
        None => return Err(err(0, 1, format!("empty text (expected {HEADER:?})"))),
    }
    let mut out = Vec::new();
    for (i, l) in lines {
        if l.is_empty() {
            continue;
        }
        let mut fields = Vec::with_capacity(7);
        let mut col = 1;
        for f in l.split(' ') {
            fields.push((col, f));
            col += f.len() + 1;
        }
        if !(7..=8).contains(&fields.len()) {
            return Err(err(
                i,
                1,
                format!(
                    "expected 7 or 8 fields (PROTO SRC DST SPORT DPORT STATUS LEFT_MS [ZONE]), found {}",
                    fields.len()
                ),
            ));
        }
        let field = |n: usize, what: &str, v: Option<u64>| {
            let (c, f) = fields[n];
            v.ok_or_else(|| {
                err(
                    i,
                    c,
                    format!("{what} {} is not valid", crate::echo::quoted(f)),
                )
            })
        };
        let addr = |n: usize, what: &str| {
            let (c, f) = fields[n];
            f.parse::<IpAddr>().map_err(|_| {
                err(
                    i,
                    c,
                    format!("{what} {} is not an address", crate::echo::quoted(f)),
                )
            })
        };
        let num = |n: usize| fields[n].1.parse::<u64>().ok();
        let protocol = field(0, "protocol", num(0).filter(|&p| p <= 255))? as u8;
        let (src, dst) = (addr(1, "source")?, addr(2, "destination")?);
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(err(
                i,
                fields[2].0,
                "source and destination families differ".into(),
            ));
        }
        let sport = field(3, "source port", num(3).filter(|&p| p <= 0xffff))? as u16;
        let dport = field(4, "destination port", num(4).filter(|&p| p <= 0xffff))? as u16;
        let status = fields[5]
            .1
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .filter(|&s| known_status(protocol, s));
        let status = field(5, "status", status)?;
        let left_ns = field(6, "time left (ms)", num(6).and_then(|m| m.checked_mul(MS)))?;
        let zone = match fields.get(7) {
            None => CtZone::default(),
            Some(&(c, f)) => {
                let parsed = f.split_once('=').and_then(|(name, id)| {
                    let dirs = match name {
                        "zone" => CtZone::ORIG | CtZone::REPLY,
                        "zone-orig" => CtZone::ORIG,
                        "zone-reply" => CtZone::REPLY,
                        _ => return None,
                    };
                    let id = id.parse::<u16>().ok()?;
                    Some(CtZone { id, dirs })
                });
                parsed.ok_or_else(|| {
                    err(
                        i,
                        c,
                        format!(
                            "zone {} is not zone=ID, zone-orig=ID or zone-reply=ID",
                            crate::echo::quoted(f)
                        ),
                    )
                })?
            }
        };
        out.push(Saved {
            zone,
            tuple: Tuple {
                src,
                dst,
                protocol,
                sport,
                dport,
            },
            status,
            left_ns,
        });
    }
    Ok(out)
}

/// Whether `s` is a status word an entry of `protocol` can have: for TCP a state and only the
/// reply/FIN bits, for others at most the reply bit.
fn known_status(protocol: u8, s: u64) -> bool {
    if protocol == PROTO_TCP {
        tcp::state_of(s).is_some() && s & !(0xff | tcp::STATUS_BITS) == 0
    } else {
        s & !tcp::SEEN_REPLY == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::conntrack::{ConntrackConfig, TcpState};
    use crate::model::ct_state;
    use crate::model::tcp_flags::{ACK, PSH, SYN};
    use crate::packet::{Packet, PacketMeta};

    const S: u64 = 1_000_000_000;

    fn strict() -> Conntrack {
        Conntrack::new(ConntrackConfig {
            tcp_loose: false,
            ..ConntrackConfig::default()
        })
        .unwrap()
    }

    /// A TCP packet client 10.0.0.1:40000 -> server 10.0.0.2:22 (or back).
    fn tcp(ct: &Conntrack, reply: bool, flags: u8, now: u64) -> u8 {
        let (a, b) = (
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        );
        let (src, dst, sport, dport) = if reply {
            (b, a, 22, 40000)
        } else {
            (a, b, 40000, 22)
        };
        let mut p = Packet::from(PacketMeta {
            src,
            dst,
            protocol: PROTO_TCP,
            sport,
            dport,
            tcp_flags: flags,
            ..PacketMeta::default()
        });
        ct.track(&mut p, now);
        p.ct_state
    }

    fn established(now: u64) -> Conntrack {
        let ct = strict();
        tcp(&ct, false, SYN, now);
        tcp(&ct, true, SYN | ACK, now);
        assert_eq!(tcp(&ct, false, ACK, now), ct_state::ESTABLISHED);
        ct
    }

    #[test]
    fn an_established_flow_is_established_in_the_restored_table() {
        let old = established(5 * S);
        let text = old.save(6 * S);
        assert_eq!(
            text,
            format!(
                "{HEADER}\n6 10.0.0.1 10.0.0.2 40000 22 0x103 {}\n",
                TcpState::Established.timeout_ns() / MS - 1000
            )
        );
        // A new table (a new process: its clock starts again), 3 s later, strict mode.
        let new = strict();
        let r = new.restore(&text, S, 3 * S).unwrap();
        assert_eq!(
            r,
            Restored {
                restored: 1,
                ..Restored::default()
            }
        );
        // The time left is what was left minus the time away.
        let left = new.list()[0].expires_ns - S;
        assert_eq!(left, TcpState::Established.timeout_ns() - 4 * S);
        assert_eq!(tcp(&new, false, ACK | PSH, 2 * S), ct_state::ESTABLISHED);
        assert_eq!(tcp(&new, true, ACK, 2 * S), ct_state::ESTABLISHED);
        // Without the restore the same packet is INVALID (no pick-up in strict mode).
        assert_eq!(tcp(&strict(), false, ACK | PSH, 2 * S), ct_state::INVALID);
    }

    #[test]
    fn expired_present_and_capped_entries() {
        let old = strict();
        tcp(&old, false, SYN, 0);
        // SYN_SENT lives 120 s: gone after 121 s away.
        let text = old.save(0);
        let r = strict().restore(&text, 0, 121 * S).unwrap();
        assert_eq!((r.restored, r.expired), (0, 1));
        // Already present: kept.
        let r = old.restore(&text, 0, 0).unwrap();
        assert_eq!((r.restored, r.present), (0, 1));
        // A text cannot give an entry more than its state's timeout.
        let forged = format!("{HEADER}\n6 10.0.0.1 10.0.0.2 40000 22 0x1 999999999999\n");
        let ct = strict();
        ct.restore(&forged, 0, 0).unwrap();
        assert_eq!(ct.list()[0].expires_ns, TcpState::SynSent.timeout_ns());
        // A full table refuses the rest.
        let two = format!(
            "{HEADER}\n17 10.0.0.1 10.0.0.2 1 53 0x100 1000\n17 10.0.0.1 10.0.0.2 2 53 0x100 1000\n"
        );
        let small = Conntrack::new(ConntrackConfig {
            max_entries: 1,
            ..ConntrackConfig::default()
        })
        .unwrap();
        let r = small.restore(&two, 0, 0).unwrap();
        assert_eq!((r.restored, r.full), (1, 1));
    }

    #[test]
    fn a_bad_line_is_refused_at_its_column_and_changes_nothing() {
        let ct = strict();
        let cases = [
            ("", "1:1: empty text"),
            ("# other v9\n", "1:1: expected"),
            ("6 1.2.3.4 1.2.3.5 1 2 0x103 5\n", "1:1: expected"),
            (
                "HEADER\n6 1.2.3.4 1.2.3.5 1 2 0x103\n",
                "2:1: expected 7 or 8 fields",
            ),
            (
                "HEADER\n6 1.2.3.4 1.2.3.5 1 2 0x103 5 zone=70000\n",
                "2:31: zone \"zone=70000\"",
            ),
            (
                "HEADER\n6 1.2.3.4 1.2.3.5 1 2 0x103 5 zone-in=3\n",
                "2:31: zone",
            ),
            (
                "HEADER\n6 1.2.3.4 ::1 1 2 0x103 5\n",
                "2:11: source and destination",
            ),
            (
                "HEADER\n6 1.2.3.4 1.2.3.5 1 70000 0x103 5\n",
                "2:21: destination port \"70000\"",
            ),
            (
                "HEADER\n6 1.2.3.4 1.2.3.x 1 2 0x103 5\n",
                "2:11: destination \"1.2.3.x\" is not an address",
            ),
            (
                "HEADER\n6 1.2.3.4 1.2.3.5 1 2 0x9 5\n",
                "2:23: status \"0x9\"",
            ),
            ("HEADER\n17 1.2.3.4 1.2.3.5 1 2 0x103 5\n", "2:24: status"),
            (
                "HEADER\n6 1.2.3.4 1.2.3.5 1 2 0x103 -5\n",
                "2:29: time left",
            ),
        ];
        for (text, want) in cases {
            let text = text.replace("HEADER", HEADER);
            // A good line first: it must not be inserted either.
            let text = text.replacen(
                &format!("{HEADER}\n"),
                &format!("{HEADER}\n17 9.9.9.9 9.9.9.8 1 2 0x0 100\n"),
                1,
            );
            let e = ct.restore(&text, 0, 0).unwrap_err().to_string();
            let want = want.replacen("2:", "3:", 1);
            assert!(e.starts_with(&want), "{text:?}: {e}");
            assert!(ct.list().is_empty(), "{text:?}: something was inserted");
        }
    }

    #[test]
    fn every_protocol_round_trips() {
        let ct = Conntrack::new(ConntrackConfig::default()).unwrap();
        let v6 = |l: u16| IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, l));
        for (protocol, src, dst, sport, dport) in [
            (17, v6(1), v6(2), 5353, 53),
            (
                1,
                IpAddr::from([10, 0, 0, 1]),
                IpAddr::from([10, 0, 0, 2]),
                0,
                8 << 8,
            ),
            (
                47,
                IpAddr::from([10, 0, 0, 1]),
                IpAddr::from([10, 0, 0, 3]),
                0,
                0,
            ),
        ] {
            let mut p = Packet::from(PacketMeta {
                src,
                dst,
                protocol,
                sport,
                dport,
                icmp_type: (dport >> 8) as u8,
                ..PacketMeta::default()
            });
            ct.track(&mut p, 0);
        }
        let text = ct.save(0);
        let again = Conntrack::new(ConntrackConfig::default()).unwrap();
        assert_eq!(again.restore(&text, 0, 0).unwrap().restored, 3);
        let mut a = ct.list();
        let mut b = again.list();
        a.sort_by_key(|c| format!("{:?}", c.original));
        b.sort_by_key(|c| format!("{:?}", c.original));
        assert_eq!(a, b);
        assert_eq!(again.save(0).lines().count(), 4);
    }
}
