//! `vallum.v1.SetService`: ipset-style sets (create, destroy, add/delete elements, list, get,
//! flush, swap, `ipset save` import and export), without a ruleset commit. A thin adapter:
//! requests are converted in [`crate::grpc::convert::sets`], the work (checks, durable store
//! transaction, publish in the engine) is in [`crate::control::pipeline::sets`]. Every call
//! runs through the one handler layer ([`crate::grpc::call`]): NOT_READY until the stored sets
//! are loaded (reads too: before that the registry is empty); mutating calls need scope
//! `ops=sets` over the sets they name, are audited like the RulesetService's, take a
//! `request_id` (idempotent, as [`State::idempotent`]) and, those that change one or two
//! named sets, their `etag`s.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::set_service_server::SetService;

use super::State;
use super::paging::{self, Paging};
use crate::control::pipeline::sets::check_set_name;
use crate::error::{Error, Result};
use crate::grpc::auth::Op;
use crate::grpc::call::{self, Digest, Mutation, Spec, Target};
use crate::grpc::convert::sets::{create_spec, element_inputs, element_pb, set_pb};

/// How ListSets pages (by name).
pub const LIST_SETS: Paging = Paging {
    method: "ListSets",
    default: 100,
    max: 1000,
};

/// How GetSet pages its elements (offsets into the sorted elements).
pub const GET_SET: Paging = Paging {
    method: "GetSet",
    default: 1000,
    max: 10_000,
};

/// The SetService implementation.
#[derive(Debug, Clone)]
pub struct SetApi {
    state: Arc<State>,
}

impl SetApi {
    /// The service over shared state.
    pub fn new(state: Arc<State>) -> Self {
        SetApi { state }
    }

    async fn header(&self, name: &str) -> Result<pb::Set> {
        let p = &self.state.pipeline;
        let not_found = || Error::NotFound {
            kind: "set",
            name: format!("sets/{name}"),
        };
        let s = p.sets().summary(name).ok_or_else(not_found)?;
        let etag = p.store().set_etag(name).await?.unwrap_or_default();
        Ok(set_pb(&s, p.set_references(name), etag))
    }

    /// Runs a mutating call through the one handler layer ([`call::mutate`]): scope
    /// `ops=sets` over the sets the request names ([`SetNames`]), then `f` (once per
    /// `request_id`), then the audit record as `method`.
    async fn mutate<R, M, F, Fut>(
        &self,
        method: &'static str,
        request: Request<R>,
        f: F,
    ) -> Result<M, Status>
    where
        R: Mutation + SetNames,
        M: prost::Message + Default + Send + 'static,
        F: FnOnce(SetApi, Arc<R>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<M>> + Send + 'static,
    {
        let spec = Spec {
            method,
            op: Op::Sets,
            targets: set_targets::<R>,
            digest: Digest::Inline,
            refused: false,
        };
        let api = self.clone();
        let r = call::mutate(&self.state, spec, request, move |_, r| Box::pin(f(api, r))).await?;
        Ok(r.into_inner())
    }
}

/// The set names a mutating request names, for the caller's scope (`ops=sets` and
/// `rulesets=` names). ImportIpsetSave names its sets inside the text: it needs a scope
/// that covers every name (`None`).
pub trait SetNames {
    /// The named sets (raw request fields), or `None` when the request may touch any set.
    fn set_names(&self) -> Option<Vec<&str>>;
}

macro_rules! set_names {
    ($($t:ty => |$r:ident| $e:expr;)*) => {$(
        impl SetNames for $t {
            fn set_names(&self) -> Option<Vec<&str>> {
                let $r = self;
                $e
            }
        }
    )*};
}

/// A request's etag field: `None` when empty (not checked).
fn etag(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

set_names! {
    pb::CreateSetRequest => |r| Some(vec![r.name.as_str()]);
    pb::DestroySetRequest => |r| Some(vec![r.name.as_str()]);
    pb::AddElementsRequest => |r| Some(vec![r.set.as_str()]);
    pb::DeleteElementsRequest => |r| Some(vec![r.set.as_str()]);
    pb::FlushSetRequest => |r| Some(vec![r.name.as_str()]);
    pb::SwapSetsRequest => |r| Some(vec![r.name.as_str(), r.other_name.as_str()]);
    pb::ImportIpsetSaveRequest => |_r| None;
}

/// The layer's [`Target`]s of a set change (see [`SetNames`]); an optional `sets/` prefix
/// is taken off.
fn set_targets<R: SetNames>(r: &R) -> Result<Vec<Target>> {
    Ok(match r.set_names() {
        None => vec![Target::every("sets/*")],
        Some(names) => names
            .into_iter()
            .map(|n| Target::set(n.strip_prefix("sets/").unwrap_or(n)))
            .collect(),
    })
}

/// A set name from a request field (an optional `sets/` prefix is accepted).
fn set_name(field: &str, s: &str) -> Result<String> {
    let s = s.strip_prefix("sets/").unwrap_or(s);
    check_set_name(field, s)?;
    Ok(s.to_string())
}

#[tonic::async_trait]
impl SetService for SetApi {
    async fn create_set(
        &self,
        request: Request<pb::CreateSetRequest>,
    ) -> Result<Response<pb::Set>, Status> {
        let set = self
            .mutate(
                "CreateSet",
                request,
                |api: SetApi, r: Arc<pb::CreateSetRequest>| async move {
                    let (name, spec) = create_spec(&r)?;
                    api.state.pipeline.create_set(&name, spec, r.exist).await?;
                    api.header(&name).await
                },
            )
            .await?;
        Ok(Response::new(set))
    }

    async fn destroy_set(
        &self,
        request: Request<pb::DestroySetRequest>,
    ) -> Result<Response<pb::DestroySetResponse>, Status> {
        let r = self
            .mutate(
                "DestroySet",
                request,
                |api: SetApi, r: Arc<pb::DestroySetRequest>| async move {
                    let name = set_name("name", &r.name)?;
                    api.state.pipeline.destroy_set(&name, etag(&r.etag)).await?;
                    Ok(pb::DestroySetResponse {})
                },
            )
            .await?;
        Ok(Response::new(r))
    }

    async fn add_elements(
        &self,
        request: Request<pb::AddElementsRequest>,
    ) -> Result<Response<pb::AddElementsResponse>, Status> {
        let r = self
            .mutate(
                "AddElements",
                request,
                |api: SetApi, r: Arc<pb::AddElementsRequest>| async move {
                    let name = set_name("set", &r.set)?;
                    let inputs = element_inputs("elements", &r.elements)?;
                    let c = api
                        .state
                        .pipeline
                        .add_elements(&name, "elements", &inputs, r.exist, etag(&r.etag))
                        .await?;
                    Ok(pb::AddElementsResponse {
                        added: c.changed,
                        entries: c.entries,
                    })
                },
            )
            .await?;
        Ok(Response::new(r))
    }

    async fn delete_elements(
        &self,
        request: Request<pb::DeleteElementsRequest>,
    ) -> Result<Response<pb::DeleteElementsResponse>, Status> {
        let r = self
            .mutate(
                "DeleteElements",
                request,
                |api: SetApi, r: Arc<pb::DeleteElementsRequest>| async move {
                    let name = set_name("set", &r.set)?;
                    let inputs = element_inputs("elements", &r.elements)?;
                    let c = api
                        .state
                        .pipeline
                        .delete_elements(&name, "elements", &inputs, r.exist, etag(&r.etag))
                        .await?;
                    Ok(pb::DeleteElementsResponse {
                        deleted: c.changed,
                        entries: c.entries,
                    })
                },
            )
            .await?;
        Ok(Response::new(r))
    }

    async fn list_sets(
        &self,
        request: Request<pb::ListSetsRequest>,
    ) -> Result<Response<pb::ListSetsResponse>, Status> {
        call::read(&self.state, request, |request| async move {
            let r = request.into_inner();
            let page = LIST_SETS.page(r.page_size, &r.page_token, "")?;
            let p = &self.state.pipeline;
            let mut etags = p.store().set_etags().await?;
            let mut summaries = p.sets().summaries();
            summaries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            let (sets, more) = paging::fill(
                summaries
                    .iter()
                    .filter(|s| page.cursor.as_deref().is_none_or(|c| *s.name > *c))
                    .map(|s| {
                        let etag = etags.remove(&s.name).unwrap_or_default();
                        set_pb(s, p.set_references(&s.name), etag)
                    }),
                page.size,
            );
            let next_page_token = match sets.last() {
                Some(last) if more => LIST_SETS.token("", &last.name),
                _ => String::new(),
            };
            Ok(Response::new(pb::ListSetsResponse {
                sets,
                next_page_token,
            }))
        })
        .await
    }

    async fn get_set(
        &self,
        request: Request<pb::GetSetRequest>,
    ) -> Result<Response<pb::GetSetResponse>, Status> {
        call::read(&self.state, request, |request| async move {
            let r = request.into_inner();
            let name = set_name("name", &r.name)?;
            let page = GET_SET.page(r.page_size, &r.page_token, &name)?;
            let start: usize = match &page.cursor {
                None => 0,
                Some(c) => c
                    .parse()
                    .map_err(|_| Error::invalid("page_token", "not a page token of GetSet"))?,
            };
            let header = self.header(&name).await?;
            let info = self.state.pipeline.get_set(&name)?;
            let (elements, more) =
                paging::fill(info.elements.iter().skip(start).map(element_pb), page.size);
            let next_page_token = if more {
                GET_SET.token(&name, &(start + elements.len()).to_string())
            } else {
                String::new()
            };
            Ok(Response::new(pb::GetSetResponse {
                set: Some(header),
                elements,
                next_page_token,
            }))
        })
        .await
    }

    async fn flush_set(
        &self,
        request: Request<pb::FlushSetRequest>,
    ) -> Result<Response<pb::FlushSetResponse>, Status> {
        let r = self
            .mutate(
                "FlushSet",
                request,
                |api: SetApi, r: Arc<pb::FlushSetRequest>| async move {
                    let name = set_name("name", &r.name)?;
                    api.state.pipeline.flush_set(&name, etag(&r.etag)).await?;
                    Ok(pb::FlushSetResponse {})
                },
            )
            .await?;
        Ok(Response::new(r))
    }

    async fn swap_sets(
        &self,
        request: Request<pb::SwapSetsRequest>,
    ) -> Result<Response<pb::SwapSetsResponse>, Status> {
        let r = self
            .mutate(
                "SwapSets",
                request,
                |api: SetApi, r: Arc<pb::SwapSetsRequest>| async move {
                    let from = set_name("name", &r.name)?;
                    let to = set_name("other_name", &r.other_name)?;
                    let etags = [etag(&r.etag), etag(&r.other_etag)];
                    api.state.pipeline.swap_sets(&from, &to, etags).await?;
                    Ok(pb::SwapSetsResponse {})
                },
            )
            .await?;
        Ok(Response::new(r))
    }

    async fn import_ipset_save(
        &self,
        request: Request<pb::ImportIpsetSaveRequest>,
    ) -> Result<Response<pb::ImportIpsetSaveResponse>, Status> {
        let r = self
            .mutate(
                "ImportIpsetSave",
                request,
                |api: SetApi, r: Arc<pb::ImportIpsetSaveRequest>| async move {
                    let filename = crate::grpc::convert::filename("filename", &r.filename)?;
                    let (lines, sets) = api
                        .state
                        .pipeline
                        .import_sets("text", &filename, &r.text)
                        .await?;
                    Ok(pb::ImportIpsetSaveResponse {
                        lines: lines as u64,
                        sets,
                    })
                },
            )
            .await?;
        Ok(Response::new(r))
    }

    async fn export_ipset_save(
        &self,
        request: Request<pb::ExportIpsetSaveRequest>,
    ) -> Result<Response<pb::ExportIpsetSaveResponse>, Status> {
        call::read(&self.state, request, |request| async move {
            let r = request.into_inner();
            let name = if r.name.is_empty() {
                None
            } else {
                Some(set_name("name", &r.name)?)
            };
            let text = self.state.pipeline.export_sets(name.as_deref())?;
            Ok(Response::new(pb::ExportIpsetSaveResponse { text }))
        })
        .await
    }
}
