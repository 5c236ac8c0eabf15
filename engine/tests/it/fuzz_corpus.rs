//! Runs every file of the `restore` fuzz corpus (`fuzz/corpus/restore/`) through the fuzz
//! target's check, so CI covers it without nightly: parsing must not panic, and an accepted
//! text must print to a canonical form that re-parses to the same model.

use std::path::PathBuf;

use vallum_engine::model::Family;
use vallum_engine::restore::{ParseOptions, PrintOptions, clear_locations, parse, print};

fn check(text: &str) -> bool {
    let mut accepted = false;
    for family in [Family::Ipv4, Family::Ipv6] {
        let opts = ParseOptions {
            family,
            counters: true,
            ..ParseOptions::default()
        };
        let Ok(first) = parse(text, &opts) else {
            continue;
        };
        accepted = true;
        let printed = print(&first.tables, &PrintOptions { counters: true });
        let second = match parse(&printed, &opts) {
            Ok(s) => s,
            Err(e) => panic!("canonical print does not re-parse: {e}\n{printed}"),
        };
        let (mut a, mut b) = (first.tables, second.tables);
        clear_locations(&mut a);
        clear_locations(&mut b);
        assert_eq!(a, b, "print changed the model:\n{printed}");
        // The canonical form is a fixed point.
        assert_eq!(print(&b, &PrintOptions { counters: true }), printed);
    }
    accepted
}

#[test]
fn fuzz_corpus_round_trips() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/corpus/restore"
    ));
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("fuzz corpus directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    let mut accepted = 0;
    for p in &entries {
        let bytes = std::fs::read(p).expect("corpus file");
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        if check(text) {
            accepted += 1;
        }
    }
    println!(
        "fuzz corpus: {} files, {accepted} accepted and round-tripped",
        entries.len()
    );
    assert!(entries.len() >= 10);
    // The corpus holds a few deliberately bad inputs (15-errors, 16-unterminated).
    assert!(accepted >= entries.len() - 2);
}

mod generated {
    //! Random command lines from a vocabulary of real tokens (the same property as the fuzz
    //! target, with proptest so it runs on stable).
    use proptest::prelude::*;

    const VOCAB: &[&str] = &[
        "-A",
        "INPUT",
        "-I",
        "1",
        "2",
        "-D",
        "-p",
        "tcp",
        "udp",
        "icmp",
        "ipv6-icmp",
        "all",
        "0",
        "47",
        "!",
        "-s",
        "10.1.2.3/8",
        "::1/64",
        "1.2.3.4/255.0.255.0",
        "-d",
        "-i",
        "eth+",
        "+",
        "-o",
        "lo",
        "-f",
        "-m",
        "tcp",
        "udp",
        "multiport",
        "conntrack",
        "state",
        "comment",
        "limit",
        "mark",
        "length",
        "mac",
        "iprange",
        "set",
        "icmp6",
        "addrtype",
        "--dport",
        "--sport",
        "80",
        "1:1023",
        ":",
        "4:",
        "--syn",
        "--tcp-flags",
        "SYN,ACK",
        "SYN",
        "NONE",
        "--tcp-option",
        "--dports",
        "--ports",
        "22,80,443:445",
        "--ctstate",
        "NEW,ESTABLISHED",
        "--ctproto",
        "--ctexpire",
        "3:3",
        "--ctdir",
        "REPLY",
        "--ctstatus",
        "ASSURED,NONE",
        "--state",
        "INVALID",
        "--comment",
        "\"a b\"",
        "\"\"",
        "x\\y",
        "--limit",
        "60/min",
        "7/sec",
        "--limit-burst",
        "9",
        "--mark",
        "0x10/0xff",
        "--length",
        "--mac-source",
        "02:00:00:00:00:0a",
        "--src-range",
        "1.1.1.1-1.1.1.9",
        "--match-set",
        "s1",
        "src,dst",
        "--return-nomatch",
        "--update-counters",
        "--packets-gt",
        "--icmp-type",
        "any",
        "3/1:4",
        "--icmpv6-type",
        "echo-request",
        "--dst-type",
        "LOCAL",
        "-j",
        "-g",
        "ACCEPT",
        "DROP",
        "RETURN",
        "REJECT",
        "--reject-with",
        "tcp-reset",
        "icmp-host-prohibited",
        "LOG",
        "--log-prefix",
        "\"p: \"",
        "--log-level",
        "debug",
        "--log-uid",
        "MARK",
        "--set-mark",
        "--opt=-1",
        "u",
        "-c",
        "1",
        "2",
        "-4",
        "-6",
    ];

    /// Whole option groups, so that most generated rules are valid.
    const FRAGMENTS: &[&str] = &[
        "-p tcp",
        "-p udp",
        "! -p tcp",
        "-p icmp",
        "-p 47",
        "-s 10.1.2.3/8",
        "! -d 1.2.3.4/255.0.255.0",
        "-i eth+",
        "! -o lo",
        "-f",
        "! -f",
        "-m tcp --dport 80",
        "--sport 1:1023",
        "--syn",
        "! --tcp-flags SYN,ACK NONE",
        "--tcp-option 2",
        "-m udp --dport :",
        "--dport 4:",
        "-m multiport --dports 22,80,443:445",
        "-m conntrack --ctstate NEW,ESTABLISHED --ctexpire 3:3",
        "-m conntrack --ctdir REPLY --ctproto udp ! --ctstatus ASSURED,NONE --ctorigsrc 10.0.0.0/8",
        "-m state ! --state INVALID",
        "-m comment --comment \"a 'b' \\\"c\\\"\"",
        "-m comment --comment \"\"",
        "-m limit --limit 60/min --limit-burst 9",
        "-m limit",
        "-m mark ! --mark 0x10/0xff",
        "-m length --length 4:",
        "-m mac --mac-source 02:00:00:00:00:0A",
        "-m iprange ! --dst-range 1.1.1.1-1.1.1.9",
        "-m set --match-set s1 src,dst --return-nomatch ! --update-counters --packets-gt 5",
        "-m icmp --icmp-type any",
        "-m icmp --icmp-type 3/1:4",
        "-m addrtype --dst-type LOCAL",
        "-m addrtype ! --src-type=-x",
        "-j ACCEPT",
        "-j u",
        "-g u",
        "-j REJECT --reject-with tcp-reset",
        "-j LOG --log-prefix \"p: \" --log-level debug --log-uid",
        "-j MARK --set-mark 0x1",
        "-j NFLOG --nflog-prefix \"x y\"",
        "-c 1 2",
        "-4",
    ];

    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::collection::vec(prop::sample::select(VOCAB), 0..14).prop_map(|v| v.join(" ")),
            prop::collection::vec(prop::sample::select(FRAGMENTS), 0..7).prop_map(|v| v.join(" ")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn generated_lines_round_trip(lines in prop::collection::vec(line(), 1..4)) {
            let mut text = String::from("*filter\n:u - [0:0]\n");
            for l in &lines {
                text.push_str("-A INPUT ");
                text.push_str(l);
                text.push('\n');
            }
            text.push_str("COMMIT\n");
            super::check(&text);
        }

        /// Arbitrary text, arbitrary bytes (lossy UTF-8: NUL, `\\` at line end, unicode) and
        /// arbitrary lines inside a table: never a panic, and whatever is accepted round-trips.
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,300}") {
            super::check(&text);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            super::check(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn arbitrary_lines_in_a_table_never_panic(
            lines in prop::collection::vec("[-!\"\\\\ a-zA-Z0-9:/,.=+*\\[\\]\u{0}\t\u{e9}]{0,60}", 0..6),
        ) {
            let text = format!("*filter\n:u - [0:0]\n{}\nCOMMIT\n", lines.join("\n"));
            super::check(&text);
        }

        /// Structured mutations of a valid ruleset: cut it anywhere, or splice a fragment or
        /// a random character in at any byte.
        #[test]
        fn mutated_rulesets_never_panic(
            frags in prop::collection::vec(prop::sample::select(FRAGMENTS), 1..5),
            at in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
            insert in prop_oneof![prop::sample::select(FRAGMENTS).prop_map(str::to_string), any::<char>().prop_map(String::from), Just("\n".to_string())],
        ) {
            let text = format!(
                "*filter\n:INPUT DROP [1:2]\n:u - [0:0]\n-A INPUT {}\n-I INPUT 2 -j u\n-D INPUT 1\nCOMMIT\n",
                frags.join(" ")
            );
            let boundaries: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            let i = boundaries[at.index(boundaries.len())];
            let mut spliced = text.clone();
            spliced.insert_str(i, &insert);
            super::check(&spliced);
            super::check(&text[..boundaries[cut.index(boundaries.len())]]);
        }

        #[test]
        fn generated_rules_round_trip_ipv6(frags in prop::collection::vec(prop::sample::select(FRAGMENTS), 0..7)) {
            let text = format!("*filter\n:u - [0:0]\n-A INPUT {}\nCOMMIT\n", frags.join(" "));
            super::check(&text);
        }
    }
}
