//! `vallum.v1.CounterService`: per-rule counters of the active snapshot.
//!
//! A request naming a ruleset that does not exist (neither in the engine nor in the store) is
//! NOT_FOUND, for GetCounters and ZeroCounters alike; an empty name means every ruleset. A
//! stored ruleset with no active revision has no counters (an empty answer). ZeroCounters is
//! an admin mutation and writes an audit record (`CounterService/ZeroCounters`), refused calls
//! included.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::counter_service_server::CounterService;

use super::State;
use crate::auth::{Grant, Op};
use crate::error::{Error, Result};
use crate::{convert, hooks};

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

    /// The ruleset a request names (`None`: every ruleset).
    ///
    /// Errors: [`Error::BadRequest`] for a malformed name, [`Error::NotFound`] when the
    /// ruleset is neither active nor stored, [`Error::Store`].
    async fn filter(&self, ruleset: &str) -> Result<Option<String>> {
        if ruleset.is_empty() {
            return Ok(None);
        }
        let name = convert::ruleset_id("ruleset", ruleset)?;
        let pipeline = &self.state.pipeline;
        let known = pipeline.engine().rulesets().contains_key(name.as_str())
            || pipeline.store().get_ruleset(&name).await?.is_some();
        if !known {
            return Err(Error::NotFound {
                kind: "ruleset",
                name: format!("rulesets/{name}"),
            });
        }
        Ok(Some(name))
    }
}

#[tonic::async_trait]
impl CounterService for CountersApi {
    async fn get_counters(
        &self,
        request: Request<pb::GetCountersRequest>,
    ) -> Result<Response<pb::GetCountersResponse>, Status> {
        let r = request.into_inner();
        let filter = self.filter(&r.ruleset).await?;
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
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        let named = (!r.ruleset.is_empty())
            .then(|| convert::ruleset_id("ruleset", &r.ruleset))
            .transpose();
        let result = match named.and_then(|named| {
            grant.check(
                &format!("ZeroCounters rulesets/{}", named.as_deref().unwrap_or("*")),
                Op::Counters,
                named.as_deref(),
                None,
            )
        }) {
            Ok(()) => self.filter(&r.ruleset).await,
            Err(e) => Err(e),
        };
        let result = result.map(|filter| {
            self.state
                .pipeline
                .engine()
                .zero_counters(filter.as_deref());
        });
        self.state
            .audit(caller, "CounterService/ZeroCounters", &r, &result)
            .await;
        result?;
        Ok(Response::new(pb::ZeroCountersResponse {}))
    }
}
