//! `vallum.v1.ConntrackService`: list, delete by filter and flush the engine's connection
//! table, and read its counters (as conntrack-tools' `conntrack -L`, `-D`, `-F`, `-S`).
//!
//! Every method runs through the one handler layer ([`crate::grpc::call`]). List and GetStats
//! are read-only; Delete and Flush need an admin token (scope `ops=conntrack`), are audited and
//! take a `request_id` (a retry returns the first call's count, see [`State::idempotent`]; no
//! etag: the table changes with every packet).
//! With conntrack off every call fails with FAILED_PRECONDITION (type `CONNTRACK`).

use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_engine::conntrack::{ConnFilter, Conntrack};
use vallum_proto::v1 as pb;
use vallum_proto::v1::conntrack_service_server::ConntrackService;

use super::State;
use super::paging::{self, Paging};
use crate::error::{Error, Result};
use crate::grpc::auth::Op;
use crate::grpc::call::{self, Digest, Mutation, Spec, Target};
use crate::grpc::convert;

/// How List pages: an entry is ~60 bytes.
pub const LIST_PAGING: Paging = Paging {
    method: "ConntrackService/List",
    default: 1000,
    max: 10_000,
};

/// The key entries are listed by and pages continue after: the original tuple and the zone
/// (unique per entry, as nf_conntrack's hash key).
type EntryKey = (std::net::IpAddr, std::net::IpAddr, u8, u16, u16, u16, u8);

fn entry_key(c: &vallum_engine::conntrack::ConnView) -> EntryKey {
    let o = &c.original;
    (
        o.src,
        o.dst,
        o.protocol,
        o.sport,
        o.dport,
        c.zone.id,
        c.zone.dirs,
    )
}

fn cursor_of(k: &EntryKey) -> String {
    format!("{} {} {} {} {} {} {}", k.0, k.1, k.2, k.3, k.4, k.5, k.6)
}

/// Errors: INVALID_ARGUMENT on `page_token`.
fn parse_cursor(s: &str) -> Result<EntryKey> {
    let bad = || Error::invalid("page_token", "not a page token of ConntrackService/List");
    let w: Vec<&str> = s.split(' ').collect();
    let [src, dst, proto, sport, dport, zone, dirs] = w[..] else {
        return Err(bad());
    };
    Ok((
        src.parse().map_err(|_| bad())?,
        dst.parse().map_err(|_| bad())?,
        proto.parse().map_err(|_| bad())?,
        sport.parse().map_err(|_| bad())?,
        dport.parse().map_err(|_| bad())?,
        zone.parse().map_err(|_| bad())?,
        dirs.parse().map_err(|_| bad())?,
    ))
}

/// How the layer runs Delete and Flush: scope `ops=conntrack` (the table is the host's, no
/// ruleset names it).
fn spec<R: Mutation>(method: &'static str) -> Spec<R> {
    Spec {
        method,
        op: Op::Conntrack,
        targets: |_| Ok(vec![Target::every("")]),
        digest: Digest::Inline,
        refused: false,
    }
}

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
        call::read(&self.state, request, |request| async move {
            let r = request.into_inner();
            let f = r.filter.unwrap_or_default();
            let page = LIST_PAGING.page(r.page_size, &r.page_token, &format!("{f:?}"))?;
            let after = page.cursor.as_deref().map(parse_cursor).transpose()?;
            let filter = convert::conntrack_filter("filter", &f)?;
            let table = self.table()?;
            let now = self.state.pipeline.now_ns();
            let all = table.list();
            let mut matched = 0u64;
            let mut rest: Vec<(EntryKey, &vallum_engine::conntrack::ConnView)> = Vec::new();
            for c in all.iter().filter(|c| filter.matches(c)) {
                matched += 1;
                let k = entry_key(c);
                if after.is_none_or(|a| k > a) {
                    rest.push((k, c));
                }
            }
            // The page's entries are the smallest keys after the cursor: a partial selection
            // (linear) and a sort of the page only, not of the whole table.
            let take = page.size + 1;
            if rest.len() > take {
                rest.select_nth_unstable_by(take - 1, |a, b| a.0.cmp(&b.0));
                rest.truncate(take);
            }
            rest.sort_unstable_by_key(|a| a.0);
            let keys: Vec<EntryKey> = rest.iter().map(|(k, _)| *k).collect();
            let (entries, more) = paging::fill(
                rest.iter().map(|(_, c)| convert::conntrack_entry(c, now)),
                page.size,
            );
            let next_page_token = match entries.len().checked_sub(1).map(|i| &keys[i]) {
                Some(last) if more => LIST_PAGING.token(&format!("{f:?}"), &cursor_of(last)),
                _ => String::new(),
            };
            Ok(Response::new(pb::ListConntrackResponse {
                entries,
                matched,
                next_page_token,
            }))
        })
        .await
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteConntrackRequest>,
    ) -> Result<Response<pb::DeleteConntrackResponse>, Status> {
        let api = self.clone();
        call::mutate(
            &self.state,
            spec("ConntrackService/Delete"),
            request,
            move |_, r| Box::pin(async move { api.delete(&r) }),
        )
        .await
    }

    async fn flush(
        &self,
        request: Request<pb::FlushConntrackRequest>,
    ) -> Result<Response<pb::FlushConntrackResponse>, Status> {
        let api = self.clone();
        call::mutate(
            &self.state,
            spec("ConntrackService/Flush"),
            request,
            move |_, _| {
                Box::pin(async move {
                    Ok(pb::FlushConntrackResponse {
                        deleted: api.table()?.flush() as u64,
                    })
                })
            },
        )
        .await
    }

    async fn get_stats(
        &self,
        _request: Request<pb::GetConntrackStatsRequest>,
    ) -> Result<Response<pb::ConntrackStats>, Status> {
        call::read(&self.state, _request, |_request| async move {
            Ok(Response::new(convert::conntrack_stats(self.table()?)))
        })
        .await
    }
}
