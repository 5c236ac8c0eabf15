//! Docker's ipset ruleset (`docker-moby-usernet-portmap-ipset.rules` from `../shared/data`)
//! against a [`SetManager`]: it fails validation and compilation while
//! `docker-ext-bridges-v4` is missing, passes once `ipset restore` text created it, and the
//! compiled snapshot follows later set changes (delete, swap) without a recompile.
//!
//! Ignored unless asked for (`-- --include-ignored`); fails when the data file is absent.

use std::path::PathBuf;
use std::sync::Arc;

use vallum_engine::model::{Family, Hook, ct_state};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::SetManager;
use vallum_engine::snapshot::{Snapshot, Verdict};
use vallum_engine::validate::{Severity, ViolationKind, validate};

/// `<repo>/../shared/data` (CI clones the repo beside `shared/`), else `$VALLUM_SHARED_DATA`.
fn data_dir() -> Option<PathBuf> {
    let canonical = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data"));
    if canonical.is_dir() {
        return Some(canonical);
    }
    let env = PathBuf::from(std::env::var_os("VALLUM_SHARED_DATA")?);
    env.is_dir().then_some(env)
}

fn forward(dst: &str) -> Packet {
    Packet {
        meta: PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Forward,
            src: "198.51.100.9".parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: 6,
            sport: 40000,
            dport: 80,
            len: 60,
            ct_state: ct_state::NEW,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new("eth0").unwrap(),
            out_iface: IfName::new("docker0").unwrap(),
            ..PacketFacts::default()
        },
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn docker_ipset_ruleset_validates_and_compiles_with_the_set() {
    let Some(dir) = data_dir() else {
        panic!("shared/data not found (set VALLUM_SHARED_DATA)");
    };
    let path = dir.join("iptables-save/docker-moby-usernet-portmap-ipset.rules");
    let Ok(text) = std::fs::read_to_string(&path) else {
        panic!("{} not found", path.display());
    };
    let rs = Arc::new(parse_ruleset("docker", &text, &ParseOptions::default()).unwrap());
    let sets = SetManager::new();

    let v = validate(&rs, Some(&sets));
    assert!(
        v.iter().any(|v| v.severity == Severity::Error
            && matches!(&v.kind, ViolationKind::UnknownSet(n) if n == "docker-ext-bridges-v4")),
        "{v:?}"
    );
    assert!(Snapshot::compile(std::slice::from_ref(&rs), &sets, 1).is_err());

    sets.restore(
        "create docker-ext-bridges-v4 hash:net family inet hashsize 1024 maxelem 65536\n\
         add docker-ext-bridges-v4 172.17.0.0/16\n\
         add docker-ext-bridges-v4 192.0.2.0/24\n\
         create docker-ext-bridges-v4-new hash:net family inet hashsize 1024 maxelem 65536\n\
         add docker-ext-bridges-v4-new 192.0.2.0/24\n",
        0,
    )
    .unwrap();
    let errors: Vec<String> = validate(&rs, Some(&sets))
        .iter()
        .filter(|v| v.severity == Severity::Error)
        .map(ToString::to_string)
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    let snap = Snapshot::compile(std::slice::from_ref(&rs), &sets, 1).unwrap();
    let verdict =
        |dst: &str| crate::support::classify_one(&snap, 0, &mut forward(dst), 0, &mut Vec::new());

    // A NEW packet from outside to docker0: FORWARD -> (set dst) DOCKER -> `! -i docker0 -o
    // docker0 -j DROP`. Outside the set it falls through to the ACCEPT policy.
    assert_eq!(verdict("172.17.0.2"), Verdict::Drop);
    assert_eq!(verdict("10.99.0.2"), Verdict::Accept);
    // Established traffic to a bridge is accepted by the set + conntrack rule.
    let mut est = forward("172.17.0.2");
    est.ct_state = ct_state::ESTABLISHED;
    assert_eq!(
        crate::support::classify_one(&snap, 0, &mut est, 0, &mut Vec::new()),
        Verdict::Accept
    );

    // Set changes reach the compiled snapshot without a recompile.
    sets.swap("docker-ext-bridges-v4", "docker-ext-bridges-v4-new")
        .unwrap();
    assert_eq!(verdict("172.17.0.2"), Verdict::Accept);
    sets.add_str("docker-ext-bridges-v4", &["172.17.0.0/16"], 0)
        .unwrap();
    assert_eq!(verdict("172.17.0.2"), Verdict::Drop);
    sets.delete_str("docker-ext-bridges-v4", &["172.17.0.0/16"])
        .unwrap();
    assert_eq!(verdict("172.17.0.2"), Verdict::Accept);
    assert!(sets.handle_count("docker-ext-bridges-v4").unwrap() >= 1);
}
