//! What `vallumd` does at start when its configuration or its stored state is wrong: it says
//! where, never shows a secret, and never runs open.

use crate::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use support::Daemon;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use vallum_proto::v1 as pb;
use vallum_proto::v1::engine_service_client::EngineServiceClient;

/// Runs vallumd with `args` (it must exit by itself: one that starts anyway stops after
/// `--exit-after 30` with code 0) and returns (exit code, stderr).
fn vallumd_exits(args: &[&str]) -> (Option<i32>, String) {
    let out = support::command()
        .args(["--cores", "1", "--exit-after", "30"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run vallumd");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A token-file line in the wrong order (`TOKEN ROLE`) stops vallumd with the file, line and
/// field, and the token appears nowhere in what it prints.
#[test]
fn malformed_token_file_never_prints_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = "07d1c24b9f6a4e1d8c3b2a1f0e9d8c7b";
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("# tokens\n{secret} admin alice\n")).expect("write");
    let db = dir.path().join("v.db");
    let (code, stderr) = vallumd_exits(&[
        "--db",
        &db.display().to_string(),
        "--token-file",
        &tokens.display().to_string(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    let want = format!("{}:2: field 1 (ROLE)", tokens.display());
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!stderr.contains(&secret[..8]), "token printed: {stderr}");
}

const WEB: &str = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 443 -j ACCEPT\nCOMMIT\n";
const OTHER: &str =
    "*filter\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -p udp --dport 53 -j ACCEPT\nCOMMIT\n";

fn apply_req(ruleset: &str, text: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        source: Some(support::text_source(text, false, "t.rules")),
        ..Default::default()
    }
}

fn open_db(db: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(db).expect("open db")
}

/// The rows of `sql`, each mapped by `f`.
fn rows<T>(
    db: &rusqlite::Connection,
    sql: &str,
    f: fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Vec<T> {
    db.prepare(sql)
        .expect(sql)
        .query_map([], f)
        .expect(sql)
        .collect::<rusqlite::Result<_>>()
        .expect(sql)
}

/// Rewrites the stored text of `ruleset`'s active revision behind vallumd's back: the chunks
/// that only it names (its key frame's and its edits') get a text that does not parse.
async fn corrupt_active_text(db: &Path, ruleset: &str) {
    let pool = open_db(db);
    let lists: Vec<(String, i64)> = rows(
        &pool,
        "SELECT r.name, e.chunk FROM rulesets r JOIN revisions v \
         ON v.ruleset = r.name AND v.number = r.active_revision \
         JOIN chunk_list_entries e ON e.list = v.chunk_list WHERE e.family = 4 \
         UNION ALL SELECT r.name, x.chunk FROM rulesets r JOIN revision_chunk_edits x \
         ON x.ruleset = r.name AND x.number = r.active_revision \
         WHERE x.family = 4 AND x.chunk IS NOT NULL",
        |r| Ok((r.get(0)?, r.get(1)?)),
    );
    let ids = |mine: bool| -> BTreeSet<i64> {
        lists
            .iter()
            .filter(|(r, _)| (r == ruleset) == mine)
            .map(|(_, id)| *id)
            .collect()
    };
    let only_mine: Vec<i64> = ids(true).difference(&ids(false)).copied().collect();
    assert!(!only_mine.is_empty(), "{lists:?}");
    for id in only_mine {
        pool.execute(
            "UPDATE chunk_texts SET text = ?1 WHERE id = ?2",
            rusqlite::params!["*filter\n-A INPUT --no-such-option -j DROP\nCOMMIT\n", id],
        )
        .expect("corrupt");
    }
}

async fn health(d: &Daemon, service: &str) -> Result<ServingStatus, tonic::Code> {
    let mut h = HealthClient::new(d.channel().await);
    h.check(HealthCheckRequest {
        service: service.into(),
    })
    .await
    .map(|r| ServingStatus::try_from(r.get_ref().status).unwrap_or(ServingStatus::Unknown))
    .map_err(|e| e.code())
}

/// Polls `health(service)` until it is `want` (bounded: 10 s).
async fn wait_health(d: &Daemon, service: &str, want: ServingStatus) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = health(d, service).await;
        if now == Ok(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{service}: {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `vallum_rulesets_not_loaded` on a scrape.
async fn not_loaded_gauge(addr: &str) -> Option<f64> {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: v\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read");
    raw.lines()
        .find(|l| l.starts_with("vallum_rulesets_not_loaded"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// An ACTIVE revision whose stored text no longer loads: by default vallumd refuses to start
/// (and says which, marks it and audits it); with `--on-load-failure degraded` it serves the
/// other ruleset, reports NOT_SERVING for `rulesets/web`, counts it in the gauge and lists it
/// in GetStatus, until a new revision of web is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_revision_that_does_not_load_is_refused_or_degraded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    {
        let d = Daemon::start(&db, &[]);
        d.wait_serving().await;
        let mut c = d.rulesets().await;
        c.apply(apply_req("web", WEB)).await.expect("apply web");
        c.apply(apply_req("other", OTHER))
            .await
            .expect("apply other");
    }
    corrupt_active_text(&db, "web").await;

    // Default: refuse.
    let db_arg = db.display().to_string();
    let (code, stderr) = vallumd_exits(&["--db", &db_arg]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("ACTIVE_REVISION_NOT_LOADED"), "{stderr}");
    assert!(stderr.contains("rulesets/web/revisions/1"), "{stderr}");
    assert!(stderr.contains("--on-load-failure degraded"), "{stderr}");
    let pool = open_db(&db);
    let marks: Vec<(String, i64)> =
        rows(&pool, "SELECT ruleset, revision FROM load_failures", |r| {
            Ok((r.get(0)?, r.get(1)?))
        });
    assert_eq!(marks, [("web".to_owned(), 1)]);
    let audit: Vec<(String, String, String)> = rows(
        &pool,
        "SELECT caller, method, outcome FROM audit WHERE method = 'Load' ORDER BY id",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    );
    let want: (String, String, String) = (
        "vallumd".into(),
        "Load".into(),
        "ACTIVE_REVISION_NOT_LOADED".into(),
    );
    assert_eq!(audit, [want]);
    drop(pool);

    // Degraded: serves `other`, says web is not loaded.
    let d = Daemon::start(&db, &["--on-load-failure", "degraded"]);
    d.wait_serving().await;
    wait_health(&d, "rulesets/web", ServingStatus::NotServing).await;
    assert_eq!(
        health(&d, "vallum.v1.RulesetService").await,
        Ok(ServingStatus::Serving)
    );
    let mut eng = EngineServiceClient::new(d.channel().await);
    let st = eng
        .get_status(pb::GetStatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let active: Vec<&str> = st.active.iter().map(|a| a.ruleset.as_str()).collect();
    assert_eq!(active, ["other"]);
    assert_eq!(st.not_loaded.len(), 1, "{st:?}");
    assert_eq!(
        (st.not_loaded[0].ruleset.as_str(), st.not_loaded[0].revision),
        ("web", 1)
    );
    assert!(!st.not_loaded[0].error.is_empty());
    assert_eq!(not_loaded_gauge(&d.metrics_addr).await, Some(1.0));
    let pool = open_db(&db);
    let n: i64 = pool
        .query_row(
            "SELECT COUNT(*) FROM audit WHERE method = 'Load'",
            [],
            |r| r.get(0),
        )
        .expect("audit");
    assert_eq!(n, 2, "one record per start that found it");

    // A new revision of web repairs it.
    let mut c = d.rulesets().await;
    c.apply(apply_req("web", WEB)).await.expect("apply web");
    wait_health(&d, "rulesets/web", ServingStatus::Serving).await;
    let st = eng
        .get_status(pb::GetStatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert!(st.not_loaded.is_empty(), "{st:?}");
    assert_eq!(st.active.len(), 2, "{st:?}");
    assert_eq!(not_loaded_gauge(&d.metrics_addr).await, Some(0.0));
    let marks: i64 = pool
        .query_row("SELECT COUNT(*) FROM load_failures", [], |r| r.get(0))
        .expect("marks");
    assert_eq!(marks, 0);
}
