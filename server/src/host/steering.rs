//! Which hooks this node's packet path evaluates, from the packet source and its steering
//! (`--source`, `--steered-chains`) and the host's forwarding sysctls, handed to validation
//! ([`SetManager::set_reached_hooks`]) so that a rule no packet can reach here is a warning
//! naming it, never silence ([`ViolationKind::HookNotReached`]).
//!
//! - `none`: no packet is classified here; nothing is said (the rulesets may be managed for
//!   another dataplane).
//! - `pcap:FILE`, `synthetic`: every packet is at INPUT (raw PREROUTING runs for it first).
//! - `nfqueue`: the chains `vallumctl dataplane install --chains` steers, as given to vallumd
//!   with `--steered-chains` (default INPUT,FORWARD,OUTPUT, the installer's default); FORWARD
//!   only for a family whose forwarding is on (`/proc/sys/net/ipv4/ip_forward`,
//!   `/proc/sys/net/ipv6/conf/all/forwarding`, read once at start; unreadable counts as on).
//!   With `--steered-new-only` (`vallumctl dataplane install --new-only`) only packets the
//!   kernel's conntrack does not see as ESTABLISHED or RELATED are queued
//!   ([`reached_steering`]): rules matching only those states are warned. Loopback packets are
//!   not queued unless vallumd is told `--steered-loopback` (`vallumctl dataplane install
//!   --include-loopback`; the installer exempts `lo` by default): rules that can match only
//!   loopback packets are warned.
//!
//! [`SetManager::set_reached_hooks`]: vallum_engine::sets::SetManager::set_reached_hooks
//! [`ViolationKind::HookNotReached`]: vallum_engine::validate::ViolationKind::HookNotReached

use vallum_engine::model::Hook;
use vallum_engine::validate::ReachedHooks;

use crate::config::Source;

/// The chains `--steered-chains` accepts: the filter table's builtin chains the installer
/// steers.
pub const STEERABLE: [Hook; 3] = [Hook::Input, Hook::Forward, Hook::Output];

/// Parses one `--steered-chains` item (`INPUT`, `FORWARD` or `OUTPUT`).
///
/// Errors: any other name, with the accepted ones.
pub fn parse_steered_chain(s: &str) -> Result<Hook, String> {
    Hook::from_chain_name(s)
        .filter(|h| STEERABLE.contains(h))
        .ok_or_else(|| format!("{s:?} is not a steered chain (INPUT, FORWARD or OUTPUT)"))
}

/// Whether the host forwards each family (`[IPv4, IPv6]`), from the sysctl files under
/// `proc` (normally `/proc`); a file that cannot be read counts as forwarding on.
pub fn forwarding(proc: &std::path::Path) -> [bool; 2] {
    [
        "sys/net/ipv4/ip_forward",
        "sys/net/ipv6/conf/all/forwarding",
    ]
    .map(|f| std::fs::read_to_string(proc.join(f)).map_or(true, |v| v.trim() != "0"))
}

/// The hooks `source` delivers packets at, given the steered chains and whether each family
/// forwards (`[IPv4, IPv6]`); `None` for `--source none`.
pub fn reached(source: &Source, steered: &[Hook], forwarding: [bool; 2]) -> Option<ReachedHooks> {
    match source {
        Source::None => None,
        Source::Pcap(_) | Source::Synthetic => Some(
            ReachedHooks::delivered(
                &[Hook::Input],
                &[Hook::Input],
                format!("the packet source `{source}` delivers every packet at INPUT"),
            )
            .without_bytes(format!("the packet source `{source}` does not keep")),
        ),
        Source::Nfqueue(_) => {
            let names = |hs: &[Hook]| {
                hs.iter()
                    .map(|h| h.chain_name())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let mut why = format!(
                "vallumd is told (--steered-chains) that NFQUEUE steers {}",
                names(steered)
            );
            let of = |fwd: bool| -> Vec<Hook> {
                steered
                    .iter()
                    .copied()
                    .filter(|&h| fwd || h != Hook::Forward)
                    .collect()
            };
            for (on, sysctl) in forwarding
                .iter()
                .zip(["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"])
            {
                if !on && steered.contains(&Hook::Forward) {
                    why.push_str(&format!(", and {sysctl} is 0 (nothing is forwarded)"));
                }
            }
            Some(ReachedHooks::delivered(
                &of(forwarding[0]),
                &of(forwarding[1]),
                why,
            ))
        }
    }
}

/// [`reached`], and under `--source nfqueue`: with `new_only` (`--steered-new-only`) only the
/// packets the kernel's conntrack does not see as ESTABLISHED or RELATED
/// ([`ReachedHooks::new_only`]: rules matching only those states get a warning); without
/// `loopback` (`--steered-loopback`) no loopback packet ([`ReachedHooks::without_loopback`]:
/// rules matching only loopback packets get a warning).
pub fn reached_steering(
    source: &Source,
    steered: &[Hook],
    forwarding: [bool; 2],
    new_only: bool,
    loopback: bool,
) -> Option<ReachedHooks> {
    let mut r = reached(source, steered, forwarding)?;
    if let Source::Nfqueue(_) = source {
        if new_only {
            r = r.new_only(
                "vallumd is told (--steered-new-only) the kernel accepts before they are queued \
                 (vallumctl dataplane install --new-only)",
            );
        }
        if !loopback {
            r = r.without_loopback(
                "the NFQUEUE steering does not queue (`vallumctl dataplane install` exempts \
                 `lo` unless --include-loopback; vallumd is not told --steered-loopback)",
            );
        }
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use vallum_engine::model::Family;

    use super::*;
    use crate::config::NfqueueSource;

    #[test]
    fn what_each_source_reaches() {
        assert_eq!(reached(&Source::None, &STEERABLE, [true; 2]), None);
        let pcap = reached(&Source::Pcap("x.pcap".into()), &STEERABLE, [true; 2]).unwrap();
        for f in [Family::Ipv4, Family::Ipv6] {
            assert!(pcap.reaches(f, Hook::Input) && pcap.reaches(f, Hook::Prerouting));
            assert!(!pcap.reaches(f, Hook::Forward) && !pcap.reaches(f, Hook::Output));
        }
        assert!(pcap.why().contains("pcap:x.pcap"), "{}", pcap.why());
        let q = Source::Nfqueue(NfqueueSource {
            first: 0,
            fail_closed: false,
            maxlen: None,
            batch_delay: None,
        });
        let all = reached(&q, &STEERABLE, [true; 2]).unwrap();
        assert!(Hook::ALL[..4].iter().all(|&h| all.reaches(Family::Ipv4, h)));
        let no_v4_fwd = reached(&q, &STEERABLE, [false, true]).unwrap();
        assert!(!no_v4_fwd.reaches(Family::Ipv4, Hook::Forward));
        assert!(no_v4_fwd.reaches(Family::Ipv6, Hook::Forward));
        assert!(
            no_v4_fwd.why().contains("net.ipv4.ip_forward is 0"),
            "{}",
            no_v4_fwd.why()
        );
        let output_only = reached(&q, &[Hook::Output], [true; 2]).unwrap();
        assert!(!output_only.reaches(Family::Ipv4, Hook::Prerouting));
        assert!(parse_steered_chain("PREROUTING").is_err());
        assert_eq!(all.only_new(), None);
        let new = reached_steering(&q, &STEERABLE, [true; 2], true, true).unwrap();
        assert!(new.only_new().unwrap().contains("--steered-new-only"));
        assert_eq!(new.no_loopback(), None);
        let pcap =
            reached_steering(&Source::Synthetic, &STEERABLE, [true; 2], true, false).unwrap();
        assert_eq!(
            (pcap.only_new(), pcap.no_loopback()),
            (None, None),
            "only NFQUEUE steering queues by state and exempts loopback"
        );
        let no_lo = reached_steering(&q, &STEERABLE, [true; 2], false, false).unwrap();
        assert!(no_lo.no_loopback().unwrap().contains("--include-loopback"));
        assert_eq!(no_lo.only_new(), None);
        assert_eq!(parse_steered_chain("FORWARD"), Ok(Hook::Forward));
    }
}
