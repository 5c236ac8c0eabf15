//! Differential test against the Linux kernel: for every ruleset in `tests/oracle/corpus` and
//! every packet of its `.packets` file, the rules whose counters the kernel's x_tables bumped
//! must be the ones the corpus expects (so the corpus itself is verified against the kernel),
//! and, once the engine's evaluator is merged, the ones the engine's trace reports.
//!
//! The kernel tests need root, `ip` and the `*tables-legacy*` tools: they are ignored unless asked
//! for (`-- --include-ignored`), and fail without them. See `oracle/kernel.rs` for what it sets
//! up.
//!
//! Run: `cargo test -p vallum-engine --test it -- kernel_oracle:: --nocapture`.

use crate::oracle::corpus;
use crate::oracle::kernel;

use std::path::PathBuf;

use vallum_engine::model::{Hook, ct_state};
use vallum_engine::packet::parse::{PacketError, parse_ethernet};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};

use corpus::{CorpusCase, load_corpus};
use kernel::{FW_IFACE, FW_MAC, KernelOracle, Setup, build_frame};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/corpus")
}

/// The packet the engine sees for a corpus packet: the frame as sent, parsed by our own
/// parser, arriving at INPUT on `vo1` as a NEW connection (each packet is a fresh flow).
/// An error is a packet the packet path drops before any rule (NFQUEUE answers NF_DROP).
fn packet_meta(frame: &[u8]) -> Result<Packet, PacketError> {
    let base = Packet {
        meta: PacketMeta {
            hook: Hook::Input,
            ct_state: ct_state::NEW,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new(FW_IFACE).expect("short name"),
            ..PacketFacts::default()
        },
    };
    parse_ethernet(frame, base)
}

/// What the engine hits for a corpus packet, with the frame's bytes from the IP header on
/// (as NFQUEUE hands them: `-m string`, `-m sctp --chunk-types` and `-m u32` read them): a
/// packet that does not parse is dropped before any rule, so no counter moves (what the
/// kernel shows for a hotdrop).
fn engine_hits_for(
    rules: &str,
    family: vallum_engine::model::Family,
    frame: &[u8],
) -> (Vec<(String, usize)>, Option<String>) {
    let bytes = vallum_engine::packet::parse::network_packet(frame).unwrap_or(&[]);
    match packet_meta(frame) {
        Ok(m) => engine_adapter::engine_hits(rules, family, &m, bytes),
        Err(_) => (Vec::new(), None),
    }
}

// ===== ENGINE ADAPTER =====
//
// `engine_hits` runs one packet through the engine and reports what the kernel reports: the
// filter-table rules whose counters would go up, as (chain, 1-based index within the chain),
// sorted and deduplicated, and the builtin chain whose policy was applied (or None).
mod engine_adapter {
    use std::sync::Arc;

    use vallum_engine::model::{Family, TableKind};
    use vallum_engine::packet::Packet;

    pub fn engine_hits(
        rules_text: &str,
        family: Family,
        packet: &Packet,
        bytes: &[u8],
    ) -> (Vec<(String, usize)>, Option<String>) {
        let ruleset = vallum_engine::restore::parse_ruleset(
            "oracle",
            rules_text,
            &vallum_engine::restore::ParseOptions {
                family,
                ..Default::default()
            },
        )
        .expect("corpus ruleset parses");
        // The namespace's own addresses, for `-m addrtype`.
        let sets = vallum_engine::sets::SetManager::new();
        sets.node_addrs()
            .replace(super::kernel::oracle_local_table());
        let snapshot = vallum_engine::snapshot::Snapshot::compile(&[Arc::new(ruleset)], &sets, 1)
            .expect("corpus ruleset compiles");
        let trace = snapshot.trace_tracked(packet, bytes, 0, None, |_, _| None);
        // Every rule step is a rule whose matches all matched (its counter goes up), including
        // jumps, gotos and RETURNs, in traversal order; keep the filter table's. A step without
        // a rule number is a builtin chain's policy.
        let mut hits: Vec<(String, usize)> = trace
            .steps
            .iter()
            .filter(|s| s.table == TableKind::Filter)
            .filter_map(|s| s.rule.map(|n| (s.chain.to_string(), n as usize)))
            .collect();
        hits.sort();
        hits.dedup();
        let policy = trace
            .steps
            .iter()
            .find(|s| s.table == TableKind::Filter && s.rule.is_none())
            .map(|s| s.chain.to_string());
        (hits, policy)
    }
}

// ===== end of ENGINE ADAPTER =====

/// Checks one case against the kernel (and the engine when enabled); returns failure lines.
fn check_case(oracle: &KernelOracle, case: &CorpusCase) -> Vec<String> {
    let mut failures = Vec::new();
    if let Err(e) = oracle.load(case.family, &case.rules) {
        return vec![format!("{}: loading the ruleset: {e}", case.name)];
    }
    for p in &case.packets {
        let frame = build_frame(&p.spec, FW_MAC);
        let meta = packet_meta(&frame);
        if let Ok(meta) = &meta {
            assert_eq!(
                (meta.src, meta.dst, meta.protocol),
                (p.spec.src, p.spec.dst, p.spec.proto.number()),
                "{}/{}: our parser disagrees with the frame we built",
                case.name,
                p.spec.id
            );
        }
        let got = match oracle.hits(case.family, &frame) {
            Ok(h) => h,
            Err(e) => {
                failures.push(format!("{}/{}: kernel: {e}", case.name, p.spec.id));
                continue;
            }
        };
        let mut kernel_rules = got.rules.clone();
        kernel_rules.sort();
        if (kernel_rules.as_slice(), got.policy.as_deref())
            != (p.hits.as_slice(), p.policy.as_deref())
        {
            failures.push(format!(
                "{}/{}: kernel hit {:?} policy {:?}, corpus expects {:?} policy {:?}",
                case.name, p.spec.id, kernel_rules, got.policy, p.hits, p.policy
            ));
        }
        let (engine_rules, engine_policy) = engine_hits_for(&case.rules, case.family, &frame);
        if (engine_rules.as_slice(), engine_policy.as_deref())
            != (kernel_rules.as_slice(), got.policy.as_deref())
        {
            failures.push(format!(
                "{}/{}: engine hit {:?} policy {:?}, kernel hit {:?} policy {:?}",
                case.name, p.spec.id, engine_rules, engine_policy, kernel_rules, got.policy
            ));
        }
    }
    failures
}

#[test]
fn corpus_files_parse() {
    let cases = load_corpus(&corpus_dir()).unwrap_or_else(|e| panic!("{e}"));
    assert!(cases.len() >= 6, "corpus has {} rulesets", cases.len());
    for c in &cases {
        assert!(!c.packets.is_empty(), "{} has no packets", c.name);
        for p in &c.packets {
            // every frame we would send parses back to the same header fields (a frame cut
            // inside its transport header may be refused)
            let meta = match packet_meta(&build_frame(&p.spec, FW_MAC)) {
                Ok(m) => m,
                Err(_) if p.spec.cut.is_some() => continue,
                Err(e) => panic!("{}/{}: {e}", c.name, p.spec.id),
            };
            assert_eq!(meta.family, c.family);
            assert_eq!((meta.src, meta.dst), (p.spec.src, p.spec.dst));
        }
    }
}

/// Runs without root: the corpus expectations were verified against the kernel (see
/// `kernel_agrees_with_corpus`), so the engine must reproduce them everywhere.
#[test]
fn engine_agrees_with_corpus_expectations() {
    let cases = load_corpus(&corpus_dir()).unwrap_or_else(|e| panic!("{e}"));
    let mut failures = Vec::new();
    let mut packets = 0;
    for case in &cases {
        for p in &case.packets {
            packets += 1;
            let frame = build_frame(&p.spec, FW_MAC);
            let (hits, policy) = engine_hits_for(&case.rules, case.family, &frame);
            let mut expected = p.hits.clone();
            expected.sort();
            if (hits.as_slice(), policy.as_deref()) != (expected.as_slice(), p.policy.as_deref()) {
                failures.push(format!(
                    "{}/{}: engine hit {:?} policy {:?}, corpus expects {:?} policy {:?}",
                    case.name, p.spec.id, hits, policy, expected, p.policy
                ));
            }
        }
    }
    println!(
        "engine vs corpus: {} rulesets, {packets} packets, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs root, iproute2 and iptables-legacy"]
fn kernel_agrees_with_corpus() {
    let cases = load_corpus(&corpus_dir()).unwrap_or_else(|e| panic!("{e}"));
    let oracle = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(reason)) => {
            panic!("kernel oracle: {reason}");
        }
        Err(e) => panic!("kernel oracle setup failed: {e}"),
    };
    let mut failures = Vec::new();
    let mut packets = 0;
    for case in &cases {
        packets += case.packets.len();
        failures.extend(check_case(&oracle, case));
    }
    drop(oracle);
    println!(
        "kernel oracle: {} rulesets, {packets} packets, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Drop must remove the namespaces, also when the test panics.
#[test]
#[ignore = "needs root, iproute2 and iptables-legacy"]
fn namespaces_are_removed_on_panic() {
    let oracle = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(reason)) => {
            panic!("kernel oracle: {reason}");
        }
        Err(e) => panic!("kernel oracle setup failed: {e}"),
    };
    let names = oracle.namespaces();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _o = oracle;
        panic!("deliberate");
    }));
    assert!(r.is_err());
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let list = String::from_utf8_lossy(&list.stdout);
    for ns in names {
        assert!(!list.contains(&ns), "namespace {ns} left behind");
    }
}

/// One line of `oracle/save-forms.txt`.
struct SaveForm {
    line: usize,
    family: vallum_engine::model::Family,
    table: String,
    input: String,
    /// The `-A` lines, or `None` for FAIL.
    output: Option<String>,
}

fn save_forms() -> Vec<SaveForm> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/save-forms.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.starts_with('#') || l.trim().is_empty() {
            continue;
        }
        let (head, output) = l
            .split_once(" => ")
            .unwrap_or_else(|| panic!("save-forms.txt:{}: no ' => '", i + 1));
        let mut w = head.splitn(3, ' ');
        let (Some(fam), Some(table), Some(input)) = (w.next(), w.next(), w.next()) else {
            panic!("save-forms.txt:{}: expected FAMILY TABLE INPUT", i + 1);
        };
        let family = match fam {
            "4" => vallum_engine::model::Family::Ipv4,
            "6" => vallum_engine::model::Family::Ipv6,
            _ => panic!("save-forms.txt:{}: family {fam}", i + 1),
        };
        let input = input.replace("\\n", "\n");
        let output = match output {
            "FAIL" => None,
            "=" => Some(input.clone()),
            o => Some(o.replace("\\n", "\n")),
        };
        out.push(SaveForm {
            line: i + 1,
            family,
            table: table.to_string(),
            input,
            output,
        });
    }
    out
}

/// The `-A` lines of a save text.
fn rule_lines(save: &str) -> String {
    save.lines()
        .filter(|l| l.starts_with("-A "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Our print of every `oracle/save-forms.txt` case is what iptables-save printed for it (and
/// what we refuse, iptables-restore refused).
#[test]
fn save_forms_match_iptables_save() {
    save_forms_match(false);
}

/// As [`save_forms_match_iptables_save`], and the record is checked against the kernel too.
#[test]
#[ignore = "needs root, iproute2 and iptables-legacy"]
fn save_forms_match_iptables_save_and_the_kernel() {
    if let Err(why) = kernel::availability() {
        panic!("the kernel part cannot run: {why}");
    }
    save_forms_match(true);
}

fn save_forms_match(kernel: bool) {
    use vallum_engine::restore::{ParseOptions, PrintOptions, parse, print};
    let mut failures = Vec::new();
    let forms = save_forms();
    for f in &forms {
        let text = format!("*{}\n{}\nCOMMIT\n", f.table, f.input);
        let opts = ParseOptions {
            family: f.family,
            ..ParseOptions::default()
        };
        let ours =
            parse(&text, &opts).map(|r| rule_lines(&print(&r.tables, &PrintOptions::default())));
        match (&ours, &f.output) {
            (Ok(got), Some(want)) if got == want => {}
            (Err(_), None) => {}
            _ => failures.push(format!(
                "save-forms.txt:{}: we give {ours:?}, iptables-save gave {:?}",
                f.line, f.output
            )),
        }
        if kernel {
            let k = kernel::restore_and_save(f.family, &f.table, &text).map(|s| rule_lines(&s));
            if k.as_ref().ok() != f.output.as_ref() {
                failures.push(format!(
                    "save-forms.txt:{}: the kernel gives {k:?}, the record says {:?}",
                    f.line, f.output
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("{} save forms checked (kernel: {kernel})", forms.len());
}
