//! nft rulesets through a real `vallumd` (ephemeral port, temporary database) and `vallumctl`.
//!
//! Cases: every ruleset of `engine/tests/nft-rulesets/` (and README's `examples/web.nft`) staged as nft text and as the nft JSON
//! its export gives, each revision's content and export byte-equal to the engine's canonical
//! listing of the file (JSON export read back to the same listing and digest); a bad text
//! refused at FILE:LINE:COL (`include`, a syntax error, an unsupported family by name) that
//! changes nothing; a commit of an nft ruleset refused by name while the engine does not
//! enforce nft, the staged revision kept; the diff of two nft revisions per chain in nft's
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
    for (file, text) in rulesets() {
        let model = nft::parse(&file, &text).unwrap_or_else(|e| panic!("{e}"));
        let listing = nft::print(&model);
        let rules: usize = (model.tables.iter().flat_map(|t| &t.chains))
            .map(|c| c.rules.len())
            .sum();
        let ruleset = file.trim_end_matches(".nft").replace('.', "-");

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nft_commit_is_refused_by_name_while_the_engine_does_not_enforce_nft() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let text = "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy drop;\n\t\ttcp dport 22 accept\n\t}\n}\n";
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
    for validate_only in [true, false] {
        let s = rs
            .apply(pb::ApplyRequest {
                ruleset: "web".into(),
                source: Some(nft_source(text, "web.nft", false)),
                validate_only,
                ..Default::default()
            })
            .await
            .expect_err("not enforced");
        assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
        assert!(s.message().contains("does not enforce"), "{}", s.message());
    }
    let rev = stage(&d, "web", nft_source(text, "web.nft", false)).await;
    assert_eq!(rev.number, 1, "the Apply stored nothing");
    let s = rs
        .commit_revision(pb::CommitRevisionRequest {
            name: rev.name.clone(),
            ..Default::default()
        })
        .await
        .expect_err("not enforced");
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    let got = rs
        .get_revision(pb::GetRevisionRequest {
            name: rev.name.clone(),
        })
        .await
        .expect("revision")
        .into_inner();
    assert_eq!(got.state, pb::RevisionState::Staged as i32, "{got:?}");
    let ruleset = rs
        .get_ruleset(pb::GetRulesetRequest {
            name: "rulesets/web".into(),
        })
        .await
        .expect("ruleset")
        .into_inner();
    assert_eq!(ruleset.active_revision, 0, "nothing active");
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
        .find(|(n, _)| n == "workstation.nft")
        .expect("workstation.nft");
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
