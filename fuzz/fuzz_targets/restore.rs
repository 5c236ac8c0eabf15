//! Fuzzes the iptables-restore parser: on any UTF-8 input it must not panic, and when it
//! accepts the input, the canonical print must re-parse to the same model (up to locations).
//! The same check runs over the committed corpus in `engine/tests/it/fuzz_corpus.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vallum_engine::model::Family;
use vallum_engine::restore::{ParseOptions, PrintOptions, clear_locations, parse, print};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for family in [Family::Ipv4, Family::Ipv6] {
        let opts = ParseOptions {
            family,
            counters: true,
            ..ParseOptions::default()
        };
        let Ok(first) = parse(text, &opts) else {
            continue;
        };
        let printed = print(&first.tables, &PrintOptions { counters: true });
        let second = parse(&printed, &opts).expect("canonical print re-parses");
        let (mut a, mut b) = (first.tables, second.tables);
        clear_locations(&mut a);
        clear_locations(&mut b);
        assert_eq!(a, b, "print changed the model:\n{printed}");
    }
});
