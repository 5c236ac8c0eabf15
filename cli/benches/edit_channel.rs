//! EditRuleset over one gRPC channel (issue #22 item 4): `CALLS` sequential one-rule edits
//! (`-A INPUT -s 192.168.x.y -j DROP`) of the ruleset `VALLUM_RULESET` on the vallumd at
//! `VALLUM_SERVER` (both required; `cli/benches/dropin.sh` starts vallumd and loads the base
//! ruleset first). Prints the median and p90 of the call's wall time and of the server's
//! reported commit phases (persist, total of the pipeline), in microseconds; with
//! `VALLUM_METRICS=HOST:PORT` (vallumd's `--metrics-listen`) also the mean time vallumd's gRPC
//! layer saw per call (`rpc_server_call_duration_seconds`, sum over count across the run), so
//! the call splits into transport and client, the handler around the pipeline, and the
//! pipeline. `VALLUM_SERVER` may be `unix:PATH` (vallumd's `--socket`). The edits ask for the
//! durability `VALLUM_SYNC` (`full` or `normal`, default `normal`: vallum-iptables' default).
//!
//! Cases: one, a single run of `VALLUM_BENCH_CALLS` calls (default 200).

use std::io::{Read as _, Write as _};
use std::time::Instant;

use vallum_proto::v1 as pb;

fn main() {
    let (Ok(server), Ok(ruleset)) = (
        std::env::var("VALLUM_SERVER"),
        std::env::var("VALLUM_RULESET"),
    ) else {
        panic!(
            "edit_channel bench not run: VALLUM_SERVER and VALLUM_RULESET are not set \
             (run cli/benches/dropin.sh)"
        );
    };
    let calls: usize = std::env::var("VALLUM_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let durability = match std::env::var("VALLUM_SYNC").as_deref() {
        Ok("full") => pb::Durability::Full,
        Ok("normal") | Err(_) => pb::Durability::Normal,
        Ok(v) => panic!("VALLUM_SYNC={v}: expected full or normal"),
    };
    let metrics = std::env::var("VALLUM_METRICS").ok();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let channel = match server.strip_prefix("unix:") {
            Some(path) => {
                let path = path.strip_prefix("//").unwrap_or(path).to_owned();
                tonic::transport::Endpoint::from_static("http://localhost")
                    .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                        let path = path.clone();
                        async move {
                            let s = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                        }
                    }))
                    .await
            }
            None => tonic::transport::Endpoint::from_shared(server.clone())
                .expect("VALLUM_SERVER")
                .connect()
                .await,
        }
        .expect("connect");
        let mut c = pb::ruleset_service_client::RulesetServiceClient::new(channel);
        let before = metrics.as_deref().map(edit_call_seconds);
        let (mut wall, mut persist, mut total) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..calls {
            let edit = pb::RuleCommand {
                family: pb::Family::Ipv4 as i32,
                table: "filter".into(),
                args: format!("-A INPUT -s 192.168.{}.{} -j DROP", 100 + i / 256, i % 256)
                    .split(' ')
                    .map(String::from)
                    .collect(),
            };
            let t = Instant::now();
            let r = c
                .edit_ruleset(pb::EditRulesetRequest {
                    ruleset: ruleset.clone(),
                    edits: vec![edit],
                    durability: durability as i32,
                    ..Default::default()
                })
                .await
                .expect("edit")
                .into_inner();
            wall.push(t.elapsed().as_nanos() as u64);
            let p = r.phases.unwrap_or_default();
            let ns = |d: Option<prost_types::Duration>| {
                d.map_or(0, |d| d.seconds as u64 * 1_000_000_000 + d.nanos as u64)
            };
            persist.push(ns(p.persist));
            total.push(ns(p.total));
        }
        let q = |v: &mut Vec<u64>, f: f64| {
            v.sort_unstable();
            v[((v.len() - 1) as f64 * f) as usize] / 1000
        };
        let handler = match (before, metrics.as_deref().map(edit_call_seconds)) {
            (Some((s0, n0)), Some((s1, n1))) if n1 > n0 => format!(
                ", vallumd's gRPC layer mean {} us",
                ((s1 - s0) / (n1 - n0) as f64 * 1e6) as u64
            ),
            _ => String::new(),
        };
        let mean = wall.iter().sum::<u64>() / wall.len().max(1) as u64 / 1000;
        println!(
            "EditRuleset over one channel ({server}), {calls} calls, durability {}: call p50 {} us (p90 {}, mean {mean}){handler}, server pipeline p50 {} us, of it persist p50 {} us",
            durability.as_str_name(),
            q(&mut wall, 0.5),
            q(&mut wall, 0.9),
            q(&mut total, 0.5),
            q(&mut persist, 0.5)
        );
    });
}

/// The sum (seconds) and count of `rpc_server_call_duration_seconds` for EditRuleset over
/// every status code, scraped from vallumd's `/metrics` at `addr` (HOST:PORT).
fn edit_call_seconds(addr: &str) -> (f64, u64) {
    let mut s = std::net::TcpStream::connect(addr).expect("VALLUM_METRICS: connect");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("VALLUM_METRICS: write");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("VALLUM_METRICS: read");
    let (mut sum, mut count) = (0.0, 0);
    for line in body.lines() {
        if !line.contains("EditRuleset") {
            continue;
        }
        let value = line.rsplit(' ').next().unwrap_or("0");
        if line.starts_with("rpc_server_call_duration_seconds_sum") {
            sum += value.parse::<f64>().unwrap_or(0.0);
        } else if line.starts_with("rpc_server_call_duration_seconds_count") {
            count += value.parse::<u64>().unwrap_or(0);
        }
    }
    (sum, count)
}
