//! EditRuleset over one gRPC channel (issue #22 item 4): `CALLS` sequential one-rule edits
//! (`-A INPUT -s 192.168.x.y -j DROP`) of the ruleset `VALLUM_RULESET` on the vallumd at
//! `VALLUM_SERVER` (both required; `cli/benches/dropin.sh` starts vallumd and loads the base
//! ruleset first). Prints the median and p90 of the call's wall time and of the server's
//! reported commit phases (persist, total of the pipeline), in microseconds.
//!
//! Cases: one, a single run of `VALLUM_BENCH_CALLS` calls (default 200).

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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = pb::ruleset_service_client::RulesetServiceClient::connect(server)
            .await
            .expect("connect");
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
        println!(
            "EditRuleset over one channel, {calls} calls: call p50 {} us (p90 {}), server pipeline p50 {} us, of it persist p50 {} us",
            q(&mut wall, 0.5),
            q(&mut wall, 0.9),
            q(&mut total, 0.5),
            q(&mut persist, 0.5)
        );
    });
}
