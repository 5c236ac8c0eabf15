//! The store's migration runner: the files of `migrations/` at the workspace root, embedded
//! in the binary ([`MIGRATIONS`]), applied in version order at open, each in its own
//! `BEGIN IMMEDIATE` transaction together with its row in `schema_migrations`.
//!
//! A migration may have a second step in Rust ([`Migration::then`]) for what SQL cannot
//! compute (the digests of `20261220090000_chunk_list_edits`), run in the same transaction.
//!
//! Forward-only, as before: a migration is never edited once released. Each applied
//! migration's SHA-384 of its text is kept and compared at every open, so a build whose
//! embedded file differs from the one that ran refuses to start; so does a database with a
//! migration this build does not know (written by a newer vallumd).
//!
//! Databases made before the store had one driver were migrated by sqlx and list their
//! migrations in `_sqlx_migrations`: the first open imports those rows (sqlx keeps the same
//! SHA-384 checksum) into `schema_migrations` and drops that table, in one transaction.

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use sha2::{Digest, Sha384};

use crate::error::{Error, Result};

/// One embedded migration file `migrations/{version}_{name}.sql`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    /// The timestamp prefix of the file name.
    pub(crate) version: i64,
    /// The rest of the file name, without `.sql` (sqlx stored it with `_` as spaces).
    pub(crate) name: &'static str,
    /// The SQL.
    pub(crate) sql: &'static str,
    /// What the server computes after the SQL, in the same transaction (what SQL cannot,
    /// e.g. sha256), if anything.
    pub(crate) then: Option<fn(&Transaction<'_>) -> Result<()>>,
}

macro_rules! migration {
    ($version:literal, $name:literal) => {
        migration!($version, $name, None)
    };
    ($version:literal, $name:literal, $then:expr) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!(
                "../../../../migrations/",
                stringify!($version),
                "_",
                $name,
                ".sql"
            )),
            then: $then,
        }
    };
}

/// Every migration, in version order (a test checks this against the directory).
pub(crate) const MIGRATIONS: &[Migration] = &[
    migration!(20261130070000, "initial"),
    migration!(20261201100000, "sets"),
    migration!(20261201120000, "revision_content"),
    migration!(20261201140000, "content_chunks"),
    migration!(20261215090000, "commit_outcomes"),
    migration!(20261215100000, "load_failures"),
    migration!(20261216090000, "chunk_list_rows"),
    migration!(20261217090000, "chunk_refs_by_trigger"),
    migration!(20261218090000, "idempotency_requests"),
    migration!(20261218100000, "set_versions"),
    migration!(20261219093000, "idempotency_by_request_id"),
    migration!(20261220090000, "chunk_list_edits", Some(tree_digests)),
    migration!(20261221090000, "pending_by_ruleset"),
];

/// The second step of `20261220090000_chunk_list_edits`: every stored revision's digest
/// becomes the root of its content's digest tree ([`crate::control::content::Content::digest`];
/// it was the sha256 of the whole combined text). Reads each revision's text once, one at a
/// time.
///
/// Errors: [`Error::Store`]; [`Error::StoreCorrupt`] when a text cannot be joined back.
fn tree_digests(tx: &Transaction<'_>) -> Result<()> {
    let keys: Vec<(String, i64)> = tx
        .prepare("SELECT ruleset, number FROM revisions ORDER BY ruleset, number")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut update =
        tx.prepare("UPDATE revisions SET digest = ?1 WHERE ruleset = ?2 AND number = ?3")?;
    for (ruleset, number) in &keys {
        for c in super::chunks::contents(tx, &[(ruleset.as_str(), *number)])? {
            update.execute(params![c.digest(), ruleset, number])?;
        }
    }
    Ok(())
}

/// SHA-384 of a migration's text (what sqlx stored as its checksum).
fn checksum_of(m: &Migration) -> Vec<u8> {
    Sha384::digest(m.sql.as_bytes()).to_vec()
}

fn failed(version: i64, what: impl std::fmt::Display) -> Error {
    Error::Migrate(format!("migration {version}: {what}"))
}

/// Applies the migrations of [`MIGRATIONS`] up to and including `until` that `conn`'s
/// database lacks, recording `now` (Unix ns) as their `applied_at`.
///
/// Errors: [`Error::Migrate`] when a migration fails, an applied one's text changed, or the
/// database has one this build does not know; [`Error::Store`] for the bookkeeping queries.
pub(crate) fn run_to(conn: &mut Connection, until: i64, now: i64) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // A database with tables but no migration table of ours (nor sqlx's) is another
    // program's: refused, never migrated into.
    let tables: Vec<String> = tx
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let ours = ["schema_migrations", "_sqlx_migrations"];
    if !tables.is_empty() && !tables.iter().any(|t| ours.contains(&t.as_str())) {
        return Err(Error::Migrate(format!(
            "not a vallumd database: it has tables ({}) and no schema_migrations",
            tables.join(", ")
        )));
    }
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY NOT NULL,
             name       TEXT NOT NULL,
             -- SHA-384 of the migration's text.
             checksum   BLOB NOT NULL,
             applied_at INTEGER NOT NULL
         )",
    )?;
    let from_sqlx = tx
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if from_sqlx {
        if let Some(v) = tx
            .query_row(
                "SELECT version FROM _sqlx_migrations WHERE NOT success",
                [],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
        {
            return Err(failed(v, "left half applied by an earlier run (sqlx)"));
        }
        tx.execute(
            "INSERT OR IGNORE INTO schema_migrations (version, name, checksum, applied_at) \
             SELECT version, replace(description, ' ', '_'), checksum, \
                    CAST(unixepoch(installed_on) AS INTEGER) * 1000000000 \
             FROM _sqlx_migrations",
            [],
        )?;
        tx.execute("DROP TABLE _sqlx_migrations", [])?;
    }
    tx.commit()?;

    let applied: Vec<(i64, Vec<u8>)> = conn
        .prepare("SELECT version, checksum FROM schema_migrations ORDER BY version")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (version, checksum) in &applied {
        let Some(m) = MIGRATIONS.iter().find(|m| m.version == *version) else {
            return Err(failed(
                *version,
                "applied to this database but unknown to this build (a newer vallumd wrote it)",
            ));
        };
        if checksum_of(m) != checksum.as_slice() {
            return Err(failed(
                *version,
                format!(
                    "migrations/{}_{}.sql changed after it was applied",
                    m.version, m.name
                ),
            ));
        }
    }
    for m in MIGRATIONS.iter().filter(|m| m.version <= until) {
        if applied.iter().any(|(v, _)| *v == m.version) {
            continue;
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(m.sql).map_err(|e| failed(m.version, e))?;
        if let Some(then) = m.then {
            then(&tx).map_err(|e| failed(m.version, e))?;
        }
        tx.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)",
            params![
                m.version,
                m.name,
                checksum_of(m).as_slice(),
                now
            ],
        )?;
        tx.commit().map_err(|e| failed(m.version, e))?;
    }
    Ok(())
}

/// Applies every pending migration (see [`run_to`]).
///
/// Errors: those of [`run_to`].
#[cfg(test)]
pub(crate) fn run(conn: &mut Connection) -> Result<()> {
    run_to(conn, i64::MAX, crate::clock::Clock::system().unix_ns())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`MIGRATIONS`] names every file of `migrations/`, in order.
    #[test]
    fn every_migration_file_is_embedded_in_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let embedded: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{}_{}.sql", m.version, m.name))
            .collect();
        assert_eq!(embedded, files);
    }

    /// A changed migration text, or an unknown applied version, stops the open.
    #[test]
    fn changed_or_unknown_migrations_are_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        run(&mut conn).unwrap();
        // Again: nothing to do.
        run(&mut conn).unwrap();
        conn.execute(
            "UPDATE schema_migrations SET checksum = x'00' WHERE version = 20261201100000",
            [],
        )
        .unwrap();
        let e = run(&mut conn).unwrap_err().to_string();
        assert!(e.contains("20261201100000") && e.contains("changed"), "{e}");
        conn.execute(
            "UPDATE schema_migrations SET checksum = ?1 WHERE version = 20261201100000",
            [checksum_of(&MIGRATIONS[1])],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO schema_migrations VALUES (29990101000000, 'future', x'00', 0)",
            [],
        )
        .unwrap();
        let e = run(&mut conn).unwrap_err().to_string();
        assert!(e.contains("29990101000000") && e.contains("newer"), "{e}");
    }
}
