//! `docs/extensions.md` is generated from the parser's own tables
//! ([`vallum_engine::restore::support_markdown`]): this test fails when the file differs, and
//! rewrites it when run with `VALLUM_BLESS=1`.

use std::path::Path;

use vallum_engine::restore::{Support, support_markdown, support_table};

#[test]
fn docs_extensions_md_is_the_parsers_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/extensions.md");
    let want = support_markdown();
    if std::env::var_os("VALLUM_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write docs/extensions.md");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/extensions.md differs from the parser's table; rerun with VALLUM_BLESS=1"
    );
}

#[test]
fn the_issue_14_extensions_have_the_status_the_docs_claim() {
    let row = |target: bool, name: &str| {
        support_table()
            .into_iter()
            .find(|r| r.target == target && r.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let enforced = |s: Support| s.is_enforced();
    for name in ["ttl", "tos", "dscp", "ecn", "ah"] {
        assert!(enforced(row(false, name).ipv4), "{name}");
    }
    for name in ["hl", "tos", "dscp", "ecn", "frag", "rt", "ipv6header"] {
        assert!(enforced(row(false, name).ipv6), "{name}");
    }
    assert_eq!(row(false, "ttl").ipv6, Support::Refused);
    assert_eq!(row(false, "hl").ipv4, Support::Refused);
    assert!(enforced(row(false, "addrtype").ipv4));
    assert!(enforced(row(false, "addrtype").ipv6));
    for name in ["rpfilter", "pkttype"] {
        let r = row(false, name);
        assert!(enforced(r.ipv4) && enforced(r.ipv6), "{name}");
    }
    for name in ["u32", "sctp"] {
        let r = row(false, name);
        assert!(enforced(r.ipv4) && enforced(r.ipv6), "{name}");
    }
    let r = row(false, "owner");
    assert!(matches!(r.ipv4, Support::WithKernel { .. }), "{r:?}");
    for (target, name) in [
        (true, "MARK"),
        (true, "CONNMARK"),
        (false, "connmark"),
        (false, "connlimit"),
        (false, "string"),
    ] {
        let r = row(target, name);
        assert!(enforced(r.ipv4) && enforced(r.ipv6), "{name}");
    }
    assert_eq!(row(true, "NFQUEUE").ipv4, Support::StoredOnly);
}
