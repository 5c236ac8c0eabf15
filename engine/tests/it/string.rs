//! `-m string` in the rule model: printed as iptables-save 1.8.9 prints it (each form below
//! checked with `iptables-legacy-save` in a namespace: a pattern with an unprintable byte or
//! a trailing backslash as `--hex-string`, libxt_string's hex reader with its quirks, `--from
//! 0` and `--to 65535` omitted, `--icase` last), and refused where iptables or the kernel
//! refuses it. Enforcement: `eval/string.rs` and `tests/it/kernel_string.rs`.

use vallum_engine::model::Family;

// Shared with the other extension tests, which use the parts this one does not.
#[allow(dead_code)]
use crate::support::one_rule;
use one_rule::printed;

#[test]
fn string_prints_as_iptables_save() {
    for (rule, want) in [
        (
            r#"-m string --hex-string "|41||42|" --algo bm"#,
            r#"-m string --string "A|42" --algo bm"#,
        ),
        (
            r#"-m string --hex-string "| 41 42|" --algo bm"#,
            r#"-m string --string "AB" --algo bm"#,
        ),
        (
            r#"-m string --string "ab\\" --algo bm"#,
            r#"-m string --hex-string "|61625c|" --algo bm"#,
        ),
        (
            r#"-m string --string "a\"b" --algo bm"#,
            r#"-m string --string "a\"b" --algo bm"#,
        ),
        (
            r#"-m string ! --hex-string "|0a0a|ab|00|" --algo bm --from 20 --to 100"#,
            r#"-m string ! --hex-string "|0a0a616200|" --algo bm --from 20 --to 100"#,
        ),
        (
            r#"-m string --algo kmp --from 0 --to 65535 --string "te st" --icase"#,
            r#"-m string --string "te st" --algo kmp --icase"#,
        ),
        (
            r#"-m string --string "a|b" --algo kmp --to 0"#,
            r#"-m string --string "a|b" --algo kmp --to 0"#,
        ),
        (
            r#"-m string --string x --algo bm --from 0x10 --to 0100"#,
            r#"-m string --string "x" --algo bm --from 16 --to 64"#,
        ),
    ] {
        assert_eq!(printed(Family::Ipv4, rule).as_deref(), Ok(want), "{rule}");
    }
    for (rule, says) in [
        ("-m string --string x --algo fsm", "not one the engine runs"),
        (
            "-m string --string x --algo bm --from 9 --to 8",
            "--from is after --to",
        ),
        (r#"-m string --string "" --algo bm"#, "empty"),
        ("-m string --string x", "--algo"),
        ("-m string --algo bm", "--string or --hex-string"),
        (
            "-m string --string x --hex-string |41| --algo bm",
            "exclude each other",
        ),
        ("-m string --hex-string |4g| --algo bm", "Invalid hex char"),
        ("-m string ! --algo bm --string x", "cannot be inverted"),
        ("-m string --string x --algo bm --to 65536", "bad value"),
    ] {
        match printed(Family::Ipv4, rule) {
            Ok(p) => panic!("{rule}: accepted as {p}"),
            Err(e) => assert!(e.contains(says), "{rule}: {e}"),
        }
    }
}
