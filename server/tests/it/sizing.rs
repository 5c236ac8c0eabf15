//! The numbers of docs/operations.md's sizing table (issue #28 item 12), measured: a real
//! `vallumd` (this build), its resident memory (VmRSS, and the peak VmHWM during a step) before
//! and after each step, per unit:
//! - per rule: one Apply of 20,000 rules (`-s ADDR -p tcp --dport N -j DROP`);
//! - per set element: one AddElements of 16 x /16 into a `hash:ip` set of `maxelem 1048576`
//!   (the report's request: 1,048,576 elements), then per element resident;
//! - per idle connection: 500 TCP connections that sent the HTTP/2 preface;
//! - per connection holding a half-sent 60 KB message: 200 of them.
//!
//! Run with `cargo test -p vallum-server --test sizing -- --ignored --nocapture`; it prints one
//! line per step. The assertions are loose bounds (a regression by an order of magnitude
//! fails); the table quotes the printed numbers.

use crate::support;

use std::io::Write;
use std::time::Duration;

use support::Daemon;
use vallum_proto::v1 as pb;

/// (VmRSS, VmHWM) of `pid`, KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| -> u64 {
        let l = s.lines().find(|l| l.starts_with(name)).expect(name);
        l.split_whitespace()
            .nth(1)
            .expect(name)
            .parse()
            .expect(name)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets VmHWM to the current RSS (`/proc/PID/clear_refs` 5), so the next reading is the
/// peak of the next step.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// Resident memory once it settles: the lowest of 10 readings 100 ms apart (mimalloc keeps
/// freed memory 10 s; `MIMALLOC_PURGE_DELAY=0` is set below so it returns it at once).
async fn settled(pid: u32) -> u64 {
    let mut low = u64::MAX;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        low = low.min(memory_kib(pid).0);
    }
    low
}

fn line(what: &str, units: u64, before: u64, after: u64, peak: u64) -> (f64, f64) {
    let per = (after.saturating_sub(before) * 1024) as f64 / units as f64;
    let peak_per = (peak.saturating_sub(before) * 1024) as f64 / units as f64;
    println!(
        "sizing: {what}: {units} units, resident {before} -> {after} KiB ({per:.0} bytes each), \
         peak {peak} KiB ({peak_per:.0} bytes each)"
    );
    (per, peak_per)
}

#[tokio::test]
#[ignore = "measurement for docs/operations.md (prints the sizing numbers); run with --ignored --nocapture"]
async fn sizing_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start_env(
        &dir.path().join("v.db"),
        &[
            "--max-set-elements",
            "1048576",
            "--handshake-timeout",
            "600",
        ],
        &[("MIMALLOC_PURGE_DELAY", "0")],
    );
    d.wait_serving().await;
    let pid = d.pid();
    let mut c = d.rulesets().await;
    let base = settled(pid).await;
    println!("sizing: idle vallumd resident {base} KiB");

    // Rules.
    const RULES: u64 = 20_000;
    let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..RULES {
        text.push_str(&format!(
            "-A INPUT -s 10.{}.{}.0/24 -p tcp -m tcp --dport {} -j DROP\n",
            i / 256 % 256,
            i % 256,
            1 + i % 60000
        ));
    }
    text.push_str("COMMIT\n");
    reset_peak(pid);
    c.apply(pb::ApplyRequest {
        ruleset: "big".into(),
        source: Some(support::text_source(&text, false, "big.rules")),
        ..Default::default()
    })
    .await
    .expect("apply");
    let peak = memory_kib(pid).1;
    let after = settled(pid).await;
    let (per_rule, _) = line("rules", RULES, base, after, peak);
    assert!(per_rule < 20_000.0, "{per_rule} bytes per rule");

    // Set elements.
    let mut sets = pb::set_service_client::SetServiceClient::new(d.channel().await);
    sets.create_set(pb::CreateSetRequest {
        name: "big".into(),
        r#type: "hash:ip".into(),
        maxelem: 1 << 20,
        ..Default::default()
    })
    .await
    .expect("create set");
    let before = settled(pid).await;
    reset_peak(pid);
    let elements = (0..16)
        .map(|i| pb::SetElement {
            text: format!("10.{}.0.0/16", 100 + i),
            ..Default::default()
        })
        .collect();
    let added = sets
        .add_elements(pb::AddElementsRequest {
            set: "big".into(),
            elements,
            ..Default::default()
        })
        .await
        .expect("add elements")
        .into_inner()
        .added;
    let peak = memory_kib(pid).1;
    let after = settled(pid).await;
    let (per_element, peak_element) = line("set elements", added, before, after, peak);
    assert_eq!(added, 1 << 20);
    assert!(per_element < 2_000.0 && peak_element < 4_000.0);

    // Idle connections (the preface sent).
    let before = settled(pid).await;
    let mut idle = Vec::new();
    for i in 0..500 {
        let mut s = std::net::TcpStream::connect(&d.addr).expect("connect");
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .expect("preface");
        idle.push(s);
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let after = settled(pid).await;
    let (per_conn, _) = line("idle connections", 500, before, after, memory_kib(pid).1);
    assert!(per_conn < 200_000.0);
    drop(idle);

    // Connections holding a half-sent 60 KB message.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = settled(pid).await;
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut s = std::net::TcpStream::connect(&d.addr).expect("connect");
        let mut out =
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00".to_vec();
        let path = b"/grpc.health.v1.Health/Check";
        let ct = b"application/grpc";
        let mut block = vec![0x83, 0x86, 0x04, path.len() as u8];
        block.extend_from_slice(path);
        block.extend_from_slice(&[0x0f, 0x10, ct.len() as u8]);
        block.extend_from_slice(ct);
        out.extend_from_slice(&[0, 0, block.len() as u8, 0x01, 0x04, 0, 0, 0, 1]);
        out.extend_from_slice(&block);
        let mut data = vec![0u8, 0x00, 0x0f, 0x42, 0x40];
        data.extend(std::iter::repeat_n(0x0au8, 60_000 - 5));
        for chunk in data.chunks(16_384) {
            let n = chunk.len();
            out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8, 0, 0, 0, 0, 0, 1]);
            out.extend_from_slice(chunk);
        }
        s.write_all(&out).expect("write");
        held.push(s);
    }
    let after = settled(pid).await;
    let (per_held, _) = line(
        "connections holding 60 KB",
        200,
        before,
        after,
        memory_kib(pid).1,
    );
    assert!(per_held < 1_000_000.0);
    drop(held);
}
