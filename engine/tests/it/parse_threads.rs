//! `restore::parse_ruleset_threads` (rule lines read ahead on several threads, commands then
//! carried out in order) gives exactly what the one-thread parse gives: the same model, the
//! same errors at the same LINE:COL, in the same order. Inputs: every file of the restore fuzz
//! corpus, the real dumps of `../shared/data` (an ignored test), and a synthetic text with every
//! kind of line the read-ahead treats specially (quoted tokens, `[p:b]` prefixes, `-I`/`-D`/
//! `-R`/`-N`/`-X`, bad `*table` lines, a missing COMMIT, CRLF, errors). Each input is repeated
//! until it is long enough for the read-ahead to run (2048 lines).

use std::path::{Path, PathBuf};

use vallum_engine::model::Family;
use vallum_engine::restore::{ParseOptions, parse_ruleset_threads};

/// `text` repeated until it has at least 2048 lines.
fn long(text: &str) -> String {
    let lines = text.lines().count().max(1);
    let mut out = String::with_capacity(text.len() * (2048 / lines + 1));
    while out.lines().count() < 2048 {
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Asserts that 2, 3 and 5 threads give the one-thread result; returns whether it parsed.
fn same(name: &str, text: &str) -> bool {
    let mut ok = false;
    for family in [Family::Ipv4, Family::Ipv6] {
        for counters in [false, true] {
            let opts = ParseOptions {
                family,
                counters,
                ..ParseOptions::default()
            };
            let one = format!("{:?}", parse_ruleset_threads("r", text, &opts, 1));
            ok |= one.starts_with("Ok");
            for threads in [2, 3, 5] {
                let many = format!("{:?}", parse_ruleset_threads("r", text, &opts, threads));
                assert!(
                    one == many,
                    "{name}: {threads} threads differ ({family:?}, counters {counters})"
                );
            }
        }
    }
    ok
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    out.retain(|p| p.is_file());
    out.sort();
    out
}

#[test]
fn fuzz_corpus_parses_the_same_on_several_threads() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/corpus/restore"
    ));
    let corpus = files(&dir);
    assert!(!corpus.is_empty(), "fuzz corpus at {}", dir.display());
    let mut parsed = 0;
    for p in &corpus {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        if same(&p.display().to_string(), &long(&text)) {
            parsed += 1;
        }
    }
    println!("{} corpus files, {parsed} parsed", corpus.len());
    assert!(parsed > 0, "some corpus files are valid rulesets");
}

#[test]
#[ignore = "needs ../shared/data"]
fn real_dumps_parse_the_same_on_several_threads() {
    let data = std::env::var_os("VALLUM_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data"))
        });
    let mut dumps = files(&data.join("iptables-save"));
    dumps.extend(files(&data.join("iptables-tests/shell-dumps")));
    if dumps.is_empty() {
        panic!("real dumps: ../shared/data/iptables-save not found");
    }
    let mut parsed = 0;
    for p in &dumps {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        if same(&p.display().to_string(), &long(&text)) {
            parsed += 1;
        }
    }
    println!("{} dumps, {parsed} parsed", dumps.len());
    assert!(parsed > 0);
}

/// A long text with every kind of line the read-ahead treats specially; with `errors`, also
/// lines that fail in each way a line can.
fn synthetic(errors: bool) -> String {
    let mut t = String::new();
    t.push_str("# a comment\n*filter\n:INPUT DROP [1:2]\n:FORWARD ACCEPT [0:0]\n:OUT-1 - [0:0]\n");
    for i in 0..3000 {
        let line = match i % 23 {
            0 => format!("-A INPUT -s 10.{}.0.0/16 -j OUT-1\n", i % 256),
            1 => format!(
                "[{i}:{}] -A INPUT -p tcp --dport {} -j ACCEPT\n",
                i * 60,
                i % 65536
            ),
            2 => format!("-A INPUT -m comment --comment \"rule {i}\" -j DROP\n"),
            3 => "-A \"INPUT\" -p udp -j ACCEPT\n".to_string(),
            4 => "-I INPUT 1 -p icmp -j ACCEPT\n".to_string(),
            5 => "-D INPUT -p icmp -j ACCEPT\n".to_string(),
            6 => "-R INPUT 1 -p tcp -j DROP\n".to_string(),
            7 => format!("-N USER-{i}\n"),
            8 => format!("-X USER-{}\n", i - 1),
            9 if errors => "-A INPUT -p tcp --dport 1 -j NOWHERE\n".to_string(),
            10 if errors => "-A INPUT -p tcp --dportx 1 -j ACCEPT\n".to_string(),
            11 if errors => "[x:1] -A INPUT -j ACCEPT\n".to_string(),
            12 if errors => "-A INPUT -m comment --comment \"unterminated -j ACCEPT\n".to_string(),
            13 => "  -A OUT-1 -d 192.0.2.1 -j RETURN\r\n".to_string(),
            14 if errors => "-A MISSING -j ACCEPT\n".to_string(),
            15 if errors => "-A INPUT -s 300.1.1.1 -j ACCEPT\n".to_string(),
            16 if errors => "-A INPUT -s 2001:db8::/32 -j ACCEPT\n".to_string(),
            17 => "-A INPUT -j \"OUT-1\"\n".to_string(),
            18 => "-A FORWARD -i eth+ ! -o docker0 -j ACCEPT\n".to_string(),
            19 => "-P FORWARD DROP\n".to_string(),
            20 => format!(
                "-A INPUT -m state --state NEW -m tcp -p tcp --sport {} -j LOG --log-prefix \"x {i}\"\n",
                i % 1000
            ),
            21 => "\n".to_string(),
            _ => format!(
                "-A OUT-1 -p udp -m multiport --dports 53,{} -j ACCEPT\n",
                i % 1000 + 1
            ),
        };
        t.push_str(&line);
        if i == 1500 {
            // A table change mid-text; with errors also a bad table, a rule outside any
            // block and a missing COMMIT.
            t.push_str("COMMIT\n");
            if errors {
                t.push_str("-A INPUT -j ACCEPT\n*bogus\n-A INPUT -j ACCEPT\nCOMMIT\n");
            }
            t.push_str("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -p tcp -j REDIRECT --to-ports 8080\n");
            t.push_str(if errors { "" } else { "COMMIT\n" });
            t.push_str("*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUT-1 - [0:0]\n");
            t.push_str(":FORWARD ACCEPT [0:0]\n-A INPUT -p icmp -j ACCEPT\n-A INPUT -j ACCEPT\n");
        }
    }
    t.push_str("COMMIT\n");
    t
}

#[test]
fn every_kind_of_line_parses_the_same_on_several_threads() {
    assert!(!same("synthetic", &synthetic(true)), "the text has errors");
    let clean = synthetic(false);
    let first = parse_ruleset_threads("r", &clean, &ParseOptions::default(), 1);
    assert!(first.is_ok(), "the clean text parses: {:?}", first.err());
    assert!(same("synthetic, clean", &clean));
}
