//! Idle records go away, and tokens still only grow (docs/storage.md).
//!
//! A record is created with the server's clock in microseconds as its
//! fence ([`FIRST_FENCE`]: the mutex's row, and the anchor of a
//! semaphore or reader-writer lock, whose slots row counts on from the
//! anchor's fence); each later grant adds one. A fence grows far slower than the clock (no server
//! grants one key a million times a second), so it stays below the clock.
//! A sweep deletes a record only once its key has been idle for the window
//! **and** its fence is below the clock of a window ago, so a key that
//! comes back, created at the clock of now, starts above every token it had.
//!
//! Unlike SQLite, PostgreSQL runs grants concurrently with the sweep: a
//! grant whose statement read the clock before a deletion it then follows
//! (it waited on the deleted row's lock) creates the key with that earlier
//! reading. It is still above the deleted fence unless the statement was in
//! flight for longer than the window, which the statements' lock timeouts
//! and the hour of the default window rule out. The argument also assumes
//! the server's clock never steps back by more than the window.
//!
//! A pass walks the key space in ranges of [`BATCH`] keys of the lease
//! table, one statement per range, so it never holds more than a range of
//! row locks ([`range_statement`] has the argument for the semaphores' and
//! rw locks' two rows per key).

use std::sync::Arc;
use std::time::Duration;

use super::exec::Param;
use super::Inner;
use crate::backend::{duration_to_millis, SweepSchedule};
use crate::error::Result;

/// Keys of the lease table per range (and so per statement).
const BATCH: i64 = 256;

/// A new record's fence: the server's clock in microseconds.
pub(super) const FIRST_FENCE: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// The statement of one range: $1 the key the range starts after, $2 the
/// window in ms. Returns the keys whose records it deleted and the range's
/// last key (NULL when it ran to the end of the key space).
///
/// A mutex row goes (`l`) when its holder left or expired more than the
/// window ago, its fence is below the clock of a window ago, and no live
/// waiter is queued for it (queue.rs); the range's dead queue entries go
/// too (`dq`). A grant or
/// a kind claim that updates the row while the delete waits for it makes
/// PostgreSQL re-check the row's own conditions on its new version (a new
/// expiry, a kind), so a row taken meanwhile stays.
///
/// A semaphore's or rw lock's key has two rows, its anchor (here) and its
/// slots (`<table>_permits` or `<table>_rw`), and both go together or
/// neither does: a slots row deleted under a kept anchor would restart its
/// fence at the anchor's, below the tokens it handed out. A grant locks the
/// anchor first and rewrites it (`claim` in semaphore.rs), then writes the
/// slots row, in one statement. So the sweep locks the anchors first,
/// skipping the ones a grant holds (`held`), and keeps only those whose row
/// is still the version of this statement's snapshot (`k`: same `ctid`): no
/// grant of those keys committed since the snapshot, so the snapshot's
/// slots rows are the keys' whole story except for releases and renewals,
/// which only rewrite a slots row, and which the deletes (`dp`, `dr`) see
/// by re-checking each row's own conditions on its latest version. A slots
/// row goes when every slot (and a waiting writer's mark) ended more than
/// the window ago and its fence is below the clock of a window ago; the
/// anchor goes with it (`da`), or alone when it has no slots row left.
pub(super) fn range_statement(table: &str) -> String {
    let permits = super::names::permits_table(table);
    let rw = super::names::rw_table(table);
    let queue = super::names::queue_table(table);
    let in_range = "t.key > $1::text AND (b.hi IS NULL OR t.key <= b.hi)";
    let last_end = |x: &str| {
        format!(
            "coalesce((SELECT max((s.v->>'e')::bigint) FROM jsonb_each({x}.slots) AS s(k, v)), 0)"
        )
    };
    format!(
        "WITH r AS (SELECT key FROM {table} WHERE key > $1::text ORDER BY key LIMIT {BATCH}), \
         b AS (SELECT CASE WHEN count(*) < {BATCH} THEN NULL ELSE max(key) END AS hi FROM r), \
         c AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $2::bigint AS ms), \
         l AS (DELETE FROM {table} AS t USING b, c \
           WHERE {in_range} AND t.kind IS NULL \
             AND t.fence < c.ms * 1000 \
             AND coalesce(t.expires_at, '-infinity') <= to_timestamp(c.ms / 1000.0) \
             AND NOT EXISTS (SELECT FROM {queue} AS q \
               WHERE q.key = t.key AND q.expires_at > clock_timestamp()) \
           RETURNING t.key), \
         dq AS (DELETE FROM {queue} AS q USING b \
           WHERE q.key > $1::text AND (b.hi IS NULL OR q.key <= b.hi) \
             AND q.expires_at <= clock_timestamp()), \
         seen AS (SELECT t.key, t.ctid FROM {table} AS t, b, c \
           WHERE {in_range} AND t.kind IS NOT NULL AND t.fence < c.ms * 1000), \
         held AS (SELECT t.key, t.ctid FROM {table} AS t, b, c \
           WHERE {in_range} AND t.kind IS NOT NULL AND t.fence < c.ms * 1000 \
           FOR UPDATE OF t SKIP LOCKED), \
         k AS (SELECT held.key FROM held JOIN seen ON seen.key = held.key AND seen.ctid = held.ctid), \
         dp AS (DELETE FROM {permits} AS x USING k, c \
           WHERE x.key = k.key AND x.fence < c.ms * 1000 AND {p_end} <= c.ms \
             AND NOT EXISTS (SELECT FROM {rw} AS o WHERE o.key = x.key) \
           RETURNING x.key), \
         dr AS (DELETE FROM {rw} AS x USING k, c \
           WHERE x.key = k.key AND x.fence < c.ms * 1000 AND {r_end} <= c.ms \
             AND coalesce((x.mark->>'e')::bigint, 0) <= c.ms \
             AND NOT EXISTS (SELECT FROM {permits} AS o WHERE o.key = x.key) \
           RETURNING x.key), \
         da AS (DELETE FROM {table} AS t USING k \
           WHERE t.key = k.key \
             AND (t.key IN (SELECT key FROM dp) OR NOT EXISTS (SELECT FROM {permits} AS o WHERE o.key = t.key)) \
             AND (t.key IN (SELECT key FROM dr) OR NOT EXISTS (SELECT FROM {rw} AS o WHERE o.key = t.key)) \
           RETURNING t.key) \
         SELECT (SELECT count(*) FROM l) + (SELECT count(*) FROM da), (SELECT hi FROM b)",
        p_end = last_end("x"),
        r_end = last_end("x"),
    )
}

/// The sweep state of one store handle (and its clones).
#[derive(Debug)]
pub(super) struct Sweeper {
    schedule: SweepSchedule,
}

impl Sweeper {
    pub(super) fn new(window: Option<Duration>) -> Self {
        Sweeper {
            schedule: SweepSchedule::new(window),
        }
    }
}

/// Ends the pass when dropped, also when its runtime shuts down mid-pass.
struct Running(Arc<Inner>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.sweeper.schedule.finish();
    }
}

impl Inner {
    /// Starts a pass in the background if one is due (called after a
    /// release, the moment a record may have become idle). A pass that
    /// fails stops; the next due one starts over.
    pub(super) fn poke_sweeper(self: &Arc<Self>) {
        let Some((window, runtime)) = self.sweeper.schedule.start_due() else {
            return;
        };
        let running = Running(Arc::clone(self));
        runtime.spawn(async move {
            if let Err(e) = running.0.sweep(window).await {
                tracing::debug!(error = %e, "leasehold: postgres sweep pass stopped");
            }
        });
    }

    /// One whole pass over the key space; how many records it deleted.
    pub(super) async fn sweep(&self, window: Duration) -> Result<u64> {
        let window_ms = duration_to_millis(window);
        let mut after = String::new();
        let mut deleted = 0;
        loop {
            let row = self
                .fetch_optional(
                    &self.sql.sweep,
                    &[Param::Text(&after), Param::Int(window_ms)],
                )
                .await?;
            let Some(row) = row else { return Ok(deleted) };
            let (count, end): (i64, Option<String>) = (
                sqlx::Row::try_get(&row, 0).map_err(super::classify)?,
                sqlx::Row::try_get(&row, 1).map_err(super::classify)?,
            );
            deleted += u64::try_from(count).unwrap_or(0);
            match end {
                Some(end) => after = end,
                None => return Ok(deleted),
            }
        }
    }
}
