//! SQLite's reader-writer locks: a fence per key (never deleted), a row per
//! reader or writer slot, and a row for a waiting writer's marker, in
//! tables of their own (a semaphore of the same key never meets them). A
//! grant is one `BEGIN IMMEDIATE` transaction, as the semaphore's; renew
//! and release are one statement each. See docs/rw-lock.md.

use std::time::Duration;

use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Connection, Row};

use super::{classify, is_locked, write_locked, BoundedBusy, SqliteBackend, STORE};
use crate::backend::{
    duration_to_millis, millis_to_duration, token_to_i64, Acquire, AcquireRequest, BoxFuture, Busy,
    Lease, PermitInfo, RecordDecoder, RwSide, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::Result;

/// Creates the tables; safe to run any number of times.
const MIGRATION: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS leasehold_rw_fences (
        key TEXT PRIMARY KEY NOT NULL,
        fence INTEGER NOT NULL
    ) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS leasehold_rw_slots (
        key TEXT NOT NULL,
        slot INTEGER NOT NULL,
        owner TEXT NOT NULL,
        holder TEXT,
        token INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        PRIMARY KEY (key, slot)
    ) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS leasehold_rw_marks (
        key TEXT PRIMARY KEY NOT NULL,
        owner TEXT NOT NULL,
        holder TEXT,
        expires_at_ms INTEGER NOT NULL
    ) WITHOUT ROWID",
];

/// For key ?1 and owner ?2: live readers, whether the writer is live,
/// whether another owner's live marker stands, and the live holder (reader,
/// writer or marker) that expires first with its time left.
const STATE: &str = concat!(
    "SELECT (SELECT count(*) FROM leasehold_rw_slots WHERE key = ?1 AND slot < ?3 AND expires_at_ms > ",
    now_ms!(),
    "), (SELECT count(*) FROM leasehold_rw_slots WHERE key = ?1 AND slot = ?3 AND expires_at_ms > ",
    now_ms!(),
    "), (SELECT count(*) FROM leasehold_rw_marks WHERE key = ?1 AND owner <> ?2 AND expires_at_ms > ",
    now_ms!(),
    "), holder, at - ",
    now_ms!(),
    " FROM (SELECT 1) LEFT JOIN (SELECT holder, at FROM (\
       SELECT holder, expires_at_ms AS at FROM leasehold_rw_slots WHERE key = ?1 \
       UNION ALL SELECT holder, expires_at_ms FROM leasehold_rw_marks WHERE key = ?1 AND owner <> ?2) \
     WHERE at > ",
    now_ms!(),
    " ORDER BY at LIMIT 1)"
);

/// The lowest reader slot below ?2 with no live reader of key ?1.
const FREE_SLOT: &str = concat!(
    "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?2) \
     SELECT i FROM s WHERE i NOT IN (SELECT slot FROM leasehold_rw_slots WHERE key = ?1 \
     AND expires_at_ms > ",
    now_ms!(),
    ") ORDER BY i LIMIT 1"
);

const NEXT_FENCE: &str = "INSERT INTO leasehold_rw_fences (key, fence) VALUES (?1, 1) \
     ON CONFLICT (key) DO UPDATE SET fence = fence + 1 RETURNING fence";

/// Parameters: key, slot, owner, holder, token, ttl in ms.
const TAKE_SLOT: &str = concat!(
    "INSERT INTO leasehold_rw_slots (key, slot, owner, holder, token, expires_at_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ",
    now_ms!(),
    " + ?6) ON CONFLICT (key, slot) DO UPDATE SET owner = excluded.owner, \
     holder = excluded.holder, token = excluded.token, expires_at_ms = excluded.expires_at_ms"
);

/// Parameters: key, owner, holder, life in ms. Sets or refreshes the
/// marker (the caller checked that no other owner's live marker stands).
const MARK: &str = concat!(
    "INSERT INTO leasehold_rw_marks (key, owner, holder, expires_at_ms) VALUES (?1, ?2, ?3, ",
    now_ms!(),
    " + ?4) ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, \
     holder = excluded.holder, expires_at_ms = excluded.expires_at_ms"
);

const UNMARK: &str = "DELETE FROM leasehold_rw_marks WHERE key = ?1";

/// Parameters: key, slot, owner, token, ttl in ms.
const RENEW: &str = concat!(
    "UPDATE leasehold_rw_slots SET expires_at_ms = ",
    now_ms!(),
    " + ?5 WHERE key = ?1 AND slot = ?2 AND owner = ?3 AND token = ?4 AND expires_at_ms > ",
    now_ms!()
);

/// Parameters: key, slot, owner, token.
const RELEASE: &str =
    "DELETE FROM leasehold_rw_slots WHERE key = ?1 AND slot = ?2 AND owner = ?3 AND token = ?4";

const LIST: &str = concat!(
    "SELECT key, slot, owner, holder, token, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_rw_slots WHERE substr(key, 1, length(?1)) = ?1 AND expires_at_ms > ",
    now_ms!(),
    " ORDER BY key, slot"
);

pub(super) async fn migrate(pool: &SqlitePool) -> std::result::Result<(), sqlx::Error> {
    for statement in MIGRATION {
        sqlx::query(statement).execute(pool).await?;
    }
    Ok(())
}

/// The parameters that name one held grant: key, slot, owner, token.
fn held<'q>(
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    lease: &'q Lease,
) -> Result<sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>> {
    Ok(query
        .bind(lease.key().as_str())
        .bind(i64::from(lease.slot().unwrap_or(u32::MAX)))
        .bind(lease.owner().to_string())
        .bind(token_to_i64(lease.token())?))
}

fn acquire_on<'a>(
    conn: &'a mut SqliteConnection,
    req: &'a AcquireRequest,
    side: RwSide,
) -> BoxFuture<'a, Result<Acquire>> {
    Box::pin(async move {
        let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
            Ok(tx) => tx,
            Err(e) if is_locked(&e) => return Ok(write_locked()),
            Err(e) => return Err(classify(e)),
        };
        let key = req.key().as_str();
        let owner = req.owner().to_string();
        let (readers, writer, others_mark, holder, remaining): (
            i64,
            i64,
            i64,
            Option<String>,
            Option<i64>,
        ) = sqlx::query_as(STATE)
            .bind(key)
            .bind(&owner)
            .bind(i64::from(WRITER_SLOT))
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        let busy = || {
            Acquire::Busy(Busy {
                holder: holder.clone().unwrap_or_default(),
                remaining: millis_to_duration(remaining.unwrap_or(0)),
            })
        };
        if writer > 0 || others_mark > 0 {
            return Ok(busy());
        }
        let slot: i64 = match side {
            RwSide::Read => {
                if readers >= i64::from(MAX_PERMITS) {
                    return Ok(busy());
                }
                sqlx::query_scalar(FREE_SLOT)
                    .bind(key)
                    .bind(i64::from(MAX_PERMITS))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(classify)?
            }
            RwSide::Write if readers > 0 => {
                // Readers hold: mark the lock as wanted, if this writer waits.
                if let Some(life) = req.writer_mark_ttl() {
                    sqlx::query(MARK)
                        .bind(key)
                        .bind(&owner)
                        .bind(req.holder())
                        .bind(duration_to_millis(life))
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                    tx.commit().await.map_err(classify)?;
                }
                return Ok(busy());
            }
            RwSide::Write => {
                sqlx::query(UNMARK)
                    .bind(key)
                    .execute(&mut *tx)
                    .await
                    .map_err(classify)?;
                i64::from(WRITER_SLOT)
            }
        };
        let fence: i64 = sqlx::query_scalar(NEXT_FENCE)
            .bind(key)
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        sqlx::query(TAKE_SLOT)
            .bind(key)
            .bind(slot)
            .bind(&owner)
            .bind(req.holder())
            .bind(fence)
            .bind(duration_to_millis(req.ttl()))
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        let record = RecordDecoder::new(STORE, key);
        let slot = u32::try_from(slot)
            .map_err(|_| record.corrupt(format!("free slot {slot} is negative")))?;
        Ok(Acquire::Granted(
            req.granted_permit(slot, record.token(fence)?),
        ))
    })
}

fn holder_from_row(row: &SqliteRow) -> Result<PermitInfo> {
    let key: String = row
        .try_get(0)
        .map_err(|e| RecordDecoder::new(STORE, "?").corrupt(format!("unreadable key: {e}")))?;
    let record = RecordDecoder::new(STORE, &key);
    let wrong_type = |e: sqlx::Error| record.corrupt(e.to_string());
    record.rw_info(
        row.try_get(1).map_err(wrong_type)?,
        &row.try_get::<String, _>(2).map_err(wrong_type)?,
        row.try_get(3).map_err(wrong_type)?,
        row.try_get(4).map_err(wrong_type)?,
        row.try_get(5).map_err(wrong_type)?,
    )
}

impl SqliteBackend {
    pub(super) fn rw_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
        side: RwSide,
    ) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            let mut conn = BoundedBusy::new(&self.pool, req).await?;
            let outcome = acquire_on(conn.conn(), req, side).await;
            conn.restore(self.busy_timeout).await?;
            outcome
        })
    }

    pub(super) fn rw_renew<'a>(
        &'a self,
        lease: &'a Lease,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let done = held(sqlx::query(RENEW), lease)?
                .bind(duration_to_millis(ttl))
                .execute(&self.pool)
                .await
                .map_err(classify)?;
            Ok(done.rows_affected() == 1)
        })
    }

    pub(super) fn rw_release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let done = held(sqlx::query(RELEASE), lease)?
                .execute(&self.pool)
                .await
                .map_err(classify)?;
            if done.rows_affected() == 1 {
                self.wake.wake(lease.key());
            }
            Ok(())
        })
    }

    pub(super) async fn rw_list(&self, prefix: &str) -> Result<Vec<PermitInfo>> {
        let rows = sqlx::query(LIST)
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        rows.iter().map(holder_from_row).collect()
    }
}
