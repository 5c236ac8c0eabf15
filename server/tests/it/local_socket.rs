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
//!
//! And local calls (`vallum_proto::local`, vallum-iptables' framing) on the same socket
//! ([`local_calls_on_the_socket`], any user): answers, refusals with details, deadlines, the
//! request limit, the audit caller, HTTP/2 beside them.

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

/// One local call's request frame (magic first when `greet`) on `io`, and its answer.
fn local_call<M: prost::Message>(
    io: &mut std::os::unix::net::UnixStream,
    greet: bool,
    path: &str,
    msg: &M,
) -> Result<Vec<u8>, vallum_proto::local::RpcStatus> {
    use std::io::Write;
    use vallum_proto::local;
    let mut out = Vec::new();
    if greet {
        out.extend_from_slice(local::MAGIC);
    }
    out.extend(local::encode_request(path, b"", msg).expect("frame"));
    io.write_all(&out).expect("send the call");
    read_answer(io)
}

/// The next answer frame on `io`: the response message, or the refusal.
fn read_answer(
    io: &mut std::os::unix::net::UnixStream,
) -> Result<Vec<u8>, vallum_proto::local::RpcStatus> {
    use std::io::Read;
    use vallum_proto::local;
    let mut len = [0u8; 4];
    io.read_exact(&mut len).expect("answer length");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    io.read_exact(&mut body).expect("answer");
    local::decode_response(&body)
        .expect("an answer frame")
        .map(<[u8]>::to_vec)
}

/// Reads `io` until it ends: the bytes vallumd sent before it closed the connection.
fn until_closed(io: &mut std::os::unix::net::UnixStream) -> Vec<u8> {
    use std::io::Read;
    // Far longer than the deadlines under test: a connection left open fails the test.
    io.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut rest = Vec::new();
    io.read_to_end(&mut rest)
        .expect("vallumd closes the connection");
    rest
}

/// Local calls (`vallum_proto::local`, what vallum-iptables sends) on the socket that also
/// serves HTTP/2: answers and refusals with their details, several calls on one connection
/// kept open while calls come within `--idle-timeout` (1 s, for more than three periods),
/// closed once silent, or silent from the start (`--handshake-timeout`), a wrong magic closed
/// unanswered, a frame over the request limit refused from its length alone; the edit is
/// audited with the peer's credentials, and vallumctl's HTTP/2 on the same socket still works.
#[test]
fn local_calls_on_the_socket() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;
    use vallum_proto::local;
    use vallum_proto::v1 as pb;

    const GET: &str = "/vallum.v1.RulesetService/GetRuleset";
    const EDIT: &str = "/vallum.v1.RulesetService/EditRuleset";
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("vallumd.sock");
    let db = dir.path().join("v.db");
    let _d = Daemon::start(
        &db,
        &[
            "--socket",
            sock.to_str().unwrap(),
            "--handshake-timeout",
            "1",
            "--idle-timeout",
            "1",
            "--max-request-bytes",
            "65536",
        ],
    );
    let get = pb::GetRulesetRequest {
        name: "rulesets/web".into(),
    };
    // A first call once vallumd has loaded (NOT_READY before), then NOT_FOUND: no such ruleset.
    let mut io = loop {
        let mut io = UnixStream::connect(&sock).expect("connect");
        match local_call(&mut io, true, GET, &get) {
            Err(s) if s.reason().as_deref() == Some("NOT_READY") => std::thread::yield_now(),
            Err(s) => {
                assert_eq!(s.code, tonic::Code::NotFound as i32, "{s:?}");
                break io;
            }
            Ok(_) => panic!("rulesets/web exists before any call made it"),
        }
    };
    let edit = |args: &str| pb::EditRulesetRequest {
        ruleset: "web".into(),
        edits: vec![pb::RuleCommand {
            family: pb::Family::Ipv4 as i32,
            table: "filter".into(),
            args: args.split(' ').map(String::from).collect(),
        }],
        message: "local call".into(),
        ..Default::default()
    };
    let done = local_call(
        &mut io,
        false,
        EDIT,
        &edit("-A INPUT -p tcp --dport 22 -j ACCEPT"),
    )
    .expect("edit through a local call");
    let done = <pb::CommitResult as prost::Message>::decode(done.as_slice()).expect("CommitResult");
    assert_eq!(done.revision.expect("a revision").number, 1);
    // A refusal keeps its details: the field violation iptables' words are made from.
    let refused = local_call(&mut io, false, EDIT, &edit("-A NOPE -j ACCEPT")).unwrap_err();
    assert_eq!(
        refused.code,
        tonic::Code::InvalidArgument as i32,
        "{refused:?}"
    );
    let why = refused.first_violation().expect("a field violation");
    assert!(why.contains("NOPE"), "{why}");
    // vallumd reads what is there at once: two calls sent in one write are both answered, in
    // order, and a call that arrives a byte at a time is answered when it is whole.
    let mut two = local::encode_request(GET, b"", &get).expect("frame");
    two.extend(
        local::encode_request(EDIT, b"", &edit("-A INPUT -p tcp --dport 23 -j ACCEPT"))
            .expect("frame"),
    );
    io.write_all(&two).expect("two calls");
    for want in [1, 2] {
        let answer = read_answer(&mut io).expect("answered");
        let number = match want {
            1 => {
                <pb::Ruleset as prost::Message>::decode(answer.as_slice())
                    .expect("Ruleset")
                    .active_revision
            }
            _ => {
                (<pb::CommitResult as prost::Message>::decode(answer.as_slice()))
                    .expect("CommitResult")
                    .revision
                    .expect("a revision")
                    .number
            }
        };
        assert_eq!(number, want);
    }
    let mut slow = UnixStream::connect(&sock).expect("connect");
    let mut call = local::MAGIC.to_vec();
    call.extend(local::encode_request(GET, b"", &get).expect("frame"));
    for b in &call {
        slow.write_all(std::slice::from_ref(b)).expect("one byte");
        std::thread::sleep(Duration::from_millis(2));
    }
    let rs = read_answer(&mut slow).expect("GetRuleset a byte at a time");
    let rs = <pb::Ruleset as prost::Message>::decode(rs.as_slice()).expect("Ruleset");
    assert_eq!(rs.active_revision, 2);
    drop(slow);
    // Calls within --idle-timeout keep the connection for more than three of its periods.
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(450));
        let rs = local_call(&mut io, false, GET, &get).expect("GetRuleset");
        let rs = <pb::Ruleset as prost::Message>::decode(rs.as_slice()).expect("Ruleset");
        assert_eq!(rs.active_revision, 2);
    }
    // Then silence: closed, nothing sent.
    assert_eq!(until_closed(&mut io), b"");
    // Silent from the start: closed at --handshake-timeout.
    let mut silent = UnixStream::connect(&sock).expect("connect");
    assert_eq!(until_closed(&mut silent), b"");
    // A wrong magic: closed unanswered.
    let mut wrong = UnixStream::connect(&sock).expect("connect");
    wrong.write_all(b"VALLUM/9").unwrap();
    assert_eq!(until_closed(&mut wrong), b"");
    // A frame longer than the request limit allows: refused from its length, then closed.
    let mut big = UnixStream::connect(&sock).expect("connect");
    let declared = local::request_frame_limit(65536) as u32 + 1;
    big.write_all(local::MAGIC).unwrap();
    big.write_all(&declared.to_be_bytes()).unwrap();
    let answer = until_closed(&mut big);
    let refused = local::decode_response(&answer[4..])
        .expect("a refusal frame")
        .unwrap_err();
    assert_eq!(refused.code, tonic::Code::ResourceExhausted as i32);
    assert_eq!(refused.reason().as_deref(), Some("REQUEST_TOO_LARGE"));
    // HTTP/2 on the same socket: vallumctl reads the revision the local call made.
    let server = format!("unix:{}", sock.display());
    let o = vallumctl(None, &["--server", &server, "export", "web/1"]);
    assert!(
        o.status.success(),
        "vallumctl over the socket: {}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("--dport 22"),
        "{}",
        text(&o)
    );
    // The edit is audited with the peer's credentials, as a gRPC call through the socket.
    let c = rusqlite::Connection::open(&db).expect("open db");
    let caller: String = c
        .query_row(
            "SELECT caller FROM audit WHERE method = 'EditRuleset' ORDER BY id LIMIT 1",
            [],
            |r| r.get(0),
        )
        .expect("an audited EditRuleset");
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert!(
        caller.starts_with(&format!("local:uid={uid},pid=")),
        "{caller}"
    );
}
