//! SQLite's reader-writer locks: a fence per key (never deleted), a row per
//! reader or writer slot, and a row for a waiting writer's marker, in
//! tables of their own (a semaphore of the same key never meets them). A
//! grant is one `BEGIN IMMEDIATE` transaction, as the semaphore's; renew
//! and release are one statement each (the slot code shared with the
//! semaphore is in `slots.rs`). See docs/rw-lock.md.

use sqlx::sqlite::{SqliteConnection, SqlitePool};

use super::slots::{self, SlotTables};
use super::{busy, classify, write_locked};
use crate::backend::{
    duration_to_millis, Acquire, AcquireRequest, BoxFuture, RwSide, MAX_PERMITS, WRITER_SLOT,
};
use crate::error::Result;

/// Creates the writers' marker table; safe to run any number of times.
const CREATE_MARKS: &str = "CREATE TABLE IF NOT EXISTS leasehold_rw_marks (
        key TEXT PRIMARY KEY NOT NULL,
        owner TEXT NOT NULL,
        holder TEXT,
        expires_at_ms INTEGER NOT NULL
    ) WITHOUT ROWID";

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

/// Readers take the slots below `MAX_PERMITS`; the writer takes `WRITER_SLOT`.
pub(super) const TABLES: SlotTables =
    slot_tables!("leasehold_rw_fences", "leasehold_rw_slots", rw_info);

/// Parameters: key, owner, holder, life in ms. Sets or refreshes the
/// marker (the caller checked that no other owner's live marker stands).
const MARK: &str = concat!(
    "INSERT INTO leasehold_rw_marks (key, owner, holder, expires_at_ms) VALUES (?1, ?2, ?3, ",
    now_ms!(),
    " + ?4) ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, \
     holder = excluded.holder, expires_at_ms = excluded.expires_at_ms"
);

pub(super) const UNMARK: &str = "DELETE FROM leasehold_rw_marks WHERE key = ?1";

pub(super) async fn migrate(pool: &SqlitePool) -> std::result::Result<(), sqlx::Error> {
    slots::migrate(pool, &TABLES).await?;
    sqlx::query(CREATE_MARKS).execute(pool).await?;
    Ok(())
}

/// A grant's transaction, on a connection whose busy timeout is bounded.
pub(super) fn acquire_on<'a>(
    conn: &'a mut SqliteConnection,
    req: &'a AcquireRequest,
    side: RwSide,
) -> BoxFuture<'a, Result<Acquire>> {
    Box::pin(async move {
        let Some(mut tx) = slots::begin(conn).await? else {
            return Ok(write_locked());
        };
        let own = match side {
            RwSide::Read => 0..=MAX_PERMITS - 1,
            RwSide::Write => WRITER_SLOT..=WRITER_SLOT,
        };
        if let Some(answer) = super::kind::claim(&mut tx, &TABLES, req).await? {
            return Ok(answer);
        }
        let mut tx = match slots::regrant(tx, &TABLES, req, own).await? {
            Ok(regranted) => return Ok(regranted),
            Err(tx) => tx,
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
        if writer > 0 || others_mark > 0 {
            return Ok(busy(holder, remaining));
        }
        let slot: i64 = match side {
            RwSide::Read => {
                if readers >= i64::from(MAX_PERMITS) {
                    return Ok(busy(holder, remaining));
                }
                slots::free_slot(&mut tx, &TABLES, req, i64::from(MAX_PERMITS)).await?
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
                return Ok(busy(holder, remaining));
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
        slots::grant(tx, &TABLES, req, slot).await
    })
}
