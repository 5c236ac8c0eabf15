//! CounterService against a real `vallumd` and `vallumctl`: a ruleset that does not exist is
//! NOT_FOUND (exit 1) for reading and zeroing alike; ZeroCounters is audited.

use crate::support;

use support::Daemon;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn vallumctl(server: &str, args: &[&str]) -> Run {
    let out = std::process::Command::new(support::vallumctl())
        .args(["--server", server, "--timeout", "10s"])
        .args(args)
        .env_clear()
        .output()
        .expect("run vallumctl");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ruleset_is_not_found_and_zeroing_is_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    let d = Daemon::start(&db, &["--example"]);
    d.wait_serving().await;
    let url = d.url();

    for args in [
        &["counters", "--zero", "nosuch"][..],
        &["counters", "nosuch"],
    ] {
        let r = vallumctl(&url, args);
        assert_eq!(r.code, 1, "{args:?}: {} {}", r.stdout, r.stderr);
        assert!(r.stderr.contains("NOT_FOUND"), "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("rulesets/nosuch"),
            "{args:?}: {}",
            r.stderr
        );
        assert!(!r.stdout.contains("zeroed"), "{args:?}: {}", r.stdout);
    }
    for args in [
        &["counters", "host-firewall"][..],
        &["counters", "--zero", "host-firewall"],
        &["counters", "--zero"],
    ] {
        let r = vallumctl(&url, args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
    }

    let pool = rusqlite::Connection::open(&db).expect("open db");
    let rows: Vec<(String, String, String)> = pool
        .prepare(
            "SELECT method, outcome, request_digest FROM audit \
             WHERE method = 'CounterService/ZeroCounters' ORDER BY id",
        )
        .expect("audit")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("audit")
        .collect::<rusqlite::Result<_>>()
        .expect("audit");
    let outcomes: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(outcomes, ["NOT_FOUND", "OK", "OK"], "{rows:?}");
    assert!(rows.iter().all(|r| r.2.len() == 64), "{rows:?}");
}
