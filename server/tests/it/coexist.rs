//! Coexistence with the kernel's own rules (root, iptables-legacy and nfnetlink_queue; ignored
//! unless asked for, and failing without them): namespaces B -- A -- C joined by veth pairs, A routing between B and C. In
//! A, kernel rules as ufw and Docker write them (INPUT -> ufw-before-input -> ufw-user-input
//! with a DROP for UDP port [`UFW_DROP`]; FORWARD -> DOCKER-USER with a DROP for UDP port
//! [`DOCKER_DROP`]; a mangle PREROUTING rule that sets a user mark [`USER_MARK`]), then the
//! steering of `vallumctl dataplane install --mode MODE`, which goes above them, and
//! `vallumd --source nfqueue --nfqueue-mode MODE` with a ruleset that accepts UDP but drops
//! [`OUR_DROP_IN`] (INPUT) and [`OUR_DROP_FWD`] (FORWARD).
//!
//! From B, real UDP datagrams to echo servers in A (INPUT) and C (FORWARD); each mode checks:
//! - a port nobody drops answers;
//! - our DROP drops in both modes (and vallumd's DROP rule counts it);
//! - `final`: the ufw and DOCKER-USER drops do not happen for packets we accept (the kernel's
//!   DROP rules count 0 packets);
//! - `continue`: they do (each counts every probe), the packets having passed our ACCEPT
//!   (vallumd's counters) first; the user's mark survives next to our bit (a kernel rule after
//!   the jump matching the mark `USER_MARK | bit` counts every accepted probe).
//!
//! The test thread never changes namespace; pieces that live in A, B or C run on threads that
//! `setns(2)` first.

use crate::support;
use crate::support::netns;

use std::net::{Ipv4Addr, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use netns::{in_netns, nsx, nsx_in, on_path, sh};
use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 241, 0, 1);
const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 241, 0, 2);
const AC_ADDR: Ipv4Addr = Ipv4Addr::new(10, 242, 0, 1);
const C_ADDR: Ipv4Addr = Ipv4Addr::new(10, 242, 0, 2);
/// UDP ports in A (INPUT): open, dropped by the ufw-style chain, dropped by our ruleset.
const OPEN_IN: u16 = 7101;
const UFW_DROP: u16 = 7102;
const OUR_DROP_IN: u16 = 7103;
/// UDP ports in C (FORWARD through A): open, dropped by DOCKER-USER, dropped by us.
const OPEN_FWD: u16 = 7201;
const DOCKER_DROP: u16 = 7202;
const OUR_DROP_FWD: u16 = 7203;
/// The mark a kernel mangle rule sets on everything from B (a user's mark).
const USER_MARK: u32 = 0x4001;
/// The continue bit (vallumd's and vallumctl's default).
const BIT: u32 = 0x4000_0000;
/// Datagrams per port and mode.
const PROBES: u64 = 3;

/// vallumd's ruleset: UDP accepted except one port per chain.
fn ours() -> String {
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p udp -m udp --dport {OUR_DROP_IN} -j DROP\n\
         -A INPUT -p udp -j ACCEPT\n\
         -A FORWARD -p udp -m udp --dport {OUR_DROP_FWD} -j DROP\n\
         -A FORWARD -p udp -j ACCEPT\nCOMMIT\n"
    )
}

/// The kernel's own rules in A, as ufw and Docker write them (iptables-legacy-restore input).
fn kernel_rules(veth_from_b: &str) -> String {
    format!(
        "*mangle\n-A PREROUTING -i {veth_from_b} -j MARK --or-mark {USER_MARK:#x}\nCOMMIT\n\
         *filter\n:ufw-before-input - [0:0]\n:ufw-user-input - [0:0]\n:DOCKER-USER - [0:0]\n\
         -A INPUT -j ufw-before-input\n\
         -A ufw-before-input -p udp -m mark --mark {:#x} -m comment --comment both-marks\n\
         -A ufw-before-input -j ufw-user-input\n\
         -A ufw-user-input -p udp -m udp --dport {UFW_DROP} -j DROP\n\
         -A FORWARD -j DOCKER-USER\n\
         -A DOCKER-USER -p udp -m udp --dport {DOCKER_DROP} -j DROP\n\
         -A DOCKER-USER -j RETURN\nCOMMIT\n",
        USER_MARK | BIT
    )
}

// === prerequisites ===

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces, iptables and NFQUEUE need it)".into());
    }
    for tool in [
        "ip",
        "iptables-legacy",
        "iptables-legacy-restore",
        "iptables-legacy-save",
    ] {
        if !on_path(tool) {
            return Some(format!("`{tool}` is not on PATH"));
        }
    }
    let _ = Command::new("modprobe").arg("nfnetlink_queue").output();
    if !Path::new("/proc/net/netfilter/nfnetlink_queue").exists() {
        return Some("the nfnetlink_queue kernel module is not available".into());
    }
    None
}

// === namespaces ===

/// B -- A -- C; deleted on drop (also on panic), with every rule in them.
struct Topology {
    a: String,
    b: String,
    c: String,
    /// A's end of the veth to B.
    a_from_b: String,
}

impl Topology {
    fn new() -> Result<Topology, String> {
        let id = std::process::id() % 100_000;
        let t = Topology {
            a: format!("vcx-a-{id}"),
            b: format!("vcx-b-{id}"),
            c: format!("vcx-c-{id}"),
            a_from_b: format!("vxab{id}"),
        };
        sh(&["ip", "netns", "add", &t.a])?;
        sh(&["ip", "netns", "add", &t.b])?;
        sh(&["ip", "netns", "add", &t.c])?;
        let (ab, ba, ac, ca) = (
            t.a_from_b.clone(),
            format!("vxba{id}"),
            format!("vxac{id}"),
            format!("vxca{id}"),
        );
        sh(&[
            "ip", "-n", &t.a, "link", "add", &ab, "type", "veth", "peer", "name", &ba, "netns",
            &t.b,
        ])?;
        sh(&[
            "ip", "-n", &t.a, "link", "add", &ac, "type", "veth", "peer", "name", &ca, "netns",
            &t.c,
        ])?;
        for (n, dev, addr) in [
            (&t.a, &ab, A_ADDR),
            (&t.b, &ba, B_ADDR),
            (&t.a, &ac, AC_ADDR),
            (&t.c, &ca, C_ADDR),
        ] {
            sh(&[
                "ip",
                "-n",
                n,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                dev,
            ])?;
            sh(&["ip", "-n", n, "link", "set", dev, "up"])?;
            sh(&["ip", "-n", n, "link", "set", "lo", "up"])?;
        }
        sh(&[
            "ip",
            "-n",
            &t.b,
            "route",
            "add",
            "10.242.0.0/24",
            "via",
            &A_ADDR.to_string(),
        ])?;
        sh(&[
            "ip",
            "-n",
            &t.c,
            "route",
            "add",
            "10.241.0.0/24",
            "via",
            &AC_ADDR.to_string(),
        ])?;
        nsx(
            &t.a,
            &["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
        )?;
        Ok(t)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for n in [&self.a, &self.b, &self.c] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// UDP echo servers on `ports` of `addr` in namespace `ns` (threads that live until the
/// namespace goes: their sockets are bound there).
fn udp_echo(ns: &str, addr: Ipv4Addr, ports: &[u16]) {
    let ports = ports.to_vec();
    in_netns(ns, move || {
        for port in ports {
            let s = UdpSocket::bind((addr, port)).expect("bind udp echo");
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while let Ok((n, from)) = s.recv_from(&mut buf) {
                    let _ = s.send_to(&buf[..n], from);
                }
            });
        }
    });
}

/// How many of [`PROBES`] datagrams from B to `to:port` were echoed back (each waits up to
/// `wait` for its echo).
fn echoed(b: &str, to: Ipv4Addr, port: u16, wait: Duration) -> u64 {
    in_netns(b, move || {
        let s = UdpSocket::bind((B_ADDR, 0)).expect("bind");
        s.set_read_timeout(Some(wait)).expect("timeout");
        let mut got = 0;
        for i in 0..PROBES {
            let msg = format!("vallum-coexist-{port}-{i}");
            s.send_to(msg.as_bytes(), (to, port)).expect("send");
            let mut buf = [0u8; 64];
            // A late echo of an earlier probe is not this one's: match the payload.
            while let Ok((n, _)) = s.recv_from(&mut buf) {
                if &buf[..n] == msg.as_bytes() {
                    got += 1;
                    break;
                }
            }
        }
        got
    })
}

/// The kernel's packet counter of the filter rule in `chain` whose `iptables-save` line
/// contains `needle`.
fn kernel_count(a: &str, chain: &str, needle: &str) -> u64 {
    let save = nsx(a, &["iptables-legacy-save", "-c", "-t", "filter"]).expect("iptables-save");
    let line = save
        .lines()
        .find(|l| l.contains(&format!("-A {chain} ")) && l.contains(needle))
        .unwrap_or_else(|| panic!("no {chain} rule with {needle:?} in:\n{save}"));
    // `[PACKETS:BYTES] -A ...`
    line.strip_prefix('[')
        .and_then(|l| l.split(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {line:?}"))
}

/// vallumd's packet counter of rule `rule` of `chain` (IPv4) in ruleset `coexist`.
async fn our_count(d: &Daemon, chain: &str, rule: u32) -> u64 {
    let mut counters = pb::counter_service_client::CounterServiceClient::new(d.channel().await);
    let c = counters
        .get_counters(pb::GetCountersRequest {
            ruleset: "coexist".into(),
            ..Default::default()
        })
        .await
        .expect("counters")
        .into_inner();
    c.counters
        .iter()
        .find(|c| c.chain == chain && c.rule == rule && c.family == pb::Family::Ipv4 as i32)
        .map_or(0, |c| c.packets)
}

/// Polls vallumd's counter until it reaches `want` (counters are published after the batch's
/// verdicts); its last value after a bounded number of polls.
async fn our_count_reaching(d: &Daemon, chain: &str, rule: u32, want: u64) -> u64 {
    let mut last = 0;
    for _ in 0..100 {
        last = our_count(d, chain, rule).await;
        if last >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last
}

/// What one mode did: echoed datagrams per port, and the counters afterwards.
#[derive(Debug, Default)]
struct Seen {
    open_in: u64,
    ufw: u64,
    ours_in: u64,
    open_fwd: u64,
    docker: u64,
    ours_fwd: u64,
    /// Kernel: ufw-user-input's DROP, DOCKER-USER's DROP, the mark-matching counter rule.
    k_ufw_drop: u64,
    k_docker_drop: u64,
    k_both_marks: u64,
    /// vallumd: INPUT rule 1 (our DROP) and 2 (ACCEPT), FORWARD rule 1 and 2.
    v_in_drop: u64,
    v_in_accept: u64,
    v_fwd_drop: u64,
    v_fwd_accept: u64,
}

/// Steering and vallumd in `mode`, the probes, the counters read back from both sides.
fn run_mode(t: &Topology, db: &Path, mode: &str) -> Seen {
    let installed = nsx(
        &t.a,
        &[
            support::vallumctl().to_str().expect("a UTF-8 path"),
            "dataplane",
            "install",
            "--iptables",
            "iptables-legacy",
            "--family",
            "ipv4",
            "--queues",
            "2",
            "--mode",
            mode,
        ],
    )
    .unwrap_or_else(|e| panic!("install --mode {mode}: {e}"));
    assert!(installed.contains(&format!("mode {mode}")), "{installed}");
    nsx(&t.a, &["iptables-legacy", "-Z"]).expect("zero kernel counters");
    let (a, b, db, mode) = (t.a.clone(), t.b.clone(), db.to_owned(), mode.to_owned());
    in_netns(&a.clone(), move || {
        let d = Daemon::start(&db, &["--source", "nfqueue", "--nfqueue-mode", &mode]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            d.wait_serving().await;
            d.rulesets()
                .await
                .apply(pb::ApplyRequest {
                    ruleset: "coexist".into(),
                    source: Some(text_source(&ours(), false, "coexist.rules")),
                    ..Default::default()
                })
                .await
                .expect("apply");
            // Counters from this run only (the ruleset is the previous run's, restored).
            pb::counter_service_client::CounterServiceClient::new(d.channel().await)
                .zero_counters(pb::ZeroCountersRequest {
                    ruleset: "coexist".into(),
                    ..Default::default()
                })
                .await
                .expect("zero");
            let (pass, block) = (Duration::from_secs(2), Duration::from_millis(700));
            let mut s = Seen {
                open_in: echoed(&b, A_ADDR, OPEN_IN, pass),
                ufw: echoed(&b, A_ADDR, UFW_DROP, block),
                ours_in: echoed(&b, A_ADDR, OUR_DROP_IN, block),
                open_fwd: echoed(&b, C_ADDR, OPEN_FWD, pass),
                docker: echoed(&b, C_ADDR, DOCKER_DROP, block),
                ours_fwd: echoed(&b, C_ADDR, OUR_DROP_FWD, block),
                ..Seen::default()
            };
            s.v_in_drop = our_count_reaching(&d, "INPUT", 1, PROBES).await;
            s.v_in_accept = our_count_reaching(&d, "INPUT", 2, 2 * PROBES).await;
            s.v_fwd_drop = our_count_reaching(&d, "FORWARD", 1, PROBES).await;
            // The open port's requests and replies, and the DOCKER-USER port's requests.
            s.v_fwd_accept = our_count_reaching(&d, "FORWARD", 2, 3 * PROBES).await;
            s.k_ufw_drop = kernel_count(&a, "ufw-user-input", &format!("--dport {UFW_DROP}"));
            s.k_docker_drop = kernel_count(&a, "DOCKER-USER", &format!("--dport {DOCKER_DROP}"));
            s.k_both_marks = kernel_count(&a, "ufw-before-input", "both-marks");
            s
        })
    })
}

#[test]
#[ignore = "needs root, iptables-legacy and nfnetlink_queue"]
fn coexistence_modes_with_ufw_and_docker_rules() {
    if let Some(why) = skip_reason() {
        panic!("coexistence_modes_with_ufw_and_docker_rules: {why}");
    }
    let t = match Topology::new() {
        Ok(t) => t,
        Err(why) => {
            panic!("coexistence_modes_with_ufw_and_docker_rules: {why}");
        }
    };
    if let Err(why) = nsx_in(
        &t.a,
        &["iptables-legacy-restore", "--noflush"],
        &kernel_rules(&t.a_from_b),
    ) {
        panic!("coexistence_modes_with_ufw_and_docker_rules: kernel rules cannot be loaded: {why}");
    }
    udp_echo(&t.a, A_ADDR, &[OPEN_IN, UFW_DROP, OUR_DROP_IN]);
    udp_echo(&t.c, C_ADDR, &[OPEN_FWD, DOCKER_DROP, OUR_DROP_FWD]);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");

    // The steering goes above the kernel's rules in both modes.
    let fin = run_mode(&t, &db, "final");
    let input = nsx(&t.a, &["iptables-legacy", "-S", "INPUT"]).expect("iptables -S");
    assert!(
        input.find("-j VALLUM-NFQUEUE") < input.find("-j ufw-before-input"),
        "{input}"
    );
    let n = PROBES;
    // final: our ACCEPT is the host's; the kernel's drops after the jump never see them.
    assert_eq!(
        (fin.open_in, fin.ufw, fin.ours_in),
        (n, n, 0),
        "final INPUT: {fin:?}"
    );
    assert_eq!(
        (fin.open_fwd, fin.docker, fin.ours_fwd),
        (n, n, 0),
        "final FORWARD: {fin:?}"
    );
    assert_eq!(
        (fin.k_ufw_drop, fin.k_docker_drop, fin.k_both_marks),
        (0, 0, 0),
        "{fin:?}"
    );
    assert_eq!(
        (fin.v_in_drop, fin.v_fwd_drop),
        (n, n),
        "our DROPs counted: {fin:?}"
    );
    assert!(
        fin.v_in_accept >= 2 * n && fin.v_fwd_accept >= 3 * n,
        "{fin:?}"
    );

    let cont = run_mode(&t, &db, "continue");
    let chain = nsx(&t.a, &["iptables-legacy", "-S", "VALLUM-NFQUEUE"]).expect("iptables -S");
    assert!(
        chain.contains("-A VALLUM-NFQUEUE -m mark --mark 0x40000000/0x40000000 -j RETURN"),
        "{chain}"
    );
    // continue: the packets we accept go on to the kernel's rules, whose DROPs drop them.
    assert_eq!(
        (cont.open_in, cont.ufw, cont.ours_in),
        (n, 0, 0),
        "continue INPUT: {cont:?}"
    );
    assert_eq!(
        (cont.open_fwd, cont.docker, cont.ours_fwd),
        (n, 0, 0),
        "continue FORWARD: {cont:?}"
    );
    assert_eq!(
        (cont.k_ufw_drop, cont.k_docker_drop),
        (n, n),
        "kernel DROPs: {cont:?}"
    );
    // Every accepted INPUT datagram reached the kernel's rules with the user's mark and our
    // bit; the ones our DROP dropped never did.
    assert_eq!(cont.k_both_marks, 2 * n, "marks: {cont:?}");
    assert_eq!(
        (cont.v_in_drop, cont.v_fwd_drop),
        (n, n),
        "our DROPs counted: {cont:?}"
    );
    assert!(
        cont.v_in_accept >= 2 * n && cont.v_fwd_accept >= 3 * n,
        "{cont:?}"
    );

    nsx(
        &t.a,
        &[
            support::vallumctl().to_str().expect("a UTF-8 path"),
            "dataplane",
            "uninstall",
            "--iptables",
            "iptables-legacy",
            "--family",
            "ipv4",
        ],
    )
    .expect("uninstall");
    let save = nsx(&t.a, &["iptables-legacy-save"]).expect("save");
    assert!(!save.contains("VALLUM"), "{save}");
    assert!(
        save.contains("-A ufw-user-input"),
        "the kernel's rules stay: {save}"
    );
    drop(t);
}

// === the systemd units (no root needed) ===

/// The value of `NAME="..."` in an environment file.
fn env_value(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no {name}= in:\n{text}"))
}

/// deploy/systemd: the steering unit runs `vallumctl dataplane install $VALLUM_STEERING_ARGS`
/// and the vallumd unit `vallumd ... $VALLUMD_ARGS` (from /usr/local/bin, where deploy/install.sh
/// puts them); the shipped defaults parse with each program's own parser and agree (queues =
/// cores, the same mode), the shipped steering never queues SSH (22) nor vallumd's own gRPC and
/// metrics ports (so no ruleset locks the operator out), and neither does `dataplane install`
/// without `--exempt-tcp-ports`. `systemd-analyze verify` of the installed units:
/// server/tests/it/install.rs.
#[test]
fn systemd_units_parse_and_agree() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd");
    let read =
        |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let steering = read("vallum-steering.service");
    let daemon = read("vallumd.service");
    assert!(
        steering
            .contains("ExecStart=/usr/local/bin/vallumctl dataplane install $VALLUM_STEERING_ARGS"),
        "{steering}"
    );
    assert!(steering.contains("Before=network-pre.target"), "{steering}");
    assert!(
        steering.contains("VALLUM_STEERING_UNINSTALL_ON_STOP"),
        "{steering}"
    );
    let exec = daemon
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/local/bin/vallumd "))
        .expect("vallumd ExecStart");
    let steer_args = env_value(&read("vallum-steering.default"), "VALLUM_STEERING_ARGS");
    let daemon_args = env_value(&read("vallumd.default"), "VALLUMD_ARGS");

    let mut args = vec!["vallumd"];
    args.extend(exec.split_whitespace().filter(|w| *w != "$VALLUMD_ARGS"));
    args.extend(daemon_args.split_whitespace());
    let config =
        vallum_server::Config::from_args(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));

    let mut install = vec!["dataplane", "install", "--dry-run", "-o", "json"];
    install.extend(steer_args.split_whitespace());
    let out = Command::new(support::vallumctl())
        .args(&install)
        .output()
        .expect("vallumctl");
    assert!(out.status.success(), "{install:?}: {out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let v4 = &report["installed"][0];
    assert_eq!(
        v4["queue_count"].as_u64(),
        Some(config.cores as u64),
        "{report}"
    );
    assert_eq!(
        v4["reject_mark"].as_u64(),
        Some(u64::from(config.nfqueue_reject_mark)),
        "the steering's REJECT rules key on vallumd's reject mark: {report}"
    );
    let mode = v4["mode"].as_str().unwrap_or_default();
    match config.nfqueue_accept() {
        vallum_server::config::NfqueueAccept::Final => assert_eq!(mode, "final"),
        vallum_server::config::NfqueueAccept::Continue { mark } => {
            assert_eq!(mode, "continue");
            assert_eq!(
                v4["continue_mark"].as_u64(),
                Some(u64::from(mark)),
                "{report}"
            );
        }
    }
    // No lockout: SSH and vallumd's own ports are exempt in the shipped steering, and in
    // `dataplane install`'s default.
    let own = [
        22,
        u64::from(config.listen.port()),
        u64::from(config.metrics.metrics_listen.port()),
    ];
    let exempt = |report: &serde_json::Value| -> Vec<u64> {
        report["installed"]
            .as_array()
            .expect("installed")
            .iter()
            .flat_map(|f| {
                f["exempt_tcp_ports"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|p| p.as_u64())
            .collect()
    };
    let shipped = exempt(&report);
    for port in own {
        assert!(
            shipped.iter().filter(|&&p| p == port).count() == 2,
            "the shipped steering ({steer_args}) queues TCP {port} in a family: {report}"
        );
    }
    let out = Command::new(support::vallumctl())
        .args(["dataplane", "install", "--dry-run", "-o", "json"])
        .output()
        .expect("vallumctl");
    assert!(out.status.success(), "{out:?}");
    let bare: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for port in own {
        assert!(
            exempt(&bare).contains(&port),
            "`dataplane install` queues TCP {port} by default: {bare}"
        );
    }
}

/// `systemd-analyze verify` of deploy/systemd finds nothing but the binaries' absence.
#[test]
#[ignore = "needs systemd-analyze (Debian systemd)"]
fn systemd_units_pass_systemd_analyze() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.join("vallum-steering.service"))
        .arg(dir.join("vallumd.service"))
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .expect("systemd-analyze (Debian systemd)");
    let err = String::from_utf8_lossy(&out.stderr);
    let other: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains("is not executable") && !l.trim().is_empty())
        .collect();
    assert!(other.is_empty(), "systemd-analyze verify: {err}");
}

// === the documented first run ===

/// docs/operations.md "A safe first NFQUEUE run": the snippet itself, run with `sh -e` inside a
/// network namespace of this test's own (the snippet's "host" side), with vallumd and
/// vallumctl on PATH and its names and /tmp paths made unique; its pings must be answered
/// and `vallumctl counters` must show the icmp rule with 3 packets.
#[test]
#[ignore = "needs root, iptables-legacy, nfnetlink_queue and ping"]
fn documented_first_run_works() {
    if let Some(why) = skip_reason() {
        panic!("documented_first_run_works: {why}");
    }
    if !on_path("ping") {
        panic!("documented_first_run_works: `ping` is not on PATH");
    }
    let ops = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .expect("operations.md");
    let section = ops
        .split("### A safe first NFQUEUE run")
        .nth(1)
        .expect("the section");
    let snippet = section
        .split("```sh\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("its sh block");
    let id = std::process::id();
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = format!("{}/", dir.path().display());
    let script = snippet
        .replace("vallum-try", &format!("vallum-try-{id}"))
        .replace("/tmp/", &tmp);
    let outer = format!("vallum-first-{id}");
    if let Err(why) = sh(&["ip", "netns", "add", &outer]) {
        panic!("documented_first_run_works: {why}");
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_vallumd"))
        .parent()
        .expect("bin dir")
        .to_owned();
    let ctl = support::vallumctl()
        .parent()
        .expect("vallumctl dir")
        .to_owned();
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        ctl.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("ip")
        .args(["netns", "exec", &outer, "sh", "-ec", &script])
        .env("PATH", path)
        .env_remove("VALLUM_SERVER")
        .output()
        .expect("run the snippet");
    let _ = sh(&["ip", "netns", "del", &format!("vallum-try-{id}")]);
    let _ = sh(&["ip", "netns", "del", &outer]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the snippet failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("3 packets transmitted, 3 received"),
        "{stdout}"
    );
    let counted = stdout
        .lines()
        .find(|l| l.contains("icmp") && l.contains("ACCEPT"))
        .unwrap_or_else(|| panic!("no icmp rule in the counters:\n{stdout}"));
    assert_eq!(counted.split_whitespace().next(), Some("3"), "{counted}");
}
