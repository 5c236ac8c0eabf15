//! The mutating methods of `vallum.v1.RulesetService` (stage, commit, confirm, apply, edit,
//! rollback, update, delete): each is the body the one handler layer
//! ([`crate::grpc::call::mutate`]) runs once it let the call through, with the layer's
//! [`Cx`] (caller, audit record). The layer checked the grant; a body checks what is the
//! method's own (fleet ownership, the source, etags) and calls the pipeline.

use vallum_engine::model::Family;
use vallum_proto::v1 as pb;

use super::{RulesetApi, Stored, etag};
use crate::control::content;
use crate::control::pipeline::Answer;
use crate::error::{Error, Result};
use crate::grpc::call::Cx;
use crate::grpc::convert;
use vallum_engine::echo::quoted;

/// `StageRevision`: parses and checks the source and stores it as a new revision that is
/// not active (a dry run: validates it and says what would be stored).
pub(super) async fn stage(
    api: &RulesetApi,
    cx: &mut Cx,
    r: &pb::StageRevisionRequest,
) -> Result<pb::Revision> {
    let name = convert::ruleset_id("ruleset", &r.ruleset)?;
    api.state.owners.check(&name)?;
    let mut stored = Stored::default();
    let (checked, base_etag) = api
        .check(&name, r.priority, r.source.as_ref(), &r.etag, &mut stored)
        .await?;
    let checked = checked.refuse_empty(r.allow_empty)?;
    let expected = base_etag.unwrap_or_else(|| r.etag.clone());
    if r.validate_only {
        dry_run_etag(api, &name, &expected, &mut stored).await?;
        let checked = api.state.pipeline.validate(checked).await?;
        let warnings = checked.warnings();
        checked.into_valid()?;
        return Ok(preview_revision(&name, &warnings));
    }
    let (_, rev, warnings) = api
        .state
        .pipeline
        .stage(checked, &cx.caller, &r.message, etag(&expected))
        .await?;
    Ok(convert::revision(&rev, false, &warnings))
}

/// `CommitRevision`: makes a staged revision active (a dry run: checks that it still
/// validates against the engine's sets).
pub(super) async fn commit_revision(
    api: &RulesetApi,
    cx: &mut Cx,
    r: &pb::CommitRevisionRequest,
) -> Result<pb::CommitResult> {
    let (name, n) = convert::revision_name("name", &r.name)?;
    api.state.owners.check(&name)?;
    let within = convert::duration("confirm_within", r.confirm_within.as_ref())?;
    if r.validate_only {
        let rev = (api.state.pipeline.store().get_revision(&name, n).await?).ok_or_else(|| {
            Error::NotFound {
                kind: "revision",
                name: r.name.clone(),
            }
        })?;
        let model = rev.content.to_ruleset(&name, 0)?;
        let v = (api.state.pipeline.engine()).validate(&model, api.state.pipeline.sets().as_ref());
        if vallum_engine::validate::has_errors(&v) {
            return Err(Error::invalid("name", "revision no longer validates"));
        }
        return Ok(pb::CommitResult {
            revision: Some(convert::revision(&rev, false, &[])),
            ..Default::default()
        });
    }
    let c = api
        .state
        .pipeline
        .commit_staged(&name, n, within, etag(&r.etag), &mut cx.audit)
        .await?;
    Ok(convert::commit_result(&c))
}

/// `ConfirmCommit`: confirms a commit made with `confirm_within`.
pub(super) async fn confirm_commit(
    api: &RulesetApi,
    r: &pb::ConfirmCommitRequest,
) -> Result<pb::ConfirmCommitResponse> {
    let (name, n) = convert::revision_name("name", &r.name)?;
    api.state.owners.check(&name)?;
    let rev = api.state.pipeline.confirm(&name, n, etag(&r.etag)).await?;
    Ok(pb::ConfirmCommitResponse {
        revision: Some(convert::revision(&rev, false, &[])),
    })
}

/// `Apply` (and `EditRuleset`, whose edits become a noflush Apply): parses and checks the
/// source while the layer hashes the request for the audit record on a blocking thread
/// (joined after the parse, [`Cx::join_audit`]), then commits with that record (written in
/// the commit's own transaction). A dry run validates and says what would be committed.
pub(super) async fn apply(
    api: &RulesetApi,
    cx: &mut Cx,
    r: &pb::ApplyRequest,
) -> Result<pb::CommitResult> {
    apply_with(api, cx, r, &mut Stored::default()).await
}

/// [`apply`] with the ruleset's row as the call has read it so far ([`Stored`]: an
/// EditRuleset read it for the priority), so every step of the call uses one read of it.
async fn apply_with(
    api: &RulesetApi,
    cx: &mut Cx,
    r: &pb::ApplyRequest,
    stored: &mut Stored,
) -> Result<pb::CommitResult> {
    let name = convert::ruleset_id("ruleset", &r.ruleset)?;
    api.state.owners.check(&name)?;
    let within = convert::duration("confirm_within", r.confirm_within.as_ref())?;
    let durability = convert::durability("durability", r.durability)?;
    if r.validate_only {
        dry_run_etag(api, &name, &r.etag, stored).await?;
        let (checked, _) = api
            .check(&name, r.priority, r.source.as_ref(), &r.etag, stored)
            .await?;
        let checked = checked.refuse_empty(r.allow_empty)?;
        let checked = api.state.pipeline.validate(checked).await?;
        let warnings = checked.warnings();
        checked.into_valid()?;
        return Ok(pb::CommitResult {
            revision: Some(preview_revision(&name, &warnings)),
            ..Default::default()
        });
    }
    let checked = api
        .check(&name, r.priority, r.source.as_ref(), &r.etag, stored)
        .await;
    cx.join_audit().await?;
    let (checked, base_etag) = checked?;
    let checked = checked.refuse_empty(r.allow_empty)?;
    let expected = base_etag.unwrap_or_else(|| r.etag.clone());
    if let Some(same) = unchanged(api, r, &name, within, &checked, stored).await? {
        return Ok(same);
    }
    let c = api
        .state
        .pipeline
        .apply_as(
            checked,
            &cx.caller,
            &r.message,
            within,
            etag(&expected),
            Answer {
                durability,
                audit: &mut cx.audit,
            },
        )
        .await?;
    Ok(convert::commit_result(&c))
}

/// `EditRuleset`: the edits as the noflush text of an Apply ([`edits_source`]) at the
/// ruleset's stored priority, applied as [`apply`] applies it (the audit record and a
/// retry's comparison use the edits, the caller's own request).
pub(super) async fn edit_ruleset(
    api: &RulesetApi,
    cx: &mut Cx,
    r: &pb::EditRulesetRequest,
) -> Result<pb::CommitResult> {
    let name = convert::ruleset_id("ruleset", &r.ruleset)?;
    let mut stored = Stored::default();
    let priority = (stored.get(&api.state, &name).await?).map_or(0, |row| row.priority);
    let source = edits_source(&r.edits)?;
    let apply_request = pb::ApplyRequest {
        ruleset: r.ruleset.clone(),
        source: Some(source),
        message: r.message.clone(),
        priority,
        confirm_within: None,
        etag: r.etag.clone(),
        request_id: r.request_id.clone(),
        validate_only: r.validate_only,
        // As iptables: deleting the last rule leaves empty tables, not an error.
        allow_empty: true,
        durability: r.durability,
    };
    apply_with(api, cx, &apply_request, &mut stored).await
}

/// `Rollback`: makes an earlier revision active again (a new revision with its content).
pub(super) async fn rollback(
    api: &RulesetApi,
    cx: &mut Cx,
    r: &pb::RollbackRequest,
) -> Result<pb::CommitResult> {
    let (name, n) = convert::revision_name("name", &r.name)?;
    api.state.owners.check(&name)?;
    let c = api
        .state
        .pipeline
        .rollback(
            &name,
            n,
            &cx.caller,
            &r.message,
            etag(&r.etag),
            &mut cx.audit,
        )
        .await?;
    Ok(convert::commit_result(&c))
}

/// `DeleteRuleset`: removes a ruleset, its revisions and its rules from the engine.
pub(super) async fn delete_ruleset(
    api: &RulesetApi,
    r: &pb::DeleteRulesetRequest,
) -> Result<pb::DeleteRulesetResponse> {
    let name = convert::ruleset_id("name", &r.name)?;
    api.state.owners.check(&name)?;
    api.state.pipeline.delete(&name, etag(&r.etag)).await?;
    Ok(pb::DeleteRulesetResponse {})
}

/// `UpdateRuleset`: changes a ruleset's priority (a commit, whose transaction writes the
/// audit record); with nothing to change, or as a dry run, the ruleset as it is (or would
/// be).
pub(super) async fn update_ruleset(
    api: &RulesetApi,
    cx: &mut Cx,
    r: &pb::UpdateRulesetRequest,
) -> Result<pb::Ruleset> {
    let (given, name, fields) = update_target(r)?;
    let priority = fields.priority.then_some(given.priority);
    api.state.owners.check(&name)?;
    let current =
        (api.state.pipeline.store().get_ruleset(&name).await?).ok_or_else(|| Error::NotFound {
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
    let row = api
        .state
        .pipeline
        .set_priority(
            &name,
            priority,
            &cx.caller,
            etag(&given.etag),
            &mut cx.audit,
        )
        .await?;
    Ok(convert::ruleset(&row))
}

/// The ruleset an UpdateRuleset names, its name and the fields it changes.
///
/// Errors: INVALID_ARGUMENT at `ruleset` when it is missing, at `ruleset.name`, and as
/// [`update_fields`].
pub(super) fn update_target(
    r: &pb::UpdateRulesetRequest,
) -> Result<(&pb::Ruleset, String, UpdateFields)> {
    let given = r
        .ruleset
        .as_ref()
        .ok_or_else(|| Error::invalid("ruleset", "the ruleset to update is required"))?;
    let name = convert::ruleset_id("ruleset.name", &given.name)?;
    let fields = update_fields(r.update_mask.as_ref(), given)?;
    Ok((given, name, fields))
}

/// The etag check of a `validate_only` Apply or StageRevision, which the real call makes
/// when it stores (a dry run says what the real call would say): a non-empty `etag` that
/// is not the ruleset's is ETAG_MISMATCH, as is any for a ruleset that does not exist.
///
/// Errors: [`Error::EtagMismatch`]; [`Error::Store`].
async fn dry_run_etag(api: &RulesetApi, name: &str, etag: &str, stored: &mut Stored) -> Result<()> {
    if etag.is_empty() {
        return Ok(());
    }
    let current = (stored.get(&api.state, name).await?)
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
/// `None` for any other call, and with `within` (a commit-confirmed is always made). The
/// ruleset's row is the one the call's parse read its base from (`stored`): an edit that
/// changed nothing is answered as of that read, as if it ran before a commit that came after.
async fn unchanged(
    api: &RulesetApi,
    r: &pb::ApplyRequest,
    name: &str,
    within: Option<std::time::Duration>,
    checked: &content::Checked,
    stored: &mut Stored,
) -> Result<Option<pb::CommitResult>> {
    let noflush = r
        .source
        .as_ref()
        .is_some_and(|s| convert::restore_flags(s).0);
    if !noflush || within.is_some() {
        return Ok(None);
    }
    let store = api.state.pipeline.store();
    let Some(rs) = stored.get(&api.state, name).await? else {
        return Ok(None);
    };
    let Some(n) = rs.active_revision else {
        return Ok(None);
    };
    // An edit that changed something (nearly every one) is told from the copy of the
    // active content in memory, without reading the revision's text from the store.
    if let Some(active) = api.state.pipeline.active_content(name, n) {
        if *active != checked.content {
            return Ok(None);
        }
    }
    let Some(rev) = store.get_revision(name, n).await? else {
        return Ok(None);
    };
    if *rev.content != checked.content {
        return Ok(None);
    }
    Ok(Some(pb::CommitResult {
        revision: Some(convert::revision(&rev, false, &checked.warnings())),
        etag: rs.etag,
        ..Default::default()
    }))
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

/// The `Ruleset` fields an UpdateRuleset changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct UpdateFields {
    /// `priority`.
    pub(super) priority: bool,
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
