//! `vallum-iptables` against a real vallumd: every edit kind (-A/-I/-D by number and by
//! rule/-R/-C/-N/-X/-F/-P), iptables' messages and exit codes, -S, save and restore; and
//! the same command sequence run by iptables-legacy in a private network namespace gives the
//! same `iptables-save` text (root and iptables-legacy: those tests are ignored unless asked
//! for, `-- --include-ignored`, and fail without them).
//!
//! vallumd is the binary next to vallum-iptables in the target directory, built there with
//! `cargo build -p vallum-server --bin vallumd` when it is not there yet.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_vallum-iptables");

/// A running vallumd on an ephemeral port and a local socket of its own, with its own
/// database; killed on drop.
struct Vallumd {
    child: Child,
    /// Where the drop-in calls it: its local socket (`unix:PATH`, local calls), as a host's
    /// `iptables` does by default, unless the test asked for TCP.
    url: String,
    /// Its gRPC TCP endpoint (`http://HOST:PORT`).
    tcp: String,
    /// `/metrics` address (`HOST:PORT`).
    metrics: String,
    dir: PathBuf,
}

impl Drop for Vallumd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn vallumd(tag: &str) -> Vallumd {
    vallumd_via(tag, false)
}

/// As [`vallumd`]; with `tcp` the drop-in calls it over TCP (gRPC) instead of its local socket.
fn vallumd_via(tag: &str, tcp: bool) -> Vallumd {
    let dir = std::env::temp_dir().join(format!("vallum-dropin-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut v = spawn_vallumd(dir);
    if tcp {
        v.url = v.tcp.clone();
    }
    // Ready once it stops answering NOT_READY ("still loading its stored state").
    for _ in 0..600 {
        let (rc, _, err) = run(&v, "iptables-restore", &["--test"], "*filter\nCOMMIT\n");
        if rc == 0 {
            return v;
        }
        assert!(err.contains("still loading"), "vallumd not ready: {err}");
        std::thread::yield_now();
    }
    panic!("vallumd never became ready");
}

/// vallumd on the database in `dir` (kept), returned as soon as it printed its address
/// (it may still be loading).
fn spawn_vallumd(dir: PathBuf) -> Vallumd {
    let mut child = Command::new(vallumd_exe())
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--cores", "1", "--db"])
        .arg(dir.join("v.db"))
        // Changes over TCP without tokens (anonymous TCP callers only read by default); a
        // socket of its own, never the host's default one (this user may change state
        // through it: vallumd runs as this user).
        .args(["--insecure-no-auth", "--socket"])
        .arg(dir.join("v.sock"))
        .env_remove("VALLUM_DB")
        .env_remove("VALLUM_SYNC")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn vallumd");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut url, mut metrics) = (None, None);
    for line in lines.by_ref() {
        let line = line.expect("read stdout");
        if let Some(a) = line.strip_prefix("metrics on ") {
            metrics = Some(a.to_owned());
        }
        if let Some(a) = line.strip_prefix("listening on ") {
            url = Some(format!("http://{a}"));
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Vallumd {
        child,
        url: format!("unix:{}", dir.join("v.sock").display()),
        tcp: url.expect("vallumd printed its address"),
        metrics: metrics.expect("vallumd printed its metrics address"),
        dir,
    }
}

/// The vallumd binary next to vallum-iptables. It belongs to another package (vallum-server),
/// and cargo builds only this package's binaries for its tests, so when it is not there the
/// first call builds it with the cargo that runs the tests (`$CARGO`), into the same target
/// directory and profile. Panics when the build fails.
fn vallumd_exe() -> &'static std::path::Path {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let exe = PathBuf::from(BIN).with_file_name("vallumd");
        if exe.exists() {
            return exe;
        }
        let profile_dir = exe.parent().expect("target/PROFILE");
        let target_dir = profile_dir.parent().expect("target/PROFILE has a parent");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => panic!("no profile in {}", profile_dir.display()),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "vallum-server"])
            .args(["--bin", "vallumd", "--profile", profile, "--target-dir"])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p vallum-server");
        assert!(status.success(), "cargo build -p vallum-server: {status}");
        exe
    })
}

/// Panics unless the kernel comparisons can run (root, iptables-legacy, unshare).
fn require_legacy() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    assert!(root, "the comparison with iptables-legacy needs root");
    let legacy = Command::new("sh")
        .args(["-c", "command -v iptables-legacy && command -v unshare"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(legacy, "iptables-legacy or unshare not installed");
}

/// Runs `script` (sh) in a private network namespace: (exit code, stdout, stderr).
fn in_netns(script: &str) -> (i32, String, String) {
    let out = Command::new("unshare")
        .args(["--net", "sh", "-c", script])
        .output()
        .expect("unshare");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `vallum-iptables` as `prog` (argv[0]) with `args`, `stdin`; (exit code, stdout, stderr).
fn run(v: &Vallumd, prog: &str, args: &[&str], stdin: &str) -> (i32, String, String) {
    run_on(v, "iptables", prog, args, stdin)
}

/// As [`run`], on the ruleset `ruleset`.
fn run_on(
    v: &Vallumd,
    ruleset: &str,
    prog: &str,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .arg0(prog)
        .args(args)
        .env("VALLUM_SERVER", &v.url)
        .env("VALLUM_RULESET", ruleset)
        .env_remove("VALLUM_TOKEN")
        .env_remove("VALLUM_SYNC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vallum-iptables");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

#[test]
fn every_edit_kind_with_iptables_words_and_exit_codes() {
    every_edit_kind(&vallumd("edits"));
}

/// The same over TCP: gRPC through tonic instead of local calls, the same words and codes.
#[test]
fn every_edit_kind_over_tcp() {
    every_edit_kind(&vallumd_via("edits-tcp", true));
}

/// Every edit kind through `v`, with iptables' words and exit codes.
fn every_edit_kind(v: &Vallumd) {
    let ok = |cmd: &str| {
        let (rc, _, err) = run(v, "iptables", &words(cmd), "");
        assert_eq!(rc, 0, "iptables {cmd}: {err}");
    };
    let fails = |cmd: &str, code: i32, words_: &str| {
        let (rc, _, err) = run(v, "iptables", &words(cmd), "");
        assert_eq!(rc, code, "iptables {cmd}: {err}");
        assert!(err.contains(words_), "iptables {cmd}: {err}");
    };
    // Before the ruleset exists its tables are empty, with their builtin chains.
    ok("-Z");
    ok("-Z INPUT");
    fails(
        "-Z NOPE",
        1,
        "iptables: No chain/target/match by that name.",
    );
    fails("-Z INPUT 1", 1, "iptables: Index of counter too big.");
    ok("-w -A INPUT -p tcp --dport 22 -j ACCEPT");
    ok("-I INPUT 1 -i lo -j ACCEPT");
    ok("-N DOCKER");
    fails("-N DOCKER", 1, "iptables: Chain already exists.");
    ok("-A DOCKER -s 10.0.0.0/8 -j DROP");
    ok("-A INPUT -j DOCKER");
    // -C and -D by rule compare canonical forms: `-m tcp` is implied by -p tcp --dport.
    ok("-C INPUT -p tcp -m tcp --dport 22 -j ACCEPT");
    ok("-C INPUT -p tcp --dport 22 -j ACCEPT");
    fails(
        "-C INPUT -p tcp --dport 23 -j ACCEPT",
        1,
        "iptables: Bad rule (does a matching rule exist in that chain?).",
    );
    fails(
        "-A NOPE -j ACCEPT",
        1,
        "No chain/target/match by that name.",
    );
    fails("--bogus-command", 2, "Try `iptables -h'");
    // A restore over vallumd's --max-request-bytes (4 MiB by default) says so, on the local
    // socket (refused from the frame's length) as over gRPC.
    let big = format!(
        "*filter\n{}COMMIT\n",
        "# padding to pass the request limit\n".repeat(130_000)
    );
    let (rc, _, err) = run(v, "iptables-restore", &["--noflush"], &big);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("--max-request-bytes"), "{err}");
    ok("-P FORWARD DROP");
    ok("-R INPUT 2 -p udp --dport 53 -j ACCEPT");
    ok("-t nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE");
    let (_, s, _) = run(v, "iptables", &["-S"], "");
    assert_eq!(
        s,
        "-P INPUT ACCEPT\n-P FORWARD DROP\n-P OUTPUT ACCEPT\n-N DOCKER\n\
         -A INPUT -i lo -j ACCEPT\n-A INPUT -p udp -m udp --dport 53 -j ACCEPT\n-A INPUT -j DOCKER\n\
         -A DOCKER -s 10.0.0.0/8 -j DROP\n"
    );
    ok("-D INPUT -j DOCKER");
    ok("-D INPUT 1");
    ok("-F DOCKER");
    ok("-X DOCKER");
    let (_, s, _) = run(v, "iptables", &["-S", "INPUT"], "");
    assert_eq!(
        s,
        "-P INPUT ACCEPT\n-A INPUT -p udp -m udp --dport 53 -j ACCEPT\n"
    );
    // restore --test changes nothing; --noflush adds; a plain restore replaces the filter
    // table only (nat stays).
    let (rc, _, err) = run(
        v,
        "iptables-restore",
        &["--test"],
        "*filter\n-A INPUT -j DROP\nCOMMIT\n",
    );
    assert_eq!(rc, 0, "{err}");
    let (rc, _, err) = run(
        v,
        "iptables-restore",
        &["--noflush"],
        "*filter\n-A INPUT -s 1.2.3.4 -j DROP\nCOMMIT\n",
    );
    assert_eq!(rc, 0, "{err}");
    let (_, s, _) = run(v, "iptables", &["-S", "INPUT"], "");
    assert!(s.contains("-A INPUT -s 1.2.3.4/32 -j DROP"), "{s}");
    assert!(!s.contains("-A INPUT -j DROP"), "{s}");
    let (rc, _, err) = run(
        v,
        "iptables-restore",
        &[],
        "*filter\n:INPUT ACCEPT [0:0]\n:X - [0:0]\n-A INPUT -j X\nCOMMIT\n",
    );
    assert_eq!(rc, 0, "{err}");
    let (_, s, _) = run(v, "iptables-save", &["-t", "filter"], "");
    let body: Vec<&str> = s.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        body,
        [
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD DROP [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            ":X - [0:0]",
            "-A INPUT -j X",
            "COMMIT"
        ]
    );
    let (_, s, _) = run(v, "iptables-save", &["-t", "nat"], "");
    assert!(
        s.contains("-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE"),
        "{s}"
    );
    // ip6tables writes the IPv6 side of the same ruleset.
    let (rc, _, err) = run(
        v,
        "ip6tables",
        &["-A", "INPUT", "-s", "::1", "-j", "ACCEPT"],
        "",
    );
    assert_eq!(rc, 0, "{err}");
    let (_, s, _) = run(v, "ip6tables-save", &[], "");
    assert!(s.contains("-A INPUT -s ::1/128 -j ACCEPT"), "{s}");
    let (_, s, _) = run(v, "iptables-save", &[], "");
    assert!(!s.contains("::1"), "{s}");
}

/// A Docker-like sequence (bridge network, a published port) and ufw-like chains.
const SCRIPT: &[&str] = &[
    "-t nat -N DOCKER",
    "-t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
    "-t nat -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER",
    "-t nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
    "-t nat -A DOCKER -i docker0 -j RETURN",
    "-t nat -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80",
    "-N DOCKER",
    "-N DOCKER-USER",
    "-A FORWARD -j DOCKER-USER",
    "-A DOCKER-USER -j RETURN",
    "-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    "-A FORWARD -o docker0 -j DOCKER",
    "-A FORWARD -i docker0 ! -o docker0 -j ACCEPT",
    "-A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT",
    "-N ufw-user-input",
    "-A INPUT -j ufw-user-input",
    "-A ufw-user-input -p tcp --dport 22 -j ACCEPT",
    "-I ufw-user-input 1 -p tcp --dport 443 -j ACCEPT",
    "-R ufw-user-input 2 -p tcp --dport 2222 -j ACCEPT",
    "-D ufw-user-input -p tcp --dport 443 -j ACCEPT",
    "-P INPUT DROP",
    "-A INPUT -m state --state ESTABLISHED -j ACCEPT",
    "-D INPUT 2",
];

#[test]
#[ignore = "needs root and iptables-legacy"]
fn same_save_output_as_iptables_legacy() {
    require_legacy();
    let v = vallumd("legacy");
    for cmd in SCRIPT {
        let (rc, _, err) = run(&v, "iptables", &words(cmd), "");
        assert_eq!(rc, 0, "iptables {cmd}: {err}");
    }
    let mut script = String::from("set -e\n");
    for cmd in SCRIPT {
        script.push_str(&format!("iptables-legacy {cmd}\n"));
    }
    for t in ["filter", "nat"] {
        script.push_str(&format!("echo '@@{t}'\niptables-legacy-save -t {t}\n"));
    }
    let out = Command::new("unshare")
        .args(["--net", "sh", "-c", &script])
        .output()
        .expect("unshare");
    if !out.status.success() {
        panic!(
            "iptables-legacy in a netns failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let kernel = String::from_utf8_lossy(&out.stdout).into_owned();
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            // Chain counters differ (the kernel's count packets).
            .map(|l| match l.find(" [") {
                Some(i) if l.starts_with(':') => l[..i].to_owned(),
                _ => l.to_owned(),
            })
            .collect()
    };
    for t in ["filter", "nat"] {
        let want = kernel
            .split(&format!("@@{t}\n"))
            .nth(1)
            .map(|s| s.split("@@").next().unwrap_or(""))
            .unwrap_or("");
        let (_, ours, _) = run(&v, "iptables-save", &["-t", t], "");
        assert_eq!(strip(&ours), strip(want), "table {t}");
    }
}

/// `EditRuleset` applies its edits as one revision, or none when one fails.
/// `name`'s value in vallumd's `/metrics` (a series without labels).
fn metric(v: &Vallumd, name: &str) -> u64 {
    use std::io::Read;
    let mut conn = std::net::TcpStream::connect(&v.metrics).expect("connect to /metrics");
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").expect("ask /metrics");
    let mut body = String::new();
    conn.read_to_string(&mut body).expect("read /metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
        .trim()
        .parse()
        .expect("a number")
}

/// The drop-in's changes ask for `normal` durability by default (docs/operations.md
/// "Durability"): against a vallumd at its default `--sync full`, `iptables -A` and
/// `iptables-restore` commit without an fsync of the store, while `VALLUM_SYNC=full` makes
/// them wait for one, as an API caller does.
#[test]
fn dropin_changes_default_to_normal_durability() {
    let v = vallumd("sync");
    let (writes, fsyncs) = (
        metric(&v, "vallum_store_writes_total"),
        metric(&v, "vallum_store_fsyncs_total"),
    );
    for i in 0..5 {
        let rule = format!("-A INPUT -s 10.9.0.{i} -j DROP");
        let (rc, _, err) = run(&v, "iptables", &words(&rule), "");
        assert_eq!(rc, 0, "iptables {rule}: {err}");
    }
    let restore = "*filter\n-A INPUT -s 10.9.1.0/24 -j DROP\nCOMMIT\n";
    let (rc, _, err) = run(&v, "iptables-restore", &["--noflush"], restore);
    assert_eq!(rc, 0, "iptables-restore: {err}");
    assert!(
        metric(&v, "vallum_store_writes_total") >= writes + 6,
        "the six commits were not written"
    );
    assert_eq!(
        metric(&v, "vallum_store_fsyncs_total"),
        fsyncs,
        "a drop-in change waited for an fsync"
    );
    // VALLUM_SYNC=full: each change is on disk before vallum-iptables exits.
    for i in 0..3 {
        let before = metric(&v, "vallum_store_fsyncs_total");
        let out = Command::new(BIN)
            .arg0("iptables")
            .args(words(&format!("-A INPUT -s 10.9.2.{i} -j DROP")))
            .env("VALLUM_SERVER", &v.url)
            .env("VALLUM_RULESET", "iptables")
            .env("VALLUM_SYNC", "full")
            .env_remove("VALLUM_TOKEN")
            .output()
            .expect("run vallum-iptables");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            metric(&v, "vallum_store_fsyncs_total") > before,
            "VALLUM_SYNC=full answered before an fsync"
        );
    }
    // A value it does not know is refused before anything is sent.
    let out = Command::new(BIN)
        .arg0("iptables")
        .args(["-A", "INPUT", "-j", "DROP"])
        .env("VALLUM_SERVER", &v.url)
        .env("VALLUM_SYNC", "sometimes")
        .output()
        .expect("run vallum-iptables");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("VALLUM_SYNC=sometimes: expected full or normal"),
        "{err}"
    );
}

#[test]
fn edit_ruleset_is_atomic_and_one_revision() {
    use vallum_proto::v1 as pb;
    let v = vallumd("atomic");
    let edit = |args: &str| pb::RuleCommand {
        family: pb::Family::Ipv4 as i32,
        table: "filter".into(),
        args: words(args).into_iter().map(String::from).collect(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = pb::ruleset_service_client::RulesetServiceClient::connect(v.tcp.clone())
            .await
            .expect("connect");
        let req = |edits| pb::EditRulesetRequest {
            ruleset: "iptables".into(),
            edits,
            ..Default::default()
        };
        c.edit_ruleset(req(vec![
            edit("-N A"),
            edit("-A A -j ACCEPT"),
            edit("-A INPUT -j A"),
        ]))
        .await
        .expect("three edits");
        let rs = c
            .get_ruleset(pb::GetRulesetRequest {
                name: "rulesets/iptables".into(),
            })
            .await
            .expect("get")
            .into_inner();
        assert_eq!(rs.latest_revision, 1);
        // The second edit fails: the first is not applied either.
        let e = c
            .edit_ruleset(req(vec![edit("-A INPUT -j DROP"), edit("-D A 5")]))
            .await
            .expect_err("rule 5 does not exist");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        let e = c
            .edit_ruleset(req(vec![edit("-L INPUT")]))
            .await
            .expect_err("-L is no edit");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        let rs2 = c
            .get_ruleset(pb::GetRulesetRequest {
                name: "rulesets/iptables".into(),
            })
            .await
            .expect("get")
            .into_inner();
        assert_eq!(rs2.latest_revision, 1);
    });
    let (_, s, _) = run(&v, "iptables", &["-S"], "");
    assert_eq!(
        s,
        "-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT\n-N A\n-A INPUT -j A\n-A A -j ACCEPT\n"
    );
}

/// Rules with the extensions `-L` prints, as a script's `iptables-restore` input.
const LISTED: &str = "*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
:EMPTY - [0:0]
-A INPUT -i lo -j ACCEPT
-A INPUT -s 10.0.0.0/8 -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -s 1.2.3.4/32 ! -d 5.6.7.0/24 -p udp -m udp --sport 53 --dport 1000:2000 -j DROP
-A INPUT -m state --state RELATED,ESTABLISHED -j ACCEPT
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"hello world\" -j ACCEPT
-A INPUT -p icmp -m icmp --icmp-type 8 -j ACCEPT
-A INPUT -p tcp -m multiport --dports 80,443 -j REJECT --reject-with tcp-reset
-A INPUT -m limit --limit 3/min --limit-burst 5 -j LOG --log-prefix \"x: \"
-A INPUT -m mark --mark 0x1/0xff -j DOCKER
-A INPUT -m addrtype --dst-type LOCAL -j ACCEPT
-A INPUT -j MARK --set-xmark 0x2/0xffffffff
-A INPUT -p icmp -m icmp --icmp-type 3/3 -j ACCEPT
-A INPUT -g DOCKER
-A INPUT
-A FORWARD ! -i eth0 -o eth1 -p tcp -m tcp --tcp-flags SYN,RST,ACK SYN -j RETURN
-A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80
COMMIT
";

/// `-L` (with `-n`, `-v`, `-x`, `--line-numbers`), `-E` and `-Z` print, fail and exit as
/// iptables-legacy does in a private network namespace for the same calls.
#[test]
#[ignore = "needs root and iptables-legacy"]
fn list_rename_zero_as_iptables_legacy() {
    require_legacy();
    let v = vallumd("list");
    let calls: &[&str] = &[
        "-E DOCKER DOCKER2",
        "-E NOPE X",
        "-E INPUT X",
        "-E DOCKER2 EMPTY",
        "-E EMPTY",
        "-L -n",
        "-L -n -v",
        "-L INPUT -n -v -x --line-numbers",
        "-nvL FORWARD",
        "-L NOPE -n",
        "-t nat -L -n",
        "-t nat -L DOCKER -n -v",
        "-Z",
        "-Z INPUT 1",
        "-Z INPUT 99",
        "-Z NOPE",
        "-t nat -Z",
    ];
    let (rc, _, err) = run(&v, "iptables-restore", &[], LISTED);
    assert_eq!(rc, 0, "{err}");
    let mut script = format!("iptables-legacy-restore <<'EOF'\n{LISTED}EOF\n");
    for (i, c) in calls.iter().enumerate() {
        script.push_str(&format!(
            "echo '@@{i}'; iptables-legacy {c} 2>&1; echo \"rc=$?\"\n"
        ));
    }
    let (rc, kernel, err) = in_netns(&script);
    assert_eq!(rc, 0, "{err}");
    for (i, c) in calls.iter().enumerate() {
        let want = kernel
            .split(&format!("@@{i}\n"))
            .nth(1)
            .and_then(|s| s.split("@@").next())
            .unwrap_or("");
        let (code, out, err) = run(&v, "iptables", &words(c), "");
        let (want_out, want_rc) = want.rsplit_once("rc=").unwrap_or((want, ""));
        assert_eq!(code.to_string(), want_rc.trim(), "iptables {c}: {err}");
        if code == 0 {
            let want_out = want_out.replace("iptables-legacy", "iptables");
            assert_eq!(out, want_out, "iptables {c}");
        } else {
            // The kernel tool's first line (ours may add the server's reason after it).
            let first = want_out
                .lines()
                .next()
                .unwrap_or("")
                .replace("(legacy)", "(vallum)");
            assert!(
                err.starts_with(&first),
                "iptables {c}: {err:?}, want {first:?}"
            );
        }
    }
}

/// A call made right after vallumd printed its address waits while it loads its stored
/// rulesets (NOT_READY), as `-w` asks, instead of failing.
#[test]
fn calls_wait_while_vallumd_loads() {
    let dir = std::env::temp_dir().join(format!("vallum-dropin-wait-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let v = spawn_vallumd(dir.clone());
    // A large stored ruleset makes the next start's load take a while.
    let mut text = String::from("*filter\n");
    for i in 0..20000 {
        text.push_str(&format!(
            "-A INPUT -s 10.{}.{}.0/24 -p tcp --dport {} -j ACCEPT\n",
            i / 256 % 256,
            i % 256,
            i % 1000 + 1
        ));
    }
    text.push_str("COMMIT\n");
    let (rc, _, err) = run(&v, "iptables-restore", &["-w", "60"], &text);
    assert_eq!(rc, 0, "{err}");
    let mut v = v;
    let _ = v.child.kill();
    let _ = v.child.wait();
    std::mem::forget(v);
    let v = spawn_vallumd(dir);
    for cmd in ["-w 60 -A INPUT -j DROP", "-C INPUT -j DROP", "-w -S INPUT"] {
        let (rc, out, err) = run(&v, "iptables", &words(cmd), "");
        assert_eq!(rc, 0, "iptables {cmd}: {err}");
        if cmd.contains("-S") {
            assert!(out.ends_with("-A INPUT -j DROP\n"), "{out}");
        }
    }
}

/// iptables-save's text without comments and chain counters (the kernel's count packets).
fn save_body(s: &str) -> Vec<String> {
    s.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.find(" [") {
            Some(i) if l.starts_with(':') => l[..i].to_owned(),
            _ => l.to_owned(),
        })
        .collect()
}

/// The restore cases of iptables' own shell tests (`../shared/data/iptables-tests/
/// restore-cases`, from tests/shell of iptables 1.8.11) that our extensions cover, each on a
/// ruleset of its own: the same `iptables-restore` calls give the same `iptables-save` text as
/// iptables-legacy's in a private network namespace.
#[test]
#[ignore = "needs root, iptables-legacy and ../shared/data"]
fn iptables_shell_restore_cases_as_iptables_legacy() {
    let dir = std::env::var("VALLUM_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
        .join("iptables-tests/restore-cases");
    if !dir.exists() {
        panic!("{} not found", dir.display());
    }
    require_legacy();
    let v = vallumd("cases");
    // (case, [(restore flags, file)], applied in order on an empty ruleset).
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("01", &[("", "01-insert-index.rules")]),
        ("02", &[("", "02-insert-index-interleaved.rules")]),
        ("03", &[("", "03-family-prefix.rules")]),
        (
            "07",
            &[("--noflush", "07-comment-and-empty-line-noflush.rules")],
        ),
        ("08", &[("", "08-dash-F-in-restore.rules")]),
        ("08n", &[("-n", "08-dash-F-in-restore.rules")]),
        ("09", &[("--test", "09-empty-tables.rules")]),
        ("10", &[("", "10-multi-table-user-chains.rules")]),
        (
            "11",
            &[
                ("", "10-multi-table-user-chains.rules"),
                ("--noflush", "11-noflush-F-X-lines.rules"),
            ],
        ),
    ];
    for (case, steps) in cases {
        let ruleset = format!("case{case}");
        let mut script = String::from("set -e\n");
        for (flags, file) in steps.iter() {
            let text = std::fs::read_to_string(dir.join(file)).expect("case file");
            let args: Vec<&str> = flags.split_whitespace().collect();
            let (rc, _, err) = run_on(&v, &ruleset, "iptables-restore", &args, &text);
            assert_eq!(rc, 0, "case {case} {file}: {err}");
            script.push_str(&format!(
                "iptables-legacy-restore {flags} < '{}'\n",
                dir.join(file).display()
            ));
        }
        for t in ["filter", "nat", "raw"] {
            script.push_str(&format!("echo '@@{t}'\niptables-legacy-save -t {t}\n"));
        }
        let (rc, kernel, err) = in_netns(&script);
        assert_eq!(rc, 0, "case {case}: {err}");
        for t in ["filter", "nat", "raw"] {
            let want = kernel
                .split(&format!("@@{t}\n"))
                .nth(1)
                .and_then(|s| s.split("@@").next())
                .unwrap_or("");
            let (_, ours, _) = run_on(&v, &ruleset, "iptables-save", &["-t", t], "");
            // A table the calls never wrote is listed by the kernel once its module is
            // loaded; ours has none: compare the tables both have.
            if ours.is_empty() {
                continue;
            }
            assert_eq!(save_body(&ours), save_body(want), "case {case} table {t}");
        }
    }
}

/// fail2ban's iptables-multiport action (start, ban, check, unban, stop: the commands of
/// action.d/iptables-multiport.conf with `-w`, and its `-n -L` actioncheck), run by `sh` with
/// `iptables` on PATH: vallum-iptables against vallumd, iptables-legacy in a private netns;
/// the same `iptables-save` after every phase.
#[test]
#[ignore = "needs root and iptables-legacy"]
fn fail2ban_action_as_iptables_legacy() {
    require_legacy();
    let v = vallumd("f2b");
    let phases: &[&str] = &[
        "iptables -w -N f2b-sshd\n\
         iptables -w -A f2b-sshd -j RETURN\n\
         iptables -w -I INPUT -p tcp -m multiport --dports 22 -j f2b-sshd",
        "iptables -w -n -L INPUT | grep -q 'f2b-sshd[ \t]'\n\
         iptables -w -C f2b-sshd -s 192.0.2.7 -j REJECT --reject-with icmp-port-unreachable || \
         iptables -w -I f2b-sshd 1 -s 192.0.2.7 -j REJECT --reject-with icmp-port-unreachable\n\
         iptables -w -C f2b-sshd -s 192.0.2.7 -j REJECT --reject-with icmp-port-unreachable || \
         iptables -w -I f2b-sshd 1 -s 192.0.2.7 -j REJECT --reject-with icmp-port-unreachable\n\
         iptables -w -I f2b-sshd 1 -s 198.51.100.9 -j REJECT --reject-with icmp-port-unreachable",
        "iptables -w -D f2b-sshd -s 192.0.2.7 -j REJECT --reject-with icmp-port-unreachable",
        "iptables -w -D INPUT -p tcp -m multiport --dports 22 -j f2b-sshd\n\
         iptables -w -F f2b-sshd\n\
         iptables -w -X f2b-sshd",
    ];
    let ours = same_as_legacy(&v, "f2b", phases, &["filter"]);
    assert!(
        ours[1].contains("-A f2b-sshd -s 198.51.100.9/32 -j REJECT"),
        "{}",
        ours[1]
    );
}

/// Runs each of `phases` (sh, `set -e`) twice with `iptables`, `iptables-save` and
/// `iptables-restore` on PATH: as symlinks to vallum-iptables (argv[0] dispatch) writing
/// ruleset `ruleset` of `v`, and as iptables-legacy's in a private network namespace; after
/// every phase `iptables-save -t T` of each of `tables` is the same (counters and comments
/// aside). Returns our output of each phase (the saves, tables marked `@@PHASE:TABLE`).
fn same_as_legacy(v: &Vallumd, ruleset: &str, phases: &[&str], tables: &[&str]) -> Vec<String> {
    let names = ["iptables", "iptables-save", "iptables-restore"];
    let bin = v.dir.join(format!("bin-{ruleset}"));
    std::fs::create_dir_all(&bin).expect("bin dir");
    for n in names {
        let _ = std::fs::remove_file(bin.join(n));
        std::os::unix::fs::symlink(BIN, bin.join(n)).expect("symlink");
    }
    let kbin = v.dir.join(format!("kbin-{ruleset}"));
    std::fs::create_dir_all(&kbin).expect("kbin dir");
    for n in names {
        let k = n.replacen("iptables", "iptables-legacy", 1);
        let _ = std::fs::remove_file(kbin.join(n));
        let path = Command::new("sh")
            .args(["-c", &format!("command -v {k}")])
            .output()
            .expect("which");
        let path = String::from_utf8_lossy(&path.stdout).trim().to_owned();
        std::os::unix::fs::symlink(path, kbin.join(n)).expect("symlink");
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let save = |i: usize| -> String {
        tables
            .iter()
            .map(|t| format!("echo '@@{i}:{t}'\niptables-save -t {t}\n"))
            .collect()
    };
    let mut kscript = format!("set -e\nexport PATH={}:{path}\n", kbin.display());
    let mut ours = Vec::new();
    for (i, p) in phases.iter().enumerate() {
        let out = Command::new("sh")
            .args(["-ec", &format!("{p}\n{}", save(i))])
            .env("PATH", format!("{}:{path}", bin.display()))
            .env("VALLUM_SERVER", &v.url)
            .env("VALLUM_RULESET", ruleset)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{ruleset} phase {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ours.push(String::from_utf8_lossy(&out.stdout).into_owned());
        kscript.push_str(&format!("{p}\n{}", save(i)));
    }
    let (rc, kernel, err) = in_netns(&kscript);
    assert_eq!(rc, 0, "{ruleset} with iptables-legacy: {err}");
    let part = |text: &str, i: usize, t: &str| -> String {
        text.split(&format!("@@{i}:{t}\n"))
            .nth(1)
            .and_then(|s| s.split("@@").next())
            .unwrap_or("")
            .to_owned()
    };
    for (i, o) in ours.iter().enumerate() {
        for t in tables {
            assert_eq!(
                save_body(&part(o, i, t)),
                save_body(&part(&kernel, i, t)),
                "{ruleset} phase {i} table {t}"
            );
        }
    }
    ours
}

/// The iptables calls dockerd 28 makes for the default bridge network (`docker0`,
/// 172.17.0.0/16) and one container (172.17.0.2) published with `-p 8080:80`, written from
/// Docker's documented rules and its bridge driver's argument lists (moby
/// `libnetwork/drivers/bridge/setup_ip_tables_linux.go`, `libnetwork/iptables`): `--wait`
/// first, `-n -L CHAIN` before `-N`, `-C || -A/-I` for every rule, the jump rules deleted and
/// inserted again at the top (ensureJumpRule), options in Docker's order (`-d 0/0`, `! -i
/// docker0` after the DNAT target's own option, `! --dst 127.0.0.0/8` after `-j DOCKER`);
/// chains DOCKER, DOCKER-USER, DOCKER-FORWARD, DOCKER-ISOLATION-STAGE-1/2 (filter), DOCKER and
/// MASQUERADE (nat), the direct-routing guard (raw). Phases: daemon start with the network,
/// container start (port published), container stop (its rules deleted). Each phase gives the
/// same `iptables-save` of filter, nat and raw as iptables-legacy.
#[test]
#[ignore = "needs root and iptables-legacy"]
fn docker_bridge_and_published_port_as_iptables_legacy() {
    require_legacy();
    let v = vallumd("docker");
    // One rule as dockerd programs it: `-C` first, then `-A`/`-I` when it is missing.
    fn ensure(table: &str, op: &str, chain: &str, rule: &str) -> String {
        format!(
            "iptables --wait -t {table} -C {chain} {rule} 2>/dev/null || \
             iptables --wait -t {table} {op} {chain} {rule}\n"
        )
    }
    fn chain(table: &str, name: &str) -> String {
        format!(
            "iptables --wait -t {table} -n -L {name} >/dev/null 2>&1 || \
             iptables --wait -t {table} -N {name}\n"
        )
    }
    fn jump(from: &str, to: &str) -> String {
        format!(
            "if iptables --wait -t filter -C {from} -j {to} 2>/dev/null; then \
             iptables --wait -t filter -D {from} -j {to}; fi\n\
             iptables --wait -t filter -I {from} -j {to}\n"
        )
    }
    let mut daemon = String::new();
    daemon += &chain("nat", "DOCKER");
    for c in [
        "DOCKER",
        "DOCKER-FORWARD",
        "DOCKER-ISOLATION-STAGE-1",
        "DOCKER-ISOLATION-STAGE-2",
        "DOCKER-USER",
    ] {
        daemon += &chain("filter", c);
    }
    daemon += &ensure(
        "nat",
        "-A",
        "PREROUTING",
        "-m addrtype --dst-type LOCAL -j DOCKER",
    );
    daemon += &ensure(
        "nat",
        "-A",
        "OUTPUT",
        "-m addrtype --dst-type LOCAL -j DOCKER ! --dst 127.0.0.0/8",
    );
    // The bridge network.
    daemon += &ensure(
        "nat",
        "-I",
        "POSTROUTING",
        "-s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
    );
    daemon += &ensure("nat", "-I", "DOCKER", "-i docker0 -j RETURN");
    daemon += &ensure("filter", "-A", "DOCKER-FORWARD", "-o docker0 -j DOCKER");
    daemon += &ensure(
        "filter",
        "-A",
        "DOCKER-FORWARD",
        "-o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    );
    daemon += &ensure("filter", "-A", "DOCKER-FORWARD", "-i docker0 -j ACCEPT");
    daemon += &ensure(
        "filter",
        "-I",
        "DOCKER-ISOLATION-STAGE-1",
        "-i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2",
    );
    daemon += &ensure(
        "filter",
        "-I",
        "DOCKER-ISOLATION-STAGE-2",
        "-o docker0 -j DROP",
    );
    daemon += &ensure(
        "filter",
        "-I",
        "DOCKER-FORWARD",
        "-j DOCKER-ISOLATION-STAGE-1",
    );
    daemon += &ensure("filter", "-A", "DOCKER", "! -i docker0 -o docker0 -j DROP");
    daemon += &jump("FORWARD", "DOCKER-FORWARD");
    daemon += &jump("FORWARD", "DOCKER-USER");
    daemon += "iptables --wait -t filter -P FORWARD DROP\n";
    // The container's published port, then its removal (the same rules with -D).
    let port_rules = [
        (
            "nat",
            "-A",
            "DOCKER",
            "-p tcp -d 0/0 --dport 8080 -j DNAT --to-destination 172.17.0.2:80 ! -i docker0",
        ),
        (
            "filter",
            "-I",
            "DOCKER",
            "! -i docker0 -o docker0 -p tcp -d 172.17.0.2 --dport 80 -j ACCEPT",
        ),
        (
            "nat",
            "-A",
            "POSTROUTING",
            "-p tcp -s 172.17.0.2 -d 172.17.0.2 --dport 80 -j MASQUERADE",
        ),
        (
            "raw",
            "-A",
            "PREROUTING",
            "-p tcp -d 172.17.0.2 --dport 80 ! -i docker0 -j DROP",
        ),
    ];
    let start: String = port_rules
        .iter()
        .map(|(t, op, c, r)| ensure(t, op, c, r))
        .collect();
    let stop: String = port_rules
        .iter()
        .map(|(t, _, c, r)| format!("iptables --wait -t {t} -D {c} {r}\n"))
        .collect();
    let ours = same_as_legacy(
        &v,
        "docker",
        &[&daemon, &start, &stop],
        &["filter", "nat", "raw"],
    );
    // Not an empty comparison: the published port's rules are there after the start.
    for rule in [
        "-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80",
        "-A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT",
        "-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER",
        "-A PREROUTING -d 172.17.0.2/32 ! -i docker0 -p tcp -m tcp --dport 80 -j DROP",
        "-A FORWARD -j DOCKER-USER",
    ] {
        assert!(ours[1].contains(rule), "{rule}: {}", ours[1]);
    }
}

/// ufw from the Debian package (`ufw --force enable`, `ufw allow 22/tcp`, `ufw limit ssh`),
/// which runs `/usr/sbin/iptables*` and `ip6tables*` by full path with its own restore files:
/// in a private mount and network namespace those paths are bind mounts of vallum-iptables
/// (with a vallumd of its own inside the namespace, ruleset `ufw`), or of iptables-legacy's
/// multi-call binary; ufw's configuration is a copy, so the host's is never touched. Both give
/// the same `iptables-save` and `ip6tables-save` of the filter table. Needs ufw, root,
/// iptables-legacy and unshare.
#[test]
#[ignore = "needs root, iptables-legacy and ufw"]
fn ufw_enable_allow_limit_as_iptables_legacy() {
    require_legacy();
    let ufw = std::path::Path::new("/usr/sbin/ufw");
    let legacy = Command::new("sh")
        .args(["-c", "command -v xtables-legacy-multi"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    if !ufw.exists() || !std::path::Path::new("/etc/ufw/before.rules").exists() {
        panic!("ufw is not installed (apt-get install ufw)");
    }
    if legacy.is_empty() {
        panic!("xtables-legacy-multi not found");
    }
    let vallumd = vallumd_exe();
    let names =
        "iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore";
    let side = |tag: &str, binary: &str, start: &str| -> String {
        let dir = std::env::temp_dir().join(format!("vallum-ufw-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let d = dir.display();
        let copy = Command::new("sh")
            .args([
                "-ec",
                &format!("cp -a /etc/ufw {d}/etc-ufw; cp /etc/default/ufw {d}/default-ufw"),
            ])
            .status()
            .expect("cp");
        assert!(copy.success(), "copy ufw's configuration");
        let script = format!(
            "set -e\nip link set lo up\n\
             mount --bind {d}/etc-ufw /etc/ufw\n\
             mount --bind {d}/default-ufw /etc/default/ufw\n\
             for n in {names}; do mount --bind {binary} /usr/sbin/$n; done\n\
             {start}\n\
             ufw --force enable >/dev/null\n\
             ufw allow 22/tcp >/dev/null\n\
             ufw limit ssh >/dev/null\n\
             echo '@@v4'; iptables-save -t filter\n\
             echo '@@v6'; ip6tables-save -t filter\n"
        );
        let out = Command::new("unshare")
            .args(["--mount", "--net", "sh", "-c", &script])
            .env("VALLUM_SERVER", "http://127.0.0.1:50051")
            .env("VALLUM_RULESET", "ufw")
            .env_remove("VALLUM_TOKEN")
            .output()
            .expect("unshare");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "ufw with {tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Ours: vallumd inside the namespace (its loopback is the namespace's), killed with it;
    // `-w 60` waits until it serves.
    let ours = side(
        "ours",
        BIN,
        &format!(
            "{} --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:0 --cores 1 \
             --insecure-no-auth --socket none \
             --db \"$(mktemp -d)/v.db\" >/dev/null 2>&1 &\n\
             trap 'kill $!' EXIT\n\
             iptables -w 60 -S >/dev/null",
            vallumd.display()
        ),
    );
    let kernel = side("legacy", &legacy, ":");
    let part = |text: &str, m: &str| -> Vec<String> {
        save_body(
            text.split(&format!("@@{m}\n"))
                .nth(1)
                .and_then(|s| s.split("@@").next())
                .unwrap_or(""),
        )
    };
    for m in ["v4", "v6"] {
        assert_eq!(part(&ours, m), part(&kernel, m), "ufw {m}");
    }
    let v4 = part(&ours, "v4").join("\n");
    assert!(
        v4.contains("-A ufw-user-input -p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -m recent --update --seconds 30 --hitcount 6"),
        "ufw limit ssh is there: {v4}"
    );
}
