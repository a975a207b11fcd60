//! SQLite's semaphores: a permit fence per key (never deleted) and a row
//! per live or expired slot, apart from the mutexes' table. A grant is one
//! `BEGIN IMMEDIATE` transaction (the write lock first, so the count, the
//! free slot and the writes are one atomic step); renew and release are one
//! statement each. See docs/semaphore.md.

use std::time::Duration;

use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Connection, Row};

use super::{classify, is_locked, write_locked, BoundedBusy, SqliteBackend, STORE};
use crate::backend::{
    duration_to_millis, millis_to_duration, token_to_i64, Acquire, AcquireRequest, BoxFuture, Busy,
    Lease, PermitInfo, RecordDecoder,
};
use crate::error::Result;

/// Creates the permit tables; safe to run any number of times.
const MIGRATION: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS leasehold_permit_fences (
        key TEXT PRIMARY KEY NOT NULL,
        fence INTEGER NOT NULL
    ) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS leasehold_permits (
        key TEXT NOT NULL,
        slot INTEGER NOT NULL,
        owner TEXT NOT NULL,
        holder TEXT,
        token INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        PRIMARY KEY (key, slot)
    ) WITHOUT ROWID",
];

/// The live permit count of key ?1, and the holder whose permit expires
/// first with its time left (none if nothing is live).
const LIVE: &str = concat!(
    "SELECT (SELECT count(*) FROM leasehold_permits WHERE key = ?1 AND expires_at_ms > ",
    now_ms!(),
    "), holder, expires_at_ms - ",
    now_ms!(),
    " FROM (SELECT 1) LEFT JOIN (SELECT holder, expires_at_ms FROM leasehold_permits \
     WHERE key = ?1 AND expires_at_ms > ",
    now_ms!(),
    " ORDER BY expires_at_ms LIMIT 1)"
);

/// The lowest slot below ?2 with no live permit of key ?1.
const FREE_SLOT: &str = concat!(
    "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?2) \
     SELECT i FROM s WHERE i NOT IN (SELECT slot FROM leasehold_permits WHERE key = ?1 \
     AND expires_at_ms > ",
    now_ms!(),
    ") ORDER BY i LIMIT 1"
);

const NEXT_FENCE: &str = "INSERT INTO leasehold_permit_fences (key, fence) VALUES (?1, 1) \
     ON CONFLICT (key) DO UPDATE SET fence = fence + 1 RETURNING fence";

/// Parameters: key, slot, owner, holder, token, ttl in ms.
const TAKE_SLOT: &str = concat!(
    "INSERT INTO leasehold_permits (key, slot, owner, holder, token, expires_at_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ",
    now_ms!(),
    " + ?6) ON CONFLICT (key, slot) DO UPDATE SET owner = excluded.owner, \
     holder = excluded.holder, token = excluded.token, expires_at_ms = excluded.expires_at_ms"
);

/// Parameters: key, slot, owner, token, ttl in ms.
const RENEW: &str = concat!(
    "UPDATE leasehold_permits SET expires_at_ms = ",
    now_ms!(),
    " + ?5 WHERE key = ?1 AND slot = ?2 AND owner = ?3 AND token = ?4 AND expires_at_ms > ",
    now_ms!()
);

/// Parameters: key, slot, owner, token.
const RELEASE: &str =
    "DELETE FROM leasehold_permits WHERE key = ?1 AND slot = ?2 AND owner = ?3 AND token = ?4";

const LIST: &str = concat!(
    "SELECT key, slot, owner, holder, token, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_permits WHERE substr(key, 1, length(?1)) = ?1 AND expires_at_ms > ",
    now_ms!(),
    " ORDER BY key, slot"
);

pub(super) async fn migrate(pool: &SqlitePool) -> std::result::Result<(), sqlx::Error> {
    for statement in MIGRATION {
        sqlx::query(statement).execute(pool).await?;
    }
    Ok(())
}

/// The parameters that name one held permit: key, slot, owner, token.
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
) -> BoxFuture<'a, Result<Acquire>> {
    Box::pin(async move {
        let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
            Ok(tx) => tx,
            // Another connection kept the write lock for the whole wait.
            Err(e) if is_locked(&e) => return Ok(write_locked()),
            Err(e) => return Err(classify(e)),
        };
        let key = req.key().as_str();
        let permits = i64::from(req.permits().unwrap_or(1));
        let (live, holder, remaining): (i64, Option<String>, Option<i64>) = sqlx::query_as(LIVE)
            .bind(key)
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        if live >= permits {
            return Ok(Acquire::Busy(Busy {
                holder: holder.unwrap_or_default(),
                remaining: millis_to_duration(remaining.unwrap_or(0)),
            }));
        }
        let slot: i64 = sqlx::query_scalar(FREE_SLOT)
            .bind(key)
            .bind(permits)
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        let fence: i64 = sqlx::query_scalar(NEXT_FENCE)
            .bind(key)
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        sqlx::query(TAKE_SLOT)
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
        let slot = u32::try_from(slot)
            .map_err(|_| record.corrupt(format!("free slot {slot} is negative")))?;
        Ok(Acquire::Granted(
            req.granted_permit(slot, record.token(fence)?),
        ))
    })
}

fn permit_from_row(row: &SqliteRow) -> Result<PermitInfo> {
    let key: String = row
        .try_get(0)
        .map_err(|e| RecordDecoder::new(STORE, "?").corrupt(format!("unreadable key: {e}")))?;
    let record = RecordDecoder::new(STORE, &key);
    let wrong_type = |e: sqlx::Error| record.corrupt(e.to_string());
    record.permit_info(
        row.try_get(1).map_err(wrong_type)?,
        &row.try_get::<String, _>(2).map_err(wrong_type)?,
        row.try_get(3).map_err(wrong_type)?,
        row.try_get(4).map_err(wrong_type)?,
        row.try_get(5).map_err(wrong_type)?,
    )
}

impl SqliteBackend {
    pub(super) fn permit_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            // The busy timeout follows the caller's wait, as for the mutex.
            let mut conn = BoundedBusy::new(&self.pool, req).await?;
            let outcome = acquire_on(conn.conn(), req).await;
            conn.restore(self.busy_timeout).await?;
            outcome
        })
    }

    pub(super) fn permit_renew<'a>(
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

    pub(super) fn permit_release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
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

    pub(super) fn permit_list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PermitInfo>>> {
        Box::pin(async move {
            let rows = sqlx::query(LIST)
                .bind(prefix)
                .fetch_all(&self.pool)
                .await
                .map_err(classify)?;
            rows.iter().map(permit_from_row).collect()
        })
    }
}
