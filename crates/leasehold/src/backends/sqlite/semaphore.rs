//! SQLite's semaphores: a permit fence per key (never deleted) and a row
//! per live or expired slot, apart from the mutexes' table. A grant is one
//! `BEGIN IMMEDIATE` transaction (the write lock first, so the count, the
//! free slot and the writes are one atomic step); renew and release are one
//! statement each (the slot code the rw lock shares is in `slots.rs`). See
//! docs/semaphore.md.

use sqlx::sqlite::{SqliteConnection, SqlitePool};

use super::slots::{self, SlotTables};
use super::{busy, classify, write_locked};
use crate::backend::{Acquire, AcquireRequest, BoxFuture};
use crate::error::Result;

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

/// The permits' fences and slots.
pub(super) const TABLES: SlotTables =
    slot_tables!("leasehold_permit_fences", "leasehold_permits", permit_info);

pub(super) async fn migrate(pool: &SqlitePool) -> std::result::Result<(), sqlx::Error> {
    slots::migrate(pool, &TABLES).await
}

/// A grant's transaction, on a connection whose busy timeout is bounded.
pub(super) fn acquire_on<'a>(
    conn: &'a mut SqliteConnection,
    req: &'a AcquireRequest,
) -> BoxFuture<'a, Result<Acquire>> {
    Box::pin(async move {
        let Some(mut tx) = slots::begin(conn).await? else {
            // Another connection kept the write lock for the whole wait.
            return Ok(write_locked());
        };
        if let Some(answer) = super::kind::claim(&mut tx, &TABLES, req).await? {
            return Ok(answer);
        }
        let mut tx = match slots::regrant(tx, &TABLES, req, 0..=u32::MAX).await? {
            Ok(regranted) => return Ok(regranted),
            Err(tx) => tx,
        };
        let permits = i64::from(req.permits().unwrap_or(1));
        let (live, holder, remaining): (i64, Option<String>, Option<i64>) = sqlx::query_as(LIVE)
            .bind(req.key().as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        if live >= permits {
            return Ok(busy(holder, remaining));
        }
        let slot = slots::free_slot(&mut tx, &TABLES, req, permits).await?;
        slots::grant(tx, &TABLES, req, slot).await
    })
}
