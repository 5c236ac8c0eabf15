//! Rulesets with many chains, as an attacker would send them: a line of 100k chains each
//! jumping to the next goes through parse, validation, commit, compile and trace on a thread
//! with a 256 KiB stack (nothing recurses on chain depth), and the parser's bookkeeping of
//! chains and jump targets (kept in maps so that a command costs the same whatever the number
//! of chains) gives what iptables-restore gives.

use crate::support::seeded;

use std::sync::Arc;

use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, CommitError, Engine, EngineConfig};
use vallum_engine::model::{Hook, Ruleset};
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::{ParseErrorKind, ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Snapshot, Verdict};
use vallum_engine::validate::{ViolationKind, validate};

/// The text of issue #13: INPUT jumps to C0, each Ci to C(i+1).
fn line_of_jumps(n: usize) -> String {
    let mut t = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..n {
        t.push_str(&format!(":C{i} - [0:0]\n"));
    }
    t.push_str("-A INPUT -j C0\n");
    for i in 0..n - 1 {
        t.push_str(&format!("-A C{i} -j C{}\n", i + 1));
    }
    t.push_str("COMMIT\n");
    t
}

/// Runs `f` on a thread with a 256 KiB stack.
fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let t = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(f)
        .expect("spawn");
    match t.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

#[test]
fn a_line_of_100k_jumps_is_refused_on_a_small_stack() {
    const N: usize = 100_000;
    small_stack(|| {
        let rs =
            parse_ruleset("deep", &line_of_jumps(N), &ParseOptions::default()).expect("parses");
        assert_eq!(rs.tables[0].chains.len(), N + 3);
        let kinds: Vec<ViolationKind> = validate(&rs, None).into_iter().map(|v| v.kind).collect();
        assert_eq!(kinds, [ViolationKind::TooDeep(N)]);

        let engine = Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: None,
            },
            Arc::new(seeded::ZeroClock),
        );
        match engine.commit(Change::Put(rs.clone()), &NoSets) {
            Err(CommitError::Invalid(v)) => {
                assert!(
                    v.iter().any(|v| v.kind == ViolationKind::TooDeep(N)),
                    "{v:?}"
                )
            }
            other => panic!("committed a 100k-deep ruleset: {:?}", other.map(|_| ())),
        }
        assert!(engine.rulesets().is_empty());

        // The compiler and the packet path, given the unvalidated ruleset: a packet that
        // would nest deeper than the limit is dropped, as the kernel does.
        let snap = Snapshot::compile(&[Arc::new(rs)], &NoSets, 1).expect("compiles");
        let pkt = PacketMeta {
            hook: Hook::Input,
            src: "10.0.0.1".parse().expect("address"),
            dst: "10.0.0.2".parse().expect("address"),
            protocol: 6,
            ..PacketMeta::default()
        };
        assert_eq!(snap.trace(pkt, 0).verdict, Verdict::Drop);
    });
}

fn parse(text: &str) -> Result<Ruleset, Vec<ParseErrorKind>> {
    parse_ruleset("x", text, &ParseOptions::default())
        .map_err(|e| e.0.into_iter().map(|e| e.kind).collect())
}

fn user_chains(rs: &Ruleset) -> Vec<&str> {
    (rs.tables[0].chains.iter())
        .filter(|c| c.policy.is_none())
        .map(|c| c.name.as_str())
        .collect()
}

/// `-X` refuses a chain some rule jumps or goes to, and deletes it once every such rule is
/// gone, whichever command removed them (`-D` by number or spec, `-R`, `-F`, create-or-flush).
#[test]
fn delete_chain_follows_the_rules_that_target_it() {
    let head = "*filter\n:INPUT ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n:C - [0:0]\n";
    let in_use = |cmds: &str| {
        let t = format!("{head}-A INPUT -j A\n-A B -g A\n{cmds}-X A\nCOMMIT\n");
        match parse(&t) {
            Ok(rs) => {
                assert!(!user_chains(&rs).contains(&"A"), "{t}");
                false
            }
            Err(e) => {
                assert_eq!(e, [ParseErrorKind::ChainInUse("A".into())], "{t}");
                true
            }
        }
    };
    assert!(in_use(""));
    assert!(in_use("-D INPUT 1\n"));
    assert!(!in_use("-D INPUT 1\n-D B 1\n"));
    assert!(!in_use("-D INPUT -j A\n-F B\n"));
    assert!(!in_use("-R INPUT 1 -j C\n:B - [0:0]\n"));
    assert!(in_use("-R INPUT 1 -j C\n-I C 1 -j A\n"));
    assert!(!in_use("-F\n"));
    // A chain deleted from the middle leaves the others findable by name.
    let rs = parse(&format!("{head}-X B\n-A C -j A\n-A A -j ACCEPT\nCOMMIT\n")).expect("parses");
    assert_eq!(user_chains(&rs), ["A", "C"]);
    // -X without a chain names the first busy chain by name.
    assert_eq!(
        parse(&format!(
            "{head}-A C -j ACCEPT\n-A INPUT -j B\n-X\nCOMMIT\n"
        ))
        .unwrap_err(),
        [ParseErrorKind::ChainInUse("B".into())]
    );
    let rs = parse(&format!("{head}-X\n:D - [0:0]\n-A INPUT -j D\nCOMMIT\n")).expect("parses");
    assert_eq!(user_chains(&rs), ["D"]);
}
