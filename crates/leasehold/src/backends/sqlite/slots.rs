//! What the semaphore's and the reader-writer lock's tables have in common:
//! a fence per key (deleted with its last slot by a sweep, see sweep.rs)
//! and a row per slot, with the same
//! columns, so the statements over them differ only in the tables' names.
//! A grant is one `BEGIN IMMEDIATE` transaction: [`begin`], the caller's
//! own checks, then [`grant`], which takes the fence and the slot and
//! commits. Renew and release are one statement each.

use std::time::Duration;

use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Connection, Row, Transaction};

use super::{classify, is_locked, Query, SqliteBackend, STORE};
use crate::backend::{
    duration_to_millis, token_to_i64, Acquire, AcquireRequest, Lease, PermitInfo, RecordDecoder,
};
use crate::error::Result;

/// The statements over one pair of tables (see `slot_tables!`).
pub(super) struct SlotTables {
    /// Creates the fence table; safe to run any number of times.
    pub(super) create_fences: &'static str,
    /// Creates the slot table; safe to run any number of times.
    pub(super) create_slots: &'static str,
    /// The lowest slot below ?2 with no live row of key ?1.
    pub(super) free_slot: &'static str,
    /// Parameter: key. Returns the key's next fence.
    pub(super) next_fence: &'static str,
    /// Parameters: key, fence. Raises the key's fence to at least that
    /// (a mutex key's fence, as the key changes kind).
    pub(super) raise_fence: &'static str,
    /// Parameter: key. How many of its slots are live.
    pub(super) count_live: &'static str,
    /// Parameter: key. Frees every slot of the key.
    pub(super) free_all: &'static str,
    /// Parameters: key, slot, owner, holder, token, ttl in ms.
    pub(super) take_slot: &'static str,
    /// Parameters: key, slot, owner, token, ttl in ms.
    pub(super) renew: &'static str,
    /// Parameters: key, owner, ttl in ms, lowest and highest slot. Extends
    /// the owner's live slot in that range; returns its slot and token.
    pub(super) regrant: &'static str,
    /// Parameters: key, slot, owner, token.
    pub(super) release: &'static str,
    /// Parameter: key prefix. The live rows, by key and slot.
    pub(super) list: &'static str,
    /// Reads a listed row's fields (slot, owner, holder, token, ms left)
    /// as this lock reads them.
    pub(super) decode: Decode,
}

/// A slot row's reading: [`RecordDecoder::permit_info`] or
/// [`RecordDecoder::rw_info`].
pub(super) type Decode =
    fn(&RecordDecoder<'_>, i64, &str, Option<String>, i64, i64) -> Result<PermitInfo>;

/// The [`SlotTables`] of a fence table and a slot table, by name (literals:
/// the statements are built at compile time), and the `RecordDecoder`
/// method that reads their rows.
macro_rules! slot_tables {
    ($fences:literal, $slots:literal, $decode:ident) => {
        $crate::backends::sqlite::slots::SlotTables {
            // The layout (and white space) of the tables' first release:
            // SQLite keeps this text as the schema.
            create_fences: concat!(
                "CREATE TABLE IF NOT EXISTS ",
                $fences,
                " (
        key TEXT PRIMARY KEY NOT NULL,
        fence INTEGER NOT NULL
    ) WITHOUT ROWID"
            ),
            create_slots: concat!(
                "CREATE TABLE IF NOT EXISTS ",
                $slots,
                " (
        key TEXT NOT NULL,
        slot INTEGER NOT NULL,
        owner TEXT NOT NULL,
        holder TEXT,
        token INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        PRIMARY KEY (key, slot)
    ) WITHOUT ROWID"
            ),
            free_slot: concat!(
                "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?2) \
                 SELECT i FROM s WHERE i NOT IN (SELECT slot FROM ",
                $slots,
                " WHERE key = ?1 AND expires_at_ms > ",
                now_ms!(),
                ") ORDER BY i LIMIT 1"
            ),
            next_fence: concat!(
                "INSERT INTO ",
                $fences,
                " (key, fence) VALUES (?1, ",
                first_fence!(),
                ") ON CONFLICT (key) DO UPDATE SET fence = fence + 1 RETURNING fence"
            ),
            raise_fence: concat!(
                "INSERT INTO ",
                $fences,
                " (key, fence) VALUES (?1, max(?2, ",
                first_fence!(),
                ")) ON CONFLICT (key) DO UPDATE SET fence = max(fence, excluded.fence)"
            ),
            count_live: concat!(
                "SELECT count(*) FROM ",
                $slots,
                " WHERE key = ?1 AND expires_at_ms > ",
                now_ms!()
            ),
            free_all: concat!("DELETE FROM ", $slots, " WHERE key = ?1"),
            take_slot: concat!(
                "INSERT INTO ",
                $slots,
                " (key, slot, owner, holder, token, expires_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ",
                now_ms!(),
                " + ?6) ON CONFLICT (key, slot) DO UPDATE SET owner = excluded.owner, \
                 holder = excluded.holder, token = excluded.token, \
                 expires_at_ms = excluded.expires_at_ms"
            ),
            renew: concat!(
                "UPDATE ",
                $slots,
                " SET expires_at_ms = ",
                now_ms!(),
                " + ?5 WHERE key = ?1 AND slot = ?2 AND owner = ?3 AND token = ?4 \
                 AND expires_at_ms > ",
                now_ms!()
            ),
            regrant: concat!(
                "UPDATE ",
                $slots,
                " SET expires_at_ms = ",
                now_ms!(),
                " + ?3 WHERE key = ?1 AND owner = ?2 AND slot BETWEEN ?4 AND ?5 \
                 AND expires_at_ms > ",
                now_ms!(),
                " RETURNING slot, token"
            ),
            // The row stays, ended now, so the key's idle window counts
            // from its last release (sweep.rs deletes it later).
            release: concat!(
                "UPDATE ",
                $slots,
                " SET expires_at_ms = min(expires_at_ms, ",
                now_ms!(),
                ") WHERE key = ?1 AND slot = ?2 AND owner = ?3 AND token = ?4"
            ),
            list: concat!(
                "SELECT key, slot, owner, holder, token, expires_at_ms - ",
                now_ms!(),
                " FROM ",
                $slots,
                " WHERE substr(key, 1, length(?1)) = ?1 AND expires_at_ms > ",
                now_ms!(),
                " ORDER BY key, slot"
            ),
            decode: |record, slot, owner, holder, token, remaining_ms| {
                record.$decode(slot, owner, holder, token, remaining_ms)
            },
        }
    };
}

/// Creates the tables, fences first; safe to run any number of times.
pub(super) async fn migrate(
    pool: &SqlitePool,
    tables: &SlotTables,
) -> std::result::Result<(), sqlx::Error> {
    for statement in [tables.create_fences, tables.create_slots] {
        sqlx::query(statement).execute(pool).await?;
    }
    Ok(())
}

/// Opens a grant's transaction. `BEGIN IMMEDIATE` takes the write lock
/// first, so the caller's reads and the writes are one atomic step; `None`
/// when another connection kept the write lock for the whole wait.
pub(super) async fn begin(conn: &mut SqliteConnection) -> Result<Option<Transaction<'_, Sqlite>>> {
    match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => Ok(Some(tx)),
        Err(e) if is_locked(&e) => Ok(None),
        Err(e) => Err(classify(e)),
    }
}

/// The admin break of a key of this kind, inside the caller's write
/// transaction: frees every slot and bumps the fence. Whether one was live.
pub(super) async fn force_release(
    tx: &mut Transaction<'_, Sqlite>,
    tables: &SlotTables,
    key: &str,
) -> Result<bool> {
    let live: i64 = sqlx::query_scalar(tables.count_live)
        .bind(key)
        .fetch_one(&mut **tx)
        .await
        .map_err(classify)?;
    for statement in [tables.free_all, tables.next_fence] {
        sqlx::query(statement)
            .bind(key)
            .execute(&mut **tx)
            .await
            .map_err(classify)?;
    }
    Ok(live > 0)
}

/// The lowest slot below `below` with no live row of the request's key.
pub(super) async fn free_slot(
    tx: &mut Transaction<'_, Sqlite>,
    tables: &SlotTables,
    req: &AcquireRequest,
    below: i64,
) -> Result<i64> {
    sqlx::query_scalar(tables.free_slot)
        .bind(req.key().as_str())
        .bind(below)
        .fetch_one(&mut **tx)
        .await
        .map_err(classify)
}

/// A repeat of a request whose owner holds a live slot in `slots`: the
/// same grant (slot and token), its expiry counted from now, committed.
/// `Err(tx)` gives the transaction back when the owner holds none.
pub(super) async fn regrant<'c>(
    mut tx: Transaction<'c, Sqlite>,
    tables: &SlotTables,
    req: &AcquireRequest,
    slots: std::ops::RangeInclusive<u32>,
) -> Result<std::result::Result<Acquire, Transaction<'c, Sqlite>>> {
    let held: Option<(i64, i64)> = sqlx::query_as(tables.regrant)
        .bind(req.key().as_str())
        .bind(req.owner().to_string())
        .bind(duration_to_millis(req.ttl()))
        .bind(i64::from(*slots.start()))
        .bind(i64::from(*slots.end()))
        .fetch_optional(&mut *tx)
        .await
        .map_err(classify)?;
    let Some((slot, token)) = held else {
        return Ok(Err(tx));
    };
    tx.commit().await.map_err(classify)?;
    let record = RecordDecoder::new(STORE, req.key().as_str());
    let slot =
        u32::try_from(slot).map_err(|_| record.corrupt(format!("slot {slot} is negative")))?;
    Ok(Ok(Acquire::Granted(
        req.granted_permit(slot, record.token(token)?),
    )))
}

/// Takes the key's next fence and `slot` for the request, and commits.
pub(super) async fn grant(
    mut tx: Transaction<'_, Sqlite>,
    tables: &SlotTables,
    req: &AcquireRequest,
    slot: i64,
) -> Result<Acquire> {
    let key = req.key().as_str();
    let fence: i64 = sqlx::query_scalar(tables.next_fence)
        .bind(key)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
    sqlx::query(tables.take_slot)
        .bind(key)
        .bind(slot)
        .bind(req.owner().to_string())
        .bind(req.holder())
        .bind(fence)
        .bind(duration_to_millis(req.ttl()))
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    let record = RecordDecoder::new(STORE, key);
    let slot =
        u32::try_from(slot).map_err(|_| record.corrupt(format!("free slot {slot} is negative")))?;
    Ok(Acquire::Granted(
        req.granted_permit(slot, record.token(fence)?),
    ))
}

/// The parameters that name one held slot: key, slot, owner, token.
fn held<'q>(query: Query<'q>, lease: &'q Lease) -> Result<Query<'q>> {
    Ok(query
        .bind(lease.key().as_str())
        .bind(i64::from(lease.slot().unwrap_or(u32::MAX)))
        .bind(lease.owner().to_string())
        .bind(token_to_i64(lease.token())?))
}

impl SqliteBackend {
    /// Extends a held slot; false if it was lost.
    pub(super) async fn renew_slot(
        &self,
        tables: &SlotTables,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<bool> {
        self.run_renew(held(sqlx::query(tables.renew), lease)?.bind(duration_to_millis(ttl)))
            .await
    }

    /// Frees a held slot, and wakes the key's waiters if it was held.
    pub(super) async fn release_slot(&self, tables: &SlotTables, lease: &Lease) -> Result<()> {
        self.run_release(held(sqlx::query(tables.release), lease)?, lease.key())
            .await
    }

    /// The live slots under `prefix`.
    pub(super) async fn list_slots(
        &self,
        tables: &SlotTables,
        prefix: &str,
    ) -> Result<Vec<PermitInfo>> {
        let rows = sqlx::query(tables.list)
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        rows.iter()
            .map(|row| slot_from_row(row, tables.decode))
            .collect()
    }
}

/// A row of a slot listing, every field checked: a column of the wrong type
/// (SQLite does not enforce them) is a corrupt record too.
fn slot_from_row(row: &SqliteRow, decode: Decode) -> Result<PermitInfo> {
    let key: String = row
        .try_get(0)
        .map_err(|e| RecordDecoder::new(STORE, "?").corrupt(format!("unreadable key: {e}")))?;
    let record = RecordDecoder::new(STORE, &key);
    let wrong_type = |e: sqlx::Error| record.corrupt(e.to_string());
    decode(
        &record,
        row.try_get(1).map_err(wrong_type)?,
        &row.try_get::<String, _>(2).map_err(wrong_type)?,
        row.try_get(3).map_err(wrong_type)?,
        row.try_get(4).map_err(wrong_type)?,
        row.try_get(5).map_err(wrong_type)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, CorruptRecord, RwSide, WRITER_SLOT};

    /// Puts a live row in `table` by hand, as a grant would leave it.
    async fn insert_slot(backend: &SqliteBackend, table: &str, slot: u32) {
        let sql = format!(
            "INSERT INTO {table} (key, slot, owner, holder, token, expires_at_ms) \
             VALUES ('k', ?1, '0123456789abcdef0123456789abcdef', 'h', 1, {} + 60000)",
            now_ms!()
        );
        sqlx::query(&sql)
            .bind(i64::from(slot))
            .execute(backend.pool())
            .await
            .unwrap();
    }

    /// Each lock's listing reads its own table with its own decoding: the
    /// writer's slot is a valid rw grant, but no valid permit's slot.
    #[tokio::test]
    async fn sqlite_each_listing_decodes_its_own_rows() {
        let tmp = tempfile::tempdir().unwrap();
        let backend = SqliteBackend::open(tmp.path().join("x.db")).await.unwrap();

        insert_slot(&backend, "leasehold_rw_slots", WRITER_SLOT).await;
        let listed = backend.list("").await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].slot, Some(WRITER_SLOT));
        assert_eq!(listed[0].rw, Some(RwSide::Write));

        insert_slot(&backend, "leasehold_permits", WRITER_SLOT).await;
        let e = backend.list("").await.unwrap_err();
        let source = std::error::Error::source(&e).unwrap();
        assert!(source.downcast_ref::<CorruptRecord>().is_some(), "{e}");
        assert!(e.to_string().contains("outside 0.."), "{e}");
    }
}
