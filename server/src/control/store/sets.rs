//! The store's part of the sets (tables `sets` and `set_elements`, migration
//! `20261201100000_sets.sql`): each function is one transaction, durable when it returns
//! (WAL, `synchronous = FULL`), so a crash leaves a set as it was before the call or after it,
//! never half-changed. Elements are stored in canonical `ipset save` syntax with an absolute
//! wall-clock expiry (Unix ns), so a restart does not extend a timeout.
//!
//! Bulk writes use multi-row statements of [`ROWS_PER_STATEMENT`] rows, all in the call's one
//! transaction on the store's writer connection (`super::writer`).

use rusqlite::{OptionalExtension, Row, ToSql, params};
use vallum_engine::model::Family;
use vallum_engine::sets::{SetSpec, SetType};

use super::writer::Tx;
use super::{Store, u64_of};
use crate::error::{Error, Result};
/// Rows per multi-row INSERT / DELETE (3 bound values a row stays under SQLite's 32766).
pub const ROWS_PER_STATEMENT: usize = 5000;

/// A stored set: name, spec and its live elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSet {
    /// Name.
    pub name: String,
    /// Type, family and options.
    pub spec: SetSpec,
    /// Elements not expired at load time.
    pub elements: Vec<StoredElement>,
}

/// One stored element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredElement {
    /// Canonical `ipset save` text of one element.
    pub text: String,
    /// Absolute expiry, Unix ns; `None` never expires.
    pub expires_at: Option<i64>,
}

/// A set an import creates or adds to (see [`Store::import_sets`]).
#[derive(Clone, Debug)]
pub struct ImportedSet {
    /// Name.
    pub name: String,
    /// `Some(spec)` when the import creates the set.
    pub create: Option<SetSpec>,
    /// Elements to add (an element already stored gets the new expiry).
    pub added: Vec<StoredElement>,
}

fn family_text(f: Family) -> &'static str {
    match f {
        Family::Ipv4 => "inet",
        Family::Ipv6 => "inet6",
    }
}

fn spec_of(r: &Row<'_>) -> Result<SetSpec> {
    let kind: String = r.get("type")?;
    let family: String = r.get("family")?;
    let bad = |what: &str| Error::store_corrupt(format!("stored set has an unknown {what}"));
    Ok(SetSpec {
        kind: SetType::from_name(&kind).ok_or_else(|| bad("type"))?,
        family: match family.as_str() {
            "inet" => Family::Ipv4,
            "inet6" => Family::Ipv6,
            _ => return Err(bad("family")),
        },
        timeout: r
            .get::<_, Option<i64>>("timeout")?
            .map(|t| u32::try_from(t).unwrap_or(u32::MAX)),
        counters: r.get::<_, i64>("counters")? != 0,
        maxelem: u32::try_from(r.get::<_, i64>("maxelem")?).unwrap_or(u32::MAX),
        hashsize: u32::try_from(r.get::<_, i64>("hashsize")?).unwrap_or(u32::MAX),
    })
}

fn set_id(tx: &Tx<'_>, name: &str) -> Result<i64> {
    tx.prepare_cached("SELECT id FROM sets WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?
        .ok_or_else(|| Error::store_corrupt(format!("set {name} is not in the store")))
}

/// The etag of a set row: its id and version (hex), e.g. `1f.3`.
fn set_etag_of(id: i64, version: i64) -> String {
    format!("{id:x}.{version}")
}

/// Checks that set `name`'s etag is `expected` (when given) and bumps its version; returns
/// the row id.
///
/// Errors: [`Error::EtagMismatch`]; [`Error::StoreCorrupt`] when the set is not stored.
fn change_set(tx: &Tx<'_>, name: &str, expected: Option<&str>) -> Result<i64> {
    let (id, version): (i64, i64) = tx
        .prepare_cached("SELECT id, version FROM sets WHERE name = ?1")?
        .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or_else(|| Error::store_corrupt(format!("set {name} is not in the store")))?;
    let current = set_etag_of(id, version);
    if let Some(e) = expected.filter(|e| !e.is_empty() && *e != current) {
        return Err(Error::EtagMismatch {
            name: format!("sets/{name}"),
            given: e.to_string(),
            current,
        });
    }
    tx.prepare_cached("UPDATE sets SET version = version + 1 WHERE id = ?1")?
        .execute([id])?;
    Ok(id)
}

fn insert_set(tx: &Tx<'_>, name: &str, spec: &SetSpec, now: i64) -> Result<i64> {
    tx.prepare_cached(
        "INSERT INTO sets (name, type, family, hashsize, maxelem, timeout, counters, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        name,
        spec.kind.name(),
        family_text(spec.family),
        i64::from(spec.hashsize),
        i64::from(spec.maxelem),
        spec.timeout.map(i64::from),
        i64::from(spec.counters),
        now
    ])?;
    Ok(tx.last_insert_rowid())
}

/// `(?, ?, ?), ...` with `rows` groups of `cols` placeholders.
fn groups(rows: usize, cols: usize) -> String {
    let one = format!("({})", vec!["?"; cols].join(", "));
    vec![one; rows].join(", ")
}

fn upsert(tx: &Tx<'_>, set_id: i64, elements: &[StoredElement]) -> Result<()> {
    for chunk in elements.chunks(ROWS_PER_STATEMENT) {
        // Two statement shapes per call at most (full chunks and the rest): cached.
        let mut stmt = tx.prepare_cached(&format!(
            "INSERT INTO set_elements (set_id, element, expires_at) VALUES {} \
             ON CONFLICT (set_id, element) DO UPDATE SET expires_at = excluded.expires_at",
            groups(chunk.len(), 3)
        ))?;
        let mut args: Vec<&dyn ToSql> = Vec::with_capacity(chunk.len() * 3);
        for e in chunk {
            args.extend([&set_id as &dyn ToSql, &e.text, &e.expires_at]);
        }
        stmt.execute(args.as_slice())?;
    }
    Ok(())
}

// === impl Store (sets) ===

impl Store {
    /// Every stored set with its elements that have not expired at `now` (Unix ns), by name.
    ///
    /// Errors: [`Error::Store`]; [`Error::StoreCorrupt`] for a row this build cannot read.
    pub async fn load_sets(&self, now: i64) -> Result<Vec<StoredSet>> {
        self.readers
            .run(move |tx| {
                let mut sets = tx.prepare_cached("SELECT * FROM sets ORDER BY name")?;
                let mut elements = tx.prepare_cached(
                    "SELECT element, expires_at FROM set_elements \
                     WHERE set_id = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
                )?;
                let mut rows = sets.query([])?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    let id: i64 = r.get("id")?;
                    let elements = elements
                        .query_map(params![id, now], |e| {
                            Ok(StoredElement {
                                text: e.get("element")?,
                                expires_at: e.get("expires_at")?,
                            })
                        })?
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    out.push(StoredSet {
                        name: r.get("name")?,
                        spec: spec_of(r)?,
                        elements,
                    });
                }
                Ok(out)
            })
            .await
    }

    /// Stores a new, empty set.
    ///
    /// Errors: [`Error::Store`] (also when the name exists: the caller checks first).
    pub async fn create_set(&self, name: &str, spec: &SetSpec, now: i64) -> Result<()> {
        let (name, spec) = (name.to_string(), *spec);
        self.writer
            .run(move |tx| insert_set(tx, &name, &spec, now).map(drop))
            .await
    }

    /// The etag of every stored set, by name (see [`Store::change_elements`]).
    ///
    /// Errors: [`Error::Store`].
    pub async fn set_etags(&self) -> Result<std::collections::HashMap<String, String>> {
        self.readers
            .run(|tx| {
                Ok(tx
                    .prepare_cached("SELECT name, id, version FROM sets")?
                    .query_map([], |r| Ok((r.get(0)?, set_etag_of(r.get(1)?, r.get(2)?))))?
                    .collect::<rusqlite::Result<_>>()?)
            })
            .await
    }

    /// The etag of set `name`, if it is stored.
    ///
    /// Errors: [`Error::Store`].
    pub async fn set_etag(&self, name: &str) -> Result<Option<String>> {
        let name = name.to_string();
        self.readers
            .run(move |tx| {
                Ok(tx
                    .prepare_cached("SELECT id, version FROM sets WHERE name = ?1")?
                    .query_row([name], |r| Ok(set_etag_of(r.get(0)?, r.get(1)?)))
                    .optional()?)
            })
            .await
    }

    /// Deletes a set and its elements; whether it existed.
    ///
    /// Errors: [`Error::EtagMismatch`] when `etag` is given and is not the set's;
    /// [`Error::Store`].
    pub async fn destroy_set(&self, name: &str, etag: Option<&str>) -> Result<bool> {
        let (name, etag) = (name.to_string(), etag.map(str::to_string));
        self.writer
            .run(move |tx| {
                if set_id(tx, &name).is_err() {
                    return Ok(false);
                }
                let id = change_set(tx, &name, etag.as_deref())?;
                Ok(tx
                    .prepare_cached("DELETE FROM sets WHERE id = ?1")?
                    .execute([id])?
                    > 0)
            })
            .await
    }

    /// Adds `add` (an element already stored gets the new expiry) and removes `delete` from
    /// set `name`, in one transaction. Every change of a set (here, [`Store::flush_set`],
    /// [`Store::swap_sets`], [`Store::import_sets`]) gives it a new etag; with `etag`, the
    /// change is made only when it is still the set's.
    ///
    /// Errors: [`Error::EtagMismatch`]; [`Error::Store`]; [`Error::StoreCorrupt`] when the set
    /// is not stored.
    pub async fn change_elements(
        &self,
        name: &str,
        add: &[StoredElement],
        delete: &[String],
        etag: Option<&str>,
    ) -> Result<()> {
        let (name, add, delete) = (name.to_string(), add.to_vec(), delete.to_vec());
        let etag = etag.map(str::to_string);
        self.writer
            .run(move |tx| {
                let id = change_set(tx, &name, etag.as_deref())?;
                upsert(tx, id, &add)?;
                for chunk in delete.chunks(ROWS_PER_STATEMENT) {
                    let mut stmt = tx.prepare_cached(&format!(
                        "DELETE FROM set_elements WHERE set_id = ? AND element IN ({})",
                        vec!["?"; chunk.len()].join(", ")
                    ))?;
                    let mut args: Vec<&dyn ToSql> = Vec::with_capacity(chunk.len() + 1);
                    args.push(&id);
                    args.extend(chunk.iter().map(|e| e as &dyn ToSql));
                    stmt.execute(args.as_slice())?;
                }
                Ok(())
            })
            .await
    }

    /// Removes every element of set `name` (with `etag`: only when it is still the set's).
    ///
    /// Errors: [`Error::EtagMismatch`]; [`Error::Store`]; [`Error::StoreCorrupt`] when the set
    /// is not stored.
    pub async fn flush_set(&self, name: &str, etag: Option<&str>) -> Result<()> {
        let (name, etag) = (name.to_string(), etag.map(str::to_string));
        self.writer
            .run(move |tx| {
                let id = change_set(tx, &name, etag.as_deref())?;
                tx.prepare_cached("DELETE FROM set_elements WHERE set_id = ?1")?
                    .execute([id])?;
                Ok(())
            })
            .await
    }

    /// Exchanges two sets' names (so their contents and options swap, as `ipset swap`);
    /// `etags` are those the two sets must still have (when given).
    ///
    /// Errors: [`Error::EtagMismatch`]; [`Error::Store`]; [`Error::StoreCorrupt`] when a set is
    /// not stored.
    pub async fn swap_sets(&self, a: &str, b: &str, etags: [Option<&str>; 2]) -> Result<()> {
        let (a, b) = (a.to_string(), b.to_string());
        let etags = etags.map(|e| e.map(str::to_string));
        self.writer
            .run(move |tx| {
                let ia = change_set(tx, &a, etags[0].as_deref())?;
                let ib = change_set(tx, &b, etags[1].as_deref())?;
                // Through a name no set can have (longer than 31 bytes), for the UNIQUE
                // constraint.
                let parked = "vallum: swap in progress, not a set name";
                let mut rename = tx.prepare_cached("UPDATE sets SET name = ?1 WHERE id = ?2")?;
                for (id, name) in [(ia, parked), (ib, a.as_str()), (ia, b.as_str())] {
                    rename.execute(params![name, id])?;
                }
                Ok(())
            })
            .await
    }

    /// Stores what an `ipset save` import did, in one transaction: the sets it creates and
    /// the elements it adds.
    ///
    /// Errors: [`Error::Store`].
    pub async fn import_sets(&self, sets: &[ImportedSet], now: i64) -> Result<()> {
        let sets = sets.to_vec();
        self.writer
            .run(move |tx| {
                for s in &sets {
                    let id = match &s.create {
                        Some(spec) => insert_set(tx, &s.name, spec, now)?,
                        None => change_set(tx, &s.name, None)?,
                    };
                    upsert(tx, id, &s.added)?;
                }
                Ok(())
            })
            .await
    }

    /// Deletes elements that expired at `now` (Unix ns); how many.
    ///
    /// Errors: [`Error::Store`].
    pub async fn expire_set_elements(&self, now: i64) -> Result<u64> {
        self.writer
            .run(move |tx| {
                let n = tx
                    .prepare_cached(
                        "DELETE FROM set_elements WHERE expires_at IS NOT NULL AND expires_at <= ?1",
                    )?
                    .execute([now])?;
                Ok(u64_of(i64::try_from(n).unwrap_or(i64::MAX)))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(text: &str, expires_at: Option<i64>) -> StoredElement {
        StoredElement {
            text: text.into(),
            expires_at,
        }
    }

    #[tokio::test]
    async fn sets_round_trip_swap_flush_expire() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db")).await.unwrap();
        let ip = SetSpec::new(SetType::HashIp, Family::Ipv4);
        let timed = SetSpec {
            timeout: Some(60),
            counters: true,
            ..SetSpec::new(SetType::HashIp, Family::Ipv4)
        };
        store.create_set("a", &ip, 1).await.unwrap();
        store.create_set("b", &timed, 1).await.unwrap();
        assert!(store.create_set("a", &ip, 1).await.is_err());
        // More rows than one statement holds.
        let many: Vec<StoredElement> = (0..(ROWS_PER_STATEMENT as u32 + 7))
            .map(|i| el(&std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string(), None))
            .collect();
        store.change_elements("a", &many, &[], None).await.unwrap();
        store
            .change_elements(
                "b",
                &[el("192.0.2.1", Some(100)), el("192.0.2.2", Some(300))],
                &[],
                None,
            )
            .await
            .unwrap();
        // Re-adding renews the expiry.
        store
            .change_elements("b", &[el("192.0.2.1", Some(200))], &[], None)
            .await
            .unwrap();
        store
            .change_elements("a", &[], &["10.0.0.0".into(), "10.0.0.1".into()], None)
            .await
            .unwrap();
        let loaded = store.load_sets(150).await.unwrap();
        assert_eq!(loaded.len(), 2);
        assert_eq!(loaded[0].elements.len(), ROWS_PER_STATEMENT + 5);
        assert_eq!(loaded[1].spec, timed);
        assert_eq!(loaded[1].elements.len(), 2, "192.0.2.1 renewed to 200");
        assert_eq!(store.load_sets(250).await.unwrap()[1].elements.len(), 1);

        store.swap_sets("a", "b", [None, None]).await.unwrap();
        let loaded = store.load_sets(0).await.unwrap();
        assert_eq!((loaded[0].name.as_str(), loaded[0].spec), ("a", timed));
        assert_eq!(loaded[0].elements.len(), 2);
        assert_eq!(loaded[1].elements.len(), ROWS_PER_STATEMENT + 5);

        assert_eq!(store.expire_set_elements(250).await.unwrap(), 1);
        store.flush_set("a", None).await.unwrap();
        store.flush_set("b", None).await.unwrap();
        assert!(
            store
                .load_sets(0)
                .await
                .unwrap()
                .iter()
                .all(|s| s.elements.is_empty())
        );
        store
            .import_sets(
                &[
                    ImportedSet {
                        name: "c".into(),
                        create: Some(ip),
                        added: vec![el("192.0.2.9", None)],
                    },
                    ImportedSet {
                        name: "a".into(),
                        create: None,
                        added: vec![el("192.0.2.8", None)],
                    },
                ],
                2,
            )
            .await
            .unwrap();
        assert_eq!(store.load_sets(0).await.unwrap().len(), 3);
        assert!(store.destroy_set("c", None).await.unwrap());
        assert!(!store.destroy_set("c", None).await.unwrap());
        // The cascade removed c's elements.
        let n: i64 = store
            .readers
            .run(|tx| Ok(tx.query_row("SELECT COUNT(*) FROM set_elements", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(n, 1);
    }

    /// Every change gives the set a new etag; a stale etag changes nothing; a swap moves
    /// the names (each set's etag changes); a set made again under the same name has an etag
    /// of its own.
    #[tokio::test]
    async fn set_etags_change_with_every_change_and_guard_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db")).await.unwrap();
        let ip = SetSpec::new(SetType::HashIp, Family::Ipv4);
        store.create_set("a", &ip, 1).await.unwrap();
        store.create_set("b", &ip, 1).await.unwrap();
        let etag = |store: &Store, n: &'static str| {
            let store = store.clone();
            async move { store.set_etag(n).await.unwrap().unwrap() }
        };
        let e0 = etag(&store, "a").await;
        store
            .change_elements("a", &[el("192.0.2.1", None)], &[], Some(&e0))
            .await
            .unwrap();
        let e1 = etag(&store, "a").await;
        assert_ne!(e0, e1);
        let stale = store
            .change_elements("a", &[el("192.0.2.2", None)], &[], Some(&e0))
            .await
            .unwrap_err();
        assert!(matches!(stale, Error::EtagMismatch { .. }), "{stale}");
        assert_eq!(store.load_sets(0).await.unwrap()[0].elements.len(), 1);
        assert!(store.flush_set("a", Some(&e0)).await.is_err());
        assert!(store.destroy_set("a", Some(&e0)).await.is_err());
        assert_eq!(etag(&store, "a").await, e1, "refusals change nothing");
        let b0 = etag(&store, "b").await;
        assert!(
            store
                .swap_sets("a", "b", [Some(&e1), Some("x")])
                .await
                .is_err()
        );
        store
            .swap_sets("a", "b", [Some(&e1), Some(&b0)])
            .await
            .unwrap();
        let (a2, b2) = (etag(&store, "a").await, etag(&store, "b").await);
        assert!(a2 != e1 && a2 != b0 && b2 != e1 && b2 != b0, "{a2} {b2}");
        assert_eq!(store.set_etags().await.unwrap()["a"], a2);
        assert!(store.destroy_set("a", Some(&a2)).await.unwrap());
        store.create_set("a", &ip, 1).await.unwrap();
        assert_ne!(etag(&store, "a").await, a2);
    }
}
