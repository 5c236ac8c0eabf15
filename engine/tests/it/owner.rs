//! `-m owner` (OUTPUT): numeric uid/gid ranges and `--socket-exists`, printed as
//! iptables-save prints them, refused where the kernel refuses them (other hooks, names the
//! engine cannot resolve), and decided as owner_mt from the socket's uid and gid
//! ([`PacketMeta::owner`], NFQUEUE's NFQA_UID / NFQA_GID).

use std::sync::Arc;

use vallum_engine::model::{Family, Hook};
use vallum_engine::packet::{Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::validate;

use crate::support::one_rule;

/// `rule` in filter OUTPUT (where the kernel loads `-m owner`), printed back; the first
/// parse error otherwise.
fn printed(f: Family, rule: &str) -> Result<String, String> {
    let text = format!("*filter\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT {rule}\nCOMMIT\n");
    let r =
        vallum_engine::restore::parse(&text, &one_rule::opts(f)).map_err(|e| e.0[0].to_string())?;
    let c = r.tables[0].chain("OUTPUT").expect("OUTPUT");
    Ok(vallum_engine::restore::print_rule_spec(&c.rules[0], f))
}

#[test]
fn owner_forms_and_refusals() {
    let f = Family::Ipv4;
    for (rule, want) in [
        ("-m owner --uid-owner 0", "-m owner --uid-owner 0"),
        (
            "-m owner --uid-owner 1000-2000",
            "-m owner --uid-owner 1000-2000",
        ),
        (
            "-m owner --gid-owner 5 --uid-owner 7 ! --socket-exists",
            "-m owner ! --socket-exists --uid-owner 7 --gid-owner 5",
        ),
        (
            "-m owner ! --uid-owner 1 --gid-owner 2 --suppl-groups",
            "-m owner ! --uid-owner 1 --gid-owner 2 --suppl-groups",
        ),
    ] {
        assert_eq!(printed(f, rule).as_deref(), Ok(want), "{rule}");
        assert_eq!(printed(f, want).as_deref(), Ok(want), "{want}");
    }
    for bad in [
        "-m owner",
        "-m owner --uid-owner root",
        "-m owner --uid-owner 4294967295",
        "-m owner --uid-owner 5-1",
        "-m owner --suppl-groups",
    ] {
        let e = printed(f, bad).expect_err(bad);
        assert!(e.starts_with("3:"), "{bad}: {e}");
    }
    // Without the caller's lookup (vallumd gives the host's), a name is refused.
    assert!(
        printed(f, "-m owner --uid-owner root")
            .expect_err("name")
            .contains("does not exist on this host")
    );
    // With it, the name is the number, printed as iptables-save prints it.
    let host = |db: vallum_engine::restore::OwnerDb, n: &str| {
        (n == "alice").then_some(match db {
            vallum_engine::restore::OwnerDb::User => 1001,
            vallum_engine::restore::OwnerDb::Group => 2002,
        })
    };
    let named = vallum_engine::restore::parse(
        "*filter\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -m owner --uid-owner alice --gid-owner alice\nCOMMIT\n",
        &ParseOptions {
            resolve_owner: Some(&host),
            ..ParseOptions::default()
        },
    )
    .expect("resolved");
    let c = named.tables[0].chain("OUTPUT").expect("OUTPUT");
    assert_eq!(
        vallum_engine::restore::print_rule_spec(&c.rules[0], f),
        "-m owner --uid-owner 1001 --gid-owner 2002"
    );
    // In the builtin INPUT chain the kernel refuses it: so does the parser.
    let e = one_rule::printed(f, "-m owner --uid-owner 0").expect_err("INPUT");
    assert!(e.contains("only in OUTPUT and POSTROUTING"), "{e}");
    // In a user chain INPUT jumps to (a packet there has no local socket) validation
    // refuses it, naming the hook.
    let rs = parse_ruleset(
        "t",
        "*filter\n:INPUT ACCEPT [0:0]\n:X - [0:0]\n-A INPUT -j X\n-A X -m owner --uid-owner 0\nCOMMIT\n",
        &ParseOptions::default(),
    )
    .expect("parses");
    let v = validate(&rs, None);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].to_string().contains("-m owner"), "{}", v[0]);
}

#[test]
fn owner_decides_by_the_socket() {
    let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT DROP [0:0]\n\
        -A OUTPUT -m owner ! --socket-exists -j ACCEPT\n\
        -A OUTPUT -m owner --uid-owner 1000-1999 ! --gid-owner 50 -j ACCEPT\n\
        -A OUTPUT -m owner ! --uid-owner 0 -j REJECT\n\
        -A OUTPUT -m owner --socket-exists --gid-owner 0 -j ACCEPT\nCOMMIT\n";
    let rs = Arc::new(parse_ruleset("t", text, &ParseOptions::default()).expect("parses"));
    assert!(validate(&rs, None).is_empty());
    let reject = Verdict::Reject(vallum_engine::model::RejectWith::PortUnreachable);
    for classifier in [Classifier::Linear, Classifier::default()] {
        let snap = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, classifier)
            .expect("compiles");
        for (owner, want) in [
            // No socket (the kernel's own packets): rule 1.
            (None, Verdict::Accept),
            (Some((1500, 100)), Verdict::Accept),
            // gid 50 fails rule 2; not root: rule 3.
            (Some((1500, 50)), reject),
            (Some((2000, 100)), reject),
            // root with gid 0: rule 4; with another gid: the policy.
            (Some((0, 0)), Verdict::Accept),
            (Some((0, 7)), Verdict::Drop),
        ] {
            let p = Packet {
                meta: PacketMeta {
                    hook: Hook::Output,
                    protocol: 17,
                    ..PacketMeta::default()
                },
                facts: PacketFacts {
                    owner,
                    ..PacketFacts::default()
                },
            };
            assert_eq!(snap.trace(&p, 0).verdict, want, "{owner:?}");
        }
    }
}
