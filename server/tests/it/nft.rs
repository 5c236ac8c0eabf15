//! nft rulesets through a real `vallumd` (ephemeral port, temporary database) and `vallumctl`.
//!
//! Cases: every ruleset of `engine/tests/nft-rulesets/` (and README's `examples/web.nft`) staged as nft text and as the nft JSON
//! its export gives, each revision's content and export byte-equal to the engine's canonical
//! listing of the file (JSON export read back to the same listing and digest); a bad text
//! refused at FILE:LINE:COL (`include`, a syntax error, an unsupported family by name) that
//! changes nothing; an nft ruleset applied and enforced (trace verdicts naming the nft chain),
//! a statement the engine does not run refused by name at its position, its named set's
//! elements added and deleted through the sets API changing verdicts without a revision,
//! CommitRevision and Rollback of nft revisions; the diff of two nft revisions per chain in nft's
//! words; `vallumctl validate/stage/export` with `--format` and with the format detected.

use crate::support;

use std::path::PathBuf;

use support::{Daemon, reason};
use tonic::Code;
use vallum_engine::nft;
use vallum_proto::v1 as pb;

fn nft_source(content: &str, filename: &str, json: bool) -> pb::RulesetSource {
    pb::RulesetSource {
        source: Some(pb::ruleset_source::Source::Nft(pb::NftText {
            content: content.to_string(),
            filename: filename.to_string(),
            json,
        })),
    }
}

/// The rulesets of `engine/tests/nft-rulesets/`, (file name, text), by name.
fn rulesets() -> Vec<(String, String)> {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../engine/tests/nft-rulesets"
    ));
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("engine/tests/nft-rulesets")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "nft"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).expect("read"))
        })
        .collect();
    out.sort();
    assert!(out.len() >= 7, "the nft rulesets: {out:?}");
    // README's example (its walk-through stages it).
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/web.nft");
    let text = std::fs::read_to_string(example).expect("examples/web.nft");
    out.push(("web.nft".to_string(), text));
    out
}

async fn export(d: &Daemon, name: &str, format: pb::ExportFormat) -> pb::ExportRevisionResponse {
    d.rulesets()
        .await
        .export_revision(pb::ExportRevisionRequest {
            name: name.to_string(),
            format: format as i32,
            counters: false,
        })
        .await
        .unwrap_or_else(|s| panic!("export {name} as {format:?}: {s:?}"))
        .into_inner()
}

async fn stage(d: &Daemon, ruleset: &str, source: pb::RulesetSource) -> pb::Revision {
    d.rulesets()
        .await
        .stage_revision(pb::StageRevisionRequest {
            ruleset: ruleset.to_string(),
            source: Some(source),
            allow_empty: true,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("stage {ruleset}: {s:?}"))
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nft_text_and_json_are_stored_and_exported_as_the_canonical_listing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let mut stored = 0;
    for (file, text) in rulesets() {
        let model = nft::parse(&file, &text).unwrap_or_else(|e| panic!("{e}"));
        let listing = nft::print(&model);
        let rules: usize = (model.tables.iter().flat_map(|t| &t.chains))
            .map(|c| c.rules.len())
            .sum();
        let ruleset = file.trim_end_matches(".nft").replace('.', "-");
        // What the engine does not enforce is refused by name at the position the engine's
        // lowering names, as in any request (stored only when it could be committed).
        if let Err(e) = nft::lower(&model, &file, &text, &ruleset, 0) {
            let s = rs
                .validate_ruleset(pb::ValidateRulesetRequest {
                    ruleset: ruleset.clone(),
                    source: Some(nft_source(&text, &file, false)),
                })
                .await
                .expect_err("not enforced");
            assert_eq!(reason(&s), "UNSUPPORTED_EXTENSION", "{file}: {s:?}");
            let first = &e.0[0];
            let at = format!("{file}:{}:{}: ", first.pos.line, first.pos.column);
            assert!(s.message().contains(&at), "{file}: {at} in {}", s.message());
            continue;
        }
        stored += 1;

        let v = rs
            .validate_ruleset(pb::ValidateRulesetRequest {
                ruleset: ruleset.clone(),
                source: Some(nft_source(&text, &file, false)),
            })
            .await
            .expect("validates")
            .into_inner();
        assert!(v.valid, "{file}: {v:?}");
        assert_eq!(v.rule_count as usize, rules, "{file}");

        let rev = stage(&d, &ruleset, nft_source(&text, &file, false)).await;
        assert_eq!(rev.number, 1, "{file}");
        assert_eq!(rev.rule_count as usize, rules, "{file}");
        let got = rs
            .get_revision(pb::GetRevisionRequest {
                name: rev.name.clone(),
            })
            .await
            .expect("revision")
            .into_inner();
        assert_eq!(got.content, listing, "{file}: stored content");
        for format in [pb::ExportFormat::Unspecified, pb::ExportFormat::Nft] {
            let e = export(&d, &rev.name, format).await;
            assert_eq!(e.content, listing, "{file}: export as {format:?}");
            assert_eq!(e.content_type, "text/plain");
        }
        // The iptables forms are not this revision's: refused at `format`.
        for format in [pb::ExportFormat::IptablesSave, pb::ExportFormat::Json] {
            let s = rs
                .export_revision(pb::ExportRevisionRequest {
                    name: rev.name.clone(),
                    format: format as i32,
                    counters: false,
                })
                .await
                .expect_err("an nft revision has no iptables-save form");
            assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
            assert!(s.message().contains("nft"), "{}", s.message());
        }

        // Its JSON export is nft JSON that stages to the same listing and digest.
        let j = export(&d, &rev.name, pb::ExportFormat::NftJson).await;
        assert_eq!(j.content_type, "application/json");
        let doc: serde_json::Value = serde_json::from_str(&j.content).expect("JSON");
        assert!(doc["nftables"].is_array(), "{file}: {doc}");
        let again = stage(&d, &ruleset, nft_source(&j.content, "export.json", true)).await;
        assert_eq!(again.number, 2, "{file}");
        assert_eq!(
            again.digest, rev.digest,
            "{file}: same listing, same digest"
        );
        let e = export(&d, &again.name, pb::ExportFormat::Nft).await;
        assert_eq!(e.content, listing, "{file}: JSON read back");
    }
    assert!(stored >= 3, "only {stored} of the rulesets are enforced");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_nft_is_refused_at_its_position_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let cases: [(&str, &str, &str, &str); 5] = [
        (
            "table inet filter {\n\tchain input {\n\t\ttcp dport 22 acept\n\t}\n}\n",
            "typo.nft",
            "UNSUPPORTED_EXTENSION",
            "typo.nft:3:16: `acept` is not supported",
        ),
        (
            "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority 0;\n\t\ttcp dport 70000 accept\n\t}\n}\n",
            "port.nft",
            "INVALID_RULESET",
            "port.nft:4:13: `70000` is not a valid inet_service",
        ),
        (
            "flush ruleset\ninclude \"/etc/nftables.d/*.nft\"\n",
            "inc.nft",
            "INVALID_RULESET",
            "inc.nft:2:1: `include` is refused",
        ),
        (
            "table bridge t {\n}\n",
            "br.nft",
            "UNSUPPORTED_EXTENSION",
            "br.nft:1:7: family `bridge` is not supported",
        ),
        (
            "{\"nftables\": [{\"table\": {\"family\": \"inet\", \"name\": \"t\"}}, ]}",
            "bad.json",
            "INVALID_RULESET",
            "bad.json:1:",
        ),
    ];
    for (text, file, want_reason, want_at) in cases {
        let json = file.ends_with(".json");
        let apply = rs
            .apply(pb::ApplyRequest {
                ruleset: "web".into(),
                source: Some(nft_source(text, file, json)),
                allow_empty: true,
                ..Default::default()
            })
            .await
            .expect_err("bad nft is refused");
        let stage = rs
            .stage_revision(pb::StageRevisionRequest {
                ruleset: "web".into(),
                source: Some(nft_source(text, file, json)),
                allow_empty: true,
                ..Default::default()
            })
            .await
            .expect_err("bad nft is refused");
        let validate = rs
            .validate_ruleset(pb::ValidateRulesetRequest {
                ruleset: "web".into(),
                source: Some(nft_source(text, file, json)),
            })
            .await
            .expect_err("bad nft is refused");
        for s in [apply, stage, validate] {
            assert_eq!(s.code(), Code::InvalidArgument, "{file}: {s:?}");
            assert_eq!(reason(&s), want_reason, "{file}: {s:?}");
            assert!(s.message().contains(want_at), "{file}: {}", s.message());
            use tonic_types::StatusExt;
            let details = s.get_error_details();
            let field = details
                .bad_request()
                .and_then(|b| b.field_violations.first())
                .map(|v| v.field.clone());
            assert_eq!(field.as_deref(), Some("source.nft.content"), "{file}");
        }
    }
    let s = rs
        .get_ruleset(pb::GetRulesetRequest {
            name: "rulesets/web".into(),
        })
        .await
        .expect_err("nothing was created");
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    d.stop().await;
}

async fn trace(d: &Daemon, src: &str, dport: u32) -> pb::TracePacketResponse {
    pb::trace_service_client::TraceServiceClient::new(d.channel().await)
        .trace_packet(pb::TracePacketRequest {
            packet: Some(pb::PacketSpec {
                source: src.into(),
                destination: "198.51.100.1".into(),
                protocol: "tcp".into(),
                source_port: 40000,
                destination_port: dport,
                tcp_flags: "S".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("trace")
        .into_inner()
}

/// Its named set `allowed` is engine set `inet.filter.allowed`; SSH only from it.
const SSH_FROM_SET: &str = "table inet filter {
\tset allowed {
\t\ttype ipv4_addr
\t\telements = { 192.0.2.1 }
\t}

\tchain input {
\t\ttype filter hook input priority filter; policy drop;
\t\tip saddr @allowed tcp dport 22 accept
\t\ttcp dport 80 accept
\t}
}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nft_apply_enforces_and_named_set_elements_change_without_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    // An empty nft ruleset is refused as an empty iptables one is.
    let s = rs
        .stage_revision(pb::StageRevisionRequest {
            ruleset: "web".into(),
            source: Some(nft_source("table inet t {\n}\n", "e.nft", false)),
            ..Default::default()
        })
        .await
        .expect_err("empty");
    assert_eq!(reason(&s), "EMPTY_RULESET", "{s:?}");
    // A statement the engine does not run in an enforced chain: refused by name at its
    // FILE:LINE:COL, nothing stored, no set created.
    let bad = SSH_FROM_SET.replace("tcp dport 80 accept", "oifname \"eth0\" masquerade");
    for validate_only in [true, false] {
        let s = rs
            .apply(pb::ApplyRequest {
                ruleset: "web".into(),
                source: Some(nft_source(&bad, "x.nft", false)),
                validate_only,
                ..Default::default()
            })
            .await
            .expect_err("masquerade in a filter chain");
        assert_eq!(reason(&s), "UNSUPPORTED_EXTENSION", "{s:?}");
        assert!(s.message().contains("x.nft:10:18:"), "{}", s.message());
        assert!(s.message().contains("masquerade"), "{}", s.message());
    }
    let mut sets = pb::set_service_client::SetServiceClient::new(d.channel().await);
    let listed = sets
        .list_sets(pb::ListSetsRequest::default())
        .await
        .expect("sets")
        .into_inner();
    assert!(listed.sets.is_empty(), "{listed:?}");

    // A dry run validates against the set the commit would create.
    rs.apply(pb::ApplyRequest {
        ruleset: "web".into(),
        source: Some(nft_source(SSH_FROM_SET, "web.nft", false)),
        validate_only: true,
        ..Default::default()
    })
    .await
    .expect("dry run");
    let c = rs
        .apply(pb::ApplyRequest {
            ruleset: "web".into(),
            source: Some(nft_source(SSH_FROM_SET, "web.nft", false)),
            ..Default::default()
        })
        .await
        .expect("applies")
        .into_inner();
    let rev = c.revision.expect("revision");
    assert_eq!((rev.number, rev.rule_count), (1, 2));

    let verdict = |t: &pb::TracePacketResponse| pb::Verdict::try_from(t.verdict).unwrap();
    let t = trace(&d, "192.0.2.1", 22).await;
    assert_eq!(verdict(&t), pb::Verdict::Accept, "{t:?}");
    let step = t.steps.iter().find(|s| s.chain == "inet filter input");
    assert_eq!(
        step.map(|s| (s.rule, s.nft_rule, s.text.as_str())),
        Some((1, 1, "ip saddr @allowed tcp dport 22 accept")),
        "the trace names the nft chain and rule: {t:?}"
    );
    let t = trace(&d, "192.0.2.7", 22).await;
    assert_eq!(verdict(&t), pb::Verdict::Drop, "{t:?}");
    assert_eq!(
        verdict(&trace(&d, "192.0.2.7", 80).await),
        pb::Verdict::Accept
    );

    // Counters name the nft rule each engine rule enforces: its position and text. The IPv6
    // copy of the inet chain has no `ip saddr` rule, so its rule 1 is nft rule 2.
    let counters = pb::counter_service_client::CounterServiceClient::new(d.channel().await)
        .get_counters(pb::GetCountersRequest {
            ruleset: "web".into(),
            ..Default::default()
        })
        .await
        .expect("counters")
        .into_inner()
        .counters;
    let of = |family: pb::Family| -> Vec<(u32, u32, String)> {
        counters
            .iter()
            .filter(|c| c.family == family as i32 && c.chain == "inet filter input" && c.rule > 0)
            .map(|c| (c.rule, c.nft_rule, c.text.clone()))
            .collect()
    };
    assert_eq!(
        of(pb::Family::Ipv4),
        [
            (1, 1, "ip saddr @allowed tcp dport 22 accept".to_string()),
            (2, 2, "tcp dport 80 accept".to_string()),
        ],
        "{counters:?}"
    );
    assert_eq!(
        of(pb::Family::Ipv6),
        [(1, 2, "tcp dport 80 accept".to_string())],
        "{counters:?}"
    );

    // `nft add element inet filter allowed { 192.0.2.7 }`, through the sets API.
    let element = |text: &str| pb::SetElement {
        text: text.into(),
        ..Default::default()
    };
    sets.add_elements(pb::AddElementsRequest {
        set: "inet.filter.allowed".into(),
        elements: vec![element("192.0.2.7")],
        ..Default::default()
    })
    .await
    .expect("add element");
    let t = trace(&d, "192.0.2.7", 22).await;
    assert_eq!(verdict(&t), pb::Verdict::Accept, "after the add: {t:?}");
    sets.delete_elements(pb::DeleteElementsRequest {
        set: "inet.filter.allowed".into(),
        elements: vec![element("192.0.2.1")],
        ..Default::default()
    })
    .await
    .expect("delete element");
    let t = trace(&d, "192.0.2.1", 22).await;
    assert_eq!(verdict(&t), pb::Verdict::Drop, "after the delete: {t:?}");
    let ruleset = rs
        .get_ruleset(pb::GetRulesetRequest {
            name: "rulesets/web".into(),
        })
        .await
        .expect("ruleset")
        .into_inner();
    assert_eq!(
        (ruleset.active_revision, ruleset.latest_revision),
        (1, 1),
        "the set changed without a revision"
    );

    // Stage + CommitRevision and Rollback of nft revisions, as of iptables ones.
    let open = SSH_FROM_SET.replace("policy drop", "policy accept");
    let staged = stage(&d, "web", nft_source(&open, "open.nft", false)).await;
    rs.commit_revision(pb::CommitRevisionRequest {
        name: staged.name.clone(),
        ..Default::default()
    })
    .await
    .expect("commits");
    assert_eq!(
        verdict(&trace(&d, "192.0.2.9", 22).await),
        pb::Verdict::Accept,
        "policy accept"
    );
    rs.rollback(pb::RollbackRequest {
        name: rev.name.clone(),
        ..Default::default()
    })
    .await
    .expect("rolls back");
    assert_eq!(
        verdict(&trace(&d, "192.0.2.9", 22).await),
        pb::Verdict::Drop,
        "policy drop again"
    );
    // The set kept the element the sets API gave it, and the commits added the listed one
    // back (as `nft -f` adds a set's listed elements).
    assert_eq!(
        verdict(&trace(&d, "192.0.2.7", 22).await),
        pb::Verdict::Accept
    );
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 22).await),
        pb::Verdict::Accept
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nft_revisions_diff_per_chain_in_nft_words() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let one = "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\tct state established,related accept\n\t\ttcp dport 22 accept\n\t\ttcp dport 80 accept\n\t}\n}\n";
    let two = "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy drop;\n\t\ttcp dport 80 accept\n\t\tct state established,related accept\n\t\ttcp dport 443 accept\n\t}\n}\ntable ip nat {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\toifname \"eth0\" masquerade\n\t}\n}\n";
    let a = stage(&d, "web", nft_source(one, "one.nft", false)).await;
    let b = stage(&d, "web", nft_source(two, "two.nft", false)).await;
    let diff = d
        .rulesets()
        .await
        .diff_revisions(pb::DiffRevisionsRequest {
            base: a.name.clone(),
            target: b.name.clone(),
        })
        .await
        .expect("diff")
        .into_inner();
    assert_eq!(diff.chains.len(), 2, "{diff:?}");
    let input = &diff.chains[0];
    assert_eq!(
        (input.table.as_str(), input.chain.as_str(), input.family),
        ("inet filter", "input", pb::Family::Unspecified as i32)
    );
    assert_eq!(input.added, ["tcp dport 443 accept"]);
    assert_eq!(input.removed, ["tcp dport 22 accept"]);
    assert_eq!(input.policy_change, "accept -> drop");
    assert_eq!(input.moved.len(), 1, "{input:?}");
    let nat = &diff.chains[1];
    assert_eq!(
        (nat.table.as_str(), nat.chain.as_str(), nat.family),
        ("ip nat", "post", pb::Family::Ipv4 as i32)
    );
    assert_eq!(nat.added, ["oifname \"eth0\" masquerade"]);
    d.stop().await;
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn ctl(url: &str, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(support::vallumctl())
        .args(args)
        .env_clear()
        .env("VALLUM_SERVER", url)
        .output()
        .await
        .expect("run vallumctl");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vallumctl_reads_nft_by_format_and_by_detection() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let url = d.url();
    let (name, text) = rulesets()
        .into_iter()
        .find(|(n, _)| n == "web.nft")
        .expect("README's web.nft");
    let listing = nft::print(&nft::parse(&name, &text).expect("parses"));
    let file = dir.path().join("rules.conf");
    std::fs::write(&file, &text).unwrap();
    let f = file.to_str().unwrap();

    // Detected: the text starts with nft words.
    let r = ctl(&url, &["validate", f]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = ctl(&url, &["stage", "ws", f]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = ctl(&url, &["export", "ws/1"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, listing, "export in the revision's own syntax");
    let r = ctl(&url, &["export", "ws/1", "--format", "nft-json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let json = dir.path().join("rules.json");
    std::fs::write(&json, &r.stdout).unwrap();
    let j = json.to_str().unwrap();
    // Detected as nft JSON, and with --format.
    for args in [
        &["stage", "ws", j][..],
        &["stage", "ws", j, "--format", "nft-json"][..],
    ] {
        let r = ctl(&url, args).await;
        assert_eq!(r.code, 0, "{args:?}: {}{}", r.stdout, r.stderr);
    }
    let r = ctl(&url, &["export", "ws/3", "--format", "nft"]).await;
    assert_eq!(r.stdout, listing);
    // --format iptables reads the nft file as iptables-restore text: refused at line 1.
    let r = ctl(&url, &["validate", f, "--format", "iptables"]).await;
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    // A bad nft file: FILE:LINE:COL on stderr, exit 1 (rejected).
    let bad = dir.path().join("bad.nft");
    std::fs::write(
        &bad,
        "flush ruleset\ntable inet t {\n\tchain c {\n\t\tfrobnicate\n\t}\n}\n",
    )
    .unwrap();
    let b = bad.to_str().unwrap();
    let r = ctl(&url, &["stage", "ws", b]).await;
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(&format!("{b}:4:3")), "{}", r.stderr);
    // The iptables-only flags are refused with an nft file.
    let r = ctl(&url, &["validate", f, "--noflush"]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("--noflush"), "{}", r.stderr);
    // Nothing of the refused calls was stored: revisions 1 to 3.
    let r = ctl(&url, &["revisions", "ws"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let revisions = r.stdout.matches("rulesets/ws/revisions/").count();
    assert_eq!(revisions, 3, "{}", r.stdout);
    d.stop().await;
}

/// kube-proxy's filter side: services without endpoints in a named verdict map.
const NO_ENDPOINTS: &str = "table ip kube-proxy {
\tmap no-endpoint-services {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\telements = { 198.51.100.1 . tcp . 80 : goto reject-chain }
\t}

\tchain filter-input {
\t\ttype filter hook input priority -110; policy accept;
\t\tct state new jump service-endpoints-check
\t}

\tchain service-endpoints-check {
\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services
\t}

\tchain reject-chain {
\t\treject
\t}
}
";

/// A named verdict map's elements (`KEY : VERDICT`) added, changed and deleted through the
/// sets API change verdicts without a revision, are refused when their chain is not in the
/// table, and are what a restarted vallumd loads back (one stored row per element); the map
/// takes up to `--max-set-elements`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_map_elements_change_without_a_commit_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    rs.apply(pb::ApplyRequest {
        ruleset: "kp".into(),
        source: Some(nft_source(NO_ENDPOINTS, "kp.nft", false)),
        ..Default::default()
    })
    .await
    .expect("applies");
    let verdict = |t: &pb::TracePacketResponse| pb::Verdict::try_from(t.verdict).unwrap();
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 80).await),
        pb::Verdict::Reject
    );
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 443).await),
        pb::Verdict::Accept
    );
    let map = "ip.kube-proxy.no-endpoint-services";
    let mut sets = pb::set_service_client::SetServiceClient::new(d.channel().await);
    let element = |text: &str| pb::SetElement {
        text: text.into(),
        ..Default::default()
    };
    let add = |texts: &[&str], exist: bool| pb::AddElementsRequest {
        set: map.into(),
        elements: texts.iter().map(|t| element(t)).collect(),
        exist,
        ..Default::default()
    };
    // `nft add element ip kube-proxy no-endpoint-services { 198.51.100.1 . tcp . 443 : drop }`
    sets.add_elements(add(&["198.51.100.1,tcp:443 : drop"], false))
        .await
        .expect("add");
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 443).await),
        pb::Verdict::Drop
    );
    // Its verdict changed (an add with `exist` replaces it).
    sets.add_elements(add(&["198.51.100.1,tcp:443 : goto reject-chain"], true))
        .await
        .expect("change");
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 443).await),
        pb::Verdict::Reject
    );
    // A chain the table does not have, an element without a verdict: refused, nothing changes.
    for bad in ["198.51.100.1,tcp:22 : goto nowhere", "198.51.100.1,tcp:22"] {
        let s = sets.add_elements(add(&[bad], false)).await.expect_err(bad);
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    }
    sets.delete_elements(pb::DeleteElementsRequest {
        set: map.into(),
        elements: vec![element("198.51.100.1,tcp:80")],
        ..Default::default()
    })
    .await
    .expect("delete");
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 80).await),
        pb::Verdict::Accept
    );
    let ruleset = rs
        .get_ruleset(pb::GetRulesetRequest {
            name: "rulesets/kp".into(),
        })
        .await
        .expect("ruleset")
        .into_inner();
    assert_eq!(
        ruleset.latest_revision, 1,
        "no revision for element changes"
    );
    // The active revision dispatches through the map: it cannot be destroyed.
    let e = sets
        .destroy_set(pb::DestroySetRequest {
            name: map.into(),
            ..Default::default()
        })
        .await
        .expect_err("in use");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    d.stop().await;

    let d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let mut sets = pb::set_service_client::SetServiceClient::new(d.channel().await);
    let listed = sets
        .get_set(pb::GetSetRequest {
            name: map.into(),
            ..Default::default()
        })
        .await
        .expect("get set")
        .into_inner();
    let texts: Vec<&str> = listed.elements.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(texts, ["198.51.100.1,tcp:443 : goto reject-chain"]);
    // A map without `size` takes up to --max-set-elements (default 262144), not 65536.
    assert_eq!(listed.set.expect("set").maxelem, 262_144);
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 443).await),
        pb::Verdict::Reject
    );
    assert_eq!(
        verdict(&trace(&d, "192.0.2.1", 80).await),
        pb::Verdict::Accept
    );
    d.stop().await;
}
