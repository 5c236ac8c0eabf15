//! Kernel nftables as the oracle of verdicts and counters, in the namespaces of
//! [`KernelOracle`]: [`load`] replaces the firewall namespace's nftables ruleset with a text and
//! adds the oracle's own table, [`hits`] sends one frame and reports what the kernel did.
//!
//! The oracle's table `inet vallum_oracle` tells the outcome apart without touching the ruleset
//! under test: a counter in a PREROUTING chain at priority -1000 (the packet arrived, before any
//! chain of the ruleset), one in an INPUT chain at priority 1000 (every base chain of the
//! ruleset accepted it), and in an OUTPUT chain at -1000 one for TCP resets and one for ICMP /
//! ICMPv6 destination-unreachable messages the namespace sends (a `reject`; the legacy raw
//! OUTPUT DROP of the setup drops them after they are counted). Arrived and accepted: ACCEPT;
//! arrived, not accepted, an answer sent: REJECT; arrived and nothing else: DROP.
//!
//! The counters of the ruleset's own rules are read from `nft -t list ruleset` (parsed with
//! `vallum_engine::nft::parse`): the packets of every rule with a `counter` statement, in
//! listing order (the order of the loaded text).

use std::time::{Duration, Instant};

use vallum_engine::nft::{self, Stmt};

use super::kernel::{KernelOracle, run_in};

const ORACLE_TABLE: &str = "table inet vallum_oracle {
	chain first {
		type filter hook prerouting priority -1000; policy accept;
		counter
	}
	chain last {
		type filter hook input priority 1000; policy accept;
		counter
	}
	chain out {
		type filter hook output priority -1000; policy accept;
		tcp flags rst counter
		icmp type destination-unreachable counter
		icmpv6 type destination-unreachable counter
	}
}
";

/// What the kernel did with one packet at INPUT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every base chain accepted it.
    Accept,
    /// Dropped without an answer.
    Drop,
    /// Rejected with a TCP reset.
    RejectTcp,
    /// Rejected with an ICMP / ICMPv6 error.
    RejectIcmp,
}

/// One packet's outcome and the packets counted since the previous read by each rule with a
/// `counter` statement of the loaded ruleset (listing order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftHits {
    /// The verdict.
    pub outcome: Outcome,
    /// Per counting rule, packets counted for this packet.
    pub counted: Vec<u64>,
}

fn fw(o: &KernelOracle) -> String {
    o.namespaces().remove(0)
}

/// Replaces the firewall namespace's nftables ruleset with `text` (the iptables-legacy rules of
/// the setup stay), then adds the oracle's table and flushes conntrack.
pub fn load(o: &KernelOracle, text: &str) -> Result<(), String> {
    let ns = fw(o);
    // A reject's ICMP error is rate-limited per destination (a burst of 6, then one a
    // second): off, so every reject answers.
    run_in(
        &ns,
        &[
            "sysctl",
            "-qw",
            "net.ipv4.icmp_ratelimit=0",
            "net.ipv6.icmp.ratelimit=0",
        ],
        None,
    )?;
    run_in(&ns, &["nft", "flush", "ruleset"], None)?;
    run_in(&ns, &["nft", "-f", "-"], Some(text))?;
    run_in(&ns, &["nft", "-f", "-"], Some(ORACLE_TABLE))?;
    // Conntrack entries of earlier probes would make a repeated flow ESTABLISHED, so the flush
    // must run (the tests need conntrack; it exits 0 on an empty table too).
    run_in(&ns, &["conntrack", "-F"], None)?;
    Ok(())
}

/// (oracle counters `[arrived, accepted, resets, ICMP unreachables, ICMPv6 unreachables]`,
/// the ruleset's counters).
fn read(o: &KernelOracle) -> Result<([u64; 5], Vec<u64>), String> {
    // Terse: without the sets' elements (a meter's live elements carry their limit state).
    let listing = run_in(&fw(o), &["nft", "-t", "list", "ruleset"], None)?;
    let rs = nft::parse("kernel listing", &listing).map_err(|e| e.to_string())?;
    let mut oracle = Vec::new();
    let mut rules = Vec::new();
    for t in &rs.tables {
        let into = if t.name == "vallum_oracle" {
            &mut oracle
        } else {
            &mut rules
        };
        for c in &t.chains {
            for r in &c.rules {
                for s in &r.stmts {
                    if let Stmt::Counter { packets, .. } = s {
                        into.push(*packets);
                    }
                }
            }
        }
    }
    let oracle: [u64; 5] = oracle
        .try_into()
        .map_err(|v| format!("the oracle table lists {v:?} counters, not 5"))?;
    Ok((oracle, rules))
}

/// Sends `frame` and reports what the kernel did (see the module docs).
pub fn hits(o: &KernelOracle, frame: &[u8]) -> Result<NftHits, String> {
    let (ob, rb) = read(o)?;
    o.send(frame)?;
    // The hooks of one packet run in one softirq pass; poll until it arrived, then until two
    // reads 30 ms apart agree.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = (ob, rb.clone());
    let mut seen = false;
    loop {
        std::thread::sleep(Duration::from_millis(if seen { 30 } else { 5 }));
        let now = read(o)?;
        if seen && now == last {
            break;
        }
        seen |= now.0[0] > ob[0];
        last = now;
        if Instant::now() > deadline {
            return Err(if seen {
                "counters did not settle".into()
            } else {
                "the packet never arrived".into()
            });
        }
    }
    let (oa, ra) = last;
    if ra.len() != rb.len() {
        return Err("the ruleset changed while a packet was in flight".into());
    }
    let outcome = if oa[1] > ob[1] {
        Outcome::Accept
    } else if oa[2] > ob[2] {
        Outcome::RejectTcp
    } else if oa[3] > ob[3] || oa[4] > ob[4] {
        Outcome::RejectIcmp
    } else {
        Outcome::Drop
    };
    Ok(NftHits {
        outcome,
        counted: ra.iter().zip(&rb).map(|(a, b)| a - b).collect(),
    })
}

/// Runs nft commands `text` (`add element ...`, `delete element ...`) on the firewall
/// namespace's loaded ruleset, in one transaction.
pub fn apply(o: &KernelOracle, text: &str) -> Result<(), String> {
    run_in(&fw(o), &["nft", "-f", "-"], Some(text)).map(drop)
}
