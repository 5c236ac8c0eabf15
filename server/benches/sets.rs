//! Bulk add of set elements through gRPC (SetService/AddElements), including the durable
//! SQLite transaction and the engine's copy-on-write publish, against an in-process server on
//! an ephemeral port; and the start of a server whose store holds a 1M-element set.
//!
//! Cases (a fresh `hash:ip` set, maxelem 2M, per sample; destroyed after it, untimed):
//! - `add/100k`: one AddElements call of 100,000 distinct hosts;
//! - `add/1M`: one AddElements call of 1,000,000 hosts (~17 MB request; the server runs with
//!   `--max-request-bytes 128 MiB`);
//! - `add/1M_in_10_calls`: ten calls of 100,000 into one set (each durable on its own);
//! - `start/1M`: vallumd start to health SERVING with one stored 1M-element set (restore from
//!   SQLite into the engine before the rulesets load).
//!
//! Each sample costs seconds and needs fresh state, so this times calls by hand (client side,
//! whole gRPC call) instead of criterion's statistics, and prints min / median per case.
//! Run: `cargo bench -p vallum-server --bench sets`

// vallumd's allocator and its settings (server/src/allocator.rs), so the in-process server
// runs as in vallumd.
#[global_allocator]
static ALLOCATOR: vallum_server::host::allocator::MiMalloc =
    vallum_server::host::allocator::MiMalloc;
// The tests' vallumd harness: `Daemon::in_process` on this bench's runtime.
#[path = "../tests/it/support/vallumd.rs"]
mod vallumd;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use vallum_proto::v1 as pb;
use vallum_proto::v1::set_service_client::SetServiceClient;

const MAX_REQUEST: usize = 128 << 20;

fn hosts(n: usize, offset: usize) -> Vec<pb::SetElement> {
    (0..n)
        .map(|i| pb::SetElement {
            text: Ipv4Addr::from(0x0a00_0000 + (offset + i) as u32).to_string(),
            ..Default::default()
        })
        .collect()
}

fn start(rt: &tokio::runtime::Runtime, db: &std::path::Path) -> vallumd::Daemon {
    vallum_server::host::allocator::keep_freed_memory();
    let max = MAX_REQUEST.to_string();
    let flags = ["--max-request-bytes", max.as_str()];
    rt.block_on(vallumd::Daemon::in_process(db, &flags, Default::default()))
}

/// Connects and waits until the server answers set calls (SERVING).
async fn client(port: u16) -> SetServiceClient<Channel> {
    for _ in 0..2000 {
        if let Ok(c) = SetServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
            let mut c = c
                .max_decoding_message_size(MAX_REQUEST)
                .max_encoding_message_size(MAX_REQUEST);
            if c.list_sets(pb::ListSetsRequest::default()).await.is_ok() {
                return c;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("server did not start");
}

async fn fresh(c: &mut SetServiceClient<Channel>, name: &str) {
    c.create_set(pb::CreateSetRequest {
        name: name.into(),
        r#type: "hash:ip".into(),
        maxelem: 2_000_000,
        hashsize: 1 << 20,
        ..Default::default()
    })
    .await
    .expect("create");
}

async fn add(c: &mut SetServiceClient<Channel>, name: &str, elements: Vec<pb::SetElement>) {
    let r = c
        .add_elements(pb::AddElementsRequest {
            set: name.into(),
            elements,
            exist: false,
            ..Default::default()
        })
        .await
        .expect("add");
    assert!(r.into_inner().added > 0);
}

fn report(case: &str, elements: usize, mut ns: Vec<u64>) {
    ns.sort_unstable();
    let ms = |v: u64| v as f64 / 1e6;
    let med = ns[ns.len() / 2];
    println!(
        "{case:<22} {} samples  min {:9.1} ms  median {:9.1} ms  ({:.2} M elements/s at the median)",
        ns.len(),
        ms(ns[0]),
        ms(med),
        elements as f64 / (med as f64 / 1e9) / 1e6
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs with no such flag: then run
    // one small sample as a smoke test.
    let full = std::env::args().any(|a| a == "--bench");
    let (n_small, n_big, reps_small, reps_big) = if full {
        (100_000, 1_000_000, 5, 3)
    } else {
        (1_000, 10_000, 1, 1)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = tmp.path().join("bench.db");
    let server = start(&rt, &db);
    let mut c = rt.block_on(client(server.port()));

    let mut run = |case: &str, reps: usize, calls: usize, per_call: usize, keep: bool| {
        let mut ns = Vec::new();
        for rep in 0..reps {
            let name = format!("{}-{rep}", case.replace(['/', '_'], "-"));
            let batches: Vec<Vec<pb::SetElement>> =
                (0..calls).map(|k| hosts(per_call, k * per_call)).collect();
            rt.block_on(fresh(&mut c, &name));
            let t0 = Instant::now();
            for b in batches {
                rt.block_on(add(&mut c, &name, b));
            }
            ns.push(t0.elapsed().as_nanos() as u64);
            if !(keep && rep == 0) {
                rt.block_on(c.destroy_set(pb::DestroySetRequest {
                    name,
                    ..Default::default()
                }))
                .expect("destroy");
            }
        }
        report(case, calls * per_call, ns);
    };
    let k = |n: usize| {
        if n >= 1_000_000 {
            format!("{}M", n / 1_000_000)
        } else {
            format!("{}k", n / 1000)
        }
    };
    run(
        &format!("add/{}", k(n_small)),
        reps_small,
        1,
        n_small,
        false,
    );
    run(&format!("add/{}", k(n_big)), reps_big, 1, n_big, true);
    run(
        &format!("add/{}_in_10_calls", k(n_big)),
        reps_big,
        10,
        n_big / 10,
        false,
    );

    rt.block_on(server.stop());
    // Start with the kept 1M-element set in the store.
    let mut ns = Vec::new();
    for _ in 0..reps_big {
        let t0 = Instant::now();
        let s = start(&rt, &db);
        let mut c = rt.block_on(client(s.port()));
        ns.push(t0.elapsed().as_nanos() as u64);
        let got = rt
            .block_on(c.list_sets(pb::ListSetsRequest::default()))
            .expect("list")
            .into_inner();
        assert_eq!(got.sets[0].entries, n_big as u64);
        rt.block_on(s.stop());
    }
    report(&format!("start/{}", k(n_big)), n_big, ns);
}
