//! The local unix socket (`vallumd --socket`), authorized by peer credentials, driven with
//! `vallumctl --server unix:PATH` run as different users (root only, for `setuid`, and `setpriv`
//! of util-linux; ignored unless asked for, and failing without them):
//! - root changes state through the socket, and the audit log records `local:uid=0,pid=P`;
//! - uid 65534 (nobody) reads through it but cannot change anything: LOCAL_ADMIN_REQUIRED,
//!   the message naming what is missing (uid 0, CAP_NET_ADMIN, --socket-group);
//! - uid 65534 in `--socket-group` (primary gid) can, audited with its uid, pid and gid;
//! - uid 65534 with CAP_NET_ADMIN (ambient, via `setpriv`) can;
//! - over TCP, without tokens and without `--insecure-no-auth`, reads pass and changes are
//!   refused with ANONYMOUS_READ_ONLY.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::Daemon;

/// A gid no account has: membership comes from `--socket-group` alone.
const GROUP: u32 = 4242;
const NOBODY: u32 = 65534;

const RULES: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n";

/// vallumctl with `args`, as root or as (uid, gid).
fn vallumctl(as_user: Option<(u32, u32)>, args: &[&str]) -> Output {
    let mut c = Command::new(support::vallumctl());
    c.args(args)
        .env_remove("VALLUM_SERVER")
        .env_remove("VALLUM_TOKEN")
        .env_remove("VALLUM_TOKEN_FILE")
        .stdin(Stdio::null());
    if let Some((uid, gid)) = as_user {
        c.uid(uid).gid(gid);
    }
    c.output().expect("run vallumctl")
}

fn text(o: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The `caller` of every audited Apply, in order.
fn apply_callers(db: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open(db).expect("open db");
    let mut q = c
        .prepare("SELECT caller FROM audit WHERE method = 'Apply' ORDER BY id")
        .expect("query");
    q.query_map([], |r| r.get::<_, String>(0))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect()
}

#[test]
#[ignore = "needs root and setpriv (util-linux)"]
fn socket_peers_by_credentials_and_tcp_read_only() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        panic!("socket_peers_by_credentials_and_tcp_read_only: not root (setuid)");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // nobody must reach the socket and the rules file.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let rules = dir.path().join("web.rules");
    std::fs::write(&rules, RULES).unwrap();
    let rules = rules.to_str().unwrap();
    let sock = dir.path().join("run/vallumd.sock");
    let db = dir.path().join("v.db");
    let group = GROUP.to_string();
    let mut d = Daemon::start(
        &db,
        &["--socket", sock.to_str().unwrap(), "--socket-group", &group],
    );
    let server = format!("unix:{}", sock.display());
    let unix = |who, args: &[&str]| {
        let mut all = vec!["--server", server.as_str()];
        all.extend_from_slice(args);
        vallumctl(who, &all)
    };

    // Root changes state through the socket.
    let o = unix(None, &["apply", "web", rules]);
    assert!(o.status.success(), "root apply: {}", text(&o));

    // nobody reads, but every change is refused, naming what is missing.
    let nobody = Some((NOBODY, NOBODY));
    let o = unix(nobody, &["export", "web/1"]);
    assert!(o.status.success(), "nobody export: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("--dport 22"),
        "{}",
        text(&o)
    );
    for args in [
        &["apply", "other", rules][..],
        &["delete", "web"][..],
        &["conntrack", "flush"][..],
    ] {
        let o = unix(nobody, args);
        assert_eq!(o.status.code(), Some(1), "nobody {args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        for want in [
            "LOCAL_ADMIN_REQUIRED",
            "CAP_NET_ADMIN",
            "uid 0",
            "--socket-group (gid 4242)",
            "local:uid=65534",
        ] {
            assert!(
                err.contains(want),
                "nobody {args:?}: no {want:?} in {}",
                text(&o)
            );
        }
    }

    // A member of --socket-group can.
    let o = unix(Some((NOBODY, GROUP)), &["apply", "group", rules]);
    assert!(o.status.success(), "group member apply: {}", text(&o));

    // So can a process with CAP_NET_ADMIN (ambient, kept across exec).
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if setpriv {
        let o = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args([
                "--inh-caps",
                "+net_admin",
                "--ambient-caps",
                "+net_admin",
                "--",
            ])
            .arg(support::vallumctl())
            .args(["--server", &server, "apply", "capable", rules])
            .env_remove("VALLUM_SERVER")
            .stdin(Stdio::null())
            .output()
            .expect("setpriv");
        assert!(o.status.success(), "CAP_NET_ADMIN apply: {}", text(&o));
    } else {
        panic!("CAP_NET_ADMIN peer: `setpriv` (util-linux) is not available");
    }

    // vallum-iptables through the socket (VALLUM_SERVER=unix:PATH): root edits, nobody not.
    let ipt = support::vallumctl().with_file_name("vallum-iptables");
    if ipt.exists() {
        let edit = |who: Option<(u32, u32)>| {
            let mut c = Command::new(&ipt);
            c.args([
                "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "80", "-j", "ACCEPT",
            ])
            .env("VALLUM_SERVER", &server)
            .env("VALLUM_RULESET", "dropin")
            .stdin(Stdio::null());
            if let Some((uid, gid)) = who {
                c.uid(uid).gid(gid);
            }
            c.output().expect("run vallum-iptables")
        };
        let o = edit(None);
        assert!(o.status.success(), "root vallum-iptables: {}", text(&o));
        let o = edit(nobody);
        assert!(!o.status.success(), "nobody vallum-iptables: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("CAP_NET_ADMIN"),
            "{}",
            text(&o)
        );
    } else {
        panic!("vallum-iptables: {} not built", ipt.display());
    }

    // Over TCP without tokens: reads pass, changes are refused.
    let tcp = d.url();
    let o = vallumctl(None, &["--server", &tcp, "export", "web/1"]);
    assert!(o.status.success(), "tcp export: {}", text(&o));
    let o = vallumctl(None, &["--server", &tcp, "apply", "tcp", rules]);
    assert_eq!(o.status.code(), Some(1), "tcp apply: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("ANONYMOUS_READ_ONLY") && err.contains("--insecure-no-auth"),
        "{}",
        text(&o)
    );

    // The audit log has each local caller's uid and pid (and why it may).
    let callers = apply_callers(&db);
    let want = if setpriv { 3 } else { 2 };
    assert_eq!(callers.len(), want, "{callers:?}");
    assert!(callers[0].starts_with("local:uid=0,pid="), "{callers:?}");
    assert!(
        callers[1].starts_with("local:uid=65534,pid=") && callers[1].ends_with(",gid=4242"),
        "{callers:?}"
    );
    if setpriv {
        assert!(callers[2].ends_with(",cap=net_admin"), "{callers:?}");
    }
    // A graceful stop removes the socket file.
    assert!(d.terminate(), "vallumd stops cleanly");
    assert!(!sock.exists(), "socket file left after a graceful stop");
}
