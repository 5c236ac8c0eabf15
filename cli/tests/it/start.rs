//! How `vallum-iptables` starts (issue #33 item 7): on the local socket it runs on one thread
//! (no runtime: local calls on a blocking socket), sends its call as a local call
//! (`vallum_proto::local`: the magic and the request frame, no HTTP/2), and without
//! `VALLUM_SERVER` it goes to vallumd's local socket (`socket::default_server`:
//! `$XDG_RUNTIME_DIR/vallum/vallumd.sock` when the root socket `/run/vallum/vallumd.sock` is
//! absent), not to TCP.
//!
//! Each test is the server end of a unix socket that accepts the call's connection, reads the
//! magic and the whole request frame (the call is under way) and never answers, so the client
//! waits while the test counts its threads in `/proc/PID/task`.

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_vallum-iptables");

/// The root socket that `default_server` tries first.
const ROOT_SOCKET: &str = "/run/vallum/vallumd.sock";

/// `vallum-iptables iptables -S` with the environment's vallumd settings removed.
fn iptables_s() -> Command {
    let mut c = Command::new(BIN);
    c.args(["iptables", "-S"]);
    for v in [
        "VALLUM_SERVER",
        "VALLUM_TOKEN",
        "VALLUM_CA",
        "VALLUM_CERT",
        "VALLUM_KEY",
        "VALLUM_TLS_DOMAIN",
        "VALLUM_RULESET",
    ] {
        c.env_remove(v);
    }
    c.stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// Accepts `child`'s connection on `listener` (failing if `child` exits first: it went
/// elsewhere or could not connect), reads its local-call magic and request frame (a
/// GetRuleset of `rulesets/iptables`, `-S`'s first call), and returns the number of threads
/// `child` runs while it waits for the answer (then kills it).
fn threads_during_call(listener: &UnixListener, mut child: Child) -> usize {
    listener.set_nonblocking(true).expect("nonblocking");
    let mut conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().expect("try_wait") {
                    panic!("vallum-iptables exited ({status}) without connecting to the socket");
                }
                std::thread::yield_now();
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).expect("blocking");
    let mut magic = [0u8; 8];
    conn.read_exact(&mut magic).expect("local-call magic");
    assert_eq!(&magic, vallum_proto::local::MAGIC);
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).expect("frame length");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    conn.read_exact(&mut body).expect("request frame");
    let req = vallum_proto::local::decode_request(&body).expect("a request frame");
    assert_eq!(req.path, "/vallum.v1.RulesetService/GetRuleset");
    let get = <vallum_proto::v1::GetRulesetRequest as prost::Message>::decode(req.message)
        .expect("GetRulesetRequest");
    assert_eq!(get.name, "rulesets/iptables");
    let n = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .expect("/proc/PID/task")
        .count();
    let _ = child.kill();
    let _ = child.wait();
    n
}

#[test]
fn one_thread_during_a_call() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vallumd.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let child = iptables_s()
        .env("VALLUM_SERVER", format!("unix:{}", path.display()))
        .spawn()
        .expect("spawn vallum-iptables");
    assert_eq!(threads_during_call(&listener, child), 1);
}

#[test]
fn local_socket_by_default() {
    assert!(
        !Path::new(ROOT_SOCKET).exists(),
        "{ROOT_SOCKET} exists (a vallumd as root on this host): vallum-iptables would use it \
         before $XDG_RUNTIME_DIR's; this test needs it absent"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("vallum")).expect("mkdir");
    let listener = UnixListener::bind(dir.path().join("vallum/vallumd.sock")).expect("bind");
    let child = iptables_s()
        .env("XDG_RUNTIME_DIR", dir.path())
        .spawn()
        .expect("spawn vallum-iptables");
    assert_eq!(threads_during_call(&listener, child), 1);
}
