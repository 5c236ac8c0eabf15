//! Content-addressed storage of revision texts: a text is cut into chunks of whole lines,
//! each chunk is stored once (table `chunks` + `chunk_texts`, keyed by its sha256) and a
//! revision keeps the list of its chunks as rows of `revision_chunk_list` (one per chunk and
//! position, with foreign keys to the revision and the chunk). Migrations:
//! `migrations/20261201140000_content_chunks.sql`, `20261216090000_chunk_list_rows.sql`.
//!
//! Why: a commit of a large ruleset usually changes a few rules. Writing the whole text
//! again made the SQLite transaction of a 10k-rule Apply write and fsync ~0.5 MB (and pruning
//! free as much); with chunks it writes the one or two chunks that changed and a list of
//! ~150 ids. Kept revisions of a ruleset share their unchanged chunks (100 revisions of a
//! 10k-rule ruleset: about one copy of the text plus the changed chunks).
//!
//! Cutting: content-defined, as rsync / restic / git's packs do to survive insertions: a chunk
//! ends after a line whose hash has its low [`BOUNDARY_BITS`] bits zero (so on average
//! every 64 lines), or at [`MAX_LINES`] lines. A boundary depends only on the line itself, so
//! inserting or deleting a rule changes the chunk around it and no other. Chunks are joined
//! back byte for byte: the concatenation of a text's chunks is the text.
//!
//! Integrity: SQLite enforces it (migration `20261217090000_chunk_refs_by_trigger.sql`): a
//! list row names a stored chunk, belongs to a stored revision (foreign key, deleted with
//! it), and a text belongs to its chunk (deleted with it); `chunks.refs`, the number of list
//! rows naming a chunk, is kept by triggers on the list rows (the server never writes it),
//! and a chunk whose count is not zero cannot be deleted. What the store does is deleting the
//! chunks whose count fell to zero, once at the end of every write transaction
//! (`delete_unused`, one statement on a partial index of those chunks).
//!
//! Why a count and not an index of the list rows by chunk: that index held an entry per list
//! row (one 10k-rule ruleset with 100 kept revisions: ~15,000) ordered by chunk, so the ~150
//! rows a commit adds and the ~150 its prune deletes landed on almost every page of it. A
//! commit of the Apply bench wrote ~80 WAL pages with the index and ~13 with the count (a
//! model of the transaction in Python's sqlite3, same schema, 400 commits); the count costs a
//! trigger step per list row instead (CPU, on the ~4 pages of `chunks`).

use std::collections::HashMap;

use rusqlite::{Connection, Transaction, params};
use sha2::{Digest, Sha256};

use crate::control::content::Content;
use crate::error::{Error, Result};

/// A chunk ends after a line whose hash has this many low bits zero (64 lines on average).
pub const BOUNDARY_BITS: u32 = 6;

/// A chunk ends after at most this many lines (bounds a chunk at ~16 KB of rules).
pub const MAX_LINES: usize = 256;

/// A hash of one line for boundary decisions only (identity is the sha256): FxHash-style
/// multiply-rotate over 8-byte words, then a final avalanche so the low bits depend on every
/// byte.
fn line_hash(line: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h: u64 = line.len() as u64;
    let mut words = line.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(K);
    }
    let mut b = [0u8; 8];
    b[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(K);
    // murmur3's fmix64.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// Cuts `text` into chunks of whole lines (each with its `\n`; the last may lack one). The
/// chunks, concatenated, are `text`; an empty text has no chunks.
pub fn split(text: &str) -> Vec<&str> {
    let mut out = Vec::with_capacity(text.len() / 2048 + 1);
    let mask = (1u64 << BOUNDARY_BITS) - 1;
    let (mut start, mut pos, mut lines) = (0, 0, 0);
    for line in text.split_inclusive('\n') {
        pos += line.len();
        lines += 1;
        if line_hash(line.as_bytes()) & mask == 0 || lines >= MAX_LINES {
            // Cuts are after a '\n': char boundaries.
            out.push(&text[start..pos]);
            start = pos;
            lines = 0;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// `?, ?, ...` with `n` placeholders.
fn placeholders(n: usize) -> String {
    let mut s = "?, ".repeat(n);
    s.truncate(s.len().saturating_sub(2));
    s
}

/// The `family` column of `revision_chunk_list`: 4 for the IPv4 text, 6 for the IPv6 text.
const FAMILIES: [i64; 2] = [4, 6];

/// Stores the chunks of `content` that are not stored yet and the chunk lists of revision
/// `number` of `ruleset` (which must be stored) as rows of `revision_chunk_list` (SQLite
/// counts them into `chunks.refs`). The stored chunks are
/// found with a few batched lookups (one statement per [`LOOKUP_BATCH`] digests) and the list
/// rows written [`LOOKUP_BATCH`] to a statement, instead of one statement per chunk. Runs in
/// the writer's transaction (statements prepared once per connection: see [`super::writer`]).
///
/// Errors: [`Error::Store`].
pub(crate) fn put(
    tx: &Transaction<'_>,
    ruleset: &str,
    number: i64,
    content: &Content,
) -> Result<()> {
    let parts: Vec<Vec<(&str, [u8; 32])>> = [&content.v4, &content.v6]
        .iter()
        .map(|text| {
            split(text)
                .into_iter()
                .map(|c| (c, Sha256::digest(c.as_bytes()).into()))
                .collect()
        })
        .collect();
    let mut digests: Vec<[u8; 32]> = parts.iter().flatten().map(|(_, d)| *d).collect();
    digests.sort_unstable();
    digests.dedup();
    let mut ids: HashMap<[u8; 32], i64> = HashMap::with_capacity(digests.len());
    let mut lookup = tx.prepare_cached(&format!(
        "SELECT id, digest FROM chunks WHERE digest IN ({})",
        placeholders(LOOKUP_BATCH)
    ))?;
    for batch in digests.chunks(LOOKUP_BATCH) {
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
    let mut insert = tx.prepare_cached("INSERT INTO chunks (digest) VALUES (?1)")?;
    let mut insert_text =
        tx.prepare_cached("INSERT INTO chunk_texts (id, text) VALUES (?1, ?2)")?;
    // (family, position, chunk) of every list row.
    let mut rows: Vec<(i64, i64, i64)> = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for (family, chunks) in FAMILIES.into_iter().zip(&parts) {
        for (position, (c, d)) in (0i64..).zip(chunks) {
            let id = match ids.get(d) {
                Some(id) => *id,
                None => {
                    insert.execute([d.as_slice()])?;
                    let id = tx.last_insert_rowid();
                    insert_text.execute(params![id, c])?;
                    ids.insert(*d, id);
                    id
                }
            };
            rows.push((family, position, id));
        }
    }
    let mut many = tx.prepare_cached(&format!(
        "INSERT INTO revision_chunk_list (ruleset, number, family, position, chunk) VALUES {}",
        vec!["(?, ?, ?, ?, ?)"; LOOKUP_BATCH].join(", ")
    ))?;
    let mut one = tx.prepare_cached(
        "INSERT INTO revision_chunk_list (ruleset, number, family, position, chunk) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let batches = rows.chunks_exact(LOOKUP_BATCH);
    let rest = batches.remainder();
    for batch in batches {
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(5 * LOOKUP_BATCH);
        for (family, position, chunk) in batch {
            args.extend([
                &ruleset as &dyn rusqlite::ToSql,
                &number,
                family,
                position,
                chunk,
            ]);
        }
        many.execute(args.as_slice())?;
    }
    for (family, position, chunk) in rest {
        one.execute(params![ruleset, number, family, position, chunk])?;
    }
    Ok(())
}

/// Digests per lookup statement in [`put`] (and list rows per INSERT).
const LOOKUP_BATCH: usize = 64;

/// Deletes the chunks (their texts go with them) that no list names any more: those whose
/// count fell to zero in this transaction (a pruned or deleted revision was the last to name
/// them, or a chunk was stored and released again). Called by the writer just before it
/// commits.
///
/// Errors: [`Error::Store`].
pub(crate) fn delete_unused(tx: &Transaction<'_>) -> Result<()> {
    tx.prepare_cached("DELETE FROM chunks WHERE refs = 0")?
        .execute([])?;
    Ok(())
}

/// The contents of the revisions `keys` (ruleset, number), in order, each text joined back
/// from its chunks (a chunk shared by several is read once). Call it inside a read
/// transaction, so the lists and the chunks come from one snapshot.
///
/// Errors: [`Error::Store`]; [`Error::StoreCorrupt`] when a listed chunk has no text (a corrupt
/// store).
pub(crate) fn contents(conn: &Connection, keys: &[(&str, i64)]) -> Result<Vec<Content>> {
    let mut list = conn.prepare_cached(
        "SELECT family, chunk FROM revision_chunk_list WHERE ruleset = ?1 AND number = ?2 \
         ORDER BY family, position",
    )?;
    let mut text = conn.prepare_cached("SELECT text FROM chunk_texts WHERE id = ?1")?;
    let mut found: HashMap<i64, String> = HashMap::new();
    let mut out = Vec::with_capacity(keys.len());
    for (ruleset, number) in keys {
        let mut content = Content::default();
        let mut rows = list.query(params![ruleset, number])?;
        while let Some(row) = rows.next()? {
            let (family, id): (i64, i64) = (row.get(0)?, row.get(1)?);
            let t = match found.entry(id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let t: Option<String> =
                        rusqlite::OptionalExtension::optional(text.query_row([id], |r| r.get(0)))?;
                    e.insert(t.ok_or_else(|| {
                        Error::store_corrupt(format!("stored chunk {id} has no text"))
                    })?)
                }
            };
            if family == 4 {
                content.v4.push_str(t);
            } else {
                content.v6.push_str(t);
            }
        }
        out.push(content);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(n: usize) -> String {
        let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..n {
            s.push_str(&format!(
                "-A INPUT -s 10.{}.{}.0/24 -p tcp -m tcp --dport {} -j ACCEPT\n",
                i / 256 % 256,
                i % 256,
                i % 65536
            ));
        }
        s.push_str("COMMIT\n");
        s
    }

    #[test]
    fn chunks_join_back_to_the_text() {
        for text in [
            String::new(),
            "x".into(),
            "a\nb".into(),
            "a\n\n\n".into(),
            rules(5000),
        ] {
            let c = split(&text);
            assert_eq!(c.concat(), text);
            assert!(c.iter().all(|c| !c.is_empty()));
            // Every chunk but the last ends a line.
            assert!(c.iter().rev().skip(1).all(|c| c.ends_with('\n')));
        }
        let text = rules(5000);
        let c = split(&text);
        assert!(c.iter().all(|c| c.lines().count() <= MAX_LINES));
        // ~64 lines on average: far fewer chunks than lines, far more than one.
        assert!(c.len() > 20 && c.len() < 500, "{} chunks", c.len());
    }

    #[test]
    fn an_inserted_line_changes_one_chunk() {
        let a = rules(5000);
        let at = a.find("-A INPUT -s 10.9.").expect("rule present");
        let b = format!("{}-A INPUT -p udp -j DROP\n{}", &a[..at], &a[at..]);
        let ca: std::collections::HashSet<&str> = split(&a).into_iter().collect();
        let cb = split(&b);
        let new: Vec<&&str> = cb.iter().filter(|c| !ca.contains(**c)).collect();
        // The chunk holding the new line; one more only if the new line is itself a boundary.
        assert!(
            !new.is_empty() && new.len() <= 2,
            "{} new chunks",
            new.len()
        );
    }
}
