//! Idle records go away, and tokens still only grow.
//!
//! A sweep deletes the records of keys nobody has held for the idle window
//! (mutex rows, semaphore and reader-writer fences, expired slots and
//! writer marks) and, in the same write transaction, raises the file's
//! **fence floor** (`leasehold_floor`, one row) to the highest fence it
//! deleted. A key's record is created with the floor plus one (`ACQUIRE`
//! in sql.rs, `next_fence` and `raise_fence` in slots.rs), so a key that
//! comes back starts above every token it ever had. SQLite runs one write
//! transaction at a time and each statement reads the floor under the write
//! lock, so no grant can read a floor older than a deletion it follows: the
//! argument needs no clock (docs/storage.md).
//!
//! A pass walks the key space in ranges of [`BATCH`] keys of
//! `leasehold_locks` (every table is keyed by `key` first, so each range is
//! an index range in every table), one short transaction per range, and
//! gives the connection back between ranges: never a scan that holds the
//! write lock for the whole table.

use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqlitePool;
use sqlx::Connection;

use super::classify;
use crate::backend::{duration_to_millis, SweepSchedule};
use crate::error::Result;

/// Keys of `leasehold_locks` per range (and so per write transaction).
const BATCH: i64 = 256;

/// Creates the floor; safe to run any number of times. A file written
/// before the floor existed starts at 0: nothing was deleted yet.
pub(super) const MIGRATION: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS leasehold_floor (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    fence INTEGER NOT NULL
)",
    "INSERT OR IGNORE INTO leasehold_floor (id, fence) VALUES (1, 0)",
];

/// The first fence of a key's new record: one above every deleted fence.
macro_rules! first_fence {
    () => {
        "(SELECT fence + 1 FROM leasehold_floor WHERE id = 1)"
    };
}

/// The upper key (inclusive) of the range after ?1; none when fewer than
/// ?2 keys follow (the last range runs to the end of the key space).
const RANGE_END: &str =
    "SELECT key FROM leasehold_locks WHERE key > ?1 ORDER BY key LIMIT 1 OFFSET ?2";

/// The range predicate: above ?1, up to ?2 (NULL: no end). ?3 is the idle
/// window in ms.
macro_rules! in_range {
    () => {
        " key > ?1 AND (?2 IS NULL OR key <= ?2) "
    };
}

/// Cut-off: a record idle since before this is gone.
macro_rules! idle_before {
    () => {
        concat!("(", now_ms!(), " - ?3)")
    };
}

/// The deletions of one range, in order: slots and marks first (their
/// tokens came from the fences), then fences with no slot left, then the
/// anchors whose kind has no record left and the idle mutex rows. Each
/// returns the fences it deleted (slots and marks none).
const DELETIONS: [&str; 7] = [
    // Dead queue entries (queue.rs): they hold no fence.
    concat!(
        "DELETE FROM leasehold_queue WHERE",
        in_range!(),
        "AND expires_at_ms <= ",
        now_ms!(),
        " RETURNING 0"
    ),
    concat!(
        "DELETE FROM leasehold_rw_marks WHERE",
        in_range!(),
        "AND expires_at_ms <= ",
        idle_before!(),
        " RETURNING 0"
    ),
    concat!(
        "DELETE FROM leasehold_permits WHERE",
        in_range!(),
        "AND expires_at_ms <= ",
        idle_before!(),
        " RETURNING 0"
    ),
    concat!(
        "DELETE FROM leasehold_rw_slots WHERE",
        in_range!(),
        "AND expires_at_ms <= ",
        idle_before!(),
        " RETURNING 0"
    ),
    concat!(
        "DELETE FROM leasehold_permit_fences AS f WHERE",
        in_range!(),
        "AND NOT EXISTS (SELECT 1 FROM leasehold_permits AS s WHERE s.key = f.key) RETURNING fence"
    ),
    concat!(
        "DELETE FROM leasehold_rw_fences AS f WHERE",
        in_range!(),
        "AND NOT EXISTS (SELECT 1 FROM leasehold_rw_slots AS s WHERE s.key = f.key) \
         AND NOT EXISTS (SELECT 1 FROM leasehold_rw_marks AS m WHERE m.key = f.key) RETURNING fence"
    ),
    // A permit kind's anchor goes with the last of its kind's records; a
    // mutex row once its holder left (release keeps the time it left in
    // `expires_at_ms`; a row released by an older version has NULL).
    concat!(
        "DELETE FROM leasehold_locks AS l WHERE",
        in_range!(),
        "AND coalesce(expires_at_ms, 0) <= ",
        idle_before!(),
        " AND NOT EXISTS (SELECT 1 FROM leasehold_queue AS q WHERE q.key = l.key) \
         AND (kind IS NULL \
           OR (kind = 'sem' AND NOT EXISTS (SELECT 1 FROM leasehold_permit_fences AS f WHERE f.key = l.key)) \
           OR (kind = 'rw' AND NOT EXISTS (SELECT 1 FROM leasehold_rw_fences AS f WHERE f.key = l.key))) \
         RETURNING fence"
    ),
];

/// Raises the floor to ?1 (never lowers it).
const RAISE_FLOOR: &str = "UPDATE leasehold_floor SET fence = max(fence, ?1) WHERE id = 1";

/// The sweep state of one store handle (and its clones).
#[derive(Debug)]
pub(super) struct Sweeper {
    schedule: SweepSchedule,
}

impl Sweeper {
    pub(super) fn new(window: Option<Duration>) -> Arc<Self> {
        Arc::new(Sweeper {
            schedule: SweepSchedule::new(window),
        })
    }

    /// Starts a pass in the background if one is due (called after a
    /// release, the moment a record may have become idle). A pass that
    /// fails stops; the next due one starts over.
    pub(super) fn poke(self: &Arc<Self>, pool: &SqlitePool) {
        let Some((window, runtime)) = self.schedule.start_due() else {
            return;
        };
        let running = Running(Arc::clone(self));
        let pool = pool.clone();
        runtime.spawn(async move {
            if let Err(e) = sweep(&pool, window).await {
                tracing::debug!(error = %e, "leasehold: sqlite sweep pass stopped");
            }
            drop(running);
        });
    }
}

/// Ends the pass when dropped, also when its runtime shuts down mid-pass.
struct Running(Arc<Sweeper>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.schedule.finish();
    }
}

/// One whole pass over the key space: deletes the records idle longer than
/// `window`, a range at a time. Returns how many records it deleted.
pub(super) async fn sweep(pool: &SqlitePool, window: Duration) -> Result<u64> {
    let window_ms = duration_to_millis(window);
    let mut after = String::new();
    let mut deleted = 0;
    loop {
        let end: Option<String> = sqlx::query_scalar(RANGE_END)
            .bind(&after)
            .bind(BATCH - 1)
            .fetch_optional(pool)
            .await
            .map_err(classify)?;
        deleted += sweep_range(pool, &after, end.as_deref(), window_ms).await?;
        match end {
            Some(end) => after = end,
            None => return Ok(deleted),
        }
        // Let the grants queued on the connection go first.
        tokio::task::yield_now().await;
    }
}

/// Deletes one range's idle records and raises the floor, in one write
/// transaction.
async fn sweep_range(
    pool: &SqlitePool,
    after: &str,
    end: Option<&str>,
    window_ms: i64,
) -> Result<u64> {
    let mut conn = pool.acquire().await.map_err(classify)?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(classify)?;
    let mut highest: Option<i64> = None;
    let mut deleted = 0;
    for statement in DELETIONS {
        let mut query = sqlx::query_scalar(statement).bind(after).bind(end);
        if statement.contains("?3") {
            query = query.bind(window_ms);
        }
        let fences: Vec<i64> = query.fetch_all(&mut *tx).await.map_err(classify)?;
        deleted += fences.len() as u64;
        highest = highest.max(fences.into_iter().max());
    }
    if let Some(fence) = highest {
        sqlx::query(RAISE_FLOOR)
            .bind(fence)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)?;
    Ok(deleted)
}
