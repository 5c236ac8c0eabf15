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
