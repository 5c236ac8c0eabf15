//! The canonical content of a revision ([`Content`]): its IPv4 and IPv6 iptables-save texts,
//! as the engine's canonical printer prints them, with their digest tree ([`super::tree`]),
//! computed once and kept with the text.

use std::sync::{Arc, OnceLock};

use vallum_engine::model::{Family, Ruleset, Table};
use vallum_engine::restore::{self, ParseOptions, PrintOptions};

use super::tree::Layout;
use crate::error::Error;

/// The line between the IPv4 and the IPv6 part of a combined content text.
pub const V6_SEPARATOR: &str = "# ---- ip6tables-save ----\n";

/// Canonical content of one revision.
///
/// Its digest tree ([`Layout`]: the texts' chunks and their sha256, the root over them) is
/// computed once, on first use ([`Content::layout`], or [`Content::layout_after`] from the
/// content it was made from), and kept with the text: a clone keeps it. Change the texts only
/// through [`Content::new`] or [`Content::family_mut`] (which forgets it); a text written
/// through the public fields after the layout was computed leaves the layout stale.
#[derive(Clone, Default)]
pub struct Content {
    /// iptables-save text of the IPv4 tables (may be empty).
    pub v4: String,
    /// ip6tables-save text of the IPv6 tables (may be empty).
    pub v6: String,
    /// The digest tree of `v4` and `v6`, once computed.
    layout: OnceLock<Arc<Layout>>,
}

impl PartialEq for Content {
    fn eq(&self, other: &Content) -> bool {
        self.v4 == other.v4 && self.v6 == other.v6
    }
}

impl Eq for Content {}

impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Content")
            .field("v4", &self.v4)
            .field("v6", &self.v6)
            .finish_non_exhaustive()
    }
}

impl Content {
    /// The content of these texts.
    pub fn new(v4: String, v6: String) -> Content {
        Content {
            v4,
            v6,
            layout: OnceLock::new(),
        }
    }

    /// The canonical content of `tables` (locations and counters dropped).
    pub fn from_tables(tables: &[Table]) -> Content {
        Content::from_tables_with(tables, &PrintOptions::default())
    }

    /// As [`Content::from_tables`], with print options (`counters` for `[p:b]`).
    pub fn from_tables_with(tables: &[Table], opts: &PrintOptions) -> Content {
        // Table by table, in order: the same text as `restore::print` of the family's tables,
        // without copying them first.
        let print = |f: Family| -> String {
            let mut out = String::new();
            for t in tables.iter().filter(|t| t.family == f) {
                let text = restore::print_table(t, opts);
                if out.is_empty() {
                    out = text;
                } else {
                    out.push_str(&text);
                }
            }
            out
        };
        Content::new(print(Family::Ipv4), print(Family::Ipv6))
    }

    /// The combined text: IPv4, then [`V6_SEPARATOR`] and IPv6 when there are IPv6 tables.
    pub fn combined(&self) -> String {
        if self.v6.is_empty() {
            self.v4.clone()
        } else {
            format!("{}{V6_SEPARATOR}{}", self.v4, self.v6)
        }
    }

    /// The text of `family`, to change (the digest tree is computed again when next asked).
    pub fn family_mut(&mut self, family: Family) -> &mut String {
        self.layout = OnceLock::new();
        match family {
            Family::Ipv4 => &mut self.v4,
            Family::Ipv6 => &mut self.v6,
        }
    }

    /// The text of `family`.
    pub fn family(&self, family: Family) -> &str {
        match family {
            Family::Ipv4 => &self.v4,
            Family::Ipv6 => &self.v6,
        }
    }

    /// The digest tree of the texts, computed on first use (every chunk hashed).
    pub fn layout(&self) -> &Arc<Layout> {
        self.layout
            .get_or_init(|| Arc::new(Layout::of(&self.v4, &self.v6)))
    }

    /// The digest tree of the texts, computed on first use from `before`'s (the content this
    /// one was made from, e.g. the revision an edit started from): only the chunks that
    /// differ are hashed ([`Layout::after`]). The same tree as [`Content::layout`].
    pub fn layout_after(&self, before: &Content) -> &Arc<Layout> {
        self.layout.get_or_init(|| {
            Arc::new(Layout::after(
                &self.v4,
                &self.v6,
                &before.v4,
                &before.v6,
                before.layout(),
            ))
        })
    }

    /// The content's digest, lower-case hex (64 characters): the root of its digest tree,
    /// sha256 over the sha256 of each chunk of [`Content::combined`] in order (see
    /// [`super::tree`]). A function of the text alone.
    pub fn digest(&self) -> String {
        self.layout().root_hex()
    }

    /// Whether this is an nft ruleset's listing (in [`Content::v4`]; see
    /// [`super::nft::is_listing`]).
    pub fn is_nft(&self) -> bool {
        super::nft::is_listing(&self.v4)
    }

    /// Parses stored content into the engine's model of the ruleset (for nft content, what
    /// the engine enforces of it, [`super::nft::to_ruleset`]).
    ///
    /// Errors: [`Error::StoreCorrupt`] when the stored text no longer parses (a corrupt store or
    /// an engine parser change).
    pub fn to_ruleset(&self, name: &str, priority: i32) -> Result<Ruleset, Error> {
        if self.is_nft() {
            return super::nft::to_ruleset(&self.v4, name, priority);
        }
        let mut tables = Vec::new();
        for (text, family) in [(&self.v4, Family::Ipv4), (&self.v6, Family::Ipv6)] {
            if text.is_empty() {
                continue;
            }
            let opts = ParseOptions {
                family,
                ..ParseOptions::default()
            };
            let rs = restore::parse_ruleset(name, text, &opts).map_err(|e| {
                Error::store_corrupt(format!(
                    "stored content of ruleset {name} does not parse: {e}"
                ))
            })?;
            tables.extend(rs.tables);
        }
        Ok(Ruleset {
            name: name.to_string(),
            priority,
            tables,
        })
    }
}
