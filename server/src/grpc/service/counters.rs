//! `vallum.v1.CounterService`: per-rule counters of the active snapshot.
//!
//! A request naming a ruleset that does not exist (neither in the engine nor in the store) is
//! NOT_FOUND, for GetCounters and ZeroCounters alike; an empty name means every ruleset. A
//! stored ruleset with no active revision has no counters (an empty answer). ZeroCounters is
//! an admin mutation and writes an audit record (`CounterService/ZeroCounters`), refused calls
//! included.
//!
//! GetCounters pages by offset into the snapshot's counters (they have no key that stays put
//! when a revision changes); the token carries a digest of the active revisions, and a page
//! asked for after a commit changed them is ABORTED ([`Error::ListChanged`]) rather than a
//! listing that skips or repeats rules.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::counter_service_server::CounterService;

use vallum_engine::model::{Family, Hook, TableKind};

use super::State;
use super::paging::{self, Page, Paging};
use crate::control::content::nft::NftRuleRefs;
use crate::error::{Error, Result};
use crate::grpc::auth::Op;
use crate::grpc::call::{self, Digest, Priority, Spec, Target};
use crate::grpc::convert;

/// How GetCounters pages: a counter is ~100 bytes, so a full page is ~1 MB.
pub const COUNTERS_PAGING: Paging = Paging {
    method: "GetCounters",
    default: 1000,
    max: 10_000,
};

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

    /// ZeroCounters' own work, once the layer let it through: every counter of the rulesets
    /// (or of the one named), or of one table, chain or rule of it.
    ///
    /// Errors: as [`CountersApi::filter`], [`scope`] and [`check_scope`].
    async fn zero(&self, r: &pb::ZeroCountersRequest) -> Result<pb::ZeroCountersResponse> {
        let filter = self.filter(&r.ruleset).await?;
        let engine = self.state.pipeline.engine();
        match (&filter, scope(r)?) {
            (Some(name), Some((family, table, chain))) => {
                check_scope(engine, name, family, table, chain.as_deref(), r.rule)?;
                let rule = (r.rule != 0).then_some(r.rule);
                engine.zero_counters_in(name, family, table, chain.as_deref(), rule);
            }
            _ => engine.zero_counters(filter.as_deref()),
        }
        Ok(pb::ZeroCountersResponse {})
    }

    /// The ruleset a request names (`None`: every ruleset).
    ///
    /// Errors: [`Error::BadRequest`] for a malformed name, [`Error::NotFound`] when the
    /// ruleset is neither active nor stored, [`Error::Store`].
    /// Per active ruleset whose content is nft (only `only` when given): the nft rule each
    /// engine rule enforces ([`crate::control::pipeline::Pipeline::nft_rule_refs`]).
    ///
    /// Errors: [`Error::Store`]; [`Error::StoreCorrupt`] for a listing that does not lower.
    async fn nft_rules(
        &self,
        revisions: &std::collections::BTreeMap<String, vallum_engine::engine::ActiveRevision>,
        only: Option<&str>,
    ) -> Result<HashMap<String, NftRuleRefs>> {
        let mut out = HashMap::new();
        for (name, a) in revisions {
            if only.is_some_and(|o| o != name) {
                continue;
            }
            if let Some(refs) = self.state.pipeline.nft_rule_refs(name, a.revision).await? {
                out.insert(name.clone(), refs);
            }
        }
        Ok(out)
    }

    /// GetCounters of a revision (`rulesets/R/revisions/N` in `ruleset`): the counters of
    /// the shadow of that revision (running, or the last that ended), in the snapshot's
    /// order, paged by position (a page token names the shadow's start time, so a page of
    /// another shadow of the same revision is refused as LIST_CHANGED).
    ///
    /// Errors: INVALID_ARGUMENT at `ruleset`; NOT_FOUND (kind `shadow`) when the revision has
    /// no shadow report.
    fn shadow_counters(&self, name: &str, page: Page) -> Result<pb::GetCountersResponse> {
        let (ruleset, number) = convert::revision_name("ruleset", name)?;
        let (report, _) = self.state.pipeline.shadow_report(&ruleset)?;
        if report.revision != number {
            return Err(Error::NotFound {
                kind: "shadow",
                name: name.to_string(),
            });
        }
        let key = report.started_ns.to_string();
        let offset = match &page.cursor {
            None => 0,
            Some(c) => {
                let (k, n) = c.split_once(':').unwrap_or_default();
                let n: usize = n
                    .parse()
                    .map_err(|_| Error::invalid("page_token", "not a page token of GetCounters"))?;
                if k != key {
                    return Err(Error::ListChanged {
                        what: "the shadow",
                        detail: format!("{name} started again"),
                    });
                }
                n
            }
        };
        let pb = convert::shadow_report(&report, None, self.state.pipeline.clock());
        let (counters, more) = paging::fill(pb.counters.into_iter().skip(offset), page.size);
        let next_page_token = if more {
            COUNTERS_PAGING.token(name, &format!("{key}:{}", offset + counters.len()))
        } else {
            String::new()
        };
        Ok(pb::GetCountersResponse {
            counters,
            next_page_token,
        })
    }

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

/// What part of a ruleset a ZeroCounters request names: `None` for all of it (no table,
/// chain or rule given), else the family, the table (`None`: every table of the family) and
/// the chain.
///
/// Errors: INVALID_ARGUMENT at `table` for an unknown table name, at `rule` for a rule
/// without a chain.
type Scope = (Family, Option<TableKind>, Option<String>);

fn scope(r: &pb::ZeroCountersRequest) -> Result<Option<Scope>> {
    let family = convert::family_of("family", r.family)?;
    if r.table.is_empty() && r.chain.is_empty() && r.rule == 0 {
        return Ok(None);
    }
    let table = match r.table.as_str() {
        "" => None,
        t => Some(TableKind::from_name(t).ok_or_else(|| {
            Error::invalid(
                "table",
                format!("can't initialize iptables table `{t}': Table does not exist"),
            )
        })?),
    };
    if r.rule != 0 && r.chain.is_empty() {
        return Err(Error::invalid("rule", "a rule number needs a chain"));
    }
    let chain = (!r.chain.is_empty()).then(|| r.chain.clone());
    Ok(Some((family, table, chain)))
}

/// The chain (and rule) a scoped ZeroCounters names must exist in the active model of
/// `ruleset`.
///
/// Errors: NOT_FOUND for a missing chain (iptables: "No chain/target/match by that name"),
/// INVALID_ARGUMENT at `rule` past its end ("Index of counter too big").
fn check_scope(
    engine: &vallum_engine::engine::Engine,
    ruleset: &str,
    family: Family,
    table: Option<TableKind>,
    chain: Option<&str>,
    rule: u32,
) -> Result<()> {
    let Some(chain) = chain else { return Ok(()) };
    let model = engine.rulesets().remove(ruleset);
    let found = model.as_ref().and_then(|m| {
        m.tables
            .iter()
            .filter(|t| t.family == family && table.is_none_or(|k| k == t.kind))
            .find_map(|t| t.chain(chain))
    });
    // A builtin chain of a table the revision lacks exists, empty, as in the kernel.
    let builtin = Hook::from_chain_name(chain).is_some_and(|h| {
        table
            .unwrap_or(TableKind::Filter)
            .builtin_hooks()
            .contains(&h)
    });
    let rules = match found {
        Some(c) => c.rules.len(),
        None if builtin => 0,
        None => {
            return Err(Error::NotFound {
                kind: "chain",
                name: format!("rulesets/{ruleset}/chains/{chain}"),
            });
        }
    };
    if rule as usize > rules {
        return Err(Error::invalid(
            "rule",
            format!("Index of counter too big: chain {chain} has {rules} rule(s)"),
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl CounterService for CountersApi {
    async fn get_counters(
        &self,
        request: Request<pb::GetCountersRequest>,
    ) -> Result<Response<pb::GetCountersResponse>, Status> {
        call::read(&self.state, request, |request| async move {
            let r = request.into_inner();
            let page = COUNTERS_PAGING.page(r.page_size, &r.page_token, &r.ruleset)?;
            if r.ruleset.contains("/revisions/") {
                return Ok(Response::new(self.shadow_counters(&r.ruleset, page)?));
            }
            let filter = self.filter(&r.ruleset).await?;
            let engine = self.state.pipeline.engine();
            // The revisions and the counters from one snapshot: a commit between the two reads
            // would pair this page's offset with the other snapshot's rules.
            let (revisions, rulesets, all) = loop {
                let before = engine.revisions();
                let rulesets: Vec<_> = engine.rulesets().into_values().collect();
                let all = engine.counters();
                if engine.revisions() == before {
                    break (before, rulesets, all);
                }
            };
            let fingerprint: String = {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                for (name, a) in &revisions {
                    h.update(format!("{name}\0{}\0{}\0", a.revision, a.priority));
                }
                h.finalize()[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            };
            let offset = match &page.cursor {
                None => 0,
                Some(c) => {
                    let (fp, n) = c.split_once(':').unwrap_or_default();
                    let n: usize = n.parse().map_err(|_| {
                        Error::invalid("page_token", "not a page token of GetCounters")
                    })?;
                    if fp != fingerprint {
                        return Err(Error::ListChanged {
                            what: "the active revisions",
                            detail: format!(
                                "now {}",
                                revisions
                                    .iter()
                                    .map(|(n, a)| format!("rulesets/{n}/revisions/{}", a.revision))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        }
                        .into());
                    }
                    n
                }
            };
            let nft = self.nft_rules(&revisions, filter.as_deref()).await?;
            let items = all
                .into_iter()
                .filter(|c| filter.as_deref().is_none_or(|f| f == &*c.ruleset))
                .skip(offset)
                .map(|c| {
                    let nft_rule = c.rule.and_then(|n| {
                        nft.get(&*c.ruleset)?
                            .get(&(c.family, c.chain.to_string(), n))
                    });
                    let text = match c.rule {
                        Some(_) if nft_rule.is_some() => {
                            nft_rule.map(|r| r.text.clone()).unwrap_or_default()
                        }
                        Some(n) => convert::rule_text_of(
                            &rulesets, &c.ruleset, c.family, c.table, &c.chain, n,
                        )
                        .unwrap_or_default(),
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
                        nft_rule: nft_rule.map_or(0, |r| r.position),
                    }
                });
            let (counters, more) = paging::fill(items, page.size);
            let next_page_token = if more {
                COUNTERS_PAGING.token(
                    &r.ruleset,
                    &format!("{fingerprint}:{}", offset + counters.len()),
                )
            } else {
                String::new()
            };
            Ok(Response::new(pb::GetCountersResponse {
                counters,
                next_page_token,
            }))
        })
        .await
    }

    async fn zero_counters(
        &self,
        request: Request<pb::ZeroCountersRequest>,
    ) -> Result<Response<pb::ZeroCountersResponse>, Status> {
        let spec = Spec {
            method: "CounterService/ZeroCounters",
            op: Op::Counters,
            targets: |r: &pb::ZeroCountersRequest| {
                Ok(vec![match r.ruleset.is_empty() {
                    true => Target::every("rulesets/*"),
                    false => Target::ruleset(
                        convert::ruleset_id("ruleset", &r.ruleset)?,
                        Priority::Unchecked,
                    ),
                }])
            },
            digest: Digest::Inline,
            refused: false,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |_, r| {
            Box::pin(async move { api.zero(&r).await })
        })
        .await
    }
}
