//! nftables content: a request's nft text or JSON (`RulesetSource.nft`) parsed with the
//! engine's front end ([`vallum_engine::nft`]), stored as its canonical `nft list ruleset`
//! listing, and the engine's model of it (what the engine enforces).
//!
//! A revision's content is nft when its text is an nft listing ([`is_listing`]): the printer
//! starts every non-empty listing with `table `, which no canonical iptables-save text does
//! (those start with `*TABLE`), so the stored text says which syntax it is and the store keeps
//! no second fact about it. The listing is kept in [`Content::v4`] (there is no IPv6 part:
//! an nft table's family is in the listing), so the digest is the digest tree of the listing
//! as for any other text.
//!
//! What the engine enforces of an nft ruleset is [`nft::lower()`]'s: `type filter` and `type
//! route` chains and what they reach, with the same classifier and counters as iptables
//! rules; a statement the engine does not run in such a chain is refused by name at its
//! FILE:LINE:COL; `type nat` chains are stored only (a warning names each). Named sets the
//! enforced chains use become engine sets named `FAMILY.TABLE.SET` ([`nft::lower::set_name`]),
//! created with their elements when the ruleset is committed
//! ([`crate::control::pipeline::Pipeline::ensure_nft_sets`]); after that their elements
//! change through the sets API without a commit, as `nft add element` changes a set.

use std::collections::HashMap;
use std::sync::Arc;

use vallum_engine::echo::clipped;
use vallum_engine::model::{Family, Ruleset};
use vallum_engine::nft;
use vallum_engine::nft::{Lowered, LoweredSet};
use vallum_engine::validate::Severity;

use super::{Checked, Content, Finding, Places, RulesetInput, position};
use crate::error::{Error, FieldViolation, Reason};
use crate::grpc::limits::{LimitsConfig, check_chains, check_rules};

/// A request's nft text or JSON (`RulesetSource.nft`).
#[derive(Clone, Debug)]
pub struct NftPart {
    /// The text (nft syntax, or with `json` a libnftables-json document).
    pub text: String,
    /// `text` is nft JSON (`nft -j list ruleset`), not nft text.
    pub json: bool,
    /// File name for `FILE:LINE:COL` messages.
    pub filename: String,
    /// Request field path of the text, e.g. `source.nft.content`.
    pub field: String,
}

/// What a checked nft input keeps besides its engine model: the parsed ruleset and the
/// engine sets its named sets become.
#[derive(Clone, Debug)]
pub struct NftChecked {
    /// The parsed ruleset (its [`nft::print`] is the stored content).
    pub model: Arc<nft::Ruleset>,
    /// The named sets the enforced chains use, as engine sets to create (with their
    /// elements) before a commit.
    pub sets: Vec<LoweredSet>,
}

/// Whether stored content `text` is an nft listing (see the module docs).
pub fn is_listing(text: &str) -> bool {
    text.starts_with("table ")
}

/// Parses `part` as ruleset `name` at `priority` (nft text with [`nft::parse`], JSON with
/// [`nft::from_json`]), checks `--max-chains` and `--max-rules` on the parsed ruleset before
/// anything is printed or lowered, and keeps its canonical listing as the content.
///
/// Errors: [`Error::BadRequest`] at `part.field`, described `FILE:LINE:COL: message (at
/// `TOKEN`)`: reason UNSUPPORTED_EXTENSION when nft syntax the model does not have is refused
/// by name ([`nft::ErrorKind::Unsupported`], a family other than ip, ip6, inet),
/// INVALID_RULESET otherwise (`include` among them); [`crate::grpc::limits::LimitError`]
/// over a limit.
pub fn check(
    name: &str,
    priority: i32,
    input: &RulesetInput,
    part: &NftPart,
    limits: Option<&LimitsConfig>,
) -> Result<Checked, Error> {
    let parsed = if part.json {
        nft::from_json(&part.filename, &part.text)
    } else {
        nft::parse(&part.filename, &part.text)
    };
    let rs = parsed.map_err(|errs| refusal(part, &errs))?;
    if let Some(limits) = limits {
        let chains = rs.tables.iter().map(|t| t.chains.len()).sum();
        check_chains(chains, limits.max_chains_per_ruleset)?;
        check_rules(rule_count(&rs), limits.max_rules_per_ruleset)?;
    }
    // JSON has no text lines: the lowering's errors carry the rule's position only.
    let text = if part.json { "" } else { part.text.as_str() };
    let lowered =
        nft::lower(&rs, &part.filename, text, name, priority).map_err(|e| refusal(part, &e))?;
    let content = Content::new(nft::print(&rs), String::new());
    let Lowered {
        ruleset,
        sets,
        stored_only,
        ..
    } = lowered;
    // Stored-only chains are said, as the iptables nat table's "not enforced" is.
    let findings = stored_only
        .iter()
        .map(|s| Finding {
            severity: Severity::Warning,
            location: position(&part.field, &part.filename, None, s.pos.line, s.pos.column),
            path: s.chain.clone(),
            message: s.why.to_string(),
            reason: Reason::InvalidRuleset,
        })
        .collect();
    Ok(Checked {
        ruleset,
        content,
        findings,
        places: Places::of(input, ""),
        validated: false,
        sources: Vec::new(),
        // Incremental parses are iptables-restore's.
        not_reusable: vec![Family::Ipv4, Family::Ipv6],
        edited: false,
        nft: Some(NftChecked {
            model: Arc::new(rs),
            sets,
        }),
    })
}

/// The engine's model of stored nft content (a listing, [`is_listing`]) of ruleset `name`.
///
/// Errors: as [`lower_stored`].
pub fn to_ruleset(text: &str, name: &str, priority: i32) -> Result<Ruleset, Error> {
    Ok(lower_stored(text, name, priority)?.ruleset)
}

/// Stored nft content (a listing) of ruleset `name` lowered onto the engine's model, with
/// the engine sets its named sets become.
///
/// Errors: [`Error::StoreCorrupt`] when the stored listing no longer parses or lowers (it
/// did when it was stored: a corrupt store or an engine change).
pub fn lower_stored(text: &str, name: &str, priority: i32) -> Result<Lowered, Error> {
    let rs = parse_stored(text, name)?;
    let file = format!("rulesets/{name}");
    nft::lower(&rs, &file, text, name, priority).map_err(|e| {
        Error::store_corrupt(format!(
            "stored nft content of ruleset {name} does not lower: {e}"
        ))
    })
}

/// Stored nft content (a listing) of ruleset `name` parsed back into its model.
///
/// Errors: [`Error::StoreCorrupt`] when it does not parse.
pub fn parse_stored(text: &str, name: &str) -> Result<nft::Ruleset, Error> {
    nft::parse(name, text).map_err(|e| {
        Error::store_corrupt(format!(
            "stored nft content of ruleset {name} does not parse: {e}"
        ))
    })
}

/// Rules over every chain of `rs`.
pub fn rule_count(rs: &nft::Ruleset) -> usize {
    (rs.tables.iter().flat_map(|t| &t.chains))
        .map(|c| c.rules.len())
        .sum()
}

/// Whether `rs` decides nothing: no rule and no base chain with policy drop (as
/// [`Checked::is_empty`] for iptables tables).
pub fn is_empty(rs: &nft::Ruleset) -> bool {
    rule_count(rs) == 0
        && (rs.tables.iter().flat_map(|t| &t.chains))
            .all(|c| c.base.is_none_or(|b| b.policy != nft::Policy::Drop))
}

/// The front end's (or the lowering's) errors as the request's error, each at `part.field`
/// described `FILE:LINE:COL: message`.
fn refusal(part: &NftPart, errs: &nft::NftErrors) -> Error {
    let unsupported = errs.0.iter().any(|e| {
        matches!(
            e.kind,
            nft::ErrorKind::Unsupported(_) | nft::ErrorKind::Family(_)
        )
    });
    Error::BadRequest {
        reason: if unsupported {
            Reason::UnsupportedExtension
        } else {
            Reason::InvalidRuleset
        },
        violations: errs
            .0
            .iter()
            .map(|e| {
                // The kind names the token already when the token is the problem.
                let message = e.kind.to_string();
                let near = if e.token.is_empty() || message.contains(e.token.as_str()) {
                    String::new()
                } else {
                    format!(" near '{}'", clipped(&e.token))
                };
                let file = if e.file.is_empty() {
                    &part.filename
                } else {
                    &e.file
                };
                FieldViolation::new(
                    part.field.clone(),
                    format!("{file}:{}:{}: {message}{near}", e.pos.line, e.pos.column),
                )
            })
            .collect(),
    }
}

/// Where an engine rule of a lowered nft ruleset comes from: the nft rule's 1-based position
/// in its nft chain and its text as the listing prints it ([`nft::rule_text`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftRuleRef {
    /// 1-based position of the nft rule in its chain.
    pub position: u32,
    /// The nft rule as `nft list ruleset` lists it.
    pub text: String,
}

/// Of one nft ruleset: the nft rule of each engine rule, by (family, engine chain, 1-based
/// engine rule) ([`rule_refs`]).
pub type NftRuleRefs = HashMap<(Family, String, u32), NftRuleRef>;

/// For each engine rule of the lowering of stored nft content `text` (a listing) of ruleset
/// `name`, keyed by (family, engine chain, 1-based engine rule), the nft rule it enforces.
/// The engine's active model of that content has the same chains and rules in the same order
/// whatever text it was lowered from (the listing re-parses to the same ruleset), so the keys
/// are those of its counters and trace steps. Cost: one parse and lowering of the listing.
///
/// Errors: as [`lower_stored`].
pub fn rule_refs(text: &str, name: &str) -> Result<NftRuleRefs, Error> {
    let rs = parse_stored(text, name)?;
    let file = format!("rulesets/{name}");
    let lowered = nft::lower(&rs, &file, text, name, 0).map_err(|e| {
        Error::store_corrupt(format!(
            "stored nft content of ruleset {name} does not lower: {e}"
        ))
    })?;
    // Each nft rule by where it starts in the listing (the engine rule's location).
    let mut by_pos: HashMap<(u32, u32), NftRuleRef> = HashMap::new();
    for t in &rs.tables {
        for c in &t.chains {
            for (i, r) in c.rules.iter().enumerate() {
                by_pos.insert(
                    (r.pos.line, r.pos.column),
                    NftRuleRef {
                        position: u32::try_from(i + 1).unwrap_or(u32::MAX),
                        text: nft::rule_text(t.family, r),
                    },
                );
            }
        }
    }
    let mut out = HashMap::new();
    for t in &lowered.ruleset.tables {
        for c in &t.chains {
            for (i, r) in c.rules.iter().enumerate() {
                if let Some(found) = by_pos.get(&(r.location.line, r.location.column)) {
                    let n = u32::try_from(i + 1).unwrap_or(u32::MAX);
                    out.insert((t.family, c.name.clone(), n), found.clone());
                }
            }
        }
    }
    Ok(out)
}
