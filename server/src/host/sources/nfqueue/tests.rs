use super::*;

#[test]
fn netfilter_hook_numbers() {
    let got: Vec<_> = (0..=5).map(hook_from_netfilter).collect();
    assert_eq!(
        got,
        vec![
            Some(Hook::Prerouting),
            Some(Hook::Input),
            Some(Hook::Forward),
            Some(Hook::Output),
            Some(Hook::Postrouting),
            None
        ]
    );
}

/// Loopback (ifindex 1 in every network namespace) is not Ethernet: mac_mt matches
/// nothing on it, though NFQA_HWADDR carries an all-zero address for it.
#[cfg(target_os = "linux")]
#[test]
fn loopback_is_not_ethernet() {
    let mut names = IfNames::default();
    assert_eq!(
        names.link(1, 0),
        (vallum_engine::packet::IfName::new("lo").unwrap(), false)
    );
    assert!(!names.link(0, 0).1);
}

#[test]
fn verdicts_by_mode() {
    use wire::{NF_ACCEPT, NF_DROP};
    let a = |accept, v, queued, after| {
        let cfg = NfqueueAnswers {
            accept,
            reject_mark: 0,
            facts_mark: 0,
        };
        let r = answer(cfg, v, queued, after);
        (r.verdict, r.mark, r.loop_guard)
    };
    let (acc, drop) = (Verdict::Accept, Verdict::Drop);
    let fin = NfqueueAccept::Final;
    let cont = NfqueueAccept::Continue { mark: 0x4000_0000 };
    // final: the mark only when an accepted packet's mark changed.
    assert_eq!(a(fin, acc, 7, Some(7)), (NF_ACCEPT, None, false));
    assert_eq!(a(fin, acc, 7, Some(9)), (NF_ACCEPT, Some(9), false));
    assert_eq!(a(fin, drop, 7, Some(9)), (NF_DROP, None, false));
    assert_eq!(a(fin, drop, 7, None), (NF_DROP, None, false));
    // continue: ACCEPT repeats the hook with only our bit added to the mark.
    assert_eq!(
        a(cont, acc, 0, Some(0)),
        (NF_REPEAT, Some(0x4000_0000), false)
    );
    assert_eq!(
        a(cont, acc, 0x0000_4001, Some(0x0000_4001)),
        (NF_REPEAT, Some(0x4000_4001), false),
        "a user mark survives"
    );
    assert_eq!(
        a(cont, acc, 1, Some(0x84)),
        (NF_REPEAT, Some(0x4000_0084), false),
        "our -j MARK survives"
    );
    // Our DROP is a DROP.
    assert_eq!(a(cont, drop, 0, Some(0)), (NF_DROP, None, false));
    assert_eq!(a(cont, drop, 0, None), (NF_DROP, None, false));
    // Arrived with our bit: the steering does not skip it; never repeat (no loop).
    assert_eq!(
        a(cont, acc, 0x4000_0000, Some(0x4000_0000)),
        (NF_ACCEPT, None, true)
    );
    // Without a reject field REJECT drops, as before.
    let rej = Verdict::Reject(RejectWith::TcpReset);
    assert_eq!(a(fin, rej, 0, Some(0)), (NF_DROP, None, false));
}

/// REJECT is handed to the kernel's REJECT rules: NF_REPEAT with the code in the field,
/// the rest of the mark as our rules left it, in both modes; a packet that comes back with
/// a code is dropped and never repeated again.
#[test]
fn reject_hands_the_code_to_the_kernel() {
    use wire::{NF_ACCEPT, NF_DROP};
    let r = 0x0f00_0000;
    let a = |accept, v, queued, after| {
        let r = answer(
            NfqueueAnswers {
                accept,
                reject_mark: r,
                facts_mark: 0,
            },
            v,
            queued,
            after,
        );
        (r.verdict, r.mark, r.reject_unsteered)
    };
    let fin = NfqueueAccept::Final;
    let cont = NfqueueAccept::Continue { mark: 0x4000_0000 };
    for (w, code) in [
        (RejectWith::NetUnreachable, 0x0100_0000),
        (RejectWith::PortUnreachable, 0x0300_0000),
        (RejectWith::TcpReset, 0x0800_0000),
        (RejectWith::RejectRoute, 0x0a00_0000),
    ] {
        for mode in [fin, cont] {
            assert_eq!(
                a(mode, Verdict::Reject(w), 0x4001, Some(0x4001)),
                (NF_REPEAT, Some(0x4001 | code), false),
                "{w:?} {mode:?}"
            );
        }
    }
    let port = Verdict::Reject(RejectWith::PortUnreachable);
    // The mark our rules left goes to the kernel's REJECT (its reply mark with
    // fwmark_reflect); a packet that did not parse has only the queued one.
    assert_eq!(
        a(fin, port, 1, Some(0x84)),
        (NF_REPEAT, Some(0x0300_0084), false)
    );
    // A field at the bottom of the mark.
    let low = answer(
        NfqueueAnswers {
            accept: fin,
            reject_mark: 0xf0,
            facts_mark: 0,
        },
        Verdict::Reject(RejectWith::AdminProhibited),
        0x4000_0001,
        Some(0x4000_0001),
    );
    assert_eq!((low.verdict, low.mark), (NF_REPEAT, Some(0x4000_0071)));
    // Came back with a code: no REJECT rule for it in the steering. Dropped, not looped;
    // an ACCEPT (the ruleset changed meanwhile) clears the code.
    assert_eq!(
        a(fin, port, 0x0300_0000, Some(0x0300_0000)),
        (NF_DROP, None, true)
    );
    assert_eq!(
        a(fin, Verdict::Accept, 0x0300_0005, Some(0x0300_0005)),
        (NF_ACCEPT, Some(5), true)
    );
    assert_eq!(
        a(cont, Verdict::Accept, 0x0300_0005, Some(0x0300_0005)),
        (NF_REPEAT, Some(0x4000_0005), true)
    );
    // Bits in the field that are no code (a user's mark there) are the user's.
    assert_eq!(
        a(fin, Verdict::Accept, 0x0f00_0000, Some(0x0f00_0000)),
        (NF_ACCEPT, None, false)
    );
    assert_eq!(
        a(fin, port, 0x0f00_0000, Some(0x0f00_0000)),
        (NF_REPEAT, Some(0x0300_0000), false)
    );
}

#[test]
fn kernel_and_our_states() {
    use ct_state::{ESTABLISHED, INVALID, NEW, RELATED, UNTRACKED};
    assert!(
        !ct_disagrees(None, NEW),
        "no kernel state: nothing to compare"
    );
    assert!(!ct_disagrees(Some(2), NEW));
    assert!(!ct_disagrees(Some(0), ESTABLISHED));
    assert!(!ct_disagrees(Some(3), ESTABLISHED), "ESTABLISHED_REPLY");
    assert!(!ct_disagrees(Some(4), RELATED), "RELATED_REPLY");
    assert!(ct_disagrees(Some(2), ESTABLISHED));
    assert!(ct_disagrees(Some(0), NEW));
    assert!(ct_disagrees(Some(0), INVALID));
    assert!(
        !ct_disagrees(Some(2), UNTRACKED),
        "our NOTRACK, unknown to the kernel"
    );
    assert!(!ct_disagrees(Some(7), NEW), "not a ctinfo");
}

#[test]
fn kernel_nat_status_bits() {
    assert_eq!(ct_nat(None), 0);
    // IPS_CONFIRMED | IPS_SEEN_REPLY: tracked, no NAT.
    assert_eq!(ct_nat(Some(0x0a)), 0);
    assert_eq!(ct_nat(Some(0x0a | wire::IPS_DST_NAT)), ct_state::DNAT);
    assert_eq!(ct_nat(Some(wire::IPS_SRC_NAT)), ct_state::SNAT);
    assert_eq!(
        ct_nat(Some(wire::IPS_SRC_NAT | wire::IPS_DST_NAT)),
        ct_state::SNAT | ct_state::DNAT
    );
}

#[test]
fn errors_say_what_to_do() {
    let e = QueueError {
        queue: 3,
        step: "bind queue",
        source: std::io::Error::from_raw_os_error(libc::EPERM),
    };
    let s = e.to_string();
    assert!(s.starts_with("NFQUEUE 3: bind queue: "), "{s}");
    assert!(s.contains("CAP_NET_ADMIN"), "{s}");
    assert!(s.contains("another process"), "{s}");
}
