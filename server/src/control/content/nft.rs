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
//! What the engine enforces of an nft ruleset is [`lower`]'s: today this build's engine has
//! no nft lowering, so an nft ruleset is parsed, checked, stored, listed, exported and diffed,
//! and a commit of it is refused with [`not_enforced`] (FAILED_PRECONDITION, type
//! `NFT_NOT_ENFORCED`), never committed as if it were empty.

use std::sync::Arc;

use vallum_engine::echo::clipped;
use vallum_engine::model::{Family, Ruleset};
use vallum_engine::nft;
use vallum_engine::validate::Severity;

use super::{Checked, Content, Finding, Places, RulesetInput};
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

/// What a checked nft input keeps besides its engine model: the parsed ruleset and why the
/// engine does not enforce it, if it does not.
#[derive(Clone, Debug)]
pub struct NftChecked {
    /// The parsed ruleset (its [`nft::print`] is the stored content).
    pub model: Arc<nft::Ruleset>,
    /// Why a commit of it is refused (`None`: the engine enforces [`lower`]'s model).
    pub not_enforced: Option<String>,
}

/// PreconditionFailure type of a commit refused because the engine does not enforce nft.
pub const NOT_ENFORCED: &str = "NFT_NOT_ENFORCED";

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
    let content = Content::new(nft::print(&rs), String::new());
    let (ruleset, not_enforced) = match lower(name, priority, &rs) {
        Ok(model) => (model, None),
        Err(why) => (empty(name, priority), Some(why)),
    };
    let findings = not_enforced
        .iter()
        .map(|why| Finding {
            severity: Severity::Warning,
            location: part.field.clone(),
            path: String::new(),
            message: why.clone(),
            reason: Reason::FailedPrecondition,
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
            not_enforced,
        }),
    })
}

/// The engine's model of stored nft content (a listing, [`is_listing`]) of ruleset `name`.
///
/// Errors: [`Error::StoreCorrupt`] when the stored listing no longer parses;
/// [`not_enforced`] when the engine does not enforce it.
pub fn to_ruleset(text: &str, name: &str, priority: i32) -> Result<Ruleset, Error> {
    let rs = parse_stored(text, name)?;
    lower(name, priority, &rs).map_err(|why| not_enforced(name, why))
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

/// The refusal of a commit of ruleset `name`'s nft content that the engine does not enforce:
/// FAILED_PRECONDITION (type [`NOT_ENFORCED`]) saying `why`.
pub fn not_enforced(name: &str, why: String) -> Error {
    Error::Precondition {
        kind: NOT_ENFORCED,
        subject: format!("rulesets/{name}"),
        message: why,
    }
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

/// What the engine enforces of `rs`, as ruleset `name` at `priority`; `Err` says why it
/// enforces none of it.
fn lower(_name: &str, _priority: i32, _rs: &nft::Ruleset) -> Result<Ruleset, String> {
    Err("nft rulesets are parsed, stored and listed, but this vallumd's engine does not enforce them yet (no nft lowering): validate and stage work, a commit is refused".to_string())
}

/// An engine model with no table.
fn empty(name: &str, priority: i32) -> Ruleset {
    Ruleset {
        name: name.to_string(),
        priority,
        tables: Vec::new(),
    }
}

/// The front end's errors as the request's error, each at `part.field` described
/// `FILE:LINE:COL: message`.
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
                FieldViolation::new(
                    part.field.clone(),
                    format!(
                        "{}:{}:{}: {message}{near}",
                        e.file, e.pos.line, e.pos.column
                    ),
                )
            })
            .collect(),
    }
}
