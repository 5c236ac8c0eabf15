//! `vallumctl counters`: CounterService, laid out like `iptables -L -v -x -n`
//! (`--line-numbers` as iptables' flag of that name), or zeroed with `--zero`.

use serde_json::json;
use vallum_proto::v1::counter_service_client::CounterServiceClient;
use vallum_proto::v1::{GetCountersRequest, ZeroCountersRequest};

use crate::connect::Svc;
use crate::error::CliError;
use crate::output::{Output, print};
use crate::view;

/// Flags of `counters`.
#[derive(Debug, clap::Args)]
pub struct CountersArgs {
    /// Only this ruleset.
    pub ruleset: Option<String>,
    /// Zero the counters instead of printing them.
    #[arg(long, conflicts_with = "line_numbers")]
    pub zero: bool,
    /// Number the rules of each chain (a `num` column first, as `iptables -L --line-numbers`).
    #[arg(long)]
    pub line_numbers: bool,
}

/// Runs `counters`.
pub async fn run(
    c: &mut CounterServiceClient<Svc>,
    out: Output,
    args: &CountersArgs,
) -> Result<(), CliError> {
    let ruleset = args.ruleset.clone().unwrap_or_default();
    if args.zero {
        c.zero_counters(ZeroCountersRequest {
            ruleset: ruleset.clone(),
            ..Default::default()
        })
        .await?;
        return print(out, json!({"zeroed": ruleset}), || {
            "counters zeroed\n".to_owned()
        });
    }
    let r = c
        .get_counters(GetCountersRequest { ruleset })
        .await?
        .into_inner();
    print(out, view::counters_json(&r.counters), || {
        view::counters_text(&r.counters, args.line_numbers)
    })
}
