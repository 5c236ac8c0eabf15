//! The nft text parser and printer (`vallum_engine::nft`) against the nft project's own vectors
//! in `shared/data/nft-tests` (see SOURCES.md there):
//! - `shell-dumps/*.nft` are kernel listings (`nft list ruleset`): each that parses prints back
//!   byte for byte; the others are refused by name. The supported count may not fall.
//! - `py/*.t` rules: each `ok` rule of the ip, ip6 and inet families is parsed in a table
//!   with the file's sets, and its listing compared with the expected listing (the third
//!   field, or the rule itself), with the spacing and element order inside `{ }` normalised as
//!   the nft project's own harness (nft-test.py) compares; `fail` rules must not parse. Every
//!   listing we print parses back to itself and survives a JSON round trip. Each parsed rule
//!   is also lowered onto the engine (`nft::lower`): it validates and compiles, or it is
//!   refused naming the construct at its position; the lowered count may not fall.
//!
//! Run with `cargo test -p vallum-engine --test it -- nft_vectors:: --include-ignored
//! --nocapture` to see the counts. Ignored unless asked for; fails when the data is absent.

use std::collections::BTreeMap;
use std::path::PathBuf;

use vallum_engine::nft;

/// `<repo>/../shared/data/nft-tests` (CI clones the repo beside `shared/`), else
/// `$VALLUM_SHARED_DATA/nft-tests`; panics when absent.
fn vectors() -> PathBuf {
    let canonical = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data"));
    let base = if canonical.is_dir() {
        canonical
    } else {
        PathBuf::from(
            std::env::var_os("VALLUM_SHARED_DATA")
                .expect("shared/data not found (set VALLUM_SHARED_DATA)"),
        )
    };
    let dir = base.join("nft-tests");
    assert!(dir.is_dir(), "{} not found", dir.display());
    dir
}

/// The reason of a refusal without its position (for the summary).
fn reason(e: &nft::NftErrors) -> String {
    e.0.first().map_or(String::new(), |e| e.kind.to_string())
}

/// How many shell dumps must parse and print back byte for byte (raise it, never lower it).
const DUMPS_SUPPORTED: usize = 7;

#[test]
#[ignore = "needs ../shared/data"]
fn shell_dumps_print_back_byte_equal() {
    let dir = vectors().join("shell-dumps");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read shell-dumps")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "nft"))
        .collect();
    files.sort();
    let (mut supported, mut refused) = (Vec::new(), Vec::new());
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read dump");
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        match nft::parse(&name, &text) {
            Ok(rs) => {
                let printed = nft::print(&rs);
                assert_eq!(printed, text, "{name}: the listing differs");
                supported.push(name);
            }
            Err(e) => refused.push(format!("{name}: {e}")),
        }
    }
    println!(
        "shell dumps: {} supported, {} refused",
        supported.len(),
        refused.len()
    );
    for r in &refused {
        println!("  refused {r}");
    }
    assert!(
        supported.len() >= DUMPS_SUPPORTED,
        "supported dumps fell to {} (floor {DUMPS_SUPPORTED})",
        supported.len()
    );
}

/// Normalises a listing as nft-test.py compares them: blanks collapsed, elements inside `{ }`
/// sorted, and counters stateless (nft-test.py lists with `--stateless`).
fn normalise(s: &str) -> String {
    let spaced = s
        .replace('{', " { ")
        .replace('}', " } ")
        .replace(',', ", ")
        .replace(":accept", " : accept")
        .replace(":drop", " : drop");
    let mut words: Vec<&str> = spaced.split_whitespace().collect();
    // `counter packets N bytes M` lists as `counter` in nft-test.py's stateless listing.
    while let Some(k) = words
        .windows(5)
        .position(|w| w[0] == "counter" && w[1] == "packets" && w[3] == "bytes")
    {
        words.drain(k + 1..k + 5);
    }
    let flat = words.join(" ").replace(" ,", ",");
    let mut out = String::new();
    let mut rest = flat.as_str();
    while let Some(open) = rest.find("{ ") {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find(" }") else {
            break;
        };
        let mut elems: Vec<&str> = rest[open + 2..open + close].split(", ").collect();
        elems.sort_unstable();
        out.push_str("{ ");
        out.push_str(&elems.join(", "));
        out.push_str(" }");
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    out
}

/// The outcome of one py rule in one family.
#[derive(Debug, Default)]
struct Tally {
    pass: usize,
    refused: BTreeMap<String, usize>,
    mismatch: Vec<String>,
    fail_accepted: Vec<String>,
    fail_refused: usize,
}

/// How many py rule vectors (rule x family) must pass (raise it, never lower it).
const PY_PASSING: usize = 1030;

/// How many of the parsed py rule vectors must lower onto the engine and compile (raise it,
/// never lower it).
const PY_LOWERED: usize = 873;

/// What `nft::lower` made of the parsed py vectors.
#[derive(Default)]
struct Lowering {
    /// Lowered, validated without errors and compiled (in an enforced or a stored-only chain).
    lowered: usize,
    /// Of those, in a nat chain (stored only).
    stored_only: usize,
    /// Refused, by the construct named.
    refused: BTreeMap<String, usize>,
}

impl Lowering {
    /// Lowers `rs` (parsed from `src`): it lowers, validates and compiles, or it is refused
    /// naming a construct in backticks at a position in the rule's line; anything else fails.
    fn add(&mut self, rs: &nft::Ruleset, src: &str, id: &str) {
        use std::sync::Arc;
        use vallum_engine::sets::{SetManager, SetRegistry};
        let l = match nft::lower(rs, "v", src, "v", 0) {
            Ok(l) => l,
            Err(e) => {
                let e = &e.0[0];
                let what = match &e.kind {
                    nft::ErrorKind::Unsupported(w) => w.clone(),
                    other => panic!("{id}: refused without a name: {other}"),
                };
                assert!(what.contains('`'), "{id}: `{what}` names no construct");
                assert!(e.pos.line >= 1, "{id}: no position");
                *self.refused.entry(what).or_default() += 1;
                return;
            }
        };
        let sets = SetManager::new();
        sets.node_addrs()
            .replace_routes(Some(vallum_engine::fib::Fib::with_default_rules([])));
        for s in &l.sets {
            sets.create(&s.name, s.spec)
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            sets.add(&s.name, s.elements.iter().copied(), 0)
                .unwrap_or_else(|e| panic!("{id}: {e}"));
        }
        let v = vallum_engine::validate::validate(&l.ruleset, Some(&sets as &dyn SetRegistry));
        assert!(!vallum_engine::validate::has_errors(&v), "{id}: {v:#?}");
        vallum_engine::snapshot::Snapshot::compile(&[Arc::new(l.ruleset)], &sets, 1)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        self.lowered += 1;
        self.stored_only += usize::from(!l.stored_only.is_empty());
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn py_vectors_list_canonically() {
    let dir = vectors().join("py");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read py")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let mut tally = Tally::default();
    let mut lowering = Lowering::default();
    let mut families_refused = BTreeMap::<String, usize>::new();
    for f in &files {
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let text = std::fs::read_to_string(f).expect("read .t");
        let mut chain_specs: BTreeMap<String, String> = BTreeMap::new();
        let mut tables: Vec<(String, String)> = Vec::new(); // (family, chain)
        let mut sets: Vec<(String, String, bool)> = Vec::new(); // (name, decl, map)
        let mut elements: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') || line.starts_with('-') {
                continue;
            }
            if let Some(rest) = line.strip_prefix(':') {
                let (chain, spec) = rest.split_once(';').expect("chain line");
                chain_specs.insert(chain.to_string(), spec.to_string());
                continue;
            }
            if let Some(rest) = line.strip_prefix('*') {
                let parts: Vec<&str> = rest.split(';').collect();
                let family = parts[0];
                if matches!(family, "ip" | "ip6" | "inet") {
                    let chain = parts[2].split(',').next().expect("chain").to_string();
                    tables.push((family.to_string(), chain));
                } else {
                    *families_refused.entry(family.to_string()).or_default() += 1;
                }
                continue;
            }
            let fields: Vec<&str> = line.split(';').collect();
            if let Some(rest) = line.strip_prefix('!') {
                let decl = rest.rsplit_once(';').map_or(rest, |(d, _)| d);
                if fields.last() == Some(&"ok") {
                    let (n, d) = decl.split_once(' ').expect("set decl");
                    sets.push((n.to_string(), d.to_string(), d.contains(" : ")));
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix('?') {
                if fields.last() == Some(&"ok") {
                    let elems = rest.rsplit_once(';').map_or(rest, |(d, _)| d);
                    let (n, e) = elems.split_once(' ').expect("element line");
                    elements.push((n.to_string(), e.to_string()));
                }
                continue;
            }
            let rule = fields[0];
            let ok = fields.get(1) == Some(&"ok");
            let expected = fields.get(2).copied().unwrap_or(rule);
            for (family, chain) in &tables {
                let spec = &chain_specs[chain];
                let mut src = format!("table {family} test {{\n");
                for (n, d, map) in &sets {
                    src.push_str(&format!(
                        "\t{} {n} {{ {d} }}\n",
                        if *map { "map" } else { "set" }
                    ));
                }
                src.push_str(&format!("\tchain {chain} {{ {spec}; }}\n}}\n"));
                for (n, e) in &elements {
                    src.push_str(&format!("add element {family} test {n} {{ {e} }}\n"));
                }
                src.push_str(&format!("add rule {family} test {chain} {rule}\n"));
                let id = format!("{name} [{family}] {rule}");
                match (nft::parse(&name, &src), ok) {
                    (Ok(rs), true) => {
                        let t = rs.tables.last().expect("table");
                        let c = t.chains.iter().find(|c| c.name == *chain).expect("chain");
                        let listing = nft::print(&rs);
                        let got = listing
                            .lines()
                            .rev()
                            .nth(2)
                            .map(str::trim)
                            .unwrap_or_default()
                            .to_string();
                        assert_eq!(c.rules.len(), 1, "{id}");
                        lowering.add(&rs, &src, &id);
                        // The listing is a fixed point: it parses back to itself, in text and JSON.
                        let again = nft::parse("listing", &listing).unwrap_or_else(|e| {
                            panic!("{id}: our listing does not parse: {e}\n{listing}")
                        });
                        assert_eq!(
                            nft::print(&again),
                            listing,
                            "{id}: listing is not a fixed point"
                        );
                        let json = nft::from_json("json", &nft::to_json(&rs).to_string())
                            .unwrap_or_else(|e| panic!("{id}: our JSON does not read back: {e}"));
                        assert_eq!(nft::print(&json), listing, "{id}: JSON round trip differs");
                        if normalise(&got) == normalise(expected) {
                            tally.pass += 1;
                        } else {
                            tally
                                .mismatch
                                .push(format!("{id}\n      want {expected}\n      got  {got}"));
                        }
                    }
                    (Err(e), true) => *tally.refused.entry(reason(&e)).or_default() += 1,
                    (Ok(_), false) => tally.fail_accepted.push(id),
                    (Err(_), false) => tally.fail_refused += 1,
                }
            }
        }
    }
    println!(
        "py vectors: {} pass, {} refused by name, {} mismatches, {} fail vectors refused, {} fail vectors accepted",
        tally.pass,
        tally.refused.values().sum::<usize>(),
        tally.mismatch.len(),
        tally.fail_refused,
        tally.fail_accepted.len()
    );
    println!("families refused by name (vector files): {families_refused:?}");
    println!(
        "lowered onto the engine: {} (in nat chains, stored only: {}), refused by name: {}",
        lowering.lowered,
        lowering.stored_only,
        lowering.refused.values().sum::<usize>()
    );
    for (r, n) in &lowering.refused {
        println!("  not lowered x{n}: {r}");
    }
    assert!(
        lowering.lowered >= PY_LOWERED,
        "lowered py vectors fell to {}",
        lowering.lowered
    );
    for (r, n) in &tally.refused {
        println!("  refused x{n}: {r}");
    }
    for m in &tally.mismatch {
        println!("  MISMATCH {m}");
    }
    for m in &tally.fail_accepted {
        println!("  ACCEPTED-FAIL {m}");
    }
    assert!(
        tally.pass >= PY_PASSING,
        "passing py vectors fell to {}",
        tally.pass
    );
    // Known: nft lists a single address of a nat map's interval data as `/32`
    // (`dnat ip to iifname . ip saddr map { ... : 1.1.2.69/32 }`), which we list as the address;
    // and nft v1.1 lists `tcp flags & (all eight) == (all eight)` as `tcp flags == 0xff` (x3
    // families), which we list as written.
    const KNOWN_MISMATCHES: usize = 4;
    assert!(
        tally.mismatch.len() <= KNOWN_MISMATCHES,
        "{} listings differ",
        tally.mismatch.len()
    );
}

/// How many shell dumps must read from their JSON form (`.json-nft`) to the same listing.
const JSON_DUMPS_SUPPORTED: usize = 7;

#[test]
#[ignore = "needs ../shared/data"]
fn shell_dump_json_reads_to_the_same_listing_and_round_trips() {
    let dir = vectors().join("shell-dumps");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read shell-dumps")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json-nft"))
        .collect();
    files.sort();
    let (mut supported, mut refused) = (0, Vec::new());
    for f in &files {
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let json = std::fs::read_to_string(f).expect("read json");
        let text = std::fs::read_to_string(f.with_extension("nft")).expect("read the .nft twin");
        match nft::from_json(&name, &json) {
            Ok(rs) => {
                assert_eq!(
                    nft::print(&rs),
                    text,
                    "{name}: JSON and text listings differ"
                );
                // And back: model -> JSON -> model is the identity (up to positions).
                let again = nft::from_json(&name, &nft::to_json(&rs).to_string())
                    .expect("our JSON reads back");
                assert_eq!(
                    nft::print(&again),
                    text,
                    "{name}: our JSON does not read back"
                );
                supported += 1;
            }
            Err(e) => refused.push(format!("{name}: {e}")),
        }
    }
    println!(
        "shell dumps (JSON): {supported} supported, {} refused",
        refused.len()
    );
    for r in &refused {
        println!("  refused {r}");
    }
    assert!(
        supported >= JSON_DUMPS_SUPPORTED,
        "supported JSON dumps fell to {supported}"
    );
}

/// How many py-json rules must read to the listing of their text form.
const PY_JSON_PASSING: usize = 127;

#[test]
#[ignore = "needs ../shared/data"]
fn py_json_rules_read_to_the_listing_of_their_text() {
    let dir = vectors().join("py-json");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read py-json")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let (mut pass, mut refused, mut mismatch) = (0, BTreeMap::<String, usize>::new(), Vec::new());
    for f in &files {
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let family = if name.starts_with("ip_") {
            "ip"
        } else {
            "inet"
        };
        let text = std::fs::read_to_string(f).expect("read .t.json");
        for block in text.split("\n# ").map(|b| b.trim_start_matches("# ")) {
            let Some((rule, json)) = block.split_once('\n') else {
                continue;
            };
            let json = json.trim();
            if json.is_empty() {
                continue;
            }
            let head = format!(
                "table {family} test {{\n\tchain c {{ type filter hook input priority 0; }}\n}}\n"
            );
            let from_text = nft::parse(&name, &format!("{head}add rule {family} test c {rule}\n"));
            let doc = format!(
                "{{\"nftables\": [{{\"table\": {{\"family\": \"{family}\", \"name\": \"test\"}}}}, \
                 {{\"chain\": {{\"family\": \"{family}\", \"table\": \"test\", \"name\": \"c\", \"type\": \"filter\", \"hook\": \"input\", \"prio\": 0, \"policy\": \"accept\"}}}}, \
                 {{\"rule\": {{\"family\": \"{family}\", \"table\": \"test\", \"chain\": \"c\", \"expr\": {json}}}}}]}}"
            );
            match (nft::from_json(&name, &doc), from_text) {
                (Ok(a), Ok(b)) => {
                    if nft::print(&a) == nft::print(&b) {
                        pass += 1;
                    } else {
                        mismatch.push(format!(
                            "{name}: {rule}\n      json {}\n      text {}",
                            nft::print(&a),
                            nft::print(&b)
                        ));
                    }
                }
                (Err(e), _) => *refused.entry(reason(&e)).or_default() += 1,
                (Ok(_), Err(e)) => {
                    *refused.entry(format!("(text) {}", reason(&e))).or_default() += 1
                }
            }
        }
    }
    println!(
        "py-json: {pass} pass, {} refused, {} mismatches",
        refused.values().sum::<usize>(),
        mismatch.len()
    );
    for (r, n) in &refused {
        println!("  refused x{n}: {r}");
    }
    for m in &mismatch {
        println!("  MISMATCH {m}");
    }
    assert!(
        pass >= PY_JSON_PASSING,
        "passing py-json rules fell to {pass}"
    );
    assert!(
        mismatch.is_empty(),
        "{} JSON rules list differently from their text",
        mismatch.len()
    );
}
