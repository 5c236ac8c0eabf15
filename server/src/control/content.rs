//! A revision's content: what the caller sent, parsed, and its canonical stored form (IPv4 and
//! IPv6 iptables-save text, printed by the engine's canonical printer) with its digest tree
//! ([`tree`]: per-chunk sha256 and a root over them; the type is in `content/canonical.rs`);
//! and the findings of the request in the caller's terms.
//!
//! This module does not validate. Validation is the engine's (`Engine::validate_change` in a
//! commit, `Engine::validate` for a dry run, both through [`crate::control::pipeline::Pipeline`]); the
//! engine's violations come back here to be placed at the request's `FILE:LINE:COL` or field
//! ([`Places::findings`], [`Checked::with_violations`]) and turned into the request's error
//! ([`accept`]).
//!
//! Stored content always re-parses to the same model (the printer's round-trip guarantee), so
//! the store keeps text, not a serialised model. The combined text shown to users is the IPv4
//! text, then [`V6_SEPARATOR`], then the IPv6 text (the separator is a comment line, so the
//! combined text is still valid iptables-restore input for the IPv4 part).
//!
//! A request's text is a whole ruleset, or with `noflush` ([`check_with`]) a change applied to
//! the ruleset's active content as `iptables-restore --noflush` applies one to the kernel's
//! tables; either way the result checked and stored is the complete ruleset. The parser's
//! warnings become warning findings at their `FILE:LINE:COL`.

use std::sync::{Arc, Weak};

use vallum_engine::echo::clipped;
use vallum_engine::model::{Family, Hook, Location, Ruleset, Table, TableKind};
use vallum_engine::restore::{self, ExternalRefKind, ParseOptions, PrintOptions};
use vallum_engine::validate::{Severity, Violation, ViolationKind};

use crate::error::{Error, FieldViolation, Reason};
use crate::grpc::limits::{LimitError, LimitsConfig};

mod canonical;
pub mod nft;
pub mod text;
pub mod tree;

pub use tree::Layout;

pub use canonical::{Content, V6_SEPARATOR};
pub use text::Text;

/// One text of a request: iptables-restore input for one family.
#[derive(Clone, Debug)]
pub struct TextPart {
    /// The text.
    pub text: String,
    /// iptables-restore (IPv4) or ip6tables-restore (IPv6).
    pub family: Family,
    /// File name for `FILE:LINE:COL` messages.
    pub filename: String,
    /// Request field path of the text, e.g. `source.text.content`.
    pub field: String,
    /// For text generated from structured input: the field path of each line (index = line
    /// - 1); violations then name the structured field instead of a line.
    pub line_fields: Option<Vec<String>>,
}

/// What a request asks to store: one or two iptables-restore texts (IPv4 and IPv6), or one
/// nft text.
#[derive(Clone, Debug, Default)]
pub struct RulesetInput {
    /// The texts, at most one per family.
    pub parts: Vec<TextPart>,
    /// nft text or JSON (`RulesetSource.nft`); `parts` is then empty.
    pub nft: Option<nft::NftPart>,
}

/// A violation in the caller's terms: where (file position or field path), what, how bad.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// `FILE:LINE:COL` for text, a field path for structured input.
    pub location: String,
    /// `filter/INPUT#3` style path inside the ruleset.
    pub path: String,
    /// The message.
    pub message: String,
    /// UPPER_SNAKE reason (a [`Reason`] name).
    pub reason: Reason,
}

/// Where a request's findings are placed: each text's request field and file name (and, for
/// structured input, each line's field), and what names the rules of a `--noflush` base.
#[derive(Clone, Debug, Default)]
pub struct Places {
    parts: Vec<Place>,
    base_label: String,
}

#[derive(Clone, Debug)]
struct Place {
    family: Family,
    field: String,
    filename: String,
    line_fields: Option<Vec<String>>,
}

impl Places {
    /// The places of `input`'s texts; findings on rules of a `--noflush` base (no line in
    /// the text) are at `base_label` (empty: none).
    pub fn of(input: &RulesetInput, base_label: &str) -> Places {
        // An nft text holds both families' rules: it is the place of both.
        let nft = input.nft.iter().flat_map(|p| {
            [Family::Ipv4, Family::Ipv6].map(|family| Place {
                family,
                field: p.field.clone(),
                filename: p.filename.clone(),
                line_fields: None,
            })
        });
        Places {
            parts: input
                .parts
                .iter()
                .map(|p| Place {
                    family: p.family,
                    field: p.field.clone(),
                    filename: p.filename.clone(),
                    line_fields: p.line_fields.clone(),
                })
                .chain(nft)
                .collect(),
            base_label: base_label.to_string(),
        }
    }

    /// The engine's `violations` of the model parsed from these texts, as findings at their
    /// `FILE:LINE:COL` (or structured field, or base label), in the same order.
    pub fn findings(&self, violations: &[Violation]) -> Vec<Finding> {
        violations.iter().map(|v| self.finding(v)).collect()
    }

    /// A validation finding at its text position; one on a rule of a `--noflush` base (line
    /// 0: not in the text) is at `source|{base_label}`.
    fn finding(&self, v: &Violation) -> Finding {
        let part = v
            .family
            .and_then(|f| self.parts.iter().find(|p| p.family == f))
            .or_else(|| self.parts.first());
        let location = match part {
            _ if v.location.line == 0 && !self.base_label.is_empty() => {
                format!("source|{}", self.base_label)
            }
            Some(p) => p.position(v.location.line, v.location.column),
            None => String::new(),
        };
        let reason = match v.kind {
            ViolationKind::Unsupported { .. } => Reason::UnsupportedExtension,
            // Both say: the packets these rules could match never reach this node's path.
            ViolationKind::HookNotReached { .. }
            | ViolationKind::StateNotQueued(..)
            | ViolationKind::LoopbackNotSteered(..) => Reason::HookNotReached,
            ViolationKind::NoPacketBytes(_) | ViolationKind::NoBytesFor { .. } => {
                Reason::NoPacketBytes
            }
            ViolationKind::WaitsForTable { .. } => Reason::WaitsForTable,
            _ => Reason::InvalidRuleset,
        };
        Finding {
            severity: v.severity,
            location,
            path: v.path(),
            message: v.kind.to_string(),
            reason,
        }
    }
}

impl Place {
    fn position(&self, line: u32, column: u32) -> String {
        position(
            &self.field,
            &self.filename,
            self.line_fields.as_deref(),
            line,
            column,
        )
    }
}

/// `Ok` with the warnings when no finding is an error, else the request's error naming every
/// error finding: the one mapping of findings to a refusal, for Apply, Stage, dry runs and
/// the fleet's check.
///
/// Errors: [`Error::BadRequest`] with reason UNSUPPORTED_EXTENSION when an error is an
/// extension the engine does not enforce, INVALID_RULESET otherwise; each violation on the
/// finding's field, described `FILE:LINE:COL: PATH: message`.
pub fn accept(findings: Vec<Finding>) -> Result<Vec<Finding>, Error> {
    if findings.iter().all(|f| f.severity != Severity::Error) {
        return Ok(findings);
    }
    let errors: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .collect();
    let reason = if errors
        .iter()
        .any(|f| f.reason == Reason::UnsupportedExtension)
    {
        Reason::UnsupportedExtension
    } else {
        Reason::InvalidRuleset
    };
    Err(Error::BadRequest {
        reason,
        violations: errors
            .iter()
            .map(|f| {
                let (field, desc) = split_field(&f.location);
                let path = if f.path.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", f.path)
                };
                FieldViolation::new(field, format!("{desc}{path}{}", f.message))
            })
            .collect(),
    })
}

/// A parsed input: its model and canonical content, the parser's findings and, once
/// validated ([`Checked::with_violations`]), validation's.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The model (priority set).
    pub ruleset: Ruleset,
    /// Its canonical content.
    pub content: Content,
    /// The parser's warnings, then (once [`Checked::validated`]) every validation finding
    /// (only warnings when [`Checked::valid`]).
    pub findings: Vec<Finding>,
    /// Where the engine's violations of `ruleset` are placed in the request.
    pub places: Places,
    /// Whether validation's findings are in `findings`.
    validated: bool,
    /// The texts the model was parsed from, when the caller keeps them for the next
    /// [`check_after`] (empty from [`check`]: see [`Checked::keep_sources`]).
    pub sources: Vec<SourceText>,
    /// The families whose text is not kept by [`Checked::keep_sources`]: their parse had
    /// warnings (the incremental parse copies unchanged lines without them, so the next
    /// check must parse in full to report them again), or the text was `--noflush` input
    /// (the model is not the parse of the text alone).
    pub not_reusable: Vec<Family>,
    /// The model was made from the active one by the request's commands
    /// ([`Base::model`]): commit it as an edit (`Change::PutEdited`), which keeps the
    /// counters of the rules it did not touch.
    pub edited: bool,
    /// For nft input: the parsed nft ruleset and the engine sets its named sets become
    /// (`ruleset` is what [`vallum_engine::nft::lower()`] made of it).
    pub nft: Option<nft::NftChecked>,
}

/// One text a model was parsed from (see [`PreviousParse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceText {
    /// IPv4 or IPv6.
    pub family: Family,
    /// The text exactly as parsed.
    pub text: Arc<String>,
    /// When the text is the canonical content of its family (as `iptables-save` output of
    /// the model is): that content, as its chunks (shared with the revision's, not copied).
    /// The next check then parses without reading the previous text line by line
    /// (`restore::parse_after_canonical`) and splices the content from these chunks instead of
    /// printing and hashing it whole.
    pub canonical: Option<Text>,
}

/// The texts a ruleset's model was parsed from and that model, for [`check_after`] to parse
/// the next text of the same ruleset incrementally (`restore::parse_after`: an orchestrator
/// that re-applies a 10k-rule ruleset with one rule changed gets it parsed in ~1 ms instead
/// of ~4). The model is not kept alive: once the engine has dropped it (a later commit of
/// something else), there is nothing to reuse and the next text is parsed in full.
#[derive(Clone, Debug)]
pub struct PreviousParse {
    /// Each text, by family, exactly as it was parsed.
    pub texts: Vec<SourceText>,
    /// What [`check`] parsed them into (the tables; its priority may have been changed).
    pub model: Weak<Ruleset>,
}

impl Checked {
    /// Moves the texts of `input` (what this was checked from) into [`Checked::sources`],
    /// noting which are the canonical content.
    pub fn keep_sources(&mut self, input: RulesetInput) {
        let skip = std::mem::take(&mut self.not_reusable);
        self.sources = input
            .parts
            .into_iter()
            .filter(|p| !skip.contains(&p.family))
            .map(|p| SourceText {
                canonical: Some(self.content.text(p.family))
                    .filter(|t| *t == p.text.as_str())
                    .cloned(),
                family: p.family,
                text: Arc::new(p.text),
            })
            .collect();
    }

    /// Whether the ruleset is empty: no rule in any table and no builtin chain with a DROP
    /// policy (its user chains, if any, have no rules and nothing jumps to them). Such a
    /// ruleset accepts every packet and, as ACCEPT passes a packet on to the next ruleset,
    /// decides nothing: committing it is the same as deleting every rule, which an empty
    /// file (`apply web /dev/null`) or a lost text does by accident. A text of no tables at
    /// all is empty too.
    pub fn is_empty(&self) -> bool {
        if let Some(n) = &self.nft {
            return nft::is_empty(&n.model);
        }
        self.ruleset.rule_count() == 0
            && self.ruleset.tables.iter().all(|t| {
                t.chains
                    .iter()
                    .all(|c| c.policy != Some(vallum_engine::model::Policy::Drop))
            })
    }

    /// Rules of the ruleset as the user wrote it: the nft ruleset's rules for nft input, else
    /// the engine model's.
    pub fn rule_count(&self) -> usize {
        match &self.nft {
            Some(n) => nft::rule_count(&n.model),
            None => self.ruleset.rule_count(),
        }
    }

    /// The engine sets an nft input's named sets become (none for iptables input).
    pub fn nft_sets(&self) -> &[vallum_engine::nft::LoweredSet] {
        self.nft.as_ref().map_or(&[], |n| &n.sets)
    }

    /// `Ok(self)` unless [`Checked::is_empty`] and the caller did not say `allow_empty`.
    ///
    /// Errors: [`Error::BadRequest`] with reason EMPTY_RULESET on `source`.
    pub fn refuse_empty(self, allow_empty: bool) -> Result<Checked, Error> {
        if allow_empty || !self.is_empty() {
            return Ok(self);
        }
        Err(Error::BadRequest {
            reason: Reason::EmptyRuleset,
            violations: vec![FieldViolation::new(
                "source",
                "the ruleset is empty (no rule and no DROP policy: it would accept every packet, as if every rule were gone); set allow_empty (vallumctl --allow-empty) to commit it",
            )],
        })
    }

    /// This input with validation's `violations` (the engine's, of [`Checked::ruleset`])
    /// placed in the request and added to its findings.
    pub fn with_violations(mut self, violations: &[Violation]) -> Checked {
        self.findings.extend(self.places.findings(violations));
        self.validated = true;
        self
    }

    /// Whether [`Checked::with_violations`] added validation's findings.
    pub fn validated(&self) -> bool {
        self.validated
    }

    /// Whether no finding is an error (of the parser's only, before validation).
    pub fn valid(&self) -> bool {
        self.findings.iter().all(|f| f.severity != Severity::Error)
    }

    /// The findings that are warnings.
    pub fn warnings(&self) -> Vec<Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .cloned()
            .collect()
    }

    /// `Ok(self)` when validated and valid, else the bad-request error naming every error
    /// finding ([`accept`]).
    ///
    /// Errors: as [`accept`]; [`Error::Invariant`] when it was not validated (a caller's bug:
    /// the request would pass unchecked).
    pub fn into_valid(mut self) -> Result<Checked, Error> {
        if !self.validated {
            return Err(Error::invariant(
                "a ruleset was accepted before it was validated",
            ));
        }
        self.findings = accept(std::mem::take(&mut self.findings))?;
        Ok(self)
    }
}

/// Findings keep `field|FILE:LINE:COL` internally so one string carries both the request
/// field and the text position; this splits them into (field, "FILE:LINE:COL: ").
fn split_field(location: &str) -> (String, String) {
    match location.split_once('|') {
        Some((field, pos)) => (field.to_string(), format!("{pos}: ")),
        None => (location.to_string(), String::new()),
    }
}

impl Finding {
    /// The location as the API shows it (`FILE:LINE:COL` or a field path).
    pub fn display_location(&self) -> String {
        match self.location.split_once('|') {
            Some((_, pos)) => pos.to_string(),
            None => self.location.clone(),
        }
    }
}

fn part_position(part: &TextPart, line: u32, column: u32) -> String {
    position(
        &part.field,
        &part.filename,
        part.line_fields.as_deref(),
        line,
        column,
    )
}

/// `field|FILE:LINE:COL`, or for structured input the field of the line.
fn position(
    field: &str,
    filename: &str,
    line_fields: Option<&[String]>,
    line: u32,
    column: u32,
) -> String {
    match line_fields {
        Some(fields) => fields
            .get((line as usize).wrapping_sub(1))
            .cloned()
            .unwrap_or_else(|| field.to_string()),
        None => format!("{field}|{filename}:{line}:{column}"),
    }
}

/// Parses `input` as ruleset `name` at `priority` and prints its canonical content (no
/// validation: see the module docs).
///
/// Errors: [`Error::BadRequest`] when a text does not parse: reason NOFLUSH_UNSUPPORTED when it
/// parses only as `iptables-restore --noflush` input (it relies on chains that exist outside
/// the text), INVALID_RULESET otherwise; every error is listed as `FILE:LINE:COL: message`.
/// The parser's warnings come back in [`Checked::findings`].
pub fn check(name: &str, priority: i32, input: &RulesetInput) -> Result<Checked, Error> {
    check_after(name, priority, input, None)
}

/// As [`check`], given the previous parse of the same ruleset: a text that differs from the
/// previous one of its family in a few rule lines is parsed incrementally
/// (`restore::parse_after`, which gives exactly what a full parse gives, or declines); any
/// other is parsed in full. Same result and errors as [`check`].
pub fn check_after(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    previous: Option<&PreviousParse>,
) -> Result<Checked, Error> {
    check_with(name, priority, input, previous, &Restoring::default(), None)
}

/// How a request's text is restored, beyond the text itself (`RestoreText.noflush` and
/// `.counters`, vallumctl `--noflush` / `--counters`).
#[derive(Clone, Debug, Default)]
pub struct Restoring {
    /// As `iptables-restore --counters`: rules keep the text's `[p:b]` / `-c P B` counters
    /// (the engine starts them there); without it they are syntax-checked and dropped.
    pub counters: bool,
    /// As `iptables-restore --noflush`: the text is applied on top of this content (the
    /// ruleset's active revision, or empty tables when none is active).
    pub noflush: Option<Base>,
}

/// What a `--noflush` text is applied to.
#[derive(Clone, Debug, Default)]
pub struct Base {
    /// The content (canonical, as stored; shared with the pipeline's copy of the active
    /// revision's, [`crate::control::pipeline::Pipeline::active_content`]).
    pub content: Arc<Content>,
    /// What findings on its rules name as their place, e.g. `rulesets/web/revisions/3`
    /// (they have no line in the request's text).
    pub label: String,
    /// The model the engine runs for this content (its canonical print is `content`), when
    /// the caller has it: the text is then applied to it (`restore::parse_onto`), not to a
    /// parse of `content`, only what changed is validated and the content is spliced from
    /// `content` (see [`check_with`]).
    pub model: Option<Arc<Ruleset>>,
}

/// As [`check_after`], with [`Restoring`] options. With `noflush`, each text is parsed as
/// `iptables-restore --noflush` input applied to the base content of its family (as the
/// kernel's tables: what the text does not name is kept, `:CHAIN` flushes or creates, `-D` /
/// `-R` / `-F` / `-A` must find their rule or chain there), and the whole merged ruleset
/// (the base's tables of a family the request has no text for included) is printed (and
/// later validated) as one complete revision. Findings on base rules are at [`Base::label`]
/// ([`Checked::places`]). Neither
/// `noflush` nor `counters` parses incrementally.
///
/// Differences from iptables-restore --noflush that remain: `-X` of a chain that does not
/// exist is a no-op, and in a second `*table` block of the same table in one text `-I
/// BUILTIN N` past the chain's end inserts at the end instead of failing.
///
/// `limits` (`--max-chains`, `--max-rules`) are checked on the parsed tables before anything
/// else is done with them (printing, validation): a refusal costs one parse, which is linear in
/// the text.
///
/// Errors: as [`check`]; a noflush text that changes a chain or rule that does not exist is
/// INVALID_RULESET at the command; [`crate::grpc::limits::LimitError`] (RESOURCE_EXHAUSTED) over a
/// limit.
pub fn check_with(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    previous: Option<&PreviousParse>,
    how: &Restoring,
    limits: Option<&LimitsConfig>,
) -> Result<Checked, Error> {
    if let Some(part) = &input.nft {
        return nft::check(name, priority, input, part, limits);
    }
    if input.parts.is_empty() {
        return Err(Error::invalid("source", "a ruleset source is required"));
    }
    if let Some(base) = &how.noflush {
        if let (Some(model), false) = (&base.model, how.counters) {
            return check_onto(name, priority, input, model, base, limits);
        }
        return check_noflush(name, priority, input, base, how.counters, limits);
    }
    let previous = previous.filter(|_| !how.counters);
    let mut tables = Vec::new();
    let mut violations = Vec::new();
    let mut noflush_only = true;
    // Warnings of the parser, as findings, and the families that had some.
    let mut parse_warnings = Vec::new();
    let mut not_reusable = Vec::new();
    let reuse = previous.and_then(|p| Some((p, p.model.upgrade()?)));
    // Per part, the canonical content spliced by `parse_after_canonical`, if it was.
    let mut spliced: Vec<(Family, Option<Text>)> = Vec::new();
    for part in &input.parts {
        let opts = ParseOptions {
            family: part.family,
            counters: how.counters,
            // `-m owner` names, looked up on this host as iptables-restore would.
            resolve_owner: Some(&crate::host::owner_names::resolve),
            max_rules: max_rules(limits),
            ..ParseOptions::default()
        };
        if how.counters {
            // A model with counters is no base for a later parse without them.
            not_reusable.push(part.family);
        }
        let incremental = reuse.as_ref().and_then(|(p, model)| {
            let src = p.texts.iter().find(|s| s.family == part.family)?;
            match &src.canonical {
                // The content is the previous one's chunks with the changed lines' chunks cut
                // again (and hashed when asked): no print or hash of the whole text.
                Some(content) => {
                    restore::parse_after_canonical(&src.text, &model.tables, &part.text, &opts)
                        .map(|(t, print)| (t, print.map(|s| content.splice(&[(s.range, s.text)]))))
                }
                None => restore::parse_after(&src.text, &model.tables, &part.text, &opts)
                    .map(|t| (t, None)),
            }
        });
        if let Some((t, print)) = incremental {
            tables.extend(t);
            spliced.push((part.family, print));
            continue;
        }
        spliced.push((part.family, None));
        match restore::parse_ruleset_warned(name, &part.text, &opts, parse_threads()) {
            Ok(w) => {
                tables.extend(w.ruleset.tables);
                if !w.warnings.is_empty() {
                    not_reusable.push(part.family);
                }
                parse_warnings.extend(w.warnings.iter().map(|w| parse_warning(part, w)));
            }
            Err(errs) => {
                if let Some(l) = errs.0.iter().find_map(|e| {
                    parse_limit(e, part_position(part, e.location.line, e.location.column))
                }) {
                    return Err(l.into());
                }
                let noflush = ParseOptions {
                    noflush: true,
                    ..opts
                };
                // Noflush input changes chains it does not declare (`-A`, `-F`, `-X`, `-D`);
                // a text whose only errors are jumps to undeclared chains is just that,
                // reported at each jump ("chain X is not declared").
                let only_jumps = errs
                    .0
                    .iter()
                    .all(|e| matches!(e.kind, restore::ParseErrorKind::UnknownTarget { .. }));
                match restore::parse(&part.text, &noflush) {
                    Ok(r) if !r.external.is_empty() && !only_jumps => {
                        let mut chains: Vec<&str> =
                            r.external.iter().map(|e| e.chain.as_str()).collect();
                        chains.dedup();
                        let e = &r.external[0];
                        violations.push(FieldViolation::new(
                            part.field.clone(),
                            format!(
                                "{}:{}:{}: this is iptables-restore --noflush input: it relies on chains that exist outside the text ({}); declare every chain it uses, or send it with noflush (vallumctl --noflush) to apply it to the ruleset's active revision",
                                part.filename,
                                e.location.line,
                                e.location.column,
                                some_names(&chains)
                            ),
                        ));
                    }
                    _ => {
                        noflush_only = false;
                        for e in errs.0 {
                            let pos = part_position(part, e.location.line, e.location.column);
                            let (field, prefix) = split_field(&pos);
                            violations.push(FieldViolation::new(
                                field,
                                format!("{prefix}{} near '{}'", e.kind, clipped(&e.token)),
                            ));
                        }
                    }
                }
            }
        }
    }
    if !violations.is_empty() {
        return Err(Error::BadRequest {
            reason: if noflush_only {
                Reason::NoflushUnsupported
            } else {
                Reason::InvalidRuleset
            },
            violations,
        });
    }
    if let Some(limits) = limits {
        limits.check_tables(&tables)?;
    }
    let ruleset = Ruleset {
        name: name.to_string(),
        priority,
        tables,
    };
    Ok(finish(
        ruleset,
        input,
        parse_warnings,
        spliced,
        not_reusable,
        "",
    ))
}

/// Prints a parsed ruleset (the common end of [`check_with`]): findings are the parser's
/// warnings; content spliced when every family has it.
fn finish(
    ruleset: Ruleset,
    input: &RulesetInput,
    parse_warnings: Vec<Finding>,
    spliced: Vec<(Family, Option<Text>)>,
    not_reusable: Vec<Family>,
    base_label: &str,
) -> Checked {
    // Every part's content spliced from the previous one: nothing to print.
    let content = if spliced.iter().all(|(_, p)| p.is_some()) {
        let mut c = Content::default();
        for (family, print) in spliced {
            c.set(family, print.unwrap_or_default());
        }
        c
    } else {
        Content::from_tables(&ruleset.tables)
    };
    Checked {
        ruleset,
        content,
        findings: parse_warnings,
        places: Places::of(input, base_label),
        validated: false,
        sources: Vec::new(),
        not_reusable,
        edited: false,
        nft: None,
    }
}

/// [`check_with`] for `--noflush` input without `counters` when the base's model is known
/// ([`Base::model`]): each family's text is applied to the model's tables of the family
/// (`restore::parse_onto`: the base is neither printed nor parsed again, its rule chunks are
/// shared) and its content is the base's chunks with only the changed rules printed and the
/// chunks around them cut and hashed again ([`changed_text`]); the commit validates it against
/// the model, which is the active one (only what changed is checked rule by rule). The same
/// result as [`check_noflush`] up to the locations of findings on base rules, at a cost in
/// proportion to the text, not the ruleset (apart from walks of the chains and of the chunk
/// list, ~64 lines a chunk: no byte of the base's text is read, copied or hashed).
///
/// Errors: as [`check_noflush`].
fn check_onto(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    model: &Ruleset,
    base: &Base,
    limits: Option<&LimitsConfig>,
) -> Result<Checked, Error> {
    let mut tables = Vec::with_capacity(model.tables.len() + 1);
    let mut violations = Vec::new();
    let mut parse_warnings = Vec::new();
    let mut content = Content::default();
    for family in [Family::Ipv4, Family::Ipv6] {
        let old: Vec<Table> = model
            .tables
            .iter()
            .filter(|t| t.family == family)
            .cloned()
            .collect();
        let base_text = base.content.text(family);
        let Some(part) = input.parts.iter().find(|p| p.family == family) else {
            tables.extend(old);
            content.set(family, base_text.clone());
            continue;
        };
        let opts = ParseOptions {
            family,
            resolve_owner: Some(&crate::host::owner_names::resolve),
            max_rules: max_rules(limits),
            ..ParseOptions::default()
        };
        let at = |line: u32, column: u32| split_field(&part_position(part, line, column));
        let r = match restore::parse_onto(&old, &part.text, &opts) {
            Ok(r) => r,
            Err(errs) => {
                for e in &errs.0 {
                    let place = part_position(part, e.location.line, e.location.column);
                    if let Some(l) = parse_limit(e, place) {
                        return Err(l.into());
                    }
                    let (field, prefix) = at(e.location.line, e.location.column);
                    violations.push(FieldViolation::new(
                        field,
                        format!("{prefix}{} near '{}'", e.kind, clipped(&e.token)),
                    ));
                }
                continue;
            }
        };
        for e in &r.external {
            if let Some(p) = external_problem(e) {
                let (field, prefix) = at(e.location.line, e.location.column);
                violations.push(FieldViolation::new(field, format!("{prefix}{p}")));
            }
        }
        parse_warnings.extend(r.warnings.iter().map(|w| parse_warning(part, w)));
        let text = changed_text(base_text, &old, &r.tables)
            .unwrap_or_else(|| Text::new(restore::print(&r.tables, &PrintOptions::default())));
        content.set(family, text);
        tables.extend(r.tables);
    }
    if !violations.is_empty() {
        return Err(Error::BadRequest {
            reason: Reason::InvalidRuleset,
            violations,
        });
    }
    if let Some(limits) = limits {
        limits.check_tables(&tables)?;
    }
    // The digest tree: only the chunks the change made are hashed (the others are the
    // base's, hashed already).
    content.layout();
    let ruleset = Ruleset {
        name: name.to_string(),
        priority,
        tables,
    };
    Ok(Checked {
        ruleset,
        content,
        findings: parse_warnings,
        places: Places::of(input, &base.label),
        validated: false,
        sources: Vec::new(),
        not_reusable: vec![Family::Ipv4, Family::Ipv6],
        edited: true,
        nft: None,
    })
}

/// The canonical text of `new` (one family's tables) made from `base`, the canonical text of
/// `old`, by the line changes between the two models (`restore::print_changes`): only the
/// changed rules are printed and only the chunks around them cut; the rest of `base` is
/// shared, not read. `None` when the tables differ in which tables there are, or `base` does
/// not have the lines `old` prints as (then print `new` in full).
fn changed_text(base: &Text, old: &[Table], new: &[Table]) -> Option<Text> {
    let (changes, lines) = restore::print_changes(old, new)?;
    if lines != base.lines() || !base.ends_with_newline() {
        return None;
    }
    let mut spans = Vec::with_capacity(changes.len());
    for c in changes {
        let start = base.line_offset(c.line)?;
        let end = base.line_offset(c.line + c.old_lines)?;
        spans.push((start..end, c.text));
    }
    Some(base.splice(&spans))
}

/// Why iptables-restore --noflush would refuse what a text names but neither it nor the
/// base has ([`restore::Restore::external`]); `None` for what it accepts (keeping a policy,
/// `-X` of a missing chain, changing a builtin chain of a table the base lacks).
fn external_problem(e: &restore::ExternalRef) -> Option<String> {
    let builtin =
        Hook::from_chain_name(&e.chain).is_some_and(|h| e.table.builtin_hooks().contains(&h));
    match e.kind {
        ExternalRefKind::KeepPolicy | ExternalRefKind::Delete => None,
        ExternalRefKind::AddRules | ExternalRefKind::Flush if builtin => None,
        ExternalRefKind::AddRules | ExternalRefKind::Flush => {
            Some(format!("chain '{}' does not exist", clipped(&e.chain)))
        }
        ExternalRefKind::Jump | ExternalRefKind::Goto => Some(format!(
            "chain '{}' does not exist (in the text or the active revision)",
            clipped(&e.chain)
        )),
        ExternalRefKind::ChangeRule => Some(format!(
            "no such rule in chain '{}' (does a matching rule exist?)",
            clipped(&e.chain)
        )),
    }
}

/// [`check_with`] for `--noflush` input (see there).
fn check_noflush(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    base: &Base,
    counters: bool,
    limits: Option<&LimitsConfig>,
) -> Result<Checked, Error> {
    let mut tables = Vec::new();
    let mut violations = Vec::new();
    let mut parse_warnings = Vec::new();
    for family in [Family::Ipv4, Family::Ipv6] {
        let base_text = base.content.family(family);
        let part = input.parts.iter().find(|p| p.family == family);
        let Some(part) = part else {
            if !base_text.is_empty() {
                let mut rs = restore::parse_ruleset(
                    name,
                    base_text,
                    &ParseOptions {
                        family,
                        ..ParseOptions::default()
                    },
                )
                .map_err(|e| {
                    Error::store_corrupt(format!("{}: does not parse: {e}", base.label))
                })?;
                restore::clear_locations(&mut rs.tables);
                tables.extend(rs.tables);
            }
            continue;
        };
        match merge_noflush(base_text, part, counters, max_rules(limits)) {
            Ok((t, warnings)) => {
                tables.extend(t);
                parse_warnings.extend(warnings.iter().map(|w| parse_warning(part, w)));
            }
            Err(MergeError::StoreCorrupt(e)) => {
                return Err(Error::store_corrupt(format!("{}: {e}", base.label)));
            }
            Err(MergeError::Text(v)) => violations.extend(v),
            Err(MergeError::Limit(l)) => return Err(l.into()),
        }
    }
    if !violations.is_empty() {
        return Err(Error::BadRequest {
            reason: Reason::InvalidRuleset,
            violations,
        });
    }
    // The merged revision is what must fit the limits.
    if let Some(limits) = limits {
        limits.check_tables(&tables)?;
    }
    let ruleset = Ruleset {
        name: name.to_string(),
        priority,
        tables,
    };
    let families = vec![Family::Ipv4, Family::Ipv6];
    let spliced = families.iter().map(|f| (*f, None)).collect();
    Ok(finish(
        ruleset,
        input,
        parse_warnings,
        spliced,
        families,
        &base.label,
    ))
}

/// The table a `*table` line opens (as the parser reads one: a single word), if it is one.
fn table_header(line: &str) -> Option<TableKind> {
    let mut words = line.split([' ', '\t', '\r']).filter(|w| !w.is_empty());
    let name = words.next()?.strip_prefix('*')?;
    if words.next().is_some() {
        return None;
    }
    TableKind::from_name(name)
}

/// For table `kind`: `-F CHAIN` for each builtin chain, then the base's `-A` lines of builtin
/// chains (canonical text: one `-A CHAIN spec` per rule, in order).
fn builtin_refill(base_text: &str, kind: TableKind) -> Vec<String> {
    let builtins: Vec<&str> = kind
        .builtin_hooks()
        .iter()
        .map(|h| h.chain_name())
        .collect();
    let mut out: Vec<String> = builtins.iter().map(|c| format!("-F {c}")).collect();
    let header = format!("*{}", kind.name());
    let mut inside = false;
    for line in base_text.lines() {
        if line == header {
            inside = true;
        } else if line == "COMMIT" {
            inside = false;
        } else if inside {
            let chain = line.strip_prefix("-A ").and_then(|l| l.split(' ').next());
            if chain.is_some_and(|c| builtins.contains(&c)) {
                out.push(line.to_string());
            }
        }
    }
    out
}

/// Why [`merge_noflush`] failed.
enum MergeError {
    /// The base content does not parse (a corrupt store).
    StoreCorrupt(String),
    /// The text's problems, at `FILE:LINE:COL`.
    Text(Vec<FieldViolation>),
    /// The text's `-s`/`-d` lists stand for more rules than `--max-rules`.
    Limit(LimitError),
}

/// `--max-rules` as the parser's limit on what `-s`/`-d` address lists expand to
/// ([`ParseOptions::max_rules`]); no limit without `limits`.
fn max_rules(limits: Option<&LimitsConfig>) -> usize {
    limits.map_or(usize::MAX, |l| l.max_rules_per_ruleset)
}

/// The parser's refusal of address lists over `--max-rules`
/// ([`restore::ParseErrorKind::TooManyRules`]) as the limit it is (RESOURCE_EXHAUSTED,
/// TOO_MANY_RULES) at `place` (`field|FILE:LINE:COL`, [`position`]); `None` for other errors.
fn parse_limit(e: &restore::ParseError, place: String) -> Option<LimitError> {
    let restore::ParseErrorKind::TooManyRules { count, max } = e.kind else {
        return None;
    };
    let (field, at) = split_field(&place);
    // Structured input (EditRuleset's edits) has no line: its place is the field.
    let at = match at.strip_suffix(": ") {
        Some(at) => at.to_string(),
        None => field.clone(),
    };
    Some(LimitError::ListTooLarge {
        field,
        at,
        count,
        max,
    })
}

/// `part` (iptables-restore --noflush input) applied to `base_text` (canonical content of the
/// same family): the base is read as a first block of each table and the text continues it
/// (the parser's --noflush reading of a repeated `*table`), so every command sees the base's
/// chains and rules. The parser reads a continued block's builtin chains as holding unknown
/// rules; right after the text's first `*table` line of each table, `-F` and the base's rules
/// of each builtin chain are read again (lines of no position), so that they are known:
/// `-I`/`-D`/`-R` by number or rule are checked against them as against the kernel's.
/// Locations are the text's; the base's are cleared (line 0).
fn merge_noflush(
    base_text: &str,
    part: &TextPart,
    counters: bool,
    max_rules: usize,
) -> Result<(Vec<Table>, Vec<restore::ParseWarning>), MergeError> {
    // The merged text, and for each of its lines (index = line - 1) the text's line, or
    // `None` for lines of the base.
    let offset = base_text.matches('\n').count();
    let mut merged = String::with_capacity(base_text.len() + part.text.len());
    merged.push_str(base_text);
    let mut map: Vec<Option<u32>> = vec![None; offset];
    let mut seen: Vec<TableKind> = Vec::new();
    let segments: Vec<&str> = part.text.split('\n').collect();
    for (i, seg) in segments.iter().enumerate() {
        merged.push_str(seg);
        map.push(Some(u32::try_from(i + 1).unwrap_or(u32::MAX)));
        if i + 1 == segments.len() {
            break;
        }
        merged.push('\n');
        let Some(kind) = table_header(seg).filter(|k| !seen.contains(k)) else {
            continue;
        };
        seen.push(kind);
        for line in builtin_refill(base_text, kind) {
            merged.push_str(&line);
            merged.push('\n');
            map.push(None);
        }
    }
    let opts = ParseOptions {
        family: part.family,
        noflush: true,
        counters,
        set_exists: None,
        resolve_owner: Some(&crate::host::owner_names::resolve),
        max_rules,
    };
    // The text's line of a merged line; past the end (a missing COMMIT) past the text's.
    let text_line = |line: u32| -> Option<u32> {
        let i = (line as usize).checked_sub(1)?;
        match map.get(i) {
            Some(l) => *l,
            None => u32::try_from(segments.len() + i + 1 - map.len()).ok(),
        }
    };
    let at = |line: u32, loc: &Location| -> (String, String) {
        split_field(&part_position(part, line, loc.column))
    };
    let mut r = match restore::parse(&merged, &opts) {
        Ok(r) => r,
        Err(errs) => {
            let mut v = Vec::new();
            for e in &errs.0 {
                let Some(line) = text_line(e.location.line) else {
                    return Err(MergeError::StoreCorrupt(format!("does not parse: {e}")));
                };
                let place = part_position(part, line, e.location.column);
                if let Some(l) = parse_limit(e, place) {
                    return Err(MergeError::Limit(l));
                }
                let (field, prefix) = at(line, &e.location);
                v.push(FieldViolation::new(
                    field,
                    format!("{prefix}{} near '{}'", e.kind, clipped(&e.token)),
                ));
            }
            return Err(MergeError::Text(v));
        }
    };
    // What the text changes must exist: the base is the whole of what is there, so a
    // reference the parser could not resolve in it is what iptables-restore --noflush
    // refuses against the kernel's tables.
    let mut violations = Vec::new();
    for e in &r.external {
        let Some(line) = text_line(e.location.line) else {
            // The `-F` of a refill.
            continue;
        };
        if let Some(p) = external_problem(e) {
            let (field, prefix) = at(line, &e.location);
            violations.push(FieldViolation::new(field, format!("{prefix}{p}")));
        }
    }
    if !violations.is_empty() {
        return Err(MergeError::Text(violations));
    }
    let shift = |loc: &mut Location| match text_line(loc.line) {
        Some(line) => loc.line = line,
        None => *loc = Location::default(),
    };
    for t in &mut r.tables {
        shift(&mut t.location);
        for c in &mut t.chains {
            shift(&mut c.location);
            for rule in &mut c.rules {
                shift(&mut rule.location);
            }
        }
    }
    for w in &mut r.warnings {
        shift(&mut w.location);
    }
    // The parser moves a table continued by a second block to the end: back to the base's
    // order (that of a full text's `*table` lines), new tables after.
    let order: Vec<&str> = base_text
        .lines()
        .filter_map(|l| l.strip_prefix('*'))
        .collect();
    r.tables.sort_by_key(|t| {
        order
            .iter()
            .position(|n| *n == t.kind.name())
            .unwrap_or(usize::MAX)
    });
    Ok((r.tables, r.warnings))
}

/// A parser warning (the text was accepted, changed as the kernel changes it) as a
/// warning-level finding at the token's `FILE:LINE:COL`, reason INVALID_RULESET as
/// validation's warnings.
fn parse_warning(part: &TextPart, w: &restore::ParseWarning) -> Finding {
    Finding {
        severity: Severity::Warning,
        location: part_position(part, w.location.line, w.location.column),
        path: String::new(),
        message: format!("{} near '{}'", w.kind, clipped(&w.token)),
        reason: Reason::InvalidRuleset,
    }
}

/// Up to 8 names, clipped, then how many more: `a, b, c and 120 more`.
fn some_names(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    let mut out: Vec<String> = names
        .iter()
        .take(SHOWN)
        .map(|n| clipped(n).to_string())
        .collect();
    if names.len() > SHOWN {
        out.push(format!("and {} more", names.len() - SHOWN));
    }
    out.join(", ")
}

/// Threads a large text's rule lines are read on (`restore::parse_ruleset_threads`): the
/// machine's CPUs, at most 4 (a 10k-rule text takes ~4 ms on one).
fn parse_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

#[cfg(test)]
mod tests;
