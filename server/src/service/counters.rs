//! `vallum.v1.CounterService`: per-rule counters of the active snapshot.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::counter_service_server::CounterService;

use super::State;
use crate::convert;

/// The CounterService implementation.
#[derive(Debug, Clone)]
pub struct CountersApi {
    state: Arc<State>,
}

impl CountersApi {
    /// The service over shared state.
    pub fn new(state: Arc<State>) -> Self {
        CountersApi { state }
    }
}

#[tonic::async_trait]
impl CounterService for CountersApi {
    async fn get_counters(
        &self,
        request: Request<pb::GetCountersRequest>,
    ) -> Result<Response<pb::GetCountersResponse>, Status> {
        let r = request.into_inner();
        let filter = if r.ruleset.is_empty() {
            None
        } else {
            Some(convert::ruleset_id("ruleset", &r.ruleset)?)
        };
        let engine = self.state.pipeline.engine();
        let rulesets: Vec<_> = engine.rulesets().into_values().collect();
        let counters = engine
            .counters()
            .into_iter()
            .filter(|c| filter.as_deref().is_none_or(|f| f == &*c.ruleset))
            .map(|c| {
                let text = match c.rule {
                    Some(n) => {
                        convert::rule_text_of(&rulesets, &c.ruleset, c.family, c.table, &c.chain, n)
                            .unwrap_or_default()
                    }
                    None => rulesets
                        .iter()
                        .find(|r| *r.name == *c.ruleset)
                        .and_then(|r| r.table(c.family, c.table))
                        .and_then(|t| t.chain(&c.chain))
                        .and_then(|ch| ch.policy)
                        .map(|p| format!("{p:?}").to_uppercase())
                        .unwrap_or_default(),
                };
                pb::RuleCounter {
                    ruleset: c.ruleset.to_string(),
                    family: convert::family_pb(c.family) as i32,
                    table: c.table.name().to_string(),
                    chain: c.chain.to_string(),
                    rule: c.rule.unwrap_or(0),
                    packets: c.packets,
                    bytes: c.bytes,
                    text,
                }
            })
            .collect();
        Ok(Response::new(pb::GetCountersResponse { counters }))
    }

    async fn zero_counters(
        &self,
        request: Request<pb::ZeroCountersRequest>,
    ) -> Result<Response<pb::ZeroCountersResponse>, Status> {
        let r = request.into_inner();
        let filter = if r.ruleset.is_empty() {
            None
        } else {
            Some(convert::ruleset_id("ruleset", &r.ruleset)?)
        };
        self.state
            .pipeline
            .engine()
            .zero_counters(filter.as_deref());
        Ok(Response::new(pb::ZeroCountersResponse {}))
    }
}
