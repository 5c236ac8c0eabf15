use super::*;
use vallum_engine::sets::{NoSets, SetRegistry};

// The checks with validation's findings (the engine's validator, as the pipeline runs
// it), under the names the tests below were written with: the findings a request gets.

fn check(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    sets: &dyn SetRegistry,
) -> Result<Checked, Error> {
    check_with(
        name,
        priority,
        input,
        sets,
        None,
        &Restoring::default(),
        None,
    )
}

fn check_after(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    sets: &dyn SetRegistry,
    previous: Option<&PreviousParse>,
) -> Result<Checked, Error> {
    check_with(
        name,
        priority,
        input,
        sets,
        previous,
        &Restoring::default(),
        None,
    )
}

fn check_with(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    sets: &dyn SetRegistry,
    previous: Option<&PreviousParse>,
    how: &Restoring,
    limits: Option<&LimitsConfig>,
) -> Result<Checked, Error> {
    let c = super::check_with(name, priority, input, previous, how, limits)?;
    assert!(!c.validated());
    let violations = vallum_engine::validate::validate(&c.ruleset, Some(sets));
    Ok(c.with_violations(&violations))
}

/// Unvalidated input is not accepted (the pipeline validates it first).
#[test]
fn unvalidated_input_is_not_accepted() {
    let t = "*filter\n:INPUT DROP [0:0]\nCOMMIT\n";
    let c = super::check("a", 0, &text(t, Family::Ipv4)).unwrap();
    assert!(matches!(c.into_valid(), Err(Error::Invariant { .. })));
}

fn text(t: &str, family: Family) -> RulesetInput {
    RulesetInput {
        parts: vec![TextPart {
            text: t.into(),
            family,
            filename: "t.rules".into(),
            field: "source.text.content".into(),
            line_fields: None,
        }],
        nft: None,
    }
}

#[test]
fn canonical_round_trip_and_digest() {
    let t = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";
    let c = check("a", 0, &text(t, Family::Ipv4), &NoSets).unwrap();
    assert!(c.valid());
    assert!(
        c.content
            .v4()
            .contains("-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT")
    );
    let rs = c.content.to_ruleset("a", 0).unwrap();
    assert_eq!(Content::from_tables(&rs.tables), c.content);
    assert_eq!(c.content.digest().len(), 64);
}

/// A text checked against the previous parse of the ruleset gives what a check from
/// scratch gives (model with locations, canonical content, findings with their
/// FILE:LINE:COL), for IPv4 and IPv6 parts, whether the shortcut applies or not; a model
/// the engine dropped is not reused.
#[test]
fn check_after_equals_check() {
    let rules = |family: Family, n: usize| {
        let mut t = String::from("*filter\n:INPUT DROP [0:0]\n:x - [0:0]\n");
        for i in 0..n {
            let src = match family {
                Family::Ipv4 => format!("10.0.{}.0/24", i % 256),
                Family::Ipv6 => format!("2001:db8:{i:x}::/48"),
            };
            t.push_str(&format!(
                "-A INPUT -s {src} -p tcp --dport {} -j x\n",
                i + 1
            ));
        }
        t.push_str("-A x -j ACCEPT\nCOMMIT\n");
        t
    };
    let input = |v4: String, v6: String| RulesetInput {
        parts: vec![
            TextPart {
                text: v4,
                family: Family::Ipv4,
                filename: "v4.rules".into(),
                field: "source.text.content".into(),
                line_fields: None,
            },
            TextPart {
                text: v6,
                family: Family::Ipv6,
                filename: "v6.rules".into(),
                field: "source.text.ipv6_content".into(),
                line_fields: None,
            },
        ],
        nft: None,
    };
    // `extra` after the middle line of a text.
    let with = |t: &str, extra: &str| {
        let lines: Vec<&str> = t.split_inclusive('\n').collect();
        let mid = lines.len() / 2;
        format!("{}{extra}{}", lines[..mid].concat(), lines[mid..].concat())
    };
    let written = input(rules(Family::Ipv4, 300), rules(Family::Ipv6, 200));
    let printed = check("a", 0, &written, &NoSets).unwrap().content;
    // As written (not canonical: no `-m tcp`), and as printed back (canonical: the
    // content is spliced, not printed).
    for (first, canonical) in [
        (written, false),
        (input(printed.v4().into(), printed.v6().into()), true),
    ] {
        let mut c = check("a", 0, &first, &NoSets).unwrap();
        let before = c.content.clone();
        let texts: Vec<String> = first.parts.iter().map(|p| p.text.clone()).collect();
        c.keep_sources(first);
        assert!(c.sources.iter().all(|s| s.canonical.is_some() == canonical));
        let model = Arc::new(c.ruleset);
        let previous = PreviousParse {
            texts: c.sources,
            model: Arc::downgrade(&model),
        };
        let next = |extra: &str| input(with(&texts[0], extra), with(&texts[1], extra));
        for extra in [
            // One rule added (the shortcut applies).
            "-A INPUT -p udp --dport 53 -j ACCEPT\n",
            // A rule that loops (a validation error at its line).
            "-A x -j x\n",
            // A rule of a chain printed later (in canonical text: not spliced).
            "-A x -p udp -j DROP\n",
            // A bad rule (parse error: falls back, same error).
            "-A INPUT -p tcp --dportx 1 -j ACCEPT\n",
            // A chain declared in the middle (falls back).
            ":y - [0:0]\n",
        ] {
            let next = next(extra);
            let fresh = check("a", 0, &next, &NoSets);
            let after = check_after("a", 0, &next, &NoSets, Some(&previous));
            match (fresh, after) {
                (Ok(f), Ok(a)) => {
                    assert_eq!(a.ruleset, f.ruleset, "{extra}");
                    assert_eq!(a.content, f.content, "{extra}");
                    if canonical && extra.starts_with("-A INPUT -p udp") {
                        // Spliced from the previous content: every chunk but the one or two
                        // around the new line is the previous one's, not a copy.
                        for family in [Family::Ipv4, Family::Ipv6] {
                            let (new, old) = (a.content.text(family), before.text(family));
                            assert!(new.chunk_count() > 3);
                            assert!(
                                new.shared_chunks(old) + 2 >= new.chunk_count(),
                                "{extra}: {} of {} chunks shared",
                                new.shared_chunks(old),
                                new.chunk_count()
                            );
                        }
                    }
                    assert_eq!(a.findings, f.findings);
                }
                (Err(f), Err(a)) => assert_eq!(format!("{a:?}"), format!("{f:?}")),
                (f, a) => panic!("{extra}: check {f:?}, check_after {a:?}"),
            }
        }
        // The first case did take the shortcut (and spliced the content when canonical).
        let next = next("-A INPUT -p udp --dport 53 -j ACCEPT\n");
        for (part, old) in next.parts.iter().zip(&previous.texts) {
            let opts = ParseOptions {
                family: part.family,
                ..ParseOptions::default()
            };
            if canonical {
                let r = restore::parse_after_canonical(&old.text, &model.tables, &part.text, &opts);
                assert!(r.is_some_and(|(_, print)| print.is_some()));
            } else {
                let r = restore::parse_after(&old.text, &model.tables, &part.text, &opts);
                assert!(r.is_some());
            }
        }
        // Dropped by the engine: nothing to reuse, a full parse.
        drop(model);
        let c = check_after("a", 0, &next, &NoSets, Some(&previous)).unwrap();
        assert_eq!(c.ruleset, check("a", 0, &next, &NoSets).unwrap().ruleset);
    }
}

/// The digest is the root of the digest tree: sha256 over the chunk digests of the combined
/// text (the separator a chunk of its own), with and without an IPv6 part; a function of the
/// text alone.
#[test]
fn digest_is_the_root_over_the_chunk_digests() {
    use sha2::{Digest, Sha256};
    for (v4, v6) in [
        ("*filter\nCOMMIT\n", ""),
        ("*filter\nCOMMIT\n", "*raw\nCOMMIT\n"),
        ("", ""),
    ] {
        let c = Content::new(v4.into(), v6.into());
        let mut h = Sha256::new();
        for t in [v4, if v6.is_empty() { "" } else { V6_SEPARATOR }, v6] {
            for chunk in tree::split(t) {
                h.update(Sha256::digest(chunk.as_bytes()));
            }
        }
        assert_eq!(c.digest(), tree::hex(&h.finalize()), "{v4:?} {v6:?}");
        assert_eq!(c.digest().len(), 64);
    }
    assert_ne!(
        Content::new("a".into(), String::new()).digest(),
        Content::new("a".into(), "b".into()).digest()
    );
    // A content changed through `set` has the digest of its new text.
    let mut c = Content::new("*filter\nCOMMIT\n".into(), String::new());
    let before = c.digest();
    c.set(
        Family::Ipv4,
        crate::control::content::Text::new("*filter\nCOMMIT\n*raw\nCOMMIT\n".into()),
    );
    assert_ne!(c.digest(), before);
    assert_eq!(
        c.digest(),
        Content::new("*filter\nCOMMIT\n*raw\nCOMMIT\n".into(), String::new()).digest()
    );
}

#[test]
fn parse_errors_have_file_line_col() {
    let t = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dportx 22 -j ACCEPT\nCOMMIT\n";
    let Err(Error::BadRequest { reason, violations }) =
        check("a", 0, &text(t, Family::Ipv4), &NoSets)
    else {
        panic!("expected bad request")
    };
    assert_eq!(reason, Reason::InvalidRuleset);
    assert_eq!(violations[0].field, "source.text.content");
    assert!(
        violations[0].description.starts_with("t.rules:3:"),
        "{violations:?}"
    );
}

fn refused(t: &str) -> (Reason, Vec<FieldViolation>) {
    match check("a", 0, &text(t, Family::Ipv4), &NoSets) {
        Err(Error::BadRequest { reason, violations }) => (reason, violations),
        other => panic!("expected a bad request, got {other:?}"),
    }
}

/// A jump to an undeclared chain is that, at the target (found by review: it was
/// reported as --noflush input); rules added to an undeclared chain are --noflush input.
#[test]
fn undeclared_chains_and_noflush_input() {
    let (reason, v) =
        refused("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -j NOSUCHCHAIN\nCOMMIT\n");
    assert_eq!(reason, Reason::InvalidRuleset);
    assert!(
        v[0].description
            .starts_with("t.rules:3:20: chain 'NOSUCHCHAIN' is not declared"),
        "{v:?}"
    );
    let (reason, v) = refused("*filter\n-A FOO -j ACCEPT\nCOMMIT\n");
    assert_eq!(reason, Reason::NoflushUnsupported);
    assert!(v[0].description.contains("--noflush"), "{v:?}");
}

/// A `--log-prefix` the parser cuts to 29 bytes comes back as a warning finding at its
/// FILE:LINE:COL (found by review: the warning was dropped), also when the text is
/// checked again against the previous parse (which copies unchanged lines).
#[test]
fn parser_warnings_are_findings() {
    let t = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j LOG --log-prefix \"[UFW BLOCK] a very long prefix \"\nCOMMIT\n";
    let mut c = check("a", 0, &text(t, Family::Ipv4), &NoSets).unwrap();
    assert!(c.valid());
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].display_location(), "t.rules:3:30");
    assert!(
        w[0].message
            .starts_with("--log-prefix is 31 bytes; the kernel keeps the first 29"),
        "{w:?}"
    );
    assert!(
        c.content
            .v4()
            .contains("--log-prefix \"[UFW BLOCK] a very long prefi\"")
    );
    // The text with warnings is not kept for an incremental parse, which would drop them.
    c.keep_sources(text(t, Family::Ipv4));
    assert!(c.sources.is_empty());
    let model = Arc::new(c.ruleset);
    // As the pipeline keeps it after a commit.
    let previous = PreviousParse {
        texts: c.sources,
        model: Arc::downgrade(&model),
    };
    let next = t.replace("COMMIT", "-A INPUT -j ACCEPT\nCOMMIT");
    let after = check_after("a", 0, &text(&next, Family::Ipv4), &NoSets, Some(&previous));
    assert_eq!(after.unwrap().warnings().len(), 1);
    // A text large enough to be read ahead on several threads reports it too.
    let mut big = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..3000 {
        big.push_str(&format!("-A INPUT -p tcp --dport {} -j ACCEPT\n", i + 1));
    }
    big.push_str(&t[t.find("-A INPUT -j LOG").unwrap()..]);
    let w = check("a", 0, &text(&big, Family::Ipv4), &NoSets)
        .unwrap()
        .warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].display_location(), "t.rules:3003:30");
}

/// The kube-proxy shape of base (KUBE-SERVICES jumping to per-service chains).
const KUBE: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SVC-B - [0:0]\n-A INPUT -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-SVC-A\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-B\n-A KUBE-SVC-A -s 10.244.1.5/32 -j ACCEPT\n-A KUBE-SVC-B -s 10.244.2.7/32 -j ACCEPT\nCOMMIT\n*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -p udp -m udp --dport 123 -j NOTRACK\nCOMMIT\n";

/// `t` as noflush input on `base`, both ways: merged with the base's text
/// (`check_noflush`) and applied to the base's model (`check_onto`, as vallumd does when
/// the base is active), which must give the same result, locations included (the
/// model's are cleared, as the merge clears the base's).
fn noflush(base: &str, t: &str) -> Result<Checked, Error> {
    let checked = check("a", 0, &text(base, Family::Ipv4), &NoSets).unwrap();
    let mut model = checked.ruleset;
    restore::clear_locations(&mut model.tables);
    let base = Base {
        content: Arc::new(checked.content),
        label: "rulesets/a/revisions/1".into(),
        model: None,
    };
    let run = |base: Base| {
        let how = Restoring {
            counters: false,
            noflush: Some(base),
        };
        check_with("a", 0, &text(t, Family::Ipv4), &NoSets, None, &how, None)
    };
    let merged = run(base.clone());
    let onto = run(Base {
        model: Some(Arc::new(model)),
        ..base
    });
    match (&merged, &onto) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.ruleset, b.ruleset, "{t}");
            assert_eq!(a.content, b.content, "{t}");
            assert_eq!(a.findings.len(), b.findings.len(), "{t}");
            assert!(b.edited && !a.edited);
        }
        (Err(a), Err(b)) => assert_eq!(a.reason(), b.reason(), "{t}: {a} / {b}"),
        (a, b) => panic!("{t}: merged {:?}, onto {:?}", a.is_ok(), b.is_ok()),
    }
    merged
}

/// A kube-proxy-style partial update (one service chain replaced, one rule appended to a
/// builtin chain, one deleted by spec) applied to the base: every other chain and table
/// is kept, the result is the complete merged ruleset; positions are the text's.
#[test]
fn noflush_merges_onto_the_base() {
    let update = "*filter\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-A -s 10.244.1.9/32 -j ACCEPT\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-D KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-B\nCOMMIT\n";
    let c = noflush(KUBE, update).unwrap();
    let want = KUBE
        .replace(
            "-A KUBE-SVC-A -s 10.244.1.5/32",
            "-A KUBE-SVC-A -s 10.244.1.9/32",
        )
        .replace(
            "-A INPUT -j KUBE-SERVICES\n",
            "-A INPUT -j KUBE-SERVICES\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n",
        )
        .replace(
            "-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-B\n",
            "",
        );
    assert_eq!(c.content.v4(), want);
    let input = &c.ruleset.tables[0].chains[0];
    assert_eq!(
        input
            .rules
            .iter()
            .map(|r| r.location.line)
            .collect::<Vec<_>>(),
        [0, 4]
    );
    // Not kept for an incremental parse (the model is not the text's alone).
    let mut c = c;
    c.keep_sources(text(update, Family::Ipv4));
    assert!(c.sources.is_empty());
    // An empty text changes nothing; a table the base lacks is created.
    assert_eq!(
        noflush(KUBE, "").unwrap().content.v4(),
        check("a", 0, &text(KUBE, Family::Ipv4), &NoSets)
            .unwrap()
            .content
            .v4()
    );
    let c = noflush("", "*filter\n-A INPUT -j DROP\nCOMMIT\n").unwrap();
    assert!(
        c.content.v4().contains("-A INPUT -j DROP"),
        "{}",
        c.content.v4()
    );
    // The base's IPv6 tables are kept when the text is IPv4 only (and the other way).
    let v6 = "*filter\n:INPUT DROP [0:0]\n-A INPUT -s 2001:db8::/32 -j ACCEPT\nCOMMIT\n";
    let both = RulesetInput {
        parts: vec![
            text(KUBE, Family::Ipv4).parts.remove(0),
            text(v6, Family::Ipv6).parts.remove(0),
        ],
        nft: None,
    };
    let base = check("a", 0, &both, &NoSets).unwrap().content;
    for (t, family) in [
        (update, Family::Ipv4),
        ("*filter\n-F INPUT\nCOMMIT\n", Family::Ipv6),
    ] {
        let how = Restoring {
            counters: false,
            noflush: Some(Base {
                content: Arc::new(base.clone()),
                label: "b".into(),
                model: None,
            }),
        };
        let c = check_with("a", 0, &text(t, family), &NoSets, None, &how, None).unwrap();
        match family {
            Family::Ipv4 => {
                assert_eq!((c.content.v4(), c.content.v6()), (want.as_str(), base.v6()))
            }
            Family::Ipv6 => {
                assert_eq!(c.content.v4(), base.v4());
                assert!(!c.content.v6().contains("-A INPUT"), "{}", c.content.v6());
            }
        }
    }
}

/// What the text changes must exist in the base (as iptables-restore --noflush against
/// the kernel's tables): errors at the text's FILE:LINE:COL.
#[test]
fn noflush_refuses_what_is_not_there() {
    for (t, want) in [
        (
            "*filter\n-A NOPE -j ACCEPT\nCOMMIT\n",
            "t.rules:2:4: chain 'NOPE' does not exist",
        ),
        (
            "*filter\n-A INPUT -j NOPE\nCOMMIT\n",
            "t.rules:2:13: chain 'NOPE' does not exist",
        ),
        (
            "*filter
-D INPUT -p tcp -j DROP
COMMIT
",
            "t.rules:2:1: bad rule",
        ),
        (
            "*filter
-I INPUT 3 -j DROP
COMMIT
",
            "t.rules:2:4: index of 3 is out of range",
        ),
        (
            "*filter
-D INPUT 9
COMMIT
",
            "t.rules:2:4: index of 9 is out of range",
        ),
        (
            "*filter\n-F NOPE\nCOMMIT\n",
            "t.rules:2:4: chain 'NOPE' does not exist",
        ),
        (
            "*filter\n-A INPUT -p tcp --dportx 1\nCOMMIT\n",
            "t.rules:2:17: unknown option",
        ),
        (
            "*filter\n-A INPUT -j ACCEPT\n",
            "t.rules:3:1: table 'filter' has no COMMIT",
        ),
    ] {
        let Err(Error::BadRequest { reason, violations }) = noflush(KUBE, t) else {
            panic!("{t:?}: expected a bad request")
        };
        assert_eq!(reason, Reason::InvalidRuleset, "{t:?}");
        assert_eq!(violations[0].field, "source.text.content", "{t:?}");
        assert!(
            violations[0].description.starts_with(want),
            "{t:?}: {violations:?}"
        );
    }
    // Builtin chains hold the base's rules: -I, -R and -D by number see them.
    let c = noflush(
            KUBE,
            "*filter\n-I INPUT 2 -j DROP\n-R INPUT 1 -p tcp -j KUBE-SERVICES\n-I INPUT -p udp -j ACCEPT\nCOMMIT\n*raw\n-D PREROUTING 1\nCOMMIT\n",
        )
        .unwrap();
    assert!(
        c.content.v4().contains(
            "-A INPUT -p udp -j ACCEPT\n-A INPUT -p tcp -j KUBE-SERVICES\n-A INPUT -j DROP\n-A KUBE"
        ),
        "{}",
        c.content.v4()
    );
    assert!(!c.content.v4().contains("NOTRACK"), "{}", c.content.v4());
    // Deleting a user chain's rules and the chain itself is fine once nothing jumps to it.
    let c = noflush(
        KUBE,
        "*filter\n-D KUBE-SERVICES 2\n-F KUBE-SVC-B\n-X KUBE-SVC-B\nCOMMIT\n",
    )
    .unwrap();
    assert!(!c.content.v4().contains("KUBE-SVC-B"), "{}", c.content.v4());
    // A finding on a base rule names the base revision.
    let c = noflush(KUBE, "*filter\n-A KUBE-SVC-B -j KUBE-SERVICES\nCOMMIT\n").unwrap();
    assert!(!c.valid());
    assert!(
        c.findings
            .iter()
            .any(|f| f.display_location() == "rulesets/a/revisions/1"),
        "{:?}",
        c.findings
    );
}

/// A NUL byte or a long token is echoed escaped and cut.
#[test]
fn echoed_tokens_are_escaped_and_short() {
    let (_, v) = refused("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j AC\0CEPT\nCOMMIT\n");
    assert!(!v[0].description.contains('\0'), "{v:?}");
    assert!(v[0].description.contains("AC\\0CEPT"), "{v:?}");
    let long = "x".repeat(10_000);
    let (_, v) = refused(&format!(
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --{long} 1\nCOMMIT\n"
    ));
    assert!(v[0].description.len() < 400, "{}", v[0].description);
}

/// An empty text, tables without rules and ACCEPT policies, and rule-less user chains
/// are empty; a DROP policy or one rule is not (found by review: `apply web /dev/null`
/// committed an empty revision without a word).
#[test]
fn empty_rulesets() {
    let is_empty = |t: &str| {
        check("a", 0, &text(t, Family::Ipv4), &NoSets)
            .unwrap()
            .is_empty()
    };
    assert!(is_empty(""));
    assert!(is_empty("*filter\nCOMMIT\n"));
    assert!(is_empty(
        "*filter\n:INPUT ACCEPT [0:0]\n:x - [0:0]\nCOMMIT\n*raw\nCOMMIT\n"
    ));
    assert!(!is_empty("*filter\n:INPUT DROP [0:0]\nCOMMIT\n"));
    assert!(!is_empty(
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"
    ));
    let empty = check("a", 0, &text("", Family::Ipv4), &NoSets).unwrap();
    let Err(Error::BadRequest { reason, violations }) = empty.clone().refuse_empty(false) else {
        panic!("expected EMPTY_RULESET")
    };
    assert_eq!(reason, Reason::EmptyRuleset);
    assert_eq!(violations[0].field, "source");
    assert!(empty.refuse_empty(true).is_ok());
}

#[test]
fn unsupported_extension_is_named() {
    let t = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m hashlimit --hashlimit-upto 10mb/s --hashlimit-name b -j ACCEPT\nCOMMIT\n";
    let c = check("a", 0, &text(t, Family::Ipv4), &NoSets).unwrap();
    let Err(Error::BadRequest { reason, violations }) = c.into_valid() else {
        panic!("expected invalid")
    };
    assert_eq!(reason, Reason::UnsupportedExtension);
    assert!(
        violations[0].description.contains("hashlimit"),
        "{violations:?}"
    );
}

/// A text the parser refuses (an `-I` whose rule number is past the end once a rule
/// above it was removed) is refused by `check_after` too, with the same error, when the
/// previous text's `-I` appended.
#[test]
fn check_after_refuses_what_check_refuses_for_an_insert() {
    let old = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-I INPUT 2 -j ACCEPT\nCOMMIT\n";
    let new = "*filter\n:INPUT DROP [0:0]\n-I INPUT 2 -j ACCEPT\nCOMMIT\n";
    let c = check("a", 0, &text(old, Family::Ipv4), &NoSets).unwrap();
    let model = Arc::new(c.ruleset);
    let previous = PreviousParse {
        texts: vec![SourceText {
            family: Family::Ipv4,
            text: Arc::new(old.to_string()),
            canonical: None,
        }],
        model: Arc::downgrade(&model),
    };
    let fresh = check("a", 0, &text(new, Family::Ipv4), &NoSets);
    let after = check_after("a", 0, &text(new, Family::Ipv4), &NoSets, Some(&previous));
    assert!(fresh.is_err());
    assert_eq!(format!("{after:?}"), format!("{fresh:?}"));
}
