//! `vallum.v1.ConntrackService`: list, delete by filter and flush the engine's connection
//! table, and read its counters (as conntrack-tools' `conntrack -L`, `-D`, `-F`, `-S`).
//!
//! List and GetStats are read-only; Delete and Flush need an admin token, are audited and take
//! a `request_id` (a retry returns the first call's count, see [`State::idempotent`]; no
//! etag: the table changes with every packet).
//! With conntrack off every call fails with FAILED_PRECONDITION (type `CONNTRACK`).

use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_engine::conntrack::{ConnFilter, Conntrack};
use vallum_proto::v1 as pb;
use vallum_proto::v1::conntrack_service_server::ConntrackService;

use super::{State, audit_entry_of, request_digest};
use crate::auth::{Grant, Op};
use crate::error::{Error, Result};
use crate::{convert, hooks};

/// Entries List returns when the request leaves `limit` at 0.
pub const DEFAULT_LIST_LIMIT: u32 = 10_000;
/// The largest `limit` List accepts.
pub const MAX_LIST_LIMIT: u32 = 1_000_000;

/// The ConntrackService implementation.
#[derive(Debug, Clone)]
pub struct ConntrackApi {
    state: Arc<State>,
}

impl ConntrackApi {
    /// The service over shared state.
    pub fn new(state: Arc<State>) -> Self {
        ConntrackApi { state }
    }

    /// The table, or FAILED_PRECONDITION when conntrack is off.
    fn table(&self) -> Result<&Conntrack> {
        self.state
            .pipeline
            .engine()
            .conntrack()
            .ok_or_else(|| Error::Precondition {
                kind: "CONNTRACK",
                subject: "conntrack".into(),
                message: "conntrack is off (vallumd --conntrack-max 0)".into(),
            })
    }

    fn delete(&self, r: &pb::DeleteConntrackRequest) -> Result<pb::DeleteConntrackResponse> {
        let filter = convert::conntrack_filter("filter", &r.filter.clone().unwrap_or_default())?;
        if filter == ConnFilter::default() {
            return Err(Error::invalid(
                "filter",
                "an empty filter would delete every entry; use Flush for that",
            ));
        }
        let deleted = self.table()?.delete(|c| filter.matches(c));
        Ok(pb::DeleteConntrackResponse {
            deleted: deleted as u64,
        })
    }
}

#[tonic::async_trait]
impl ConntrackService for ConntrackApi {
    async fn list(
        &self,
        request: Request<pb::ListConntrackRequest>,
    ) -> Result<Response<pb::ListConntrackResponse>, Status> {
        let r = request.into_inner();
        let filter = convert::conntrack_filter("filter", &r.filter.unwrap_or_default())?;
        let limit = match r.limit {
            0 => DEFAULT_LIST_LIMIT,
            n if n <= MAX_LIST_LIMIT => n,
            n => {
                return Err(Error::invalid(
                    "limit",
                    format!("{n} is above the maximum {MAX_LIST_LIMIT}"),
                )
                .into());
            }
        } as usize;
        let table = self.table()?;
        let now = self.state.pipeline.now_ns();
        let mut matched = 0u64;
        let mut entries = Vec::new();
        for c in table.list().iter().filter(|c| filter.matches(c)) {
            matched += 1;
            if entries.len() < limit {
                entries.push(convert::conntrack_entry(c, now));
            }
        }
        Ok(Response::new(pb::ListConntrackResponse {
            entries,
            matched,
        }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteConntrackRequest>,
    ) -> Result<Response<pb::DeleteConntrackResponse>, Status> {
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        let method = "ConntrackService/Delete";
        let digest = request_digest(&r);
        let result = match grant.check(method, Op::Conntrack, None, None) {
            Ok(()) => {
                let call = async { ConntrackApi::delete(self, &r) };
                (self.state)
                    .idempotent(method, &r.request_id, &digest, call)
                    .await
            }
            Err(e) => Err(e),
        };
        let entry = audit_entry_of(caller, method, digest);
        self.state.audit_pending(Some(entry), &result).await;
        Ok(Response::new(result?))
    }

    async fn flush(
        &self,
        request: Request<pb::FlushConntrackRequest>,
    ) -> Result<Response<pb::FlushConntrackResponse>, Status> {
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        let method = "ConntrackService/Flush";
        let digest = request_digest(&r);
        let result = match grant.check(method, Op::Conntrack, None, None) {
            Ok(()) => {
                let call = async {
                    Ok(pb::FlushConntrackResponse {
                        deleted: self.table()?.flush() as u64,
                    })
                };
                (self.state)
                    .idempotent(method, &r.request_id, &digest, call)
                    .await
            }
            Err(e) => Err(e),
        };
        let entry = audit_entry_of(caller, method, digest);
        self.state.audit_pending(Some(entry), &result).await;
        Ok(Response::new(result?))
    }

    async fn get_stats(
        &self,
        _request: Request<pb::GetConntrackStatsRequest>,
    ) -> Result<Response<pb::ConntrackStats>, Status> {
        Ok(Response::new(convert::conntrack_stats(self.table()?)))
    }
}
