//! The mutex's SQL: the lease table and one statement per operation, each
//! run by SQLite as one write transaction, and the reading of a listed row.
//! (The permit and reader-writer statements are in `slots.rs`.)

use sqlx::Row;
use sqlx::Sqlite;

use super::STORE;
use crate::backend::{LeaseInfo, RecordDecoder};
use crate::error::Result;

/// A statement with its parameters bound.
pub(super) type Query<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// Creates the lease table; safe to run any number of times.
pub(super) const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS leasehold_locks (
    key TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL,
    owner TEXT,
    holder TEXT,
    expires_at_ms INTEGER
) WITHOUT ROWID";

/// Grants the lease if the key is new (its fence one above every deleted
/// one, see sweep.rs), or free or expired with no live waiter queued ahead
/// of the requester (queue.rs), and a mutex (`kind IS NULL`: one key is
/// one lock, see `kind.rs`); returns the new fence. A repeat by the owner
/// that holds it live (or the claim of a grant handed over to it) is the
/// same grant, its expiry counted from now (the fence stays). Parameters:
/// key, owner, holder, ttl in ms.
pub(super) const ACQUIRE: &str = concat!(
    "INSERT INTO leasehold_locks (key, fence, owner, holder, expires_at_ms) VALUES (?1, ",
    first_fence!(),
    ", ?2, ?3, ",
    now_ms!(),
    " + ?4) ON CONFLICT (key) DO UPDATE SET fence = CASE WHEN owner = excluded.owner \
     AND expires_at_ms > ",
    now_ms!(),
    " THEN fence ELSE fence + 1 END, owner = excluded.owner, \
     holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
     WHERE kind IS NULL AND ((owner = excluded.owner AND expires_at_ms > ",
    now_ms!(),
    ") OR ((owner IS NULL OR expires_at_ms <= ",
    now_ms!(),
    ") AND NOT EXISTS ",
    queued_ahead!(),
    ")) RETURNING fence"
);

/// Frees the key if owner and fence match, keeping the time it was freed
/// in `expires_at_ms` (where the idle window counts from, see sweep.rs);
/// or, if a live waiter is queued, hands it over to the head in the same
/// statement (the next fence, the head's label, its claim window: see
/// queue.rs). Returns the fence, the new owner (NULL: freed) and the
/// ticket of the head's entry (read as the row is updated, before the
/// trigger that deletes the entry runs). Parameters: key, owner, fence.
pub(super) const RELEASE: &str = concat!(
    "UPDATE leasehold_locks SET owner = (SELECT q.owner",
    queue_head!(),
    "), holder = (SELECT q.holder",
    queue_head!(),
    "), fence = fence + EXISTS (SELECT 1",
    queue_head!(),
    "), expires_at_ms = coalesce(",
    now_ms!(),
    " + (SELECT q.claim_ms",
    queue_head!(),
    "), min(expires_at_ms, ",
    now_ms!(),
    ")) WHERE key = ?1 AND owner = ?2 AND fence = ?3 RETURNING fence, owner, \
     (SELECT q.ticket FROM leasehold_queue AS q WHERE q.key = ?1 AND q.owner = leasehold_locks.owner)"
);

/// Why ACQUIRE granted nothing: the key's kind (not NULL: another kind
/// than a mutex), its holder and time left in ms.
pub(super) const BUSY_INFO: &str = concat!(
    "SELECT kind, holder, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_locks WHERE key = ?1"
);

pub(super) const RENEW: &str = concat!(
    "UPDATE leasehold_locks SET expires_at_ms = ",
    now_ms!(),
    " + ?4 WHERE key = ?1 AND owner = ?2 AND fence = ?3 AND expires_at_ms > ",
    now_ms!()
);

pub(super) const INSPECT: &str = concat!(
    "SELECT key, owner, holder, fence, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_locks WHERE key = ?1 AND owner IS NOT NULL AND expires_at_ms > ",
    now_ms!()
);

pub(super) const LIST: &str = concat!(
    "SELECT key, owner, holder, fence, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_locks WHERE substr(key, 1, length(?1)) = ?1 \
     AND owner IS NOT NULL AND expires_at_ms > ",
    now_ms!(),
    " ORDER BY key"
);

/// Key ?1's kind, and whether a mutex holder is live.
pub(super) const WAS_LIVE: &str = concat!(
    "SELECT kind, owner IS NOT NULL AND expires_at_ms > ",
    now_ms!(),
    " FROM leasehold_locks WHERE key = ?1"
);

/// Frees key ?1 whoever holds it and bumps its fence. The row keeps the
/// time its holder left in `expires_at_ms`, as a release does, so the sweep
/// counts its idle window from then (NULL would read as idle since the
/// epoch, and the row would go at the next pass).
pub(super) const FORCE_RELEASE: &str = concat!(
    "UPDATE leasehold_locks SET owner = NULL, holder = NULL, expires_at_ms = min(coalesce(expires_at_ms, ",
    now_ms!(),
    "), ",
    now_ms!(),
    "), fence = fence + 1 WHERE key = ?1"
);

/// A row of INSPECT or LIST, every field checked: a column of the wrong
/// type (SQLite does not enforce them) is a corrupt record too.
pub(super) fn info_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<LeaseInfo> {
    let key: String = row
        .try_get(0)
        .map_err(|e| RecordDecoder::new(STORE, "?").corrupt(format!("unreadable key: {e}")))?;
    let record = RecordDecoder::new(STORE, &key);
    let wrong_type = |e: sqlx::Error| record.corrupt(e.to_string());
    record.lease_info(
        &row.try_get::<String, _>(1).map_err(wrong_type)?,
        row.try_get(2).map_err(wrong_type)?,
        row.try_get(3).map_err(wrong_type)?,
        row.try_get(4).map_err(wrong_type)?,
    )
}
