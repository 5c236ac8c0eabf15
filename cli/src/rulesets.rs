//! The RulesetService commands: `validate`, `stage`, `commit`, `confirm`, `apply`, `rollback`,
//! `revisions`, `diff`, `export`, `rulesets`, `delete` and `watch`.
//!
//! A ruleset FILE may be `-` (standard input: `iptables-save | vallumctl apply host -`); errors
//! in it print as `FILE:LINE:COL` (`<stdin>:LINE:COL`). `--dry-run` on `apply`, `stage` and
//! `commit` asks the server to run every check and change nothing (the requests'
//! `validate_only`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;
use vallum_proto::v1::{
    self as pb, ApplyRequest, CommitRevisionRequest, ConfirmCommitRequest, DeleteRulesetRequest,
    DiffRevisionsRequest, ExportFormat, ExportRevisionRequest, ListRevisionsRequest,
    ListRulesetsRequest, RestoreText, RollbackRequest, RulesetSource, ShadowEnd,
    StageRevisionRequest, ValidateRulesetRequest, WatchCommitsRequest,
};

use crate::args::{FamilyArg, parse_duration, proto_duration, revision_arg};
use crate::connect::Svc;
use crate::error::{self, CliError};
use crate::input::{display_name, is_stdin, read_text, with_file};
use crate::output::{Output, print, write_stdout};
use crate::pages::{PAGE_SIZE, all_pages};
use crate::view;

/// The client type.
pub type Client = RulesetServiceClient<Svc>;

/// `--format` of `export` (absent: the revision's own syntax, iptables-save or nft).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// iptables-save text (an iptables ruleset).
    Save,
    /// The ruleset as JSON (an iptables ruleset).
    Json,
    /// The `nft list ruleset` listing (a ruleset sent as nft).
    Nft,
    /// `nft -j list ruleset` JSON (a ruleset sent as nft).
    NftJson,
}

/// `--format` of a ruleset file (`apply`, `stage`, `validate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// iptables-restore text (`iptables-save` output).
    Iptables,
    /// nftables text (`nft list ruleset` output, an nftables.conf).
    Nft,
    /// nft JSON (`nft -j list ruleset` output).
    NftJson,
}

impl InputFormat {
    /// The format of `text` when no `--format` says it: nft JSON when it starts with `{`
    /// (libnftables-json is one object, `{"nftables": [...]}`), nft when its first line that
    /// is not blank or a `#` comment starts with a word only nft files start with (`table`,
    /// `flush`, `define`, `add`, `create`, `insert`, `delete`, `include`) or the text starts
    /// with `#!` (`#!/usr/sbin/nft -f`, as nftables.conf files do), else iptables-restore
    /// text (whose lines start with `*`, `:`, `-` or `COMMIT`).
    pub fn detect(text: &str) -> InputFormat {
        let body = text.trim_start();
        if body.starts_with('{') {
            return InputFormat::NftJson;
        }
        if body.starts_with("#!") {
            return InputFormat::Nft;
        }
        const NFT_WORDS: [&str; 8] = [
            "table", "flush", "define", "add", "create", "insert", "delete", "include",
        ];
        let first = body
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .and_then(|l| l.split_whitespace().next());
        match first {
            Some(w) if NFT_WORDS.contains(&w) => InputFormat::Nft,
            _ => InputFormat::Iptables,
        }
    }
}

/// Flags of commands that upload a ruleset file.
#[derive(Debug, clap::Args)]
pub struct SourceArgs {
    /// The file's syntax; absent: detected from the text (nft JSON starts with `{`, nft text
    /// with `table`, `flush ruleset`, `define`, `#!`...; anything else is iptables-restore
    /// text).
    #[arg(long, value_enum, env = "VALLUM_INPUT_FORMAT")]
    pub format: Option<InputFormat>,
    /// Family of lines without -4/-6.
    #[arg(long, value_enum, default_value_t = FamilyArg::Ipv4)]
    pub family: FamilyArg,
    /// An ip6tables-restore file stored in the same ruleset (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub v6: Option<PathBuf>,
    /// As `iptables-restore --noflush`: the file changes the ruleset's active revision
    /// (tables it names are not flushed; `:CHAIN` lines flush or create chains) and the
    /// merged result is checked and stored.
    #[arg(long, short = 'n')]
    pub noflush: bool,
    /// As `iptables-restore --counters`: rules start with the file's `[p:b]` counters.
    #[arg(long, short = 'c')]
    pub counters: bool,
}

/// Flags of commands that change a ruleset.
#[derive(Debug, clap::Args)]
pub struct ChangeArgs {
    /// Commit message.
    #[arg(long, short = 'm', default_value = "")]
    pub message: String,
    /// Only apply if the ruleset's etag still matches.
    #[arg(long)]
    pub etag: Option<String>,
    /// Idempotency key: a retry with the same id returns the first result.
    #[arg(long)]
    pub request_id: Option<String>,
}

/// The ruleset subcommands (flattened into the top level: `vallumctl apply ...`).
#[derive(Debug, Subcommand)]
pub enum RulesetCommand {
    /// Check a ruleset file without storing it.
    Validate {
        /// Ruleset file: iptables-restore, nft or nft JSON text (`-`: standard input).
        file: PathBuf,
        /// Ruleset name (for set lookups and messages).
        #[arg(long, default_value = "validate")]
        ruleset: String,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Store a ruleset file as a new staged revision.
    Stage {
        /// Ruleset name.
        ruleset: String,
        /// Ruleset file: iptables-restore, nft or nft JSON text (`-`: standard input).
        file: PathBuf,
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        change: ChangeArgs,
        /// Priority among rulesets (lower runs first); stored on first stage.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Run every check, store nothing.
        #[arg(long, visible_alias = "dry-run")]
        validate_only: bool,
        /// Stage an empty ruleset (no rule, no DROP policy), refused otherwise.
        #[arg(long)]
        allow_empty: bool,
    },
    /// Make a staged revision active (RULESET/N or rulesets/RULESET/revisions/N).
    Commit {
        /// The revision.
        #[arg(value_parser = revision_arg)]
        revision: String,
        /// Roll back automatically unless confirmed within this time (e.g. 30s).
        #[arg(long, value_parser = parse_duration)]
        confirm_within: Option<Duration>,
        #[command(flatten)]
        change: ChangeArgs,
        /// Check that the revision could be committed (it exists and still validates);
        /// commit nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Confirm a commit made with --confirm-within.
    Confirm {
        /// The revision.
        #[arg(value_parser = revision_arg)]
        revision: String,
        /// Only confirm if the ruleset's etag still matches (the commit's etag).
        #[arg(long)]
        etag: Option<String>,
        /// Idempotency key: a retry with the same id returns the first result.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Change a ruleset's priority (UpdateRuleset): with an active revision, a commit of its
    /// own (a new revision with the same rules) that moves the ruleset in the dataplane order.
    Update {
        /// Ruleset name.
        ruleset: String,
        /// The new priority (lower runs first).
        #[arg(long, allow_negative_numbers = true)]
        priority: i32,
        /// Only update if the ruleset's etag still matches.
        #[arg(long)]
        etag: Option<String>,
        /// Idempotency key: a retry with the same id returns the first result.
        #[arg(long)]
        request_id: Option<String>,
        /// Check the change (etag, scope); change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Stage and commit a ruleset file in one call.
    Apply {
        /// Ruleset name.
        ruleset: String,
        /// Ruleset file: iptables-restore, nft or nft JSON text (`-`: standard input, e.g.
        /// `iptables-save | vallumctl apply host -`).
        file: PathBuf,
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        change: ChangeArgs,
        /// Priority among rulesets (lower runs first).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Roll back automatically unless confirmed within this time.
        #[arg(long, value_parser = parse_duration)]
        confirm_within: Option<Duration>,
        /// Apply an empty ruleset (no rule, no DROP policy: every rule gone), refused
        /// otherwise.
        #[arg(long)]
        allow_empty: bool,
        /// Run every check Apply runs (parse, validate, limits, etag, empty ruleset); store
        /// and commit nothing.
        #[arg(long)]
        dry_run: bool,
        /// Stage the file, shadow the active revision with it on live traffic for this long
        /// (`vallumctl shadow`), and commit it only if at most --max-changed-flows flows would
        /// change their verdict; otherwise print the report and leave the active revision
        /// (the new one stays staged). Then --confirm-within as usual.
        #[arg(long, value_parser = parse_duration, env = "VALLUM_SHADOW_FOR", value_name = "DURATION", conflicts_with = "dry_run")]
        shadow_for: Option<Duration>,
        /// With --shadow-for: the most flows whose verdict may change (default 0: none).
        #[arg(
            long,
            env = "VALLUM_MAX_CHANGED_FLOWS",
            value_name = "N",
            default_value_t = 0,
            requires = "shadow_for"
        )]
        max_changed_flows: u64,
    },
    /// Commit the content of an earlier revision again.
    Rollback {
        /// The revision whose content becomes active.
        #[arg(value_parser = revision_arg)]
        revision: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// List the revisions of a ruleset: state, rules, time, author, digest, message.
    Revisions {
        /// Ruleset name.
        ruleset: String,
    },
    /// Rules added, removed and moved between two revisions.
    Diff {
        /// Older revision.
        #[arg(value_parser = revision_arg)]
        from: String,
        /// Newer revision.
        #[arg(value_parser = revision_arg)]
        to: String,
    },
    /// Print a revision as iptables-save text or JSON.
    Export {
        /// The revision.
        #[arg(value_parser = revision_arg)]
        revision: String,
        /// Output format of the content (default: the revision's own syntax, iptables-save
        /// or, for a ruleset sent as nft, the `nft list ruleset` listing).
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Include live counters (`[packets:bytes]`) if the revision is active.
        #[arg(long)]
        counters: bool,
    },
    /// Stream commit events as they happen.
    Watch {
        /// Only this ruleset.
        ruleset: Option<String>,
        /// Resume after this event `sequence` (the last one seen, as `-o json` prints it):
        /// first the events after it that vallumd still keeps, then the new ones.
        #[arg(long, value_name = "SEQUENCE")]
        start_after: Option<u64>,
    },
    /// List rulesets.
    Rulesets,
    /// Deactivate and delete a ruleset with its revisions.
    Delete {
        /// Ruleset name.
        ruleset: String,
        /// Only delete if the etag still matches.
        #[arg(long)]
        etag: Option<String>,
        /// Idempotency key: a retry with the same id answers as the first call did.
        #[arg(long)]
        request_id: Option<String>,
    },
}

impl RulesetCommand {
    /// Whether the command may change state on the server.
    pub fn changes(&self) -> bool {
        match self {
            RulesetCommand::Stage { validate_only, .. } => !validate_only,
            RulesetCommand::Commit { dry_run, .. }
            | RulesetCommand::Apply { dry_run, .. }
            | RulesetCommand::Update { dry_run, .. } => !dry_run,
            RulesetCommand::Confirm { .. }
            | RulesetCommand::Rollback { .. }
            | RulesetCommand::Delete { .. } => true,
            RulesetCommand::Validate { .. }
            | RulesetCommand::Revisions { .. }
            | RulesetCommand::Diff { .. }
            | RulesetCommand::Export { .. }
            | RulesetCommand::Watch { .. }
            | RulesetCommand::Rulesets => false,
        }
    }

    /// Whether the command streams without end (no `--timeout`).
    pub fn streams(&self) -> bool {
        matches!(self, RulesetCommand::Watch { .. })
    }
}

/// The `StageRevisionRequest` of `vallumctl stage` and of `vallumctl apply --shadow-for`: FILE
/// read as [`source`] reads it, the change flags as given.
///
/// Errors: as [`source`].
fn stage_request(
    ruleset: &str,
    file: &Path,
    src: &SourceArgs,
    change: &ChangeArgs,
    priority: i32,
    validate_only: bool,
    allow_empty: bool,
) -> Result<StageRevisionRequest, CliError> {
    Ok(StageRevisionRequest {
        ruleset: ruleset.to_owned(),
        source: Some(source(file, src)?),
        message: change.message.clone(),
        priority,
        etag: change.etag.clone().unwrap_or_default(),
        request_id: change.request_id.clone().unwrap_or_default(),
        validate_only,
        allow_empty,
    })
}

/// The `source` of a request from FILE (and `--v6 FILE`); at most one of them may be `-`.
pub fn source(file: &Path, args: &SourceArgs) -> Result<RulesetSource, CliError> {
    if let Some(v6) = &args.v6 {
        if is_stdin(file) && is_stdin(v6) {
            return Err(CliError::Argument(
                "FILE and --v6 cannot both be `-` (standard input)".to_owned(),
            ));
        }
    }
    let content = read_text(file)?;
    let format = args.format.unwrap_or_else(|| InputFormat::detect(&content));
    if format != InputFormat::Iptables {
        let iptables_only = [
            (args.v6.is_some(), "--v6"),
            (args.noflush, "--noflush"),
            (args.counters, "--counters"),
            (args.family != FamilyArg::Ipv4, "--family"),
        ];
        if let Some((_, flag)) = iptables_only.iter().find(|(set, _)| *set) {
            return Err(CliError::Argument(format!(
                "{flag} is for iptables-restore files; {} is {} (--format)",
                display_name(file),
                if format == InputFormat::Nft {
                    "nft text"
                } else {
                    "nft JSON"
                }
            )));
        }
        return Ok(RulesetSource {
            source: Some(pb::ruleset_source::Source::Nft(pb::NftText {
                content,
                filename: display_name(file),
                json: format == InputFormat::NftJson,
            })),
        });
    }
    let content_v6 = match &args.v6 {
        Some(p) => read_text(p)?,
        None => String::new(),
    };
    let family = match args.family {
        FamilyArg::Ipv4 => pb::Family::Ipv4,
        FamilyArg::Ipv6 => pb::Family::Ipv6,
    };
    Ok(RulesetSource {
        source: Some(pb::ruleset_source::Source::Text(RestoreText {
            content,
            family: family as i32,
            content_v6,
            filename: display_name(file),
            noflush: args.noflush,
            counters: args.counters,
        })),
    })
}

/// What a dry run prints: what was checked, the warnings, and that nothing changed.
fn dry_run_text(what: &str, r: Option<&pb::Revision>) -> String {
    let mut s = format!("dry run: {what}; nothing was stored or committed\n");
    if let Some(r) = r {
        s.push_str(&view::warnings_text(r));
    }
    s
}

/// A dry run's result as JSON: the commit JSON with `"dry_run": true`.
fn dry_run_json(r: &pb::CommitResult) -> Value {
    let mut j = view::commit_json(r);
    j["dry_run"] = json!(true);
    j
}

/// Runs one ruleset subcommand.
pub async fn run(c: &mut Client, out: Output, cmd: &RulesetCommand) -> Result<(), CliError> {
    match cmd {
        RulesetCommand::Validate {
            file,
            ruleset,
            source: src,
        } => {
            let resp = c
                .validate_ruleset(ValidateRulesetRequest {
                    ruleset: ruleset.clone(),
                    source: Some(source(file, src)?),
                })
                .await
                .map_err(with_file(file))?
                .into_inner();
            let path = display_name(file);
            let loc = |v: &pb::Violation| {
                let l = error::localize(&format!("{}: ", v.location), &path);
                l.trim_end_matches(": ").trim_end_matches(':').to_owned()
            };
            print(
                out,
                json!({
                    "valid": resp.valid,
                    "rule_count": resp.rule_count,
                    "violations": resp.violations.iter().map(|v| view::violation_json(v, &loc(v))).collect::<Vec<_>>(),
                }),
                || {
                    let mut s = String::new();
                    for v in &resp.violations {
                        s.push_str(&view::violation_text(v, &loc(v)));
                        s.push('\n');
                    }
                    if resp.valid {
                        s.push_str(&format!("{path}: valid, {} rules\n", resp.rule_count));
                    }
                    s
                },
            )?;
            if !resp.valid {
                return Err(CliError::Invalid);
            }
        }
        RulesetCommand::Stage {
            ruleset,
            file,
            source: src,
            change,
            priority,
            validate_only,
            allow_empty,
        } => {
            let r = c
                .stage_revision(stage_request(
                    ruleset,
                    file,
                    src,
                    change,
                    *priority,
                    *validate_only,
                    *allow_empty,
                )?)
                .await
                .map_err(with_file(file))?
                .into_inner();
            if *validate_only {
                let mut j = view::revision_json(&r);
                j["dry_run"] = json!(true);
                print(out, j, || {
                    dry_run_text(
                        &format!("{} would be staged from {}", r.ruleset, display_name(file)),
                        Some(&r),
                    )
                })?;
            } else {
                print(out, view::revision_json(&r), || {
                    format!(
                        "staged {}\n{}",
                        view::revision_text(&r),
                        view::warnings_text(&r)
                    )
                })?;
            }
        }
        RulesetCommand::Commit {
            revision,
            confirm_within,
            change,
            dry_run,
        } => {
            let r = c
                .commit_revision(CommitRevisionRequest {
                    name: revision.clone(),
                    confirm_within: proto_duration(*confirm_within),
                    etag: change.etag.clone().unwrap_or_default(),
                    request_id: change.request_id.clone().unwrap_or_default(),
                    validate_only: *dry_run,
                })
                .await?
                .into_inner();
            if *dry_run {
                print(out, dry_run_json(&r), || {
                    let name = r.revision.as_ref().map_or(revision.as_str(), |r| &r.name);
                    dry_run_text(&format!("{name} would be committed"), None)
                })?;
            } else {
                print(out, view::commit_json(&r), || view::commit_text(&r))?;
            }
        }
        RulesetCommand::Update {
            ruleset,
            priority,
            etag,
            request_id,
            dry_run,
        } => {
            let r = c
                .update_ruleset(pb::UpdateRulesetRequest {
                    ruleset: Some(pb::Ruleset {
                        name: format!("rulesets/{ruleset}"),
                        priority: *priority,
                        etag: etag.clone().unwrap_or_default(),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask {
                        paths: vec!["priority".into()],
                    }),
                    request_id: request_id.clone().unwrap_or_default(),
                    validate_only: *dry_run,
                })
                .await?
                .into_inner();
            let mut j = view::ruleset_json(&r);
            if *dry_run {
                j["dry_run"] = json!(true);
            }
            print(out, j, || {
                let mut t = view::rulesets_text(std::slice::from_ref(&r));
                t.push_str(&format!("etag {}\n", r.etag));
                if *dry_run {
                    t.push_str("dry run: nothing was changed\n");
                }
                t
            })?;
        }
        RulesetCommand::Confirm {
            revision,
            etag,
            request_id,
        } => {
            let r = c
                .confirm_commit(ConfirmCommitRequest {
                    name: revision.clone(),
                    etag: etag.clone().unwrap_or_default(),
                    request_id: request_id.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            let rev = r.revision.unwrap_or_default();
            print(out, view::revision_json(&rev), || {
                format!("confirmed {}\n", view::revision_text(&rev))
            })?;
        }
        RulesetCommand::Apply {
            ruleset,
            file,
            source: src,
            change,
            priority,
            confirm_within,
            allow_empty,
            dry_run: _,
            shadow_for: Some(shadow_for),
            max_changed_flows,
        } => {
            let staged = c
                .stage_revision(stage_request(
                    ruleset,
                    file,
                    src,
                    change,
                    *priority,
                    false,
                    *allow_empty,
                )?)
                .await
                .map_err(with_file(file))?
                .into_inner();
            let report = crate::shadow::shadow_for(c, &staged.name, ruleset, *shadow_for).await?;
            if report.ended != ShadowEnd::Expired as i32 {
                print(out, crate::shadow::report_json(&report), || {
                    crate::shadow::report_text(&report)
                })?;
                return Err(CliError::ShadowRefused(format!(
                    "the shadow of {} ended before its time ({}): nothing committed, {} stays \
                     staged",
                    staged.name,
                    crate::shadow::ended(report.ended),
                    staged.name
                )));
            }
            if report.changed_flows > *max_changed_flows {
                print(out, crate::shadow::report_json(&report), || {
                    crate::shadow::report_text(&report)
                })?;
                return Err(CliError::ShadowRefused(format!(
                    "{} flow(s) would change their verdict, more than --max-changed-flows {}: \
                     nothing committed, the active revision is unchanged and {} stays staged",
                    report.changed_flows, max_changed_flows, staged.name
                )));
            }
            let r = c
                .commit_revision(CommitRevisionRequest {
                    name: staged.name.clone(),
                    confirm_within: proto_duration(*confirm_within),
                    etag: String::new(),
                    request_id: String::new(),
                    validate_only: false,
                })
                .await?
                .into_inner();
            let mut j = view::commit_json(&r);
            j["shadow"] = crate::shadow::report_json(&report);
            print(out, j, || {
                format!(
                    "{}{}",
                    crate::shadow::report_text(&report),
                    view::commit_text(&r)
                )
            })?;
        }
        RulesetCommand::Apply {
            ruleset,
            file,
            source: src,
            change,
            priority,
            confirm_within,
            allow_empty,
            dry_run,
            shadow_for: None,
            ..
        } => {
            let r = c
                .apply(ApplyRequest {
                    ruleset: ruleset.clone(),
                    source: Some(source(file, src)?),
                    message: change.message.clone(),
                    priority: *priority,
                    confirm_within: proto_duration(*confirm_within),
                    etag: change.etag.clone().unwrap_or_default(),
                    request_id: change.request_id.clone().unwrap_or_default(),
                    validate_only: *dry_run,
                    allow_empty: *allow_empty,
                    // vallumd's --sync (full unless its operator chose normal).
                    durability: vallum_proto::v1::Durability::Unspecified as i32,
                })
                .await
                .map_err(with_file(file))?
                .into_inner();
            if *dry_run {
                print(out, dry_run_json(&r), || {
                    dry_run_text(
                        &format!(
                            "rulesets/{ruleset} would be applied from {}",
                            display_name(file)
                        ),
                        r.revision.as_ref(),
                    )
                })?;
            } else {
                print(out, view::commit_json(&r), || view::commit_text(&r))?;
            }
        }
        RulesetCommand::Rollback { revision, change } => {
            let r = c
                .rollback(RollbackRequest {
                    name: revision.clone(),
                    message: change.message.clone(),
                    etag: change.etag.clone().unwrap_or_default(),
                    request_id: change.request_id.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            print(out, view::commit_json(&r), || view::commit_text(&r))?;
        }
        RulesetCommand::Revisions { ruleset } => {
            let all = all_pages!(
                |token| c
                    .list_revisions(ListRevisionsRequest {
                        ruleset: ruleset.clone(),
                        page_size: PAGE_SIZE,
                        page_token: token.clone(),
                    })
                    .await?,
                revisions
            );
            print(
                out,
                Value::Array(all.iter().map(view::revision_json).collect()),
                || view::revisions_text(&all),
            )?;
        }
        RulesetCommand::Diff { from, to } => {
            let r = c
                .diff_revisions(DiffRevisionsRequest {
                    base: from.clone(),
                    target: to.clone(),
                })
                .await?
                .into_inner();
            print(out, view::diff_json(&r), || view::diff_text(&r))?;
        }
        RulesetCommand::Export {
            revision,
            format,
            counters,
        } => {
            let r = c
                .export_revision(ExportRevisionRequest {
                    name: revision.clone(),
                    format: match format {
                        None => ExportFormat::Unspecified,
                        Some(FormatArg::Save) => ExportFormat::IptablesSave,
                        Some(FormatArg::Json) => ExportFormat::Json,
                        Some(FormatArg::Nft) => ExportFormat::Nft,
                        Some(FormatArg::NftJson) => ExportFormat::NftJson,
                    } as i32,
                    counters: *counters,
                })
                .await?
                .into_inner();
            // The content is already in the asked format; --output json wraps it.
            print(
                out,
                json!({"content": r.content, "content_type": r.content_type}),
                || r.content.clone(),
            )?;
        }
        RulesetCommand::Watch {
            ruleset,
            start_after,
        } => {
            let mut stream = c
                .watch_commits(WatchCommitsRequest {
                    ruleset: ruleset.clone().unwrap_or_default(),
                    start_after: start_after.unwrap_or(0),
                })
                .await?
                .into_inner();
            while let Some(ev) = stream.next().await {
                let ev = ev?;
                match out {
                    Output::Json => write_stdout(&format!("{}\n", view::event_json(&ev))),
                    Output::Text => write_stdout(&format!("{}\n", view::event_text(&ev))),
                }
            }
        }
        RulesetCommand::Rulesets => {
            let rulesets = all_pages!(
                |token| c
                    .list_rulesets(ListRulesetsRequest {
                        page_size: PAGE_SIZE,
                        page_token: token.clone(),
                    })
                    .await?,
                rulesets
            );
            print(
                out,
                Value::Array(rulesets.iter().map(view::ruleset_json).collect()),
                || view::rulesets_text(&rulesets),
            )?;
        }
        RulesetCommand::Delete {
            ruleset,
            etag,
            request_id,
        } => {
            c.delete_ruleset(DeleteRulesetRequest {
                name: format!("rulesets/{ruleset}"),
                etag: etag.clone().unwrap_or_default(),
                request_id: request_id.clone().unwrap_or_default(),
            })
            .await?;
            print(out, json!({"deleted": ruleset}), || {
                format!("deleted ruleset {ruleset}\n")
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_input_is_stdin() {
        let args = SourceArgs {
            format: None,
            family: FamilyArg::Ipv4,
            v6: Some(PathBuf::from(crate::input::STDIN)),
            noflush: false,
            counters: false,
        };
        assert!(matches!(
            source(Path::new("-"), &args),
            Err(CliError::Argument(m)) if m.contains("both")
        ));
    }

    /// Detection reads the first word that is not a comment: nft files by their commands,
    /// nft JSON by its `{`, everything else as iptables-restore text.
    #[test]
    fn input_format_is_detected_from_the_text() {
        use InputFormat::{Iptables, Nft, NftJson};
        for (text, want) in [
            ("table inet filter {\n}\n", Nft),
            ("#!/usr/sbin/nft -f\nflush ruleset\n", Nft),
            ("\n# Debian\n\nflush ruleset\ntable inet filter {}\n", Nft),
            ("define lan = 10.0.0.0/8\ntable ip t {}\n", Nft),
            ("add table ip t\n", Nft),
            ("include \"/etc/nft.d/*.nft\"\n", Nft),
            ("{\"nftables\": []}", NftJson),
            ("  \n{\"nftables\": [{\"metainfo\": {}}]}", NftJson),
            ("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", Iptables),
            (
                "# Generated by iptables-save v1.8.9\n*filter\nCOMMIT\n",
                Iptables,
            ),
            ("", Iptables),
            ("tables\n", Iptables),
        ] {
            assert_eq!(InputFormat::detect(text), want, "{text:?}");
        }
    }

    /// The iptables-only flags are refused with an nft file instead of being ignored.
    #[test]
    fn iptables_flags_are_refused_with_nft() {
        let dir = std::env::temp_dir().join(format!("vallumctl-nft-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rules.nft");
        std::fs::write(&file, "table inet filter {\n}\n").unwrap();
        let args = SourceArgs {
            format: None,
            family: FamilyArg::Ipv4,
            v6: None,
            noflush: true,
            counters: false,
        };
        let r = source(&file, &args);
        assert!(
            matches!(&r, Err(CliError::Argument(m)) if m.contains("--noflush")),
            "{r:?}"
        );
        let args = SourceArgs {
            noflush: false,
            ..args
        };
        let Ok(RulesetSource {
            source: Some(pb::ruleset_source::Source::Nft(t)),
        }) = source(&file, &args)
        else {
            panic!("not an nft source");
        };
        assert!(!t.json);
        assert_eq!(t.content, "table inet filter {\n}\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
