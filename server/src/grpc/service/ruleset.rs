//! `vallum.v1.RulesetService`: validate, stage, commit, confirm, apply, edit, rollback,
//! update, delete, read, diff, export and watch. Every method runs through the one handler
//! layer ([`crate::grpc::call`]: ready, caller, grant, idempotency, audit, refused); this
//! file says, per method, what the layer does for it ([`Spec`]: the audit name, the scope
//! operation, the ruleset it touches) and hands the method's own work to
//! `ruleset/commit.rs` (the mutating methods) or `ruleset/read.rs` (the rest, and the
//! revision diff). `RulesetApi::check`, the parse of a request's source, is shared by
//! both.

use std::pin::Pin;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::ruleset_service_server::RulesetService;

use super::State;
use super::paging::Paging;
use crate::control::content::{self, RulesetInput};
use crate::error::{Error, Result};
use crate::grpc::auth::Op;
use crate::grpc::call::{self, Digest, Priority, Spec, Target};
use crate::grpc::convert;

mod commit;
mod read;
mod shadow;

pub use read::diff;

/// How ListRulesets pages (by name).
pub const LIST_RULESETS: Paging = Paging {
    method: "ListRulesets",
    default: 100,
    max: 1000,
};

/// How ListRevisions pages (by number).
pub const LIST_REVISIONS: Paging = Paging {
    method: "ListRevisions",
    default: 100,
    max: 1000,
};

/// The longest noflush text (bytes) applied to the active model that a call checks on its
/// own async worker rather than on a blocking thread (see [`RulesetApi::check`]): about a
/// hundred rules, checked in well under a millisecond.
const INLINE_CHECK_BYTES: usize = 8 * 1024;

/// The RulesetService implementation.
#[derive(Debug, Clone)]
pub struct RulesetApi {
    state: Arc<State>,
}

impl RulesetApi {
    /// The service over shared state.
    pub fn new(state: Arc<State>) -> Self {
        RulesetApi { state }
    }

    /// Parses a request's source for ruleset `name` (validation is the commit's, or
    /// [`crate::control::pipeline::Pipeline::validate`] for a dry run). With `noflush` the text is
    /// applied to the ruleset's active revision (empty tables when it has none), as
    /// `iptables-restore --noflush` applies to the kernel's live tables; the second value is
    /// then the etag the commit must still see (the ruleset's when the base was read, `""`
    /// for a ruleset that does not exist yet), so that a commit in between is refused
    /// (ETAG_MISMATCH) rather than undone by the merged revision.
    ///
    /// The ruleset's row comes from `stored` (read there when the call has not read it yet),
    /// so a call reads it once whatever number of its steps need it.
    ///
    /// Errors: as [`content::check_with`]; with `noflush`, [`Error::EtagMismatch`] when
    /// `etag` is given and is not the ruleset's; [`Error::Store`] for the row.
    async fn check(
        &self,
        name: &str,
        priority: i32,
        source: Option<&pb::RulesetSource>,
        etag: &str,
        stored: &mut Stored,
    ) -> Result<(content::Checked, Option<String>)> {
        let source =
            source.ok_or_else(|| Error::invalid("source", "a ruleset source is required"))?;
        let input = RulesetInput::try_from(source)?;
        let (noflush, counters) = convert::restore_flags(source);
        let mut expected_etag = None;
        let base = if noflush {
            let store = self.state.pipeline.store();
            let row = stored.get(&self.state, name).await?;
            if let Some(rs) = &row {
                if !etag.is_empty() && etag != rs.etag {
                    return Err(Error::EtagMismatch {
                        name: format!("rulesets/{name}"),
                        given: etag.to_string(),
                        current: rs.etag.clone(),
                    });
                }
            }
            expected_etag = Some(row.as_ref().map(|r| r.etag.clone()).unwrap_or_default());
            let active = row.as_ref().and_then(|r| r.active_revision);
            Some(match active {
                Some(n) => {
                    // The engine's model of that revision, when it runs it: the text is then
                    // applied to it (a one-rule edit costs one rule, not a parse of the base).
                    let pipeline = &self.state.pipeline;
                    let model = pipeline
                        .active_model(name)
                        .filter(|(m, _)| *m == n)
                        .map(|(_, model)| model);
                    // Its text as the last commit left it in memory, else from the store.
                    let content = match pipeline.active_content(name, n) {
                        Some(c) => c,
                        None => {
                            store
                                .get_revision(name, n)
                                .await?
                                .ok_or_else(|| {
                                    Error::store_corrupt(format!(
                                        "active revision {n} of {name} is not stored"
                                    ))
                                })?
                                .content
                        }
                    };
                    content::Base {
                        content,
                        label: format!("rulesets/{name}/revisions/{n}"),
                        model,
                    }
                }
                // Empty tables, known to be empty: a command that names a chain or rule that
                // does not exist fails (`restore::parse_onto`).
                None => content::Base {
                    content: Arc::default(),
                    label: format!("rulesets/{name} (no active revision)"),
                    model: Some(Arc::new(vallum_engine::model::Ruleset {
                        name: name.to_string(),
                        priority,
                        tables: Vec::new(),
                    })),
                },
            })
        } else {
            None
        };
        let onto_model = !counters && base.as_ref().is_some_and(|b| b.model.is_some());
        let text_len: usize = input.parts.iter().map(|p| p.text.len()).sum();
        let how = content::Restoring {
            counters,
            noflush: base,
        };
        let previous = self.state.pipeline.previous_parse(name);
        let limits = self.state.pipeline.limits().clone();
        let name = name.to_string();
        let run = move || {
            let mut checked = content::check_with(
                &name,
                priority,
                &input,
                previous.as_ref(),
                &how,
                Some(&limits),
            )?;
            // Kept by the pipeline after a commit, for the next check of this ruleset.
            checked.keep_sources(input);
            Ok((checked, expected_etag))
        };
        // A short noflush text applied to the active model (an EditRuleset, a drop-in
        // command) costs microseconds (its lines, and walks of the chains and of the chunk
        // list): here, as a hop to a blocking thread would cost about as much again. Parsing
        // and printing a whole ruleset takes milliseconds (~5 ms for 10k rules, ~1 ms to
        // parse again after a change of a few rules): off the async workers, which keep
        // serving other calls meanwhile.
        if onto_model && text_len <= INLINE_CHECK_BYTES {
            return run();
        }
        tokio::task::spawn_blocking(run)
            .await
            .map_err(|e| Error::TaskFailed {
                task: "check",
                source: e,
            })?
    }
}

/// A ruleset's stored row as one call read it: read at most once per call, by the first of
/// its steps that needs it ([`Stored::get`]; an EditRuleset's priority, the noflush base and
/// its etag, the unchanged-edit test), and the same row for all of them. A commit that came
/// in between is still caught: the call's commit expects the etag of this row.
#[derive(Debug, Default)]
pub(super) enum Stored {
    /// Not read yet.
    #[default]
    Unread,
    /// The row (`None`: no such ruleset).
    Read(Option<crate::control::store::RulesetRow>),
}

impl Stored {
    /// The row of ruleset `name` (`None`: no such ruleset), read from the store on the first
    /// call.
    ///
    /// Errors: [`Error::Store`].
    pub(super) async fn get(
        &mut self,
        state: &State,
        name: &str,
    ) -> Result<Option<crate::control::store::RulesetRow>> {
        if let Stored::Read(row) = self {
            return Ok(row.clone());
        }
        let row = state.pipeline.store().get_ruleset(name).await?;
        *self = Stored::Read(row.clone());
        Ok(row)
    }
}

/// A request's etag field: `None` when empty (not checked).
fn etag(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// The ruleset a request names in `field`, as the layer's one [`Target`].
///
/// Errors: INVALID_ARGUMENT at `field`.
fn ruleset_target(field: &str, value: &str, priority: Priority) -> Result<Vec<Target>> {
    Ok(vec![Target::ruleset(
        convert::ruleset_id(field, value)?,
        priority,
    )])
}

/// The ruleset of the revision a request names in `field` (`rulesets/NAME/revisions/N`).
///
/// Errors: INVALID_ARGUMENT at `field`.
fn revision_target(field: &str, value: &str) -> Result<Vec<Target>> {
    let (name, _) = convert::revision_name(field, value)?;
    Ok(vec![Target::ruleset(name, Priority::Stored)])
}

type WatchStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CommitEvent, Status>> + Send>>;

#[tonic::async_trait]
impl RulesetService for RulesetApi {
    async fn validate_ruleset(
        &self,
        request: Request<pb::ValidateRulesetRequest>,
    ) -> Result<Response<pb::ValidateRulesetResponse>, Status> {
        call::read(&self.state, request, |r| read::validate_ruleset(self, r)).await
    }

    async fn stage_revision(
        &self,
        request: Request<pb::StageRevisionRequest>,
    ) -> Result<Response<pb::Revision>, Status> {
        let spec = Spec {
            method: "StageRevision",
            op: Op::Apply,
            targets: |r: &pb::StageRevisionRequest| {
                ruleset_target("ruleset", &r.ruleset, Priority::Requested(r.priority))
            },
            digest: Digest::Parallel,
            refused: false,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |cx, r| {
            Box::pin(async move { commit::stage(&api, cx, &r).await })
        })
        .await
    }

    async fn commit_revision(
        &self,
        request: Request<pb::CommitRevisionRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        let spec = Spec {
            method: "CommitRevision",
            op: Op::Apply,
            targets: |r: &pb::CommitRevisionRequest| revision_target("name", &r.name),
            digest: Digest::Inline,
            refused: true,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |cx, r| {
            Box::pin(async move { commit::commit_revision(&api, cx, &r).await })
        })
        .await
    }

    async fn confirm_commit(
        &self,
        request: Request<pb::ConfirmCommitRequest>,
    ) -> Result<Response<pb::ConfirmCommitResponse>, Status> {
        let spec = Spec {
            method: "ConfirmCommit",
            op: Op::Apply,
            targets: |r: &pb::ConfirmCommitRequest| revision_target("name", &r.name),
            digest: Digest::Inline,
            refused: false,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |_, r| {
            Box::pin(async move { commit::confirm_commit(&api, &r).await })
        })
        .await
    }

    async fn apply(
        &self,
        request: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        let spec = Spec {
            method: "Apply",
            op: Op::Apply,
            targets: |r: &pb::ApplyRequest| {
                ruleset_target("ruleset", &r.ruleset, Priority::Requested(r.priority))
            },
            digest: Digest::Parallel,
            refused: true,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |cx, r| {
            Box::pin(async move { commit::apply(&api, cx, &r).await })
        })
        .await
    }

    async fn edit_ruleset(
        &self,
        request: Request<pb::EditRulesetRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        let spec = Spec {
            method: "EditRuleset",
            op: Op::Apply,
            // An edit keeps the ruleset's priority.
            targets: |r: &pb::EditRulesetRequest| {
                ruleset_target("ruleset", &r.ruleset, Priority::Stored)
            },
            digest: Digest::Inline,
            refused: true,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |cx, r| {
            Box::pin(async move { commit::edit_ruleset(&api, cx, &r).await })
        })
        .await
    }

    async fn rollback(
        &self,
        request: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        let spec = Spec {
            method: "Rollback",
            op: Op::Apply,
            targets: |r: &pb::RollbackRequest| revision_target("name", &r.name),
            digest: Digest::Inline,
            refused: true,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |cx, r| {
            Box::pin(async move { commit::rollback(&api, cx, &r).await })
        })
        .await
    }

    async fn get_ruleset(
        &self,
        request: Request<pb::GetRulesetRequest>,
    ) -> Result<Response<pb::Ruleset>, Status> {
        call::read(&self.state, request, |r| read::get_ruleset(self, r)).await
    }

    async fn update_ruleset(
        &self,
        request: Request<pb::UpdateRulesetRequest>,
    ) -> Result<Response<pb::Ruleset>, Status> {
        let spec = Spec {
            method: "UpdateRuleset",
            op: Op::Apply,
            targets: |r: &pb::UpdateRulesetRequest| {
                let (given, name, fields) = commit::update_target(r)?;
                let priority = match fields.priority {
                    true => Priority::Requested(given.priority),
                    false => Priority::Stored,
                };
                Ok(vec![Target::ruleset(name, priority)])
            },
            digest: Digest::Inline,
            refused: false,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |cx, r| {
            Box::pin(async move { commit::update_ruleset(&api, cx, &r).await })
        })
        .await
    }

    async fn list_rulesets(
        &self,
        request: Request<pb::ListRulesetsRequest>,
    ) -> Result<Response<pb::ListRulesetsResponse>, Status> {
        call::read(&self.state, request, |r| read::list_rulesets(self, r)).await
    }

    async fn delete_ruleset(
        &self,
        request: Request<pb::DeleteRulesetRequest>,
    ) -> Result<Response<pb::DeleteRulesetResponse>, Status> {
        let spec = Spec {
            method: "DeleteRuleset",
            op: Op::Apply,
            targets: |r: &pb::DeleteRulesetRequest| {
                ruleset_target("name", &r.name, Priority::Unchecked)
            },
            digest: Digest::Inline,
            refused: false,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |_, r| {
            Box::pin(async move { commit::delete_ruleset(&api, &r).await })
        })
        .await
    }

    async fn list_revisions(
        &self,
        request: Request<pb::ListRevisionsRequest>,
    ) -> Result<Response<pb::ListRevisionsResponse>, Status> {
        call::read(&self.state, request, |r| read::list_revisions(self, r)).await
    }

    async fn get_revision(
        &self,
        request: Request<pb::GetRevisionRequest>,
    ) -> Result<Response<pb::Revision>, Status> {
        call::read(&self.state, request, |r| read::get_revision(self, r)).await
    }

    async fn diff_revisions(
        &self,
        request: Request<pb::DiffRevisionsRequest>,
    ) -> Result<Response<pb::DiffRevisionsResponse>, Status> {
        call::read(&self.state, request, |r| read::diff_revisions(self, r)).await
    }

    async fn export_revision(
        &self,
        request: Request<pb::ExportRevisionRequest>,
    ) -> Result<Response<pb::ExportRevisionResponse>, Status> {
        call::read(&self.state, request, |r| read::export_revision(self, r)).await
    }

    type WatchCommitsStream = WatchStream;

    async fn watch_commits(
        &self,
        request: Request<pb::WatchCommitsRequest>,
    ) -> Result<Response<Self::WatchCommitsStream>, Status> {
        call::read(&self.state, request, |r| read::watch_commits(self, r)).await
    }

    async fn shadow_revision(
        &self,
        request: Request<pb::ShadowRevisionRequest>,
    ) -> Result<Response<pb::ShadowReport>, Status> {
        let spec = Spec {
            method: "ShadowRevision",
            op: Op::Apply,
            targets: |r: &pb::ShadowRevisionRequest| revision_target("name", &r.name),
            digest: Digest::Inline,
            refused: false,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |_, r| {
            Box::pin(async move { shadow::shadow_revision(&api, &r).await })
        })
        .await
    }

    async fn end_shadow(
        &self,
        request: Request<pb::EndShadowRequest>,
    ) -> Result<Response<pb::ShadowReport>, Status> {
        let spec = Spec {
            method: "EndShadow",
            op: Op::Apply,
            targets: |r: &pb::EndShadowRequest| {
                ruleset_target("ruleset", &r.ruleset, Priority::Stored)
            },
            digest: Digest::Inline,
            refused: false,
        };
        let api = self.clone();
        call::mutate(&self.state, spec, request, move |_, r| {
            Box::pin(async move { shadow::end_shadow(&api, &r).await })
        })
        .await
    }

    async fn get_shadow_report(
        &self,
        request: Request<pb::GetShadowReportRequest>,
    ) -> Result<Response<pb::ShadowReport>, Status> {
        call::read(&self.state, request, |r| async move {
            Ok(Response::new(shadow::get_shadow_report(self, r.get_ref())?))
        })
        .await
    }
}
