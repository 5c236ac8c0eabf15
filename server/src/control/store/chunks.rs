//! Content-addressed storage of revision texts: a text is cut into chunks of whole lines (the
//! chunks of its digest tree, `control/content/tree.rs`), each chunk is stored once (tables
//! `chunks` + `chunk_texts`, keyed by its sha256), and a revision's list of chunks is a shared
//! full list (`chunk_lists` + `chunk_list_entries`, a "key frame") plus the revision's edits
//! to it (`revision_chunk_edits`). Migrations: `migrations/20261201140000_content_chunks.sql`,
//! `20261216090000_chunk_list_rows.sql`, `20261220090000_chunk_list_edits.sql`.
//!
//! Why: a commit of a large ruleset usually changes a few rules. With a full list per
//! revision a one-rule edit of a 10k-rule ruleset wrote ~150 list rows (with their count
//! triggers) and its prune deleted as many. Now it writes the chunk the rule is in, the
//! revision row and one or two edit rows against the ruleset's current key frame; a new key
//! frame (one full list) is written every [`KEYFRAME_EVERY`] revisions or when the edits
//! outgrow [`MAX_EDITS`] (or a quarter of the list), so reading any revision costs one list
//! and at most that many edits. Pruning the oldest revision deletes its row and edits; its
//! key frame goes with the last revision that names it.
//!
//! The writer remembers, per ruleset, the key frame it last wrote against (`Lists`, kept only
//! after the transaction committed): a new revision's chunks are looked up only when the key
//! frame does not have them, and its edits are a diff of chunk digests against the key
//! frame's. Its digest tree hashes only the chunks not hashed yet (a content spliced from the
//! active one shares that one's, `content/text.rs`). Without that memory (a restart, another
//! ruleset's key frame deleted) a revision starts a new key frame.
//!
//! Integrity: SQLite enforces it (the migrations' triggers): every list entry and edit names
//! a stored chunk, `chunks.refs` counts them (the server never writes it) and a counted chunk
//! cannot be deleted; `chunk_lists.refs` counts the revisions naming a list and a counted list
//! cannot be deleted; entries go with their list, edits with their revision. What the store
//! does is delete the lists and then the chunks whose count fell to zero, once at the end of
//! every write transaction (`delete_unused`).

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use vallum_engine::model::Family;

use crate::control::content::Content;
use crate::error::{Error, Result};

pub use crate::control::content::tree::{BOUNDARY_BITS, MAX_LINES, split};

/// A revision starts a new key frame after this many revisions were stored against the last.
pub const KEYFRAME_EVERY: usize = 64;

/// A revision starts a new key frame when its edits against the last would be more rows than
/// this (or than a quarter of the key frame's entries, whichever is more).
pub const MAX_EDITS: usize = 16;

/// `?, ?, ...` with `n` placeholders.
fn placeholders(n: usize) -> String {
    let mut s = "?, ".repeat(n);
    s.truncate(s.len().saturating_sub(2));
    s
}

/// The `family` column: 4 for the IPv4 text, 6 for the IPv6 text.
const FAMILIES: [i64; 2] = [4, 6];

/// A key frame the writer remembers: its id and its entries, per family, as (chunk digest,
/// chunk id) in order, with each digest's positions.
#[derive(Debug)]
pub(crate) struct Keyframe {
    id: i64,
    lists: [Vec<([u8; 32], i64)>; 2],
    at: [HashMap<[u8; 32], Vec<usize>>; 2],
}

impl Keyframe {
    fn new(id: i64, lists: [Vec<([u8; 32], i64)>; 2]) -> Keyframe {
        let at = [0, 1].map(|f| {
            let mut m: HashMap<[u8; 32], Vec<usize>> = HashMap::with_capacity(lists[f].len());
            for (i, (d, _)) in lists[f].iter().enumerate() {
                m.entry(*d).or_default().push(i);
            }
            m
        });
        Keyframe { id, lists, at }
    }

    fn len(&self) -> usize {
        self.lists[0].len() + self.lists[1].len()
    }
}

/// What the writer remembers of one ruleset between transactions (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Last {
    /// The key frame the last revision was stored against.
    keyframe: Arc<Keyframe>,
    /// Revisions stored against it so far.
    uses: usize,
}

/// Per ruleset, what the writer remembers (see the module docs).
pub(crate) type Lists = HashMap<String, Last>;

/// One edit of a revision's list (a row of `revision_chunk_edits`): keep the key frame's
/// entries up to `at`, skip `removed`, then add `chunk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edit {
    at: usize,
    removed: usize,
    chunk: Option<i64>,
}

/// The edits that make `new` (digest, id) from the key frame list `key` (with `at`, each
/// digest's positions in it): a greedy diff (chunks are content-defined, so an unchanged
/// chunk is found by its digest).
fn diff(
    key: &[([u8; 32], i64)],
    at: &HashMap<[u8; 32], Vec<usize>>,
    new: &[([u8; 32], i64)],
) -> Vec<Edit> {
    let mut out = Vec::new();
    let mut j = 0;
    for (d, id) in new {
        if key.get(j).is_some_and(|(k, _)| k == d) {
            j += 1;
            continue;
        }
        match at.get(d).and_then(|ps| ps.iter().find(|&&k| k >= j)) {
            Some(&k) => {
                out.push(Edit {
                    at: j,
                    removed: k - j,
                    chunk: None,
                });
                j = k + 1;
            }
            None => out.push(Edit {
                at: j,
                removed: 0,
                chunk: Some(*id),
            }),
        }
    }
    if j < key.len() {
        out.push(Edit {
            at: j,
            removed: key.len() - j,
            chunk: None,
        });
    }
    // A skip right after an add at the same place is that add's skip (one row, not two):
    // the add keeps up to `at`, skips, then adds; the same list.
    let mut merged: Vec<Edit> = Vec::with_capacity(out.len());
    for e in out {
        match merged.last_mut() {
            Some(last)
                if e.chunk.is_none()
                    && last.chunk.is_some()
                    && last.removed == 0
                    && last.at == e.at =>
            {
                last.removed = e.removed;
            }
            _ => merged.push(e),
        }
    }
    merged
}

/// The list `key` with `edits` applied (see [`Edit`]).
///
/// Errors: [`Error::StoreCorrupt`] when an edit points outside the list or before the one
/// before it.
fn apply(key: &[i64], edits: &[Edit]) -> Result<Vec<i64>> {
    let mut out = Vec::with_capacity(key.len() + edits.len());
    let mut cursor = 0;
    for e in edits {
        let Some(kept) = key.get(cursor..e.at) else {
            return Err(Error::store_corrupt(format!(
                "a stored chunk edit at {} does not fit its list of {} (after {cursor})",
                e.at,
                key.len()
            )));
        };
        out.extend_from_slice(kept);
        cursor = e.at + e.removed;
        if cursor > key.len() {
            return Err(Error::store_corrupt(format!(
                "a stored chunk edit removes past the end of its list of {}",
                key.len()
            )));
        }
        out.extend(e.chunk);
    }
    out.extend_from_slice(&key[cursor..]);
    Ok(out)
}

/// The chunk ids of `digests`, storing the chunks that are not stored yet (`text(i)` is the
/// text of `digests[i]`): those the key frame names are known, the rest found with batched
/// lookups ([`LOOKUP_BATCH`] digests a statement) and inserted when missing.
fn chunk_ids(
    tx: &Transaction<'_>,
    known: Option<&Keyframe>,
    digests: &[[u8; 32]],
    text: &dyn Fn(usize) -> String,
) -> Result<Vec<i64>> {
    // The key frame's chunks are found through its own index (not copied into a map: a
    // one-rule edit of a 100k-rule ruleset looks up ~1,500 digests there).
    let in_key = |d: &[u8; 32]| -> Option<i64> {
        let k = known?;
        (0..2).find_map(|f| k.at[f].get(d).map(|ps| k.lists[f][ps[0]].1))
    };
    let mut ids: HashMap<[u8; 32], i64> = HashMap::new();
    let mut missing: Vec<[u8; 32]> = digests
        .iter()
        .filter(|d| in_key(d).is_none())
        .copied()
        .collect();
    missing.sort_unstable();
    missing.dedup();
    if !missing.is_empty() {
        let mut lookup = tx.prepare_cached(&format!(
            "SELECT id, digest FROM chunks WHERE digest IN ({})",
            placeholders(LOOKUP_BATCH)
        ))?;
        for batch in missing.chunks(LOOKUP_BATCH) {
            // Padded with the batch's last digest: one statement shape, prepared once (a
            // repeated value in an IN list matches once).
            let args = (0..LOOKUP_BATCH).map(|i| batch[i.min(batch.len() - 1)].to_vec());
            let mut rows = lookup.query(rusqlite::params_from_iter(args))?;
            while let Some(row) = rows.next()? {
                let digest: Vec<u8> = row.get(1)?;
                if let Ok(d) = <[u8; 32]>::try_from(digest.as_slice()) {
                    ids.insert(d, row.get(0)?);
                }
            }
        }
    }
    let mut insert = tx.prepare_cached("INSERT INTO chunks (digest) VALUES (?1)")?;
    let mut insert_text =
        tx.prepare_cached("INSERT INTO chunk_texts (id, text) VALUES (?1, ?2)")?;
    let mut out = Vec::with_capacity(digests.len());
    for (i, d) in digests.iter().enumerate() {
        let id = match in_key(d).or_else(|| ids.get(d).copied()) {
            Some(id) => id,
            None => {
                insert.execute([d.as_slice()])?;
                let id = tx.last_insert_rowid();
                insert_text.execute(params![id, text(i)])?;
                ids.insert(*d, id);
                id
            }
        };
        out.push(id);
    }
    Ok(out)
}

/// Stores the chunks of `content` that are not stored yet and picks the chunk list of a new
/// revision whose row is not written yet: the key frame `last` names, with edits, or a new
/// key frame (written here). Returns the list's id (the revision row's `chunk_list`), the
/// edits to write once the row is ([`put_edits`]) and what the writer remembers after the
/// transaction ([`Put`]). The content's digest tree is computed here when it was
/// not (only its chunks not hashed yet are).
///
/// Errors: [`Error::Store`].
pub(crate) fn put(
    tx: &Transaction<'_>,
    last: Option<&Last>,
    content: &Arc<Content>,
) -> Result<Put> {
    // Only the chunks not hashed yet are (a content spliced from the last one shares its
    // hashed chunks).
    let layout = content.layout();
    // The key frame is still stored (ids are never reused: AUTOINCREMENT).
    let last = match last {
        Some(l) => tx
            .prepare_cached("SELECT 1 FROM chunk_lists WHERE id = ?1")?
            .query_row([l.keyframe.id], |_| Ok(()))
            .optional()?
            .map(|()| l),
        None => None,
    };
    let digests: Vec<[u8; 32]> = [&layout.v4, &layout.v6]
        .iter()
        .flat_map(|l| l.iter().map(|c| c.digest))
        .collect();
    // The text of the i-th chunk of both families together.
    let text = |i: usize| -> String {
        match i.checked_sub(layout.v4.len()) {
            None => content.text(Family::Ipv4).chunk(i),
            Some(i) => content.text(Family::Ipv6).chunk(i),
        }
        .to_string()
    };
    let ids = chunk_ids(tx, last.map(|l| l.keyframe.as_ref()), &digests, &text)?;
    let split_at = layout.v4.len();
    let new: [Vec<([u8; 32], i64)>; 2] = [
        digests[..split_at]
            .iter()
            .copied()
            .zip(ids[..split_at].iter().copied())
            .collect(),
        digests[split_at..]
            .iter()
            .copied()
            .zip(ids[split_at..].iter().copied())
            .collect(),
    ];
    if let Some(l) = last.filter(|l| l.uses < KEYFRAME_EVERY) {
        let k = &l.keyframe;
        let edits: Vec<(i64, Edit)> = FAMILIES
            .iter()
            .zip(0..2)
            .flat_map(|(f, i)| {
                diff(&k.lists[i], &k.at[i], &new[i])
                    .into_iter()
                    .map(move |e| (*f, e))
            })
            .collect();
        if edits.len() <= MAX_EDITS.max(k.len() / 4) {
            let next = Last {
                keyframe: k.clone(),
                uses: l.uses + 1,
            };
            return Ok(Put {
                list: k.id,
                edits,
                last: next,
            });
        }
    }
    // A new key frame.
    tx.prepare_cached("INSERT INTO chunk_lists (refs) VALUES (0)")?
        .execute([])?;
    let id = tx.last_insert_rowid();
    let rows: Vec<(i64, i64, i64)> = FAMILIES
        .iter()
        .zip(&new)
        .flat_map(|(f, list)| {
            (0i64..)
                .zip(list)
                .map(move |(position, (_, chunk))| (*f, position, *chunk))
        })
        .collect();
    let mut many = tx.prepare_cached(&format!(
        "INSERT INTO chunk_list_entries (list, family, position, chunk) VALUES {}",
        vec!["(?, ?, ?, ?)"; LOOKUP_BATCH].join(", ")
    ))?;
    let mut one = tx.prepare_cached(
        "INSERT INTO chunk_list_entries (list, family, position, chunk) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let batches = rows.chunks_exact(LOOKUP_BATCH);
    let rest = batches.remainder();
    for batch in batches {
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(4 * LOOKUP_BATCH);
        for (family, position, chunk) in batch {
            args.extend([&id as &dyn rusqlite::ToSql, family, position, chunk]);
        }
        many.execute(args.as_slice())?;
    }
    for (family, position, chunk) in rest {
        one.execute(params![id, family, position, chunk])?;
    }
    let next = Last {
        keyframe: Arc::new(Keyframe::new(id, new)),
        uses: 1,
    };
    Ok(Put {
        list: id,
        edits: Vec::new(),
        last: next,
    })
}

/// What [`put`] chose for a new revision.
#[derive(Debug)]
pub(crate) struct Put {
    /// The key frame (the revision row's `chunk_list`).
    pub(crate) list: i64,
    /// The revision's edits to it, with their family (4 or 6), for [`put_edits`].
    pub(crate) edits: Vec<(i64, Edit)>,
    /// What the writer remembers of the ruleset once the transaction commits.
    pub(crate) last: Last,
}

/// Writes the `edits` of revision `number` of `ruleset` (its row written) from [`put`].
///
/// Errors: [`Error::Store`].
pub(crate) fn put_edits(
    tx: &Transaction<'_>,
    ruleset: &str,
    number: i64,
    edits: &[(i64, Edit)],
) -> Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO revision_chunk_edits (ruleset, number, family, seq, at, removed, chunk) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (seq, (family, e)) in (0i64..).zip(edits) {
        insert.execute(params![
            ruleset,
            number,
            family,
            seq,
            i64::try_from(e.at).unwrap_or(i64::MAX),
            i64::try_from(e.removed).unwrap_or(i64::MAX),
            e.chunk
        ])?;
    }
    Ok(())
}

/// Digests per lookup statement in [`put`] (and list entries per INSERT).
const LOOKUP_BATCH: usize = 64;

/// Deletes the key frames no revision names any more, then the chunks (their texts go with
/// them) that no list entry or edit names: those whose count fell to zero in this
/// transaction. Called by the writer just before it commits.
///
/// Errors: [`Error::Store`].
pub(crate) fn delete_unused(tx: &Transaction<'_>) -> Result<()> {
    tx.prepare_cached("DELETE FROM chunk_lists WHERE refs = 0")?
        .execute([])?;
    tx.prepare_cached("DELETE FROM chunks WHERE refs = 0")?
        .execute([])?;
    Ok(())
}

/// The chunk ids of revision `number` of `ruleset`, per family (IPv4, IPv6), in order:
/// its list with its edits applied. `lists` keeps the lists read so far (revisions read
/// together share their key frame).
fn chunk_list(
    conn: &Connection,
    lists: &mut HashMap<i64, [Vec<i64>; 2]>,
    ruleset: &str,
    number: i64,
) -> Result<[Vec<i64>; 2]> {
    let list: Option<i64> = conn
        .prepare_cached("SELECT chunk_list FROM revisions WHERE ruleset = ?1 AND number = ?2")?
        .query_row(params![ruleset, number], |r| r.get(0))
        .optional()?
        .flatten();
    let Some(list) = list else {
        return Err(Error::store_corrupt(format!(
            "revision {number} of ruleset {ruleset} has no chunk list"
        )));
    };
    if let std::collections::hash_map::Entry::Vacant(slot) = lists.entry(list) {
        let mut entries: [Vec<i64>; 2] = [Vec::new(), Vec::new()];
        let mut stmt = conn.prepare_cached(
            "SELECT family, chunk FROM chunk_list_entries WHERE list = ?1 ORDER BY family, position",
        )?;
        let mut rows = stmt.query([list])?;
        while let Some(row) = rows.next()? {
            let (family, chunk): (i64, i64) = (row.get(0)?, row.get(1)?);
            entries[usize::from(family == 6)].push(chunk);
        }
        slot.insert(entries);
    }
    let mut edits: [Vec<Edit>; 2] = [Vec::new(), Vec::new()];
    let mut stmt = conn.prepare_cached(
        "SELECT family, at, removed, chunk FROM revision_chunk_edits \
         WHERE ruleset = ?1 AND number = ?2 ORDER BY family, seq",
    )?;
    let mut rows = stmt.query(params![ruleset, number])?;
    while let Some(row) = rows.next()? {
        let family: i64 = row.get(0)?;
        let at: i64 = row.get(1)?;
        let removed: i64 = row.get(2)?;
        edits[usize::from(family == 6)].push(Edit {
            at: usize::try_from(at).unwrap_or(usize::MAX),
            removed: usize::try_from(removed).unwrap_or(usize::MAX),
            chunk: row.get(3)?,
        });
    }
    let key = &lists[&list];
    Ok([apply(&key[0], &edits[0])?, apply(&key[1], &edits[1])?])
}

/// The contents of the revisions `keys` (ruleset, number), in order, each text joined back
/// from its chunks (a chunk or key frame shared by several is read once). Call it inside a
/// read transaction, so the lists and the chunks come from one snapshot.
///
/// Errors: [`Error::Store`]; [`Error::StoreCorrupt`] when a revision has no list, an edit
/// does not fit its list or a listed chunk has no text (a corrupt store).
pub(crate) fn contents(conn: &Connection, keys: &[(&str, i64)]) -> Result<Vec<Content>> {
    let mut text = conn.prepare_cached("SELECT text FROM chunk_texts WHERE id = ?1")?;
    let mut found: HashMap<i64, String> = HashMap::new();
    let mut lists = HashMap::new();
    let mut out = Vec::with_capacity(keys.len());
    for (ruleset, number) in keys {
        let ids = chunk_list(conn, &mut lists, ruleset, *number)?;
        let mut texts = [String::new(), String::new()];
        for (family, ids) in ids.iter().enumerate() {
            for id in ids {
                let t = match found.entry(*id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let t: Option<String> = text.query_row([id], |r| r.get(0)).optional()?;
                        e.insert(t.ok_or_else(|| {
                            Error::store_corrupt(format!("stored chunk {id} has no text"))
                        })?)
                    }
                };
                texts[family].push_str(t);
            }
        }
        let [v4, v6] = texts;
        out.push(Content::new(v4, v6));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8) -> ([u8; 32], i64) {
        ([n; 32], i64::from(n))
    }

    /// The edits of [`diff`], applied to the key frame, give the new list, for changes of
    /// every shape; a one-chunk change is one edit row.
    #[test]
    fn edits_rebuild_the_list() {
        let key: Vec<([u8; 32], i64)> = (1..=20).map(entry).collect();
        let k = Keyframe::new(1, [key.clone(), Vec::new()]);
        let ids = |l: &[([u8; 32], i64)]| l.iter().map(|(_, id)| *id).collect::<Vec<_>>();
        let mut cases: Vec<Vec<([u8; 32], i64)>> = vec![
            key.clone(),
            Vec::new(),
            vec![entry(99)],
            key.iter().copied().chain([entry(99)]).collect(),
            [entry(99)].into_iter().chain(key.iter().copied()).collect(),
            key.iter().rev().copied().collect(),
        ];
        for at in [0, 7, 19] {
            let mut replaced = key.clone();
            replaced[at] = entry(100 + at as u8);
            cases.push(replaced);
            let mut removed = key.clone();
            removed.remove(at);
            cases.push(removed);
            let mut inserted = key.clone();
            inserted.insert(at, entry(150));
            inserted.insert(at, entry(151));
            cases.push(inserted);
        }
        let mut two = key.clone();
        two[3] = entry(200);
        two[15] = entry(201);
        cases.push(two);
        for (i, new) in cases.iter().enumerate() {
            let edits = diff(&k.lists[0], &k.at[0], new);
            assert_eq!(apply(&ids(&key), &edits).unwrap(), ids(new), "case {i}");
        }
        let mut one = key.clone();
        one[7] = entry(120);
        assert_eq!(diff(&k.lists[0], &k.at[0], &one).len(), 1);
        assert!(diff(&k.lists[0], &k.at[0], &key).is_empty());
        // Edits that do not fit are a corrupt store, not a panic.
        let bad = [Edit {
            at: 30,
            removed: 0,
            chunk: None,
        }];
        assert!(apply(&ids(&key), &bad).is_err());
    }
}
