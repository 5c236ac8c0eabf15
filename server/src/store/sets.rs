//! The store's part of the sets (tables `sets` and `set_elements`, migration
//! `20261201100000_sets.sql`): each function is one transaction, durable when it returns
//! (WAL, `synchronous = FULL`), so a crash leaves a set as it was before the call or after it,
//! never half-changed. Elements are stored in canonical `ipset save` syntax with an absolute
//! wall-clock expiry (Unix ns), so a restart does not extend a timeout.
//!
//! Bulk writes use multi-row statements of [`ROWS_PER_STATEMENT`] rows, all in the call's one
//! transaction. Transactions begin IMMEDIATE (take the write lock first): a deferred one that
//! reads and then writes fails with SQLITE_BUSY, without waiting, when another connection
//! wrote in between (a commit's phase record, an audit row).

use sqlx::{QueryBuilder, Row, Sqlite, Transaction};
use vallum_engine::model::Family;
use vallum_engine::sets::{SetSpec, SetType};

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

fn spec_of(r: &sqlx::sqlite::SqliteRow) -> Result<SetSpec> {
    let kind: String = r.try_get("type")?;
    let family: String = r.try_get("family")?;
    let bad = |what: &str| Error::Internal(format!("stored set has an unknown {what}"));
    Ok(SetSpec {
        kind: SetType::from_name(&kind).ok_or_else(|| bad("type"))?,
        family: match family.as_str() {
            "inet" => Family::Ipv4,
            "inet6" => Family::Ipv6,
            _ => return Err(bad("family")),
        },
        timeout: r
            .try_get::<Option<i64>, _>("timeout")?
            .map(|t| u32::try_from(t).unwrap_or(u32::MAX)),
        counters: r.try_get::<i64, _>("counters")? != 0,
        maxelem: u32::try_from(r.try_get::<i64, _>("maxelem")?).unwrap_or(u32::MAX),
        hashsize: u32::try_from(r.try_get::<i64, _>("hashsize")?).unwrap_or(u32::MAX),
    })
}

async fn set_id(tx: &mut Transaction<'_, Sqlite>, name: &str) -> Result<i64> {
    sqlx::query_scalar("SELECT id FROM sets WHERE name = ?")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or_else(|| Error::Internal(format!("set {name} is not in the store")))
}

async fn insert_set(
    tx: &mut Transaction<'_, Sqlite>,
    name: &str,
    spec: &SetSpec,
    now: i64,
) -> Result<i64> {
    let id = sqlx::query_scalar(
        "INSERT INTO sets (name, type, family, hashsize, maxelem, timeout, counters, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(name)
    .bind(spec.kind.name())
    .bind(family_text(spec.family))
    .bind(i64::from(spec.hashsize))
    .bind(i64::from(spec.maxelem))
    .bind(spec.timeout.map(i64::from))
    .bind(i64::from(spec.counters))
    .bind(now)
    .fetch_one(&mut **tx)
    .await?;
    Ok(id)
}

async fn upsert(
    tx: &mut Transaction<'_, Sqlite>,
    set_id: i64,
    elements: &[StoredElement],
) -> Result<()> {
    for chunk in elements.chunks(ROWS_PER_STATEMENT) {
        let mut q: QueryBuilder<Sqlite> =
            QueryBuilder::new("INSERT INTO set_elements (set_id, element, expires_at) ");
        q.push_values(chunk, |mut b, e| {
            b.push_bind(set_id)
                .push_bind(e.text.as_str())
                .push_bind(e.expires_at);
        });
        q.push(" ON CONFLICT (set_id, element) DO UPDATE SET expires_at = excluded.expires_at");
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

// === impl Store (sets) ===

impl Store {
    /// Every stored set with its elements that have not expired at `now` (Unix ns), by name.
    ///
    /// Errors: [`Error::Store`]; [`Error::Internal`] for a row this build cannot read.
    pub async fn load_sets(&self, now: i64) -> Result<Vec<StoredSet>> {
        let rows = sqlx::query("SELECT * FROM sets ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: i64 = r.try_get("id")?;
            let elements = sqlx::query(
                "SELECT element, expires_at FROM set_elements \
                 WHERE set_id = ? AND (expires_at IS NULL OR expires_at > ?)",
            )
            .bind(id)
            .bind(now)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|e| {
                Ok(StoredElement {
                    text: e.try_get("element")?,
                    expires_at: e.try_get("expires_at")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
            out.push(StoredSet {
                name: r.try_get("name")?,
                spec: spec_of(r)?,
                elements,
            });
        }
        Ok(out)
    }

    /// Stores a new, empty set.
    ///
    /// Errors: [`Error::Store`] (also when the name exists: the caller checks first).
    pub async fn create_set(&self, name: &str, spec: &SetSpec, now: i64) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        insert_set(&mut tx, name, spec, now).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes a set and its elements; whether it existed.
    ///
    /// Errors: [`Error::Store`].
    pub async fn destroy_set(&self, name: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM sets WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Adds `add` (an element already stored gets the new expiry) and removes `delete` from
    /// set `name`, in one transaction.
    ///
    /// Errors: [`Error::Store`]; [`Error::Internal`] when the set is not stored.
    pub async fn change_elements(
        &self,
        name: &str,
        add: &[StoredElement],
        delete: &[String],
    ) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let id = set_id(&mut tx, name).await?;
        upsert(&mut tx, id, add).await?;
        for chunk in delete.chunks(ROWS_PER_STATEMENT) {
            let mut q: QueryBuilder<Sqlite> =
                QueryBuilder::new("DELETE FROM set_elements WHERE set_id = ");
            q.push_bind(id).push(" AND element IN (");
            let mut sep = q.separated(", ");
            for e in chunk {
                sep.push_bind(e.as_str());
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Removes every element of set `name`.
    ///
    /// Errors: [`Error::Store`]; [`Error::Internal`] when the set is not stored.
    pub async fn flush_set(&self, name: &str) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let id = set_id(&mut tx, name).await?;
        sqlx::query("DELETE FROM set_elements WHERE set_id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Exchanges two sets' names (so their contents and options swap, as `ipset swap`).
    ///
    /// Errors: [`Error::Store`]; [`Error::Internal`] when a set is not stored.
    pub async fn swap_sets(&self, a: &str, b: &str) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let ia = set_id(&mut tx, a).await?;
        let ib = set_id(&mut tx, b).await?;
        // Through a name no set can have (longer than 31 bytes), for the UNIQUE constraint.
        let parked = "vallum: swap in progress, not a set name";
        for (id, name) in [(ia, parked), (ib, a), (ia, b)] {
            sqlx::query("UPDATE sets SET name = ? WHERE id = ?")
                .bind(name)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Stores what an `ipset save` import did, in one transaction: the sets it creates and
    /// the elements it adds.
    ///
    /// Errors: [`Error::Store`].
    pub async fn import_sets(&self, sets: &[ImportedSet], now: i64) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for s in sets {
            let id = match &s.create {
                Some(spec) => insert_set(&mut tx, &s.name, spec, now).await?,
                None => set_id(&mut tx, &s.name).await?,
            };
            upsert(&mut tx, id, &s.added).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Deletes elements that expired at `now` (Unix ns); how many.
    ///
    /// Errors: [`Error::Store`].
    pub async fn expire_set_elements(&self, now: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM set_elements WHERE expires_at IS NOT NULL AND expires_at <= ?",
        )
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(u64_of(i64::try_from(r.rows_affected()).unwrap_or(i64::MAX)))
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
        store.change_elements("a", &many, &[]).await.unwrap();
        store
            .change_elements(
                "b",
                &[el("192.0.2.1", Some(100)), el("192.0.2.2", Some(300))],
                &[],
            )
            .await
            .unwrap();
        // Re-adding renews the expiry.
        store
            .change_elements("b", &[el("192.0.2.1", Some(200))], &[])
            .await
            .unwrap();
        store
            .change_elements("a", &[], &["10.0.0.0".into(), "10.0.0.1".into()])
            .await
            .unwrap();
        let loaded = store.load_sets(150).await.unwrap();
        assert_eq!(loaded.len(), 2);
        assert_eq!(loaded[0].elements.len(), ROWS_PER_STATEMENT + 5);
        assert_eq!(loaded[1].spec, timed);
        assert_eq!(loaded[1].elements.len(), 2, "192.0.2.1 renewed to 200");
        assert_eq!(store.load_sets(250).await.unwrap()[1].elements.len(), 1);

        store.swap_sets("a", "b").await.unwrap();
        let loaded = store.load_sets(0).await.unwrap();
        assert_eq!((loaded[0].name.as_str(), loaded[0].spec), ("a", timed));
        assert_eq!(loaded[0].elements.len(), 2);
        assert_eq!(loaded[1].elements.len(), ROWS_PER_STATEMENT + 5);

        assert_eq!(store.expire_set_elements(250).await.unwrap(), 1);
        store.flush_set("a").await.unwrap();
        store.flush_set("b").await.unwrap();
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
        assert!(store.destroy_set("c").await.unwrap());
        assert!(!store.destroy_set("c").await.unwrap());
        // The cascade removed c's elements.
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM set_elements")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
}
