use super::*;

#[test]
fn durations_outside_duration_proto_are_refused() {
    let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
    assert_eq!(
        duration("f", Some(&d(1, 5))).expect("in range"),
        Some(Duration::new(1, 5))
    );
    assert_eq!(duration("f", Some(&d(0, 0))).expect("zero"), None);
    for bad in [
        d(0, 1_000_000_000),
        d(MAX_DURATION_SECONDS + 1, 0),
        d(i64::MAX, 0),
        d(-1, 0),
    ] {
        let e = duration("confirm_within", Some(&bad)).expect_err("refused");
        assert!(e.to_string().contains("confirm_within"), "{e}");
    }
}
fn violations(e: Error) -> Vec<(String, String)> {
    match e {
        Error::BadRequest { violations, .. } => violations
            .into_iter()
            .map(|v| (v.field, v.description))
            .collect(),
        e => panic!("{e}"),
    }
}

/// Structured fields are checked by field path before any text is made of them (found
/// by review: chain name `A B` was "invalid counters near '-'").
#[test]
fn structured_fields_are_checked_by_path() {
    let chain = |name: &str, policy: &str| pb::ChainSpec {
        name: name.into(),
        policy: policy.into(),
        ..Default::default()
    };
    let spec = pb::RulesetSpec {
        tables: vec![
            pb::TableSpec {
                table: "filter".into(),
                chains: vec![chain("INPUT", "DROP"), chain("A B", ""), chain("-x", "")],
                ..Default::default()
            },
            pb::TableSpec {
                table: "nosuch".into(),
                chains: vec![chain("OK", "REJECT")],
                ..Default::default()
            },
        ],
    };
    let src = pb::RulesetSource {
        source: Some(pb::ruleset_source::Source::Structured(spec)),
    };
    let v = violations(RulesetInput::try_from(&src).unwrap_err());
    let fields: Vec<&str> = v.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "source.structured.tables[0].chains[1].name",
            "source.structured.tables[0].chains[2].name",
            "source.structured.tables[1].table",
            "source.structured.tables[1].chains[0].policy",
        ],
        "{v:?}"
    );
    assert!(
        v[0].1
            .starts_with("\"A B\": a chain name has no whitespace"),
        "{v:?}"
    );
    assert!(v.iter().all(|(_, d)| !d.contains("counters")), "{v:?}");
}

fn description(e: Error) -> String {
    match e {
        Error::BadRequest { violations, .. } => violations[0].description.clone(),
        e => panic!("{e}"),
    }
}

/// The one grammar of ruleset names (found by review: `.` and `..` were accepted, so
/// `rulesets/../revisions/1` named a revision), with short messages for long input.
#[test]
fn ruleset_names() {
    for ok in ["web", "rulesets/web", "a", "k8s-node.v1_2", &"x".repeat(63)] {
        assert!(ruleset_id("ruleset", ok).is_ok(), "{ok:?}");
    }
    for bad in [
        "",
        ".",
        "..",
        ".x",
        "-x",
        "_x",
        "a/b",
        "a b",
        "a\0",
        "rulesets/",
        "rulesets/..",
        &"x".repeat(64),
    ] {
        assert!(ruleset_id("ruleset", bad).is_err(), "{bad:?}");
    }
    assert!(revision_name("name", "rulesets/../revisions/1").is_err());
    assert!(revision_name("name", "rulesets/./revisions/1").is_err());
    let long = description(ruleset_id("ruleset", &"x".repeat(10_000)).unwrap_err());
    assert!(long.len() < 200, "{long}");
    assert!(long.contains("(10000 bytes)"), "{long}");
    let nul = description(ruleset_id("ruleset", "a\0b").unwrap_err());
    assert!(nul.starts_with("\"a\\0b\" is not a ruleset name"), "{nul}");
    let long = description(revision_name("name", &"r".repeat(10_000)).unwrap_err());
    assert!(long.len() < 200, "{long}");
}

fn fields(f: &pb::ConntrackFilter) -> Vec<String> {
    match conntrack_filter("filter", f) {
        Ok(_) => Vec::new(),
        Err(Error::BadRequest { violations, .. }) => {
            violations.into_iter().map(|v| v.field).collect()
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn conntrack_filters_that_never_match_are_refused() {
    let icmp_ports = pb::ConntrackFilter {
        protocol: "icmp".into(),
        source_port: 8,
        destination_port: 80,
        ..Default::default()
    };
    assert_eq!(
        fields(&icmp_ports),
        ["filter.source_port", "filter.destination_port"]
    );
    let udp_state = pb::ConntrackFilter {
        protocol: "udp".into(),
        state: "ESTABLISHED".into(),
        ..Default::default()
    };
    assert_eq!(fields(&udp_state), ["filter.state"]);
    let sctp_port = pb::ConntrackFilter {
        protocol: "sctp".into(),
        destination_port: 5000,
        ..Default::default()
    };
    assert_eq!(fields(&sctp_port), ["filter.destination_port"]);
    // What can match is accepted: ports on tcp/udp or without a protocol, state on tcp.
    for ok in [
        pb::ConntrackFilter {
            protocol: "tcp".into(),
            destination_port: 80,
            state: "established".into(),
            ..Default::default()
        },
        pb::ConntrackFilter {
            protocol: "udp".into(),
            source_port: 53,
            ..Default::default()
        },
        pb::ConntrackFilter {
            destination_port: 53,
            ..Default::default()
        },
    ] {
        assert_eq!(fields(&ok), Vec::<String>::new(), "{ok:?}");
    }
}
