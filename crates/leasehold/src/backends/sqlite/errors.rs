//! How SQLite's failures and refusals read: a transient error (busy,
//! locked, I/O, pool) is retryable, and a key held or a database write-locked
//! for the whole wait is a busy answer.

use std::time::Duration;

use super::STORE;
use crate::backend::{millis_to_duration, Acquire, Busy};
use crate::error::Error;

/// SQLITE_BUSY or SQLITE_LOCKED, with any extended code.
pub(super) fn is_locked(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6)),
        _ => false,
    }
}

/// Transient failures (busy, locked, I/O, pool exhaustion) are retryable;
/// everything else is a permanent store error.
pub(crate) fn classify(e: sqlx::Error) -> Error {
    use sqlx::Error as E;
    let transient = match &e {
        E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
        // SQLITE_BUSY (5), SQLITE_LOCKED (6), SQLITE_CANTOPEN (14) and their
        // extended codes (low byte).
        E::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6 | 14)),
        _ => false,
    };
    Error::from_store(STORE, transient, e)
}

/// The holder reported when another connection kept the database's write
/// lock for the whole wait (SQLite does not say whose, nor for how long).
const WRITE_LOCKED_HOLDER: &str = "another transaction (database locked)";

/// The answer when another connection kept the write lock for the whole
/// wait: the key cannot be taken now, so it is busy.
pub(super) fn write_locked() -> Acquire {
    Acquire::Busy(Busy {
        holder: WRITE_LOCKED_HOLDER.to_owned(),
        remaining: Duration::ZERO,
    })
}

/// The answer for a held key: the holder that expires first and its time
/// left in ms, as the statements read them (none if it left meanwhile:
/// zero remaining, so the waiter retries at once).
pub(super) fn busy(holder: Option<String>, remaining: Option<i64>) -> Acquire {
    Acquire::Busy(Busy {
        holder: holder.unwrap_or_default(),
        remaining: millis_to_duration(remaining.unwrap_or(0)),
    })
}
