//! One key is one lock on SQLite: the key's row in `leasehold_locks` (its
//! anchor) names the key's kind in its `kind` column (NULL: a mutex, as
//! every row written before the column existed). A permit or reader-writer
//! grant claims the anchor inside its own `BEGIN IMMEDIATE` transaction,
//! so the claim and the grant are one atomic step; the mutex's one
//! statement grants only while `kind IS NULL`.

use sqlx::sqlite::SqlitePool;
use sqlx::{Sqlite, Transaction};

use super::errors::busy;
use super::slots::SlotTables;
use super::{classify, STORE};
use crate::backend::{Acquire, AcquireRequest, KeyKind, RecordDecoder};
use crate::error::Result;
use crate::key::Key;

/// Adds the `kind` column to a table written before it existed; does
/// nothing if it is there. Every existing row keeps NULL: a mutex.
const HAS_KIND: &str =
    "SELECT count(*) FROM pragma_table_info('leasehold_locks') WHERE name = 'kind'";
const ADD_KIND: &str = "ALTER TABLE leasehold_locks ADD COLUMN kind TEXT";

/// Key ?1's anchor: its kind, whether a live mutex holder has it, that
/// holder and its time left in ms.
const ANCHOR: &str = concat!(
    "SELECT kind, owner IS NOT NULL AND expires_at_ms > ",
    now_ms!(),
    ", holder, expires_at_ms - ",
    now_ms!(),
    ", fence FROM leasehold_locks WHERE key = ?1"
);

/// Parameters: key, kind. A new key's anchor, of a permit kind (fence 0:
/// no mutex grant ever had the key).
const NEW_ANCHOR: &str = "INSERT INTO leasehold_locks (key, fence, kind) VALUES (?1, 0, ?2)";

/// Parameters: key, kind. A free mutex key becomes that kind.
const CONVERT: &str = "UPDATE leasehold_locks SET kind = ?2, owner = NULL, holder = NULL, \
     expires_at_ms = NULL WHERE key = ?1";

/// Runs the column's migration; safe to run any number of times, and by
/// two processes at once (the second's ALTER finds the column).
pub(super) async fn migrate(pool: &SqlitePool) -> std::result::Result<(), sqlx::Error> {
    let present: i64 = sqlx::query_scalar(HAS_KIND).fetch_one(pool).await?;
    if present > 0 {
        return Ok(());
    }
    match sqlx::query(ADD_KIND).execute(pool).await {
        Ok(_) => Ok(()),
        // Another process added it between the check and the ALTER.
        Err(sqlx::Error::Database(db)) if db.message().contains("duplicate column") => Ok(()),
        Err(e) => Err(e),
    }
}

/// A stored kind read back, a damaged one reported as a corrupt record.
pub(super) fn decode(key: &Key, stored: Option<&str>) -> Result<KeyKind> {
    KeyKind::from_stored(stored).ok_or_else(|| {
        RecordDecoder::new(STORE, key.as_str()).corrupt(format!("unknown kind {stored:?}"))
    })
}

/// A row of ANCHOR: kind, mutex live, holder, ms left, fence.
type AnchorRow = (
    Option<String>,
    Option<bool>,
    Option<String>,
    Option<i64>,
    i64,
);

/// Runs `sql` (NEW_ANCHOR or CONVERT) for key `key` and kind `stored` in
/// the claim's transaction.
async fn set_kind(
    tx: &mut Transaction<'_, Sqlite>,
    sql: &'static str,
    key: &str,
    stored: Option<&'static str>,
) -> Result<()> {
    sqlx::query(sql)
        .bind(key)
        .bind(stored)
        .execute(&mut **tx)
        .await
        .map_err(classify)?;
    Ok(())
}

/// Claims the key's anchor for `req`'s kind, inside the grant's
/// transaction (`# Contract` of `Backend`): `None` to go on with the
/// grant; else the answer (busy behind a live mutex holder, or the other
/// kind), the transaction then rolled back by its drop. A free mutex key
/// becomes the requested kind, and the permits' fence is raised to the
/// mutex's, so the key's tokens keep increasing.
pub(super) async fn claim(
    tx: &mut Transaction<'_, Sqlite>,
    tables: &SlotTables,
    req: &AcquireRequest,
) -> Result<Option<Acquire>> {
    let key = req.key().as_str();
    let wanted = req.key_kind();
    let stored = wanted.stored();
    let anchor: Option<AnchorRow> = sqlx::query_as(ANCHOR)
        .bind(key)
        .fetch_optional(&mut **tx)
        .await
        .map_err(classify)?;
    let Some((kind, live, holder, remaining, fence)) = anchor else {
        set_kind(tx, NEW_ANCHOR, key, stored).await?;
        return Ok(None);
    };
    match decode(req.key(), kind.as_deref())? {
        kind if kind == wanted => Ok(None),
        KeyKind::Mutex if live == Some(true) => Ok(Some(busy(holder, remaining))),
        KeyKind::Mutex => {
            set_kind(tx, CONVERT, key, stored).await?;
            sqlx::query(tables.raise_fence)
                .bind(key)
                .bind(fence)
                .execute(&mut **tx)
                .await
                .map_err(classify)?;
            Ok(None)
        }
        other => Ok(Some(Acquire::OtherKind(other))),
    }
}

// The checks after the migration are the conformance kit's, shared with
// the PostgreSQL store's test of its own old table.
#[cfg(all(test, feature = "conformance"))]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    use super::super::sql::MIGRATION;
    use super::super::SqliteBackend;
    use super::HAS_KIND;
    use crate::backend::OwnerId;

    /// A file written by the release before kinds: a held key (fence 7)
    /// and a free one (fence 5). Opened by this version, the column is
    /// added (twice: idempotent), the held lease stays held and its owner
    /// can renew and release it, and tokens go on from the old fences,
    /// also when the free key becomes a reader-writer lock.
    #[tokio::test]
    async fn a_table_without_kinds_keeps_its_leases_and_tokens() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("old.db");
        let owner = OwnerId::random();
        let in_a_minute = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            + 60_000;
        {
            let old = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(
                    SqliteConnectOptions::new()
                        .filename(&path)
                        .create_if_missing(true),
                )
                .await
                .unwrap();
            // The table as the release before kinds created it: this
            // version's first statement still creates it so, and `migrate`
            // adds the column after.
            sqlx::query(MIGRATION).execute(&old).await.unwrap();
            let kinds: i64 = sqlx::query_scalar(HAS_KIND).fetch_one(&old).await.unwrap();
            assert_eq!(kinds, 0, "the old table has no kind column");
            sqlx::query(
                "INSERT INTO leasehold_locks VALUES ('held', 7, ?1, 'old:1', ?2), \
                 ('free', 5, NULL, NULL, NULL)",
            )
            .bind(owner.to_string())
            .bind(in_a_minute)
            .execute(&old)
            .await
            .unwrap();
            old.close().await;
        }
        let backend = SqliteBackend::open(&path).await.unwrap();
        drop(backend);
        let backend = SqliteBackend::open(&path).await.unwrap();
        crate::conformance::records_from_before_kinds_keep_leases_and_tokens(&backend, owner).await;
    }
}
