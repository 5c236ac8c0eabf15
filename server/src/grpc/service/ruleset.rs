//! `vallum.v1.RulesetService`: validate, stage, commit, confirm, apply, rollback, read, diff,
//! export and watch.
//!
//! Over 1,200 lines: each method still repeats the handlers' opening and closing (ready,
//! caller, grant, idempotency, audit, refused), which the one handler layer of issue #31
//! takes out; the file is split then, by method group.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tonic::{Request, Response, Status};
use vallum_engine::model::{Counters, Family, Ruleset, TableKind};
use vallum_engine::restore::{PrintOptions, print_rule_spec};
use vallum_proto::v1 as pb;
use vallum_proto::v1::ruleset_service_server::RulesetService;

use super::paging::{self, Paging};
use super::{State, audit_entry, audit_entry_of, request_digest, to_completion};
use crate::control::content::{self, Content, RulesetInput};
use crate::control::hooks;
use crate::error::{Error, Result};
use crate::grpc::auth::{Grant, Op};
use crate::grpc::convert;
use vallum_engine::echo::quoted;

/// The `iptables-restore --noflush` text of `EditRuleset`'s edits: each command is one line
/// of its family's text (`IPv4` first, `content_v6` after), in order, inside `*table` /
/// `COMMIT` blocks; a word with a space, a quote or a backslash is quoted as
/// iptables-restore reads it. The server applies it as Apply applies noflush text, so every
/// edit is checked against the active revision and all of them make one revision.
///
/// Errors: INVALID_ARGUMENT at `edits[i].args[0]` for a command other than
/// -A/-I/-D/-R/-N/-X/-F/-P/-E (their long forms too), at `edits[i].table` for an unknown
/// table, at `edits` when there is none.
fn edits_source(edits: &[pb::RuleCommand]) -> Result<pb::RulesetSource> {
    const TABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];
    const COMMANDS: [&str; 18] = [
        "-A",
        "--append",
        "-I",
        "--insert",
        "-D",
        "--delete",
        "-R",
        "--replace",
        "-N",
        "--new-chain",
        "-X",
        "--delete-chain",
        "-F",
        "--flush",
        "-P",
        "--policy",
        "-E",
        "--rename-chain",
    ];
    if edits.is_empty() {
        return Err(Error::invalid("edits", "at least one edit is required"));
    }
    let mut texts = [String::new(), String::new()];
    let mut open: [Option<&str>; 2] = [None, None];
    for (i, e) in edits.iter().enumerate() {
        let v6 = convert::family_of(&format!("edits[{i}].family"), e.family)? == Family::Ipv6;
        let k = usize::from(v6);
        let table = if e.table.is_empty() {
            "filter"
        } else {
            e.table.as_str()
        };
        if !TABLES.contains(&table) {
            return Err(Error::invalid(
                format!("edits[{i}].table"),
                format!("can't initialize iptables table `{table}': Table does not exist"),
            ));
        }
        let cmd = e.args.first().map(String::as_str).unwrap_or("");
        if !COMMANDS.contains(&cmd) {
            return Err(Error::invalid(
                format!("edits[{i}].args[0]"),
                format!(
                    "'{cmd}' is not an edit (one of -A -I -D -R -N -X -F -P -E; -C is a -D with validate_only)"
                ),
            ));
        }
        let text = &mut texts[k];
        if open[k] != Some(table) {
            if open[k].is_some() {
                text.push_str("COMMIT\n");
            }
            text.push('*');
            text.push_str(table);
            text.push('\n');
            open[k] = Some(table);
        }
        for (j, a) in e.args.iter().enumerate() {
            if j > 0 {
                text.push(' ');
            }
            if a.is_empty() || a.contains([' ', '\t', '"', '\\', '\'']) {
                text.push('"');
                for ch in a.chars() {
                    if ch == '"' || ch == '\\' {
                        text.push('\\');
                    }
                    text.push(ch);
                }
                text.push('"');
            } else {
                text.push_str(a);
            }
        }
        text.push('\n');
    }
    for (k, t) in texts.iter_mut().enumerate() {
        if open[k].is_some() {
            t.push_str("COMMIT\n");
        }
    }
    let [v4, v6] = texts;
    let (content, family, content_v6) = if v4.is_empty() {
        (v6, pb::Family::Ipv6, String::new())
    } else {
        (v4, pb::Family::Ipv4, v6)
    };
    Ok(pb::RulesetSource {
        source: Some(pb::ruleset_source::Source::Text(pb::RestoreText {
            content,
            family: family as i32,
            content_v6,
            filename: "edits".into(),
            noflush: true,
            counters: false,
        })),
    })
}

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
    /// The priority a scoped token's `min-priority` is checked against for `name`: the lower
    /// of the requested one and, when the ruleset exists, its stored one (a ruleset keeps the
    /// priority of its first stage, so committing to one created below the floor would put
    /// the caller's rules ahead of it). Reads the store only for a token with a floor.
    async fn scoped_priority(
        &self,
        grant: &Grant,
        name: &str,
        requested: Option<i32>,
    ) -> Result<Option<i32>> {
        if !grant.limits_priority() {
            return Ok(requested);
        }
        let stored = self
            .state
            .pipeline
            .store()
            .get_ruleset(name)
            .await?
            .map(|r| r.priority);
        Ok(match (requested, stored) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// Parses a request's source for ruleset `name` (validation is the commit's, or
    /// [`crate::control::pipeline::Pipeline::validate`] for a dry run). With `noflush` the text is
    /// applied to the ruleset's active revision (empty tables when it has none), as
    /// `iptables-restore --noflush` applies to the kernel's live tables; the second value is
    /// then the etag the commit must still see (the ruleset's when the base was read, `""`
    /// for a ruleset that does not exist yet), so that a commit in between is refused
    /// (ETAG_MISMATCH) rather than undone by the merged revision.
    ///
    /// Errors: as [`content::check_with`]; with `noflush`, [`Error::EtagMismatch`] when
    /// `etag` is given and is not the ruleset's.
    async fn check(
        &self,
        name: &str,
        priority: i32,
        source: Option<&pb::RulesetSource>,
        etag: &str,
    ) -> Result<(content::Checked, Option<String>)> {
        let source =
            source.ok_or_else(|| Error::invalid("source", "a ruleset source is required"))?;
        let input = RulesetInput::try_from(source)?;
        let (noflush, counters) = convert::restore_flags(source);
        let mut expected_etag = None;
        let base = if noflush {
            let store = self.state.pipeline.store();
            let row = store.get_ruleset(name).await?;
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
                        None => Arc::new(
                            store
                                .get_revision(name, n)
                                .await?
                                .ok_or_else(|| {
                                    Error::store_corrupt(format!(
                                        "active revision {n} of {name} is not stored"
                                    ))
                                })?
                                .content,
                        ),
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
        let how = content::Restoring {
            counters,
            noflush: base,
        };
        let previous = self.state.pipeline.previous_parse(name);
        let limits = self.state.pipeline.limits().clone();
        let name = name.to_string();
        // Parsing and printing a large ruleset takes milliseconds (~5 ms for 10k rules, ~1 ms
        // to parse again after a change of a few rules): off the async workers, which keep
        // serving other calls meanwhile.
        tokio::task::spawn_blocking(move || {
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
        })
        .await
        .map_err(|e| Error::TaskFailed {
            task: "check",
            source: e,
        })?
    }
    /// The body of `apply` (and of `edit_ruleset`, whose edits become a noflush Apply),
    /// run by [`to_completion`]; `method` names the call in the audit log and the
    /// idempotency keys; `digest` is the [`request_digest`] of the caller's own request when
    /// it is not `request` (EditRuleset's), made here otherwise.
    async fn apply_call(
        &self,
        request: Request<pb::ApplyRequest>,
        method: &'static str,
        digest: Option<String>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = Arc::new(request.into_inner());
        // The audit record (a sha256 of the ~0.5 MB encoded request for a 10k-rule ruleset) is
        // made on a second blocking thread while the text is parsed; no record for a dry run.
        let mut audit = match (&digest, r.validate_only) {
            (Some(d), false) => Some(audit_entry_of(caller.clone(), method, d.clone())),
            _ => None,
        };
        let mut digesting = (digest.is_none() && !r.validate_only).then(|| {
            let (r, caller) = (r.clone(), caller.clone());
            tokio::task::spawn_blocking(move || audit_entry(caller, method, &*r))
        });
        let result = async {
            let name = convert::ruleset_id("ruleset", &r.ruleset)?;
            grant.check(
                &format!("Apply rulesets/{name} priority {}", r.priority),
                Op::Apply,
                Some(&name),
                self.scoped_priority(&grant, &name, Some(r.priority))
                    .await?,
            )?;
            self.state.owners.check(&name)?;
            let within = convert::duration("confirm_within", r.confirm_within.as_ref())?;
            if r.validate_only {
                self.dry_run_etag(&name, &r.etag).await?;
                let (checked, _) = self
                    .check(&name, r.priority, r.source.as_ref(), &r.etag)
                    .await?;
                let checked = checked.refuse_empty(r.allow_empty)?;
                let checked = self.state.pipeline.validate(checked).await?;
                let warnings = checked.warnings();
                checked.into_valid()?;
                return Ok(pb::CommitResult {
                    revision: Some(preview_revision(&name, &warnings)),
                    ..Default::default()
                });
            }
            if r.request_id.is_empty() {
                return self
                    .apply_once(&r, &name, within, &caller, &mut digesting, &mut audit)
                    .await;
            }
            // A retry is told from a reuse by the request's digest: wait for it first (a
            // retry neither parses nor checks again: it gets the first answer).
            if let Some(t) = digesting.take() {
                audit = Some(t.await.map_err(|e| Error::TaskFailed {
                    task: "audit",
                    source: e,
                })?);
            }
            let digest = audit
                .as_ref()
                .map(|a| a.request_digest.clone())
                .unwrap_or_default();
            let once = self.apply_once(&r, &name, within, &caller, &mut digesting, &mut audit);
            self.state
                .idempotent(method, &r.request_id, &digest, once)
                .await
        }
        .await;
        if let Some(t) = digesting {
            // Refused before the check: the record was not joined yet.
            audit = Some(refused_audit(t, &caller, method).await);
        }
        if !r.validate_only {
            self.state.audit_pending(audit, &result).await;
            if let Err(e) = &result {
                let name = convert::ruleset_id("ruleset", &r.ruleset).ok();
                self.state.pipeline.refused(name.as_deref(), e).await;
            }
        }
        Ok(Response::new(result?))
    }

    /// One Apply of `r` to ruleset `name`: parse and check the source (while `digesting`
    /// makes the audit record, joined into `audit` after the check), then commit with
    /// `audit` (taken once it is durable with the commit).
    async fn apply_once(
        &self,
        r: &pb::ApplyRequest,
        name: &str,
        within: Option<std::time::Duration>,
        caller: &str,
        digesting: &mut Option<tokio::task::JoinHandle<crate::control::store::AuditEntry>>,
        audit: &mut Option<crate::control::store::AuditEntry>,
    ) -> Result<pb::CommitResult> {
        let checked = self
            .check(name, r.priority, r.source.as_ref(), &r.etag)
            .await;
        if let Some(t) = digesting.take() {
            *audit = Some(t.await.map_err(|e| Error::TaskFailed {
                task: "audit",
                source: e,
            })?);
        }
        let (checked, base_etag) = checked?;
        let checked = checked.refuse_empty(r.allow_empty)?;
        let expected = base_etag.unwrap_or_else(|| r.etag.clone());
        if let Some(same) = self.unchanged(r, name, within, &checked).await? {
            return Ok(same);
        }
        let c = self
            .state
            .pipeline
            .apply(checked, caller, &r.message, within, etag(&expected), audit)
            .await?;
        Ok(convert::commit_result(&c))
    }

    /// The etag check of a `validate_only` Apply or StageRevision, which the real call makes
    /// when it stores (a dry run says what the real call would say): a non-empty `etag` that
    /// is not the ruleset's is ETAG_MISMATCH, as is any for a ruleset that does not exist.
    ///
    /// Errors: [`Error::EtagMismatch`]; [`Error::Store`].
    async fn dry_run_etag(&self, name: &str, etag: &str) -> Result<()> {
        if etag.is_empty() {
            return Ok(());
        }
        let current = (self.state.pipeline.store().get_ruleset(name).await?)
            .map(|rs| rs.etag)
            .unwrap_or_default();
        if current == etag {
            return Ok(());
        }
        Err(Error::EtagMismatch {
            name: format!("rulesets/{name}"),
            given: etag.to_string(),
            current,
        })
    }

    /// A noflush Apply (an EditRuleset) whose result is the active revision's content, as
    /// iptables after an edit that changes nothing (`-F` of an empty chain, `-P` to the
    /// policy there is): the active revision and the ruleset's etag, and no new revision.
    /// `None` for any other call, and with `within` (a commit-confirmed is always made).
    async fn unchanged(
        &self,
        r: &pb::ApplyRequest,
        name: &str,
        within: Option<std::time::Duration>,
        checked: &content::Checked,
    ) -> Result<Option<pb::CommitResult>> {
        let noflush = r
            .source
            .as_ref()
            .is_some_and(|s| convert::restore_flags(s).0);
        if !noflush || within.is_some() {
            return Ok(None);
        }
        let store = self.state.pipeline.store();
        let Some(rs) = store.get_ruleset(name).await? else {
            return Ok(None);
        };
        let Some(n) = rs.active_revision else {
            return Ok(None);
        };
        // An edit that changed something (nearly every one) is told from the copy of the
        // active content in memory, without reading the revision's text from the store.
        if let Some(active) = self.state.pipeline.active_content(name, n) {
            if *active != checked.content {
                return Ok(None);
            }
        }
        let Some(rev) = store.get_revision(name, n).await? else {
            return Ok(None);
        };
        if rev.content != checked.content {
            return Ok(None);
        }
        Ok(Some(pb::CommitResult {
            revision: Some(convert::revision(&rev, false, &checked.warnings())),
            etag: rs.etag,
            ..Default::default()
        }))
    }

    /// The body of `commit_revision`, run by [`to_completion`].
    async fn commit_revision_call(
        &self,
        request: Request<pb::CommitRevisionRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        // No record for a dry run.
        let mut audit =
            (!r.validate_only).then(|| audit_entry(caller.clone(), "CommitRevision", &r));
        let result = async {
            let (name, n) = convert::revision_name("name", &r.name)?;
            grant.check(
                &format!("CommitRevision rulesets/{name}"),
                Op::Apply,
                Some(&name),
                self.scoped_priority(&grant, &name, None).await?,
            )?;
            self.state.owners.check(&name)?;
            let within = convert::duration("confirm_within", r.confirm_within.as_ref())?;
            if r.validate_only {
                let rev = self
                    .state
                    .pipeline
                    .store()
                    .get_revision(&name, n)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        kind: "revision",
                        name: r.name.clone(),
                    })?;
                let model = rev.content.to_ruleset(&name, 0)?;
                let v = self
                    .state
                    .pipeline
                    .engine()
                    .validate(&model, self.state.pipeline.sets().as_ref());
                if vallum_engine::validate::has_errors(&v) {
                    return Err(Error::invalid("name", "revision no longer validates"));
                }
                return Ok(pb::CommitResult {
                    revision: Some(convert::revision(&rev, false, &[])),
                    ..Default::default()
                });
            }
            let digest = audit.as_ref().map(|a| a.request_digest.clone());
            self.state
                .idempotent(
                    "CommitRevision",
                    &r.request_id,
                    &digest.unwrap_or_default(),
                    async {
                        let c = self
                            .state
                            .pipeline
                            .commit_staged(&name, n, within, etag(&r.etag), &mut audit)
                            .await?;
                        Ok(convert::commit_result(&c))
                    },
                )
                .await
        }
        .await;
        if !r.validate_only {
            self.state.audit_pending(audit, &result).await;
            if let Err(e) = &result {
                let name = convert::revision_name("name", &r.name).ok();
                let name = name.as_ref().map(|(n, _)| n.as_str());
                self.state.pipeline.refused(name, e).await;
            }
        }
        Ok(Response::new(result?))
    }

    /// The body of `rollback`, run by [`to_completion`].
    async fn rollback_call(
        &self,
        request: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        let mut audit = Some(audit_entry(caller.clone(), "Rollback", &r));
        let digest = audit.as_ref().map(|a| a.request_digest.clone());
        let result = async {
            let (name, n) = convert::revision_name("name", &r.name)?;
            grant.check(
                &format!("Rollback rulesets/{name}"),
                Op::Apply,
                Some(&name),
                self.scoped_priority(&grant, &name, None).await?,
            )?;
            self.state.owners.check(&name)?;
            self.state
                .idempotent(
                    "Rollback",
                    &r.request_id,
                    &digest.unwrap_or_default(),
                    async {
                        let c = self
                            .state
                            .pipeline
                            .rollback(&name, n, &caller, &r.message, etag(&r.etag), &mut audit)
                            .await?;
                        Ok(convert::commit_result(&c))
                    },
                )
                .await
        }
        .await;
        self.state.audit_pending(audit, &result).await;
        if let Err(e) = &result {
            let name = convert::revision_name("name", &r.name).ok();
            let name = name.as_ref().map(|(n, _)| n.as_str());
            self.state.pipeline.refused(name, e).await;
        }
        Ok(Response::new(result?))
    }

    /// The body of `delete_ruleset`, run by [`to_completion`].
    async fn delete_ruleset_call(
        &self,
        request: Request<pb::DeleteRulesetRequest>,
    ) -> Result<Response<pb::DeleteRulesetResponse>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        let digest = request_digest(&r);
        let result = async {
            let name = convert::ruleset_id("name", &r.name)?;
            grant.check(
                &format!("DeleteRuleset rulesets/{name}"),
                Op::Apply,
                Some(&name),
                None,
            )?;
            self.state.owners.check(&name)?;
            self.state
                .idempotent("DeleteRuleset", &r.request_id, &digest, async {
                    self.state.pipeline.delete(&name, etag(&r.etag)).await?;
                    Ok(pb::DeleteRulesetResponse {})
                })
                .await
        }
        .await;
        let entry = audit_entry_of(caller, "DeleteRuleset", digest);
        self.state.audit_pending(Some(entry), &result).await;
        Ok(Response::new(result?))
    }

    /// The body of `update_ruleset`, run by [`to_completion`].
    async fn update_ruleset_call(
        &self,
        request: Request<pb::UpdateRulesetRequest>,
    ) -> Result<Response<pb::Ruleset>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        let digest = request_digest(&r);
        // No record for a dry run; a priority commit writes it with the commit.
        let mut audit = (!r.validate_only)
            .then(|| audit_entry_of(caller.clone(), "UpdateRuleset", digest.clone()));
        let result = async {
            let given = r
                .ruleset
                .as_ref()
                .ok_or_else(|| Error::invalid("ruleset", "the ruleset to update is required"))?;
            let name = convert::ruleset_id("ruleset.name", &given.name)?;
            let fields = update_fields(r.update_mask.as_ref(), given)?;
            let priority = fields.priority.then_some(given.priority);
            grant.check(
                &format!(
                    "UpdateRuleset rulesets/{name}{}",
                    priority
                        .map(|p| format!(" priority {p}"))
                        .unwrap_or_default()
                ),
                Op::Apply,
                Some(&name),
                self.scoped_priority(&grant, &name, priority).await?,
            )?;
            self.state.owners.check(&name)?;
            let store = self.state.pipeline.store();
            let current = store
                .get_ruleset(&name)
                .await?
                .ok_or_else(|| Error::NotFound {
                    kind: "ruleset",
                    name: format!("rulesets/{name}"),
                })?;
            let (Some(priority), false) = (priority, r.validate_only) else {
                // Nothing to change, or a dry run: the ruleset as it is (or would be).
                if !given.etag.is_empty() && given.etag != current.etag {
                    return Err(Error::EtagMismatch {
                        name: format!("rulesets/{name}"),
                        given: given.etag.clone(),
                        current: current.etag,
                    });
                }
                let mut out = convert::ruleset(&current);
                if let Some(p) = priority {
                    out.priority = p;
                }
                return Ok(out);
            };
            self.state
                .idempotent("UpdateRuleset", &r.request_id, &digest, async {
                    let row = self
                        .state
                        .pipeline
                        .set_priority(&name, priority, &caller, etag(&given.etag), &mut audit)
                        .await?;
                    Ok(convert::ruleset(&row))
                })
                .await
        }
        .await;
        if !r.validate_only {
            self.state.audit_pending(audit, &result).await;
        }
        Ok(Response::new(result?))
    }
}

/// The `Ruleset` fields an UpdateRuleset changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct UpdateFields {
    priority: bool,
}

/// The fields `mask` names (AIP-134): `priority`, or `*` for every updatable one; without a
/// mask (or with no path), the fields of `given` that are set (non-zero).
///
/// Errors: INVALID_ARGUMENT at `update_mask.paths[i]` for a path that is not a field of
/// `Ruleset`, or one that cannot be updated (the name, the etag, output-only fields).
fn update_fields(
    mask: Option<&prost_types::FieldMask>,
    given: &pb::Ruleset,
) -> Result<UpdateFields> {
    const OUTPUT_ONLY: [&str; 5] = [
        "name",
        "etag",
        "active_revision",
        "latest_revision",
        "update_time",
    ];
    let paths = mask.map_or(&[][..], |m| m.paths.as_slice());
    if paths.is_empty() {
        return Ok(UpdateFields {
            priority: given.priority != 0,
        });
    }
    let mut fields = UpdateFields::default();
    for (i, path) in paths.iter().enumerate() {
        match path.as_str() {
            "priority" | "*" => fields.priority = true,
            p if OUTPUT_ONLY.contains(&p) => {
                return Err(Error::invalid(
                    format!("update_mask.paths[{i}]"),
                    format!(
                        "{} cannot be updated (identifying or output-only); updatable: priority",
                        quoted(p)
                    ),
                ));
            }
            p => {
                return Err(Error::invalid(
                    format!("update_mask.paths[{i}]"),
                    format!(
                        "{} is not a field of Ruleset; updatable: priority",
                        quoted(p)
                    ),
                ));
            }
        }
    }
    Ok(fields)
}

fn etag(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

type WatchStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CommitEvent, Status>> + Send>>;

#[tonic::async_trait]
impl RulesetService for RulesetApi {
    async fn validate_ruleset(
        &self,
        request: Request<pb::ValidateRulesetRequest>,
    ) -> Result<Response<pb::ValidateRulesetResponse>, Status> {
        let r = request.into_inner();
        let name = if r.ruleset.is_empty() {
            "validate".to_string()
        } else {
            convert::ruleset_id("ruleset", &r.ruleset)?
        };
        let (checked, _) = self.check(&name, 0, r.source.as_ref(), "").await?;
        let checked = self.state.pipeline.validate(checked).await?;
        Ok(Response::new(pb::ValidateRulesetResponse {
            valid: checked.valid(),
            violations: checked.findings.iter().map(convert::violation).collect(),
            rule_count: u32::try_from(checked.ruleset.rule_count()).unwrap_or(u32::MAX),
        }))
    }

    async fn stage_revision(
        &self,
        request: Request<pb::StageRevisionRequest>,
    ) -> Result<Response<pb::Revision>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        // No record (nor key) for a dry run.
        let digest = (!r.validate_only).then(|| request_digest(&r));
        let result = async {
            let name = convert::ruleset_id("ruleset", &r.ruleset)?;
            grant.check(
                &format!("StageRevision rulesets/{name} priority {}", r.priority),
                Op::Apply,
                Some(&name),
                self.scoped_priority(&grant, &name, Some(r.priority))
                    .await?,
            )?;
            self.state.owners.check(&name)?;
            let stage = async {
                let (checked, base_etag) = self
                    .check(&name, r.priority, r.source.as_ref(), &r.etag)
                    .await?;
                let checked = checked.refuse_empty(r.allow_empty)?;
                let expected = base_etag.unwrap_or_else(|| r.etag.clone());
                if r.validate_only {
                    self.dry_run_etag(&name, &expected).await?;
                    let checked = self.state.pipeline.validate(checked).await?;
                    let warnings = checked.warnings();
                    checked.into_valid()?;
                    return Ok(preview_revision(&name, &warnings));
                }
                let (_, rev, warnings) = self
                    .state
                    .pipeline
                    .stage(checked, &caller, &r.message, etag(&expected))
                    .await?;
                Ok(convert::revision(&rev, false, &warnings))
            };
            match &digest {
                // A retry neither parses nor checks again: it gets the first answer.
                Some(d) => {
                    self.state
                        .idempotent("StageRevision", &r.request_id, d, stage)
                        .await
                }
                None => stage.await,
            }
        }
        .await;
        if let Some(d) = digest {
            let entry = audit_entry_of(caller, "StageRevision", d);
            self.state.audit_pending(Some(entry), &result).await;
        }
        Ok(Response::new(result?))
    }

    async fn commit_revision(
        &self,
        request: Request<pb::CommitRevisionRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        // On a task of its own: a client that gives up cannot stop it half done.
        let api = self.clone();
        to_completion(async move { api.commit_revision_call(request).await }).await
    }

    async fn confirm_commit(
        &self,
        request: Request<pb::ConfirmCommitRequest>,
    ) -> Result<Response<pb::ConfirmCommitResponse>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let grant = Grant::of(&request);
        let r = request.into_inner();
        let digest = request_digest(&r);
        let result = async {
            let (name, n) = convert::revision_name("name", &r.name)?;
            grant.check(
                &format!("ConfirmCommit rulesets/{name}"),
                Op::Apply,
                Some(&name),
                self.scoped_priority(&grant, &name, None).await?,
            )?;
            self.state.owners.check(&name)?;
            self.state
                .idempotent("ConfirmCommit", &r.request_id, &digest, async {
                    let rev = self.state.pipeline.confirm(&name, n, etag(&r.etag)).await?;
                    Ok(pb::ConfirmCommitResponse {
                        revision: Some(convert::revision(&rev, false, &[])),
                    })
                })
                .await
        }
        .await;
        let entry = audit_entry_of(caller, "ConfirmCommit", digest);
        self.state.audit_pending(Some(entry), &result).await;
        Ok(Response::new(result?))
    }

    async fn apply(
        &self,
        request: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        // On a task of its own: a client that gives up cannot stop it half done.
        let api = self.clone();
        to_completion(async move { api.apply_call(request, "Apply", None).await }).await
    }

    async fn edit_ruleset(
        &self,
        request: Request<pb::EditRulesetRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        let (metadata, extensions, r) = request.into_parts();
        // The edits are the request: the audit record and a retry's comparison use them.
        let digest = request_digest(&r);
        let name = convert::ruleset_id("ruleset", &r.ruleset)?;
        let priority = match self.state.pipeline.store().get_ruleset(&name).await {
            Ok(Some(row)) => row.priority,
            Ok(None) => 0,
            Err(e) => return Err(e.into()),
        };
        let source = edits_source(&r.edits)?;
        let apply = pb::ApplyRequest {
            ruleset: r.ruleset,
            source: Some(source),
            message: r.message,
            priority,
            confirm_within: None,
            etag: r.etag,
            request_id: r.request_id,
            validate_only: r.validate_only,
            // As iptables: deleting the last rule leaves empty tables, not an error.
            allow_empty: true,
        };
        let api = self.clone();
        let request = Request::from_parts(metadata, extensions, apply);
        to_completion(async move { api.apply_call(request, "EditRuleset", Some(digest)).await })
            .await
    }

    async fn rollback(
        &self,
        request: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::CommitResult>, Status> {
        // On a task of its own: a client that gives up cannot stop it half done.
        let api = self.clone();
        to_completion(async move { api.rollback_call(request).await }).await
    }

    async fn get_ruleset(
        &self,
        request: Request<pb::GetRulesetRequest>,
    ) -> Result<Response<pb::Ruleset>, Status> {
        let r = request.into_inner();
        let name = convert::ruleset_id("name", &r.name)?;
        let rs = self.state.pipeline.store().get_ruleset(&name).await?;
        let rs = rs.ok_or_else(|| Error::NotFound {
            kind: "ruleset",
            name: format!("rulesets/{name}"),
        })?;
        Ok(Response::new(convert::ruleset(&rs)))
    }

    async fn update_ruleset(
        &self,
        request: Request<pb::UpdateRulesetRequest>,
    ) -> Result<Response<pb::Ruleset>, Status> {
        // On a task of its own: a priority commit cannot be stopped half done.
        let api = self.clone();
        to_completion(async move { api.update_ruleset_call(request).await }).await
    }

    async fn list_rulesets(
        &self,
        request: Request<pb::ListRulesetsRequest>,
    ) -> Result<Response<pb::ListRulesetsResponse>, Status> {
        let r = request.into_inner();
        let page = LIST_RULESETS.page(r.page_size, &r.page_token, "")?;
        let after = page.cursor.unwrap_or_default();
        let rows = self
            .state
            .pipeline
            .store()
            .list_rulesets_after(&after, page.size as u32 + 1)
            .await?;
        let (rulesets, more) = paging::fill(rows.iter().map(convert::ruleset), page.size);
        let next_page_token = match rulesets.len().checked_sub(1) {
            Some(last) if more => LIST_RULESETS.token("", &rows[last].name),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListRulesetsResponse {
            rulesets,
            next_page_token,
        }))
    }

    async fn delete_ruleset(
        &self,
        request: Request<pb::DeleteRulesetRequest>,
    ) -> Result<Response<pb::DeleteRulesetResponse>, Status> {
        // On a task of its own: a client that gives up cannot stop it half done.
        let api = self.clone();
        to_completion(async move { api.delete_ruleset_call(request).await }).await
    }

    async fn list_revisions(
        &self,
        request: Request<pb::ListRevisionsRequest>,
    ) -> Result<Response<pb::ListRevisionsResponse>, Status> {
        let r = request.into_inner();
        let name = convert::ruleset_id("ruleset", &r.ruleset)?;
        let page = LIST_REVISIONS.page(r.page_size, &r.page_token, &name)?;
        let after: u64 = match page.cursor {
            None => 0,
            Some(c) => c
                .parse()
                .map_err(|_| Error::invalid("page_token", "not a page token of ListRevisions"))?,
        };
        let store = self.state.pipeline.store();
        if store.get_ruleset(&name).await?.is_none() {
            return Err(Error::NotFound {
                kind: "ruleset",
                name: format!("rulesets/{name}"),
            }
            .into());
        }
        let revs = store
            .list_revisions(&name, after, page.size as u32 + 1)
            .await?;
        let (revisions, more) = paging::fill(
            revs.iter().map(|r| convert::revision(r, false, &[])),
            page.size,
        );
        let next_page_token = match revisions.last() {
            Some(last) if more => LIST_REVISIONS.token(&name, &last.number.to_string()),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListRevisionsResponse {
            next_page_token,
            revisions,
        }))
    }

    async fn get_revision(
        &self,
        request: Request<pb::GetRevisionRequest>,
    ) -> Result<Response<pb::Revision>, Status> {
        let r = request.into_inner();
        let (name, n) = convert::revision_name("name", &r.name)?;
        let rev = self.state.pipeline.store().get_revision(&name, n).await?;
        let rev = rev.ok_or_else(|| Error::NotFound {
            kind: "revision",
            name: r.name.clone(),
        })?;
        Ok(Response::new(convert::revision(&rev, true, &[])))
    }

    async fn diff_revisions(
        &self,
        request: Request<pb::DiffRevisionsRequest>,
    ) -> Result<Response<pb::DiffRevisionsResponse>, Status> {
        let r = request.into_inner();
        let (a, an) = convert::revision_name("base", &r.base)?;
        let (b, bn) = convert::revision_name("target", &r.target)?;
        if a != b {
            return Err(
                Error::invalid("target", "both revisions must belong to the same ruleset").into(),
            );
        }
        let store = self.state.pipeline.store();
        let load = |n: u64, field: &'static str| {
            let a = a.clone();
            async move {
                let rev = store
                    .get_revision(&a, n)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        kind: "revision",
                        name: convert::revision_resource(&a, n),
                    });
                let _ = field;
                rev?.content.to_ruleset(&a, 0)
            }
        };
        let from = load(an, "base").await?;
        let to = load(bn, "target").await?;
        Ok(Response::new(pb::DiffRevisionsResponse {
            chains: diff(&from, &to),
        }))
    }

    async fn export_revision(
        &self,
        request: Request<pb::ExportRevisionRequest>,
    ) -> Result<Response<pb::ExportRevisionResponse>, Status> {
        let r = request.into_inner();
        let (name, n) = convert::revision_name("name", &r.name)?;
        let rev = self.state.pipeline.store().get_revision(&name, n).await?;
        let rev = rev.ok_or_else(|| Error::NotFound {
            kind: "revision",
            name: r.name.clone(),
        })?;
        let mut model = rev.content.to_ruleset(&name, 0)?;
        let live =
            r.counters && self.state.pipeline.active().get(&name).map(|x| x.revision) == Some(n);
        if live {
            fill_counters(&mut model, &self.state.pipeline.engine().counters());
        }
        let format = pb::ExportFormat::try_from(r.format)
            .map_err(|_| Error::invalid("format", "unknown export format"))?;
        let (content, content_type) = match format {
            pb::ExportFormat::Unspecified | pb::ExportFormat::IptablesSave => {
                let c = Content::from_tables_with(
                    &model.tables,
                    &PrintOptions {
                        counters: r.counters,
                    },
                );
                (c.combined(), "text/plain")
            }
            pb::ExportFormat::Json => (json_view(&model, n, &rev.digest, live), "application/json"),
        };
        Ok(Response::new(pb::ExportRevisionResponse {
            content,
            content_type: content_type.into(),
        }))
    }

    type WatchCommitsStream = WatchStream;

    async fn watch_commits(
        &self,
        request: Request<pb::WatchCommitsRequest>,
    ) -> Result<Response<Self::WatchCommitsStream>, Status> {
        let r = request.into_inner();
        let filter = if r.ruleset.is_empty() {
            None
        } else {
            Some(convert::ruleset_id("ruleset", &r.ruleset)?)
        };
        let (replay, rx) = match r.start_after {
            0 => (Vec::new(), self.state.pipeline.subscribe()),
            n => self.state.pipeline.resume_events(n)?,
        };
        // The last sequence this watcher was sent (or skipped by the filter): where a
        // watcher that lagged resumes.
        let mut last = replay.last().map_or(r.start_after, |e| e.sequence);
        let wanted = move |e: &crate::control::pipeline::CommitEvent| {
            filter.as_ref().is_none_or(|f| *f == e.ruleset)
        };
        let replay: Vec<_> = replay.into_iter().filter(&wanted).collect();
        let live = BroadcastStream::new(rx).filter_map(move |e| match e {
            Ok(e) => {
                last = e.sequence;
                wanted(&e).then(|| Ok(convert::commit_event(&e)))
            }
            // A slow watcher lost events: tell it, rather than silently skipping.
            Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
                Some(Err(Status::data_loss(format!(
                    "watcher lagged behind; {n} commit events were dropped: watch again with start_after {last}"
                ))))
            }
        });
        let stream = tokio_stream::iter(replay.into_iter().map(|e| Ok(convert::commit_event(&e))))
            .chain(live);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// What a `validate_only` Stage or Apply answers: the ruleset and the warnings, no revision
/// number (nothing was stored).
fn preview_revision(name: &str, warnings: &[crate::control::content::Finding]) -> pb::Revision {
    pb::Revision {
        ruleset: format!("rulesets/{name}"),
        warnings: warnings.iter().map(convert::violation).collect(),
        ..Default::default()
    }
}

fn fill_counters(model: &mut Ruleset, counters: &[vallum_engine::compile::SlotCounters]) {
    for c in counters.iter().filter(|c| *c.ruleset == *model.name) {
        let Some(t) = model
            .tables
            .iter_mut()
            .find(|t| t.family == c.family && t.kind == c.table)
        else {
            continue;
        };
        let Some(ch) = t.chains.iter_mut().find(|ch| *ch.name == *c.chain) else {
            continue;
        };
        let v = Counters {
            packets: c.packets,
            bytes: c.bytes,
        };
        match c.rule {
            Some(n) => {
                if let Some(rule) = usize::try_from(n)
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|i| ch.rules.get_mut(i))
                {
                    rule.counters = Some(v);
                }
            }
            None => ch.counters = v,
        }
    }
}

fn json_view(model: &Ruleset, number: u64, digest: &str, counters: bool) -> String {
    let tables: Vec<serde_json::Value> = model
        .tables
        .iter()
        .map(|t| {
            let chains: Vec<serde_json::Value> = t
                .chains
                .iter()
                .map(|c| {
                    let rules: Vec<serde_json::Value> = c
                        .rules
                        .iter()
                        .map(|r| {
                            let mut v = serde_json::json!({ "rule": print_rule_spec(r, t.family) });
                            if let (true, Some(k)) = (counters, r.counters) {
                                v["packets"] = k.packets.into();
                                v["bytes"] = k.bytes.into();
                            }
                            v
                        })
                        .collect();
                    serde_json::json!({
                        "name": c.name,
                        "policy": c.policy.map(|p| format!("{p:?}").to_uppercase()),
                        "rules": rules,
                    })
                })
                .collect();
            serde_json::json!({
                "family": match t.family { Family::Ipv4 => "ipv4", Family::Ipv6 => "ipv6" },
                "table": t.kind.name(),
                "chains": chains,
            })
        })
        .collect();
    let v = serde_json::json!({
        "ruleset": model.name,
        "revision": number,
        "digest": digest,
        "tables": tables,
    });
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| String::from("{}"))
}

type ChainKey = (Family, TableKind, String);

/// A chain's key, canonical rule texts and policy name.
type ChainEntry = (ChainKey, Vec<String>, Option<String>);

fn chains(rs: &Ruleset) -> BTreeMap<(u8, u8, String), ChainEntry> {
    let mut out = BTreeMap::new();
    for t in &rs.tables {
        for c in &t.chains {
            let fam = match t.family {
                Family::Ipv4 => 0,
                Family::Ipv6 => 1,
            };
            let kind = TableKind::ALL
                .iter()
                .position(|k| *k == t.kind)
                .unwrap_or(0) as u8;
            out.insert(
                (fam, kind, c.name.clone()),
                (
                    (t.family, t.kind, c.name.clone()),
                    c.rules
                        .iter()
                        .map(|r| print_rule_spec(r, t.family))
                        .collect(),
                    c.policy.map(|p| format!("{p:?}").to_uppercase()),
                ),
            );
        }
    }
    out
}

/// Per chain: rules only in `to` (added), only in `from` (removed), and rules in both whose
/// order relative to the others changed (moved: those outside a longest common order).
/// Equal rule texts are paired by occurrence (the k-th copy with the k-th copy).
pub fn diff(from: &Ruleset, to: &Ruleset) -> Vec<pb::ChainDiff> {
    let a = chains(from);
    let b = chains(to);
    let mut keys: Vec<_> = a.keys().chain(b.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    let empty = Vec::new();
    let mut out = Vec::new();
    for k in keys {
        let ea = a.get(&k);
        let eb = b.get(&k);
        let key = ea.or(eb).map(|e| e.0.clone());
        let Some((family, table, chain)) = key else {
            continue;
        };
        let old = ea.map_or(&empty, |e| &e.1);
        let new = eb.map_or(&empty, |e| &e.1);
        // Pair occurrences.
        let mut positions: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, r) in new.iter().enumerate() {
            positions.entry(r.as_str()).or_default().push(i);
        }
        for v in positions.values_mut() {
            v.reverse();
        }
        let mut pairs = Vec::new(); // (old index, new index)
        let mut removed = Vec::new();
        for (i, r) in old.iter().enumerate() {
            match positions.get_mut(r.as_str()).and_then(Vec::pop) {
                Some(j) => pairs.push((i, j)),
                None => removed.push(r.clone()),
            }
        }
        let paired_new: std::collections::HashSet<usize> = pairs.iter().map(|p| p.1).collect();
        let added: Vec<String> = new
            .iter()
            .enumerate()
            .filter(|(j, _)| !paired_new.contains(j))
            .map(|(_, r)| r.clone())
            .collect();
        // Longest increasing subsequence of new indices, in old order: those stay; others moved.
        let keep = lis(&pairs.iter().map(|p| p.1).collect::<Vec<_>>());
        let moved: Vec<pb::RuleMove> = pairs
            .iter()
            .enumerate()
            .filter(|(idx, _)| !keep.contains(idx))
            .map(|(_, &(i, j))| pb::RuleMove {
                rule: old[i].clone(),
                from_position: (i + 1) as u32,
                to_position: (j + 1) as u32,
            })
            .collect();
        let pa = ea.and_then(|e| e.2.clone());
        let pb_ = eb.and_then(|e| e.2.clone());
        let policy_change = if pa != pb_ && pa.is_some() && pb_.is_some() {
            format!("{} -> {}", pa.unwrap_or_default(), pb_.unwrap_or_default())
        } else {
            String::new()
        };
        if added.is_empty()
            && removed.is_empty()
            && moved.is_empty()
            && policy_change.is_empty()
            && ea.is_some() == eb.is_some()
        {
            continue;
        }
        out.push(pb::ChainDiff {
            family: convert::family_pb(family) as i32,
            table: table.name().to_string(),
            chain,
            added,
            removed,
            moved,
            policy_change,
        });
    }
    out
}

/// Indices (into `v`) of one longest strictly increasing subsequence.
fn lis(v: &[usize]) -> std::collections::HashSet<usize> {
    let mut tails: Vec<usize> = Vec::new(); // indices into v
    let mut prev = vec![usize::MAX; v.len()];
    for i in 0..v.len() {
        let pos = tails.partition_point(|&t| v[t] < v[i]);
        if pos > 0 {
            prev[i] = tails[pos - 1];
        }
        if pos == tails.len() {
            tails.push(i);
        } else {
            tails[pos] = i;
        }
    }
    let mut out = std::collections::HashSet::new();
    let mut cur = tails.last().copied();
    while let Some(i) = cur {
        out.insert(i);
        cur = (prev[i] != usize::MAX).then_some(prev[i]);
    }
    out
}

/// The audit record of a call refused before its digest was joined: the digest task's record,
/// or, when that task failed (it panicked or was cancelled), a record without the digest, so the
/// refused call still has its audit row; the failure is logged.
async fn refused_audit(
    digesting: tokio::task::JoinHandle<crate::control::store::AuditEntry>,
    caller: &str,
    method: &str,
) -> crate::control::store::AuditEntry {
    digesting.await.unwrap_or_else(|e| {
        tracing::error!(error = %e, method, "audit digest task failed: the row has no digest");
        audit_entry_of(caller.to_string(), method, String::new())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vallum_engine::restore::{ParseOptions, parse_ruleset};

    /// A digest task that panicked still gives the refused call its audit row (no digest).
    #[tokio::test]
    async fn refused_audit_survives_a_failed_digest_task() {
        let ok = tokio::task::spawn_blocking(|| audit_entry_of("c".into(), "Apply", "d".into()));
        let row = refused_audit(ok, "c", "Apply").await;
        assert_eq!(
            (row.caller.as_str(), row.request_digest.as_str()),
            ("c", "d")
        );
        let failed = tokio::task::spawn_blocking(|| -> crate::control::store::AuditEntry {
            panic!("digest failed");
        });
        let row = refused_audit(failed, "local:uid=0", "Apply").await;
        assert_eq!(
            (
                row.caller.as_str(),
                row.method.as_str(),
                row.request_digest.as_str()
            ),
            ("local:uid=0", "Apply", "")
        );
    }

    #[test]
    fn diff_added_removed_moved() {
        let p = |t: &str| parse_ruleset("a", t, &ParseOptions::default()).unwrap();
        let a = p(
            "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s 1.1.1.1/32 -j DROP\n-A INPUT -s 2.2.2.2/32 -j DROP\n-A INPUT -s 3.3.3.3/32 -j DROP\nCOMMIT\n",
        );
        let b = p(
            "*filter\n:INPUT DROP [0:0]\n-A INPUT -s 3.3.3.3/32 -j DROP\n-A INPUT -s 1.1.1.1/32 -j DROP\n-A INPUT -s 4.4.4.4/32 -j DROP\nCOMMIT\n",
        );
        let d = diff(&a, &b);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].added, vec!["-s 4.4.4.4/32 -j DROP"]);
        assert_eq!(d[0].removed, vec!["-s 2.2.2.2/32 -j DROP"]);
        assert_eq!(d[0].moved.len(), 1);
        assert_eq!(d[0].policy_change, "ACCEPT -> DROP");
    }
}
