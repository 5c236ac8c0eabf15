//! `vallumctl counters`: CounterService, laid out like `iptables -L -v -x -n`
//! (`--line-numbers` as iptables' flag of that name), or zeroed with `--zero`.

use serde_json::json;
use tonic_types::StatusExt;
use vallum_api::reason::Reason;
use vallum_proto::v1::counter_service_client::CounterServiceClient;
use vallum_proto::v1::{GetCountersRequest, RuleCounter, ZeroCountersRequest};

use crate::connect::Svc;
use crate::error::CliError;
use crate::output::{Output, print};
use crate::pages::{PAGE_SIZE, all_pages};
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
    let counters = read_all(c, &ruleset).await?;
    print(out, view::counters_json(&counters), || {
        view::counters_text(&counters, args.line_numbers)
    })
}

/// Listings restarted when a commit changes the active revisions between two pages
/// (LIST_CHANGED) before the error is the answer.
const RESTARTS: usize = 3;

/// Every counter of `ruleset` (empty: all), page by page, from one set of active
/// revisions: a page refused with LIST_CHANGED restarts the listing from the first page.
async fn read_all(
    c: &mut CounterServiceClient<Svc>,
    ruleset: &str,
) -> Result<Vec<RuleCounter>, CliError> {
    let mut restarts = 0;
    loop {
        let pages: Result<Vec<RuleCounter>, CliError> = async {
            Ok(all_pages!(
                |token| c
                    .get_counters(GetCountersRequest {
                        ruleset: ruleset.to_string(),
                        page_size: PAGE_SIZE,
                        page_token: token.clone(),
                    })
                    .await?,
                counters
            ))
        }
        .await;
        match pages {
            Err(CliError::Status { status, .. })
                if restarts < RESTARTS
                    && status
                        .get_details_error_info()
                        .is_some_and(|i| i.reason == Reason::ListChanged.info().name) =>
            {
                restarts += 1;
            }
            other => return other,
        }
    }
}
