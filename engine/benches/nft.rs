//! nftables rulesets (issue #35's targets), each next to kernel nftables in the same run.
//!
//! Cases (best of `VALLUM_BENCH_ROUNDS` rounds, default 5; the kernel's in a private network
//! namespace `vbench-PID`, as whole `nft` processes, which is what a user runs):
//! - `commit/full/N`: a kube-proxy-style ruleset of N services (`table ip kube-proxy`: the
//!   `cluster-ips` set, the `no-endpoint-services` verdict map (every tenth service) and the
//!   filter chains that use them; the `service-ips` verdict map, a chain per service with
//!   `numgen random mod 1 vmap` and a chain per endpoint with `dnat`, in nat chains, stored
//!   only by the engine) as the engine commits it: parse the text, lower it, create its sets
//!   with their elements, validate, compile and publish on a dataplane. Kernel: `nft -f FILE`
//!   into an empty ruleset.
//! - `commit/filter/N`: the same with the filter side only (`cluster-ips` and
//!   `no-endpoint-services` with all N services): what the engine enforces, without the
//!   chains per service and endpoint (the kernel's anonymous `numgen` maps dominate its time
//!   in `commit/full`, which is measured up to N = 10,000).
//! - `add_element/SHAPE/N`: one element added to the `no-endpoint-services` verdict map
//!   that a compiled `vmap` uses (`SetManager::add_str`, the engine's part of
//!   AddElements; median of 1,000 adds). Kernel: one `nft add element ip kube-proxy
//!   no-endpoint-services { ... }` on the loaded ruleset (median of 5).
//! - `classify/N`: one core classifies 1,024 packets (half to a service without endpoints,
//!   dropped) through `jump service-endpoints-check` -> `vmap @no-endpoint-services` of N
//!   elements (lowered from nft), and through the same rules as iptables (`-A CHECK -d IP/32
//!   -p tcp --dport 80 -j DROP` per element); packets per second, best round of 200 batches.
//!
//! Run (root, nft): `cargo bench -p vallum-engine --bench nft` (`VALLUM_BENCH_SIZES`, a comma
//! list, default `10000,100000`). Without root or nft the kernel columns say why they are
//! missing; the engine's are measured anyway.

use std::hint::black_box;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vallum_engine::conntrack::NoTracking;
use vallum_engine::dataplane::{BarrierStrategy, Dataplane};
use vallum_engine::model::{Family, Hook};
use vallum_engine::nft;
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::{SetManager, SetRegistry};
use vallum_engine::snapshot::{LogEvent, Snapshot, Verdict};
use vallum_engine::validate;

struct WallClock(Instant);

impl vallum_engine::Clock for WallClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

fn dataplane() -> Dataplane<Snapshot> {
    Dataplane::new(
        Snapshot::empty(1),
        1,
        BarrierStrategy::SeqCst,
        Arc::new(WallClock(Instant::now())),
    )
}

fn service(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 30 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
}

fn endpoint(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 180 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
}

/// The kube-proxy-style ruleset of `n` services (module docs); every tenth service has no
/// endpoints and is in `no-endpoint-services` instead of `service-ips`.
fn kube_proxy(n: usize) -> String {
    let mut t = String::with_capacity(n * 400);
    t.push_str("table ip kube-proxy {\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\telements = { ");
    let all: Vec<String> = (0..n).map(|i| service(i).to_string()).collect();
    t.push_str(&all.join(", "));
    t.push_str(" }\n\t}\n\tmap no-endpoint-services {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = { ");
    let none: Vec<String> = (0..n)
        .filter(|i| i % 10 == 0)
        .map(|i| format!("{} . tcp . 80 : goto reject-chain", service(i)))
        .collect();
    t.push_str(&none.join(", "));
    t.push_str(" }\n\t}\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = { ");
    let svc: Vec<String> = (0..n)
        .filter(|i| i % 10 != 0)
        .map(|i| format!("{} . tcp . 80 : goto service-{i}", service(i)))
        .collect();
    t.push_str(&svc.join(", "));
    t.push_str(" }\n\t}\n");
    t.push_str(
        "\tchain filter-input {\n\t\ttype filter hook input priority -110; policy accept;\n\
         \t\tct state new jump service-endpoints-check\n\t}\n\
         \tchain filter-forward {\n\t\ttype filter hook forward priority -110; policy accept;\n\
         \t\tct state new jump service-endpoints-check\n\
         \t\tct state new ip daddr @cluster-ips reject\n\t}\n\
         \tchain service-endpoints-check {\n\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}\n\
         \tchain reject-chain {\n\t\treject\n\t}\n\
         \tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n\
         \tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n\
         \tchain masquerading {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tmeta mark & 0x00004000 == 0x00000000 return\n\t\tmeta mark set meta mark ^ 0x00004000\n\
         \t\tmasquerade fully-random\n\t}\n\
         \tchain mark-for-masquerade {\n\t\tmeta mark set meta mark | 0x00004000\n\t}\n\
         \tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n",
    );
    for i in (0..n).filter(|i| i % 10 != 0) {
        let (s, e) = (service(i), endpoint(i));
        t.push_str(&format!(
            "\tchain service-{i} {{\n\t\tip daddr {s} tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade\n\
             \t\tnumgen random mod 1 vmap {{ 0 : goto endpoint-{i} }}\n\t}}\n\
             \tchain endpoint-{i} {{\n\t\tip saddr {e} jump mark-for-masquerade\n\
             \t\tmeta l4proto tcp dnat to {e}:80\n\t}}\n"
        ));
    }
    t.push_str("}\n");
    t
}

/// The filter side alone: `cluster-ips` and `no-endpoint-services` with all `n` services
/// (every element `goto reject-chain`), the chains that use them; what the engine enforces of
/// [`kube_proxy`], without the nat chains the kernel runs.
fn filter_only(n: usize) -> String {
    let mut t = String::with_capacity(n * 60);
    t.push_str("table ip kube-proxy {\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\telements = { ");
    let all: Vec<String> = (0..n).map(|i| service(i).to_string()).collect();
    t.push_str(&all.join(", "));
    t.push_str(" }\n\t}\n\tmap no-endpoint-services {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = { ");
    let none: Vec<String> = (0..n)
        .map(|i| format!("{} . tcp . 80 : goto reject-chain", service(i)))
        .collect();
    t.push_str(&none.join(", "));
    t.push_str(
        " }\n\t}\n\tchain filter-input {\n\t\ttype filter hook input priority -110; policy accept;\n\
         \t\tct state new jump service-endpoints-check\n\t}\n\
         \tchain filter-forward {\n\t\ttype filter hook forward priority -110; policy accept;\n\
         \t\tct state new jump service-endpoints-check\n\
         \t\tct state new ip daddr @cluster-ips reject\n\t}\n\
         \tchain service-endpoints-check {\n\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}\n\
         \tchain reject-chain {\n\t\treject\n\t}\n}\n",
    );
    t
}

fn rounds() -> usize {
    std::env::var("VALLUM_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

fn best(mut f: impl FnMut() -> Duration) -> Duration {
    (0..rounds()).map(|_| f()).min().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The engine's commit of `text`: parse, lower, sets, validate, compile, publish. Returns the
/// time and the manager and dataplane it left (for the element adds).
fn engine_commit(text: &str) -> (Duration, Arc<SetManager>, Dataplane<Snapshot>) {
    let dp = dataplane();
    let sets = Arc::new(SetManager::for_dataplane(Arc::clone(dp.quiescence())));
    let t0 = Instant::now();
    let rs = nft::parse("kp.nft", text).expect("parses");
    let t1 = Instant::now();
    let lowered = nft::lower(&rs, "kp.nft", text, "kp", 0).expect("lowers");
    let t2 = Instant::now();
    for s in &lowered.sets {
        sets.create(&s.name, s.spec).expect("create");
        sets.add(&s.name, s.elements.iter().copied(), 0)
            .expect("add");
    }
    let t3 = Instant::now();
    let v = validate::validate(&lowered.ruleset, Some(&*sets as &dyn SetRegistry));
    assert!(!validate::has_errors(&v), "{v:?}");
    let t4 = Instant::now();
    let snap = Snapshot::compile(&[Arc::new(lowered.ruleset)], &*sets, 1).expect("compiles");
    drop(dp.commit(Box::new(snap)));
    let t5 = Instant::now();
    if std::env::var_os("VALLUM_BENCH_PHASES").is_some() {
        eprintln!(
            "phases ms: parse {:.1} lower {:.1} sets {:.1} validate {:.1} compile+publish {:.1}",
            ms(t1 - t0),
            ms(t2 - t1),
            ms(t3 - t2),
            ms(t4 - t3),
            ms(t5 - t4)
        );
    }
    (t0.elapsed(), sets, dp)
}

/// A private namespace for the kernel's side, removed on drop.
struct Netns(String);

impl Netns {
    fn new() -> Result<Netns, String> {
        let name = format!("vbench-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .map_err(|e| format!("ip: {e}"))?;
        if !ok.success() {
            return Err("`ip netns add` failed (needs root)".into());
        }
        Ok(Netns(name))
    }

    /// Runs `nft ARGS` (stdin `input`) in the namespace; the whole process's wall time.
    fn nft(&self, args: &[&str], input: Option<&str>) -> Result<Duration, String> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.0, "nft"]).args(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let t0 = Instant::now();
        let mut child = cmd.spawn().map_err(|e| format!("nft: {e}"))?;
        if let Some(text) = input {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .map_err(|e| e.to_string())?;
        } else {
            drop(child.stdin.take());
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let took = t0.elapsed();
        if !out.status.success() {
            return Err(format!(
                "nft {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(took)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn commit_and_add(n: usize, kernel: &Result<Netns, String>, shape: &str) {
    let text = if shape == "full" {
        kube_proxy(n)
    } else {
        filter_only(n)
    };
    let path = std::env::temp_dir().join(format!("vbench-kp-{}-{n}.nft", std::process::id()));
    std::fs::write(&path, &text).expect("write ruleset");
    let file = path.to_string_lossy().to_string();
    let ours = best(|| engine_commit(&text).0);
    let (_, sets, _dp) = engine_commit(&text);
    let map = "ip.kube-proxy.no-endpoint-services";
    let mut adds = Vec::with_capacity(1000);
    for k in 0..1000 {
        let e = format!("{},udp:{} : goto reject-chain", service(k % n), 1000 + k);
        let t0 = Instant::now();
        sets.add_str(map, &[e.as_str()], 0).expect("add element");
        adds.push(t0.elapsed());
    }
    let ours_add = median(adds);
    let map_len = sets.summary(map).map_or(0, |s| s.entries);
    let (theirs, theirs_add) = match kernel {
        Ok(ns) => {
            let load = best(|| {
                ns.nft(&["flush", "ruleset"], None).expect("flush");
                ns.nft(&["-f", &file], None).expect("nft -f")
            });
            let adds: Vec<Duration> = (0..5)
                .map(|k| {
                    let cmd = format!(
                        "add element ip kube-proxy no-endpoint-services {{ {} . udp . {} : goto reject-chain }}",
                        service(k % n),
                        3000 + k
                    );
                    ns.nft(&[&cmd], None).expect("nft add element")
                })
                .collect();
            (
                format!("{:.1}", ms(load)),
                format!("{:.2}", ms(median(adds))),
            )
        }
        Err(why) => (why.clone(), why.clone()),
    };
    let _ = std::fs::remove_file(&path);
    println!(
        "commit/{shape}/{n}: engine {:.2} ms, kernel nft -f {theirs} ms ({} bytes of text)",
        ms(ours),
        text.len()
    );
    println!(
        "add_element/{shape}/{n}: engine {:.1} us (median of 1000, map of {map_len}), kernel nft add element {theirs_add} ms (median of 5)",
        ours_add.as_secs_f64() * 1e6
    );
}

/// The filter side only, every element dropped: nft (a verdict map) and iptables (a rule per
/// element).
fn classify(n: usize) {
    let elems: Vec<String> = (0..n)
        .map(|i| format!("{} . tcp . 80 : drop", service(i)))
        .collect();
    let text = format!(
        "table ip kp {{\n\tmap no-endpoint-services {{\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\
         \t\telements = {{ {} }}\n\t}}\n\
         \tchain input {{\n\t\ttype filter hook input priority filter; policy accept;\n\t\tjump check\n\t}}\n\
         \tchain check {{\n\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}}\n}}\n",
        elems.join(", ")
    );
    let mut ipt = String::from("*filter\n:INPUT ACCEPT [0:0]\n:CHECK - [0:0]\n-A INPUT -j CHECK\n");
    for i in 0..n {
        ipt.push_str(&format!(
            "-A CHECK -d {}/32 -p tcp -m tcp --dport 80 -j DROP\n",
            service(i)
        ));
    }
    ipt.push_str("COMMIT\n");
    let pkts: Vec<PacketMeta> = (0..1024)
        .map(|k| {
            let i = (k * 7919) % n;
            PacketMeta {
                family: Family::Ipv4,
                hook: Hook::Input,
                src: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
                dst: IpAddr::V4(service(i)),
                protocol: 6,
                sport: 40000,
                // Odd packets to a port no element has: accepted.
                dport: if k % 2 == 0 { 80 } else { 81 },
                len: 60,
                ..PacketMeta::default()
            }
        })
        .collect();
    let run = |dp: &Dataplane<Snapshot>| -> f64 {
        let mut w = dp.worker(0).expect("core 0");
        let mut logs: Vec<LogEvent> = Vec::new();
        let iters = 200;
        let t0 = Instant::now();
        for _ in 0..iters {
            w.batch(|snap, _| {
                let mut drops = 0usize;
                let mut v = [Verdict::Accept];
                for p in &pkts {
                    let mut p = [*black_box(p)];
                    snap.classify_batch(
                        0,
                        &mut p,
                        &mut [],
                        &mut v,
                        0,
                        &mut logs,
                        &[],
                        &mut NoTracking,
                    );
                    drops += usize::from(v[0] == Verdict::Drop);
                }
                assert_eq!(drops, pkts.len() / 2);
            });
        }
        (iters * pkts.len()) as f64 / t0.elapsed().as_secs_f64()
    };
    let nft_dp = dataplane();
    let sets = SetManager::for_dataplane(Arc::clone(nft_dp.quiescence()));
    let rs = nft::parse("c.nft", &text).expect("parses");
    let lowered = nft::lower(&rs, "c.nft", &text, "c", 0).expect("lowers");
    for s in &lowered.sets {
        sets.create(&s.name, s.spec).expect("create");
        sets.add(&s.name, s.elements.iter().copied(), 0)
            .expect("add");
    }
    let snap = Snapshot::compile(&[Arc::new(lowered.ruleset)], &sets, 1).expect("compiles");
    drop(nft_dp.commit(Box::new(snap)));
    let ipt_dp = dataplane();
    let model = parse_ruleset("c", &ipt, &ParseOptions::default()).expect("iptables parses");
    let snap = Snapshot::compile(&[Arc::new(model)], &sets, 1).expect("compiles");
    drop(ipt_dp.commit(Box::new(snap)));
    let (mut a, mut b) = (0f64, 0f64);
    // Alternated, best of rounds.
    for _ in 0..rounds() {
        a = a.max(run(&nft_dp));
        b = b.max(run(&ipt_dp));
    }
    println!(
        "classify/{n}: nft vmap {:.2} Mpps, iptables rules {:.2} Mpps, nft/iptables {:.2}x",
        a / 1e6,
        b / 1e6,
        a / b
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::var("VALLUM_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000]);
    // `cargo bench` passes `--bench`; a filter word selects cases.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |case: &str| filter.is_empty() || filter.iter().any(|f| case.contains(f.as_str()));
    let kernel = Netns::new();
    if let Err(why) = &kernel {
        eprintln!("kernel side not measured: {why}");
    }
    for &n in &sizes {
        for shape in ["filter", "full"] {
            // The kernel's load of the full shape grows with the square of its anonymous
            // maps (20 s at 10k here): past 10k it is not measured.
            if shape == "full" && n > 10_000 {
                continue;
            }
            if want(&format!("commit/{shape}")) || want(&format!("add_element/{shape}")) {
                commit_and_add(n, &kernel, shape);
            }
        }
        if want("classify") {
            classify(n);
        }
    }
}
