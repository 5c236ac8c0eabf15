//! The canonical content of a revision ([`Content`]): its IPv4 and IPv6 iptables-save texts,
//! as the engine's canonical printer prints them, each held as its chunks
//! ([`super::text::Text`]), with their digest tree ([`super::tree`]), computed once and kept
//! with the text.

use std::sync::{Arc, OnceLock};

use vallum_engine::model::{Family, Ruleset, Table};
use vallum_engine::restore::{self, ParseOptions, PrintOptions};

use super::text::Text;
use super::tree::Layout;
use crate::error::Error;

/// The line between the IPv4 and the IPv6 part of a combined content text.
pub const V6_SEPARATOR: &str = "# ---- ip6tables-save ----\n";

/// Canonical content of one revision.
///
/// Each family's text is held as its chunks ([`Text`]), so a content made from another by a
/// few changed rules shares the other's chunks. Its digest tree ([`Layout`]: the chunks and
/// their sha256, the root over them) is computed once, on first use ([`Content::layout`]),
/// hashing only the chunks not hashed yet, and kept: a clone keeps it. Change a text only
/// through [`Content::set`] (which forgets the tree).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Content {
    /// The IPv4 tables' iptables-save text (may be empty).
    v4: Text,
    /// The IPv6 tables' ip6tables-save text (may be empty).
    v6: Text,
    /// The digest tree of `v4` and `v6`, once computed.
    layout: LayoutCell,
}

/// The digest tree of a content, once computed; not part of what a content is (equal
/// contents may have computed theirs or not).
#[derive(Clone, Default)]
struct LayoutCell(OnceLock<Arc<Layout>>);

impl PartialEq for LayoutCell {
    fn eq(&self, _: &LayoutCell) -> bool {
        true
    }
}

impl Eq for LayoutCell {}

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
        Content::of(Text::new(v4), Text::new(v6))
    }

    /// The content of these texts, held as chunks.
    pub fn of(v4: Text, v6: Text) -> Content {
        Content {
            v4,
            v6,
            layout: LayoutCell::default(),
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

    /// The IPv4 tables' iptables-save text (joined from its chunks on first use).
    pub fn v4(&self) -> &str {
        self.v4.as_str()
    }

    /// The IPv6 tables' ip6tables-save text (joined from its chunks on first use).
    pub fn v6(&self) -> &str {
        self.v6.as_str()
    }

    /// The combined text: IPv4, then [`V6_SEPARATOR`] and IPv6 when there are IPv6 tables.
    pub fn combined(&self) -> String {
        if self.v6.is_empty() {
            self.v4().to_string()
        } else {
            format!("{}{V6_SEPARATOR}{}", self.v4(), self.v6())
        }
    }

    /// Replaces the text of `family` (the digest tree is computed again when next asked).
    pub fn set(&mut self, family: Family, text: Text) {
        self.layout = LayoutCell::default();
        match family {
            Family::Ipv4 => self.v4 = text,
            Family::Ipv6 => self.v6 = text,
        }
    }

    /// The text of `family`.
    pub fn family(&self, family: Family) -> &str {
        self.text(family).as_str()
    }

    /// The text of `family`, as its chunks.
    pub fn text(&self, family: Family) -> &Text {
        match family {
            Family::Ipv4 => &self.v4,
            Family::Ipv6 => &self.v6,
        }
    }

    /// The digest tree of the texts, computed on first use: only the chunks not hashed yet
    /// are (a content spliced from another shares the other's hashed chunks).
    pub fn layout(&self) -> &Arc<Layout> {
        self.layout.0.get_or_init(|| {
            Arc::new(Layout::from_chunks(
                self.v4.chunks(),
                self.v6.chunks(),
                self.v6.is_empty(),
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
        super::nft::is_listing(self.v4())
    }

    /// Parses stored content into the engine's model of the ruleset (for nft content, what
    /// the engine enforces of it, [`super::nft::to_ruleset`]).
    ///
    /// Errors: [`Error::StoreCorrupt`] when the stored text no longer parses (a corrupt store or
    /// an engine parser change).
    pub fn to_ruleset(&self, name: &str, priority: i32) -> Result<Ruleset, Error> {
        if self.is_nft() {
            return super::nft::to_ruleset(self.v4(), name, priority);
        }
        let mut tables = Vec::new();
        for (text, family) in [(self.v4(), Family::Ipv4), (self.v6(), Family::Ipv6)] {
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
