//! Content-addressed storage of revision texts: a text is cut into chunks of whole lines,
//! each chunk is stored once (table `chunks` + `chunk_texts`, keyed by its sha256) and a
//! revision keeps the list of its chunk ids (`revision_chunks`). Migration:
//! `migrations/20261201140000_content_chunks.sql`.
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
//! Reference counts: `chunks.refs` counts the chunk lists (one per revision and family) that
//! name a chunk, once per list however often it occurs there. [`put`] adds a list's
//! references, [`release`] removes them; both only note the change in the writer's
//! transaction ([`super::writer::Tx`]), and [`apply_refs`] writes the net change per chunk
//! and deletes the chunks nobody names any more just before that transaction commits, so a
//! crash leaves counts and lists consistent.

use std::collections::HashMap;

use rusqlite::{Transaction, params};
use sha2::{Digest, Sha256};
// Dynamic SQL here only varies in the number of `?` placeholders (built by `placeholders`);
// every value is bound, so `AssertSqlSafe` holds.
use sqlx::{AssertSqlSafe, Row, SqliteConnection};

use super::writer::Tx;
use crate::content::Content;
use crate::error::{Error, Result};

/// A chunk ends after a line whose hash has this many low bits zero (64 lines on average).
pub const BOUNDARY_BITS: u32 = 6;

/// A chunk ends after at most this many lines (bounds a chunk at ~16 KB of rules).
pub const MAX_LINES: usize = 256;

/// Bound parameters per statement (SQLite's historical limit is 999).
const BATCH: usize = 400;

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

/// Encodes chunk ids as stored in `revision_chunks`: comma-separated decimal.
fn encode(ids: &[i64]) -> String {
    let mut s = String::with_capacity(ids.len() * 6);
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&id.to_string());
    }
    s
}

/// Decodes a stored chunk list.
///
/// Errors: [`Error::Internal`] for a malformed list (a corrupt store).
pub fn decode(list: &str) -> Result<Vec<i64>> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    list.split(',')
        .map(|s| {
            s.parse()
                .map_err(|_| Error::Internal(format!("corrupt chunk list {list:?}")))
        })
        .collect()
}

/// `?, ?, ...` with `n` placeholders.
fn placeholders(n: usize) -> String {
    let mut s = "?, ".repeat(n);
    s.truncate(s.len().saturating_sub(2));
    s
}

/// The distinct ids of `list`, in first-seen order.
fn distinct(list: &[i64]) -> Vec<i64> {
    let mut seen = std::collections::HashSet::with_capacity(list.len());
    list.iter().copied().filter(|id| seen.insert(*id)).collect()
}

/// Stores the chunks of `content` that are not stored yet and adds one reference per family
/// list (to `tx`'s pending changes: see [`apply_refs`]); returns the encoded chunk lists
/// `(v4, v6)` for `revision_chunks`. The stored chunks are found with a few batched lookups
/// (one statement per [`LOOKUP_BATCH`] digests) instead of one per chunk. Runs in the
/// writer's transaction (statements prepared once, on the calling thread: see
/// [`super::writer`]).
///
/// Errors: [`Error::StoreWrite`].
pub(crate) fn put(tx: &Tx<'_>, content: &Content) -> Result<(String, String)> {
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
    let mut insert = tx.prepare_cached("INSERT INTO chunks (digest, refs) VALUES (?1, 0)")?;
    let mut insert_text =
        tx.prepare_cached("INSERT INTO chunk_texts (id, text) VALUES (?1, ?2)")?;
    let mut lists: Vec<Vec<i64>> = Vec::with_capacity(2);
    for chunks in &parts {
        let mut list = Vec::with_capacity(chunks.len());
        for (c, d) in chunks {
            let id = match ids.get(d) {
                Some(id) => *id,
                None => {
                    insert.execute([d.as_slice()])?;
                    let id = tx.last_insert_rowid();
                    tx.created.borrow_mut().push(id);
                    insert_text.execute(params![id, c])?;
                    ids.insert(*d, id);
                    id
                }
            };
            list.push(id);
        }
        lists.push(list);
    }
    let mut refs = tx.refs.borrow_mut();
    for list in &lists {
        for id in distinct(list) {
            *refs.entry(id).or_default() += 1;
        }
    }
    Ok((encode(&lists[0]), encode(&lists[1])))
}

/// Digests per lookup statement in [`put`] (and ids per statement in [`apply_refs`]).
const LOOKUP_BATCH: usize = 64;

/// Pending changes of chunk reference counts in one transaction: chunk id -> delta.
pub(crate) type RefChanges = HashMap<i64, i64>;

/// Drops one reference per stored list in `lists` (encoded as in `revision_chunks`), to
/// `tx`'s pending changes: the chunks no list names any more are deleted by [`apply_refs`]
/// at the end of the transaction.
///
/// Errors: [`Error::Internal`] for a malformed list.
pub(crate) fn release(tx: &Tx<'_>, lists: &[String]) -> Result<()> {
    let mut refs = tx.refs.borrow_mut();
    for list in lists {
        for id in distinct(&decode(list)?) {
            *refs.entry(id).or_default() -= 1;
        }
    }
    Ok(())
}

/// Writes a transaction's net reference count changes (chunks whose count did not change
/// are not touched), then deletes the chunks (and their texts) whose count fell to zero,
/// and those `created` by the transaction (stored with no reference) that no list names at
/// its end. Called by the writer just before it commits.
///
/// Errors: [`Error::StoreWrite`].
pub(crate) fn apply_refs(
    tx: &Transaction<'_>,
    changes: RefChanges,
    created: Vec<i64>,
) -> Result<()> {
    let mut by_delta: HashMap<i64, Vec<i64>> = HashMap::new();
    // A chunk stored here and released again has a net change of zero and a count of zero.
    let mut fell: Vec<i64> = created
        .into_iter()
        .filter(|id| changes.get(id).is_none_or(|d| *d == 0))
        .collect();
    for (id, delta) in changes {
        if delta != 0 {
            by_delta.entry(delta).or_default().push(id);
        }
        if delta < 0 {
            fell.push(id);
        }
    }
    let list = placeholders(LOOKUP_BATCH);
    let mut adjust = tx.prepare_cached(&format!(
        "UPDATE chunks SET refs = refs + ?1 WHERE id IN ({list})"
    ))?;
    for (delta, ids) in by_delta {
        for batch in ids.chunks(LOOKUP_BATCH) {
            let args = std::iter::once(delta)
                .chain((0..LOOKUP_BATCH).map(|i| batch[i.min(batch.len() - 1)]));
            adjust.execute(rusqlite::params_from_iter(args))?;
        }
    }
    let mut unused = tx.prepare_cached("DELETE FROM chunks WHERE id = ?1 AND refs <= 0")?;
    let mut text = tx.prepare_cached("DELETE FROM chunk_texts WHERE id = ?1")?;
    for id in fell {
        if unused.execute([id])? > 0 {
            text.execute([id])?;
        }
    }
    Ok(())
}

/// The texts of stored chunk lists, each joined back in order: one `String` per list.
///
/// Errors: [`Error::Store`]; [`Error::Internal`] for a malformed list or a missing chunk.
pub async fn texts(conn: &mut SqliteConnection, lists: &[&str]) -> Result<Vec<String>> {
    let decoded: Vec<Vec<i64>> = lists.iter().map(|l| decode(l)).collect::<Result<_>>()?;
    let all = distinct(&decoded.concat());
    let mut found: HashMap<i64, String> = HashMap::with_capacity(all.len());
    for batch in all.chunks(BATCH) {
        let sql = format!(
            "SELECT id, text FROM chunk_texts WHERE id IN ({})",
            placeholders(batch.len())
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for id in batch {
            q = q.bind(*id);
        }
        for row in q.fetch_all(&mut *conn).await? {
            found.insert(row.try_get("id")?, row.try_get("text")?);
        }
    }
    decoded
        .iter()
        .map(|ids| {
            let mut s = String::with_capacity(
                ids.iter()
                    .map(|id| found.get(id).map_or(0, String::len))
                    .sum(),
            );
            for id in ids {
                let t = found
                    .get(id)
                    .ok_or_else(|| Error::Internal(format!("stored chunk {id} is missing")))?;
                s.push_str(t);
            }
            Ok(s)
        })
        .collect()
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

    #[test]
    fn lists_round_trip_and_reject_garbage() {
        assert_eq!(decode(&encode(&[1, 22, 333])).unwrap(), [1, 22, 333]);
        assert_eq!(decode("").unwrap(), Vec::<i64>::new());
        assert!(decode("1,,2").is_err());
        assert!(decode("x").is_err());
    }
}
