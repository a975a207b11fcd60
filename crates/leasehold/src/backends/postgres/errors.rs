//! How PostgreSQL's failures read: transient ones (connection, pool,
//! serialization, lock timeout, restart, failover) are retryable, a
//! pooler's own mistakes name the setting to change, and a row another
//! transaction kept locked for the whole wait is a busy answer.

use std::time::Duration;

use super::{pooler, STORE};
use crate::backend::{Acquire, Busy};
use crate::error::Error;

/// Whether retrying may fix `e`: connection failures, pool timeouts,
/// serialization failures (40001), deadlocks (40P01), lock timeouts (55P03),
/// server shutdown or restart (57P01..57P03), cancelled statements (57014,
/// e.g. `statement_timeout`), too many connections (53300), and a read-only
/// server after a failover (25006).
pub fn is_transient_pg_error(e: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match e {
        E::Io(_) | E::PoolTimedOut | E::WorkerCrashed => true,
        E::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(
                    &*code,
                    "40001"
                        | "40P01"
                        | "55P03"
                        | "57P01"
                        | "57P02"
                        | "57P03"
                        | "57014"
                        | "53300"
                        | "25006"
                )
        }),
        _ => false,
    }
}

/// The holder reported when another transaction kept the lease row locked
/// for the whole wait (PostgreSQL does not say which, nor for how long).
const ROW_LOCKED_HOLDER: &str = "another transaction (row locked)";

/// SQLSTATE 55P03: `lock_timeout` passed (or `NOWAIT` found a lock).
/// The answer when another transaction kept the key's row locked for the
/// whole wait: the key is not free to take, so it is busy.
pub(super) fn row_locked() -> Acquire {
    Acquire::Busy(Busy {
        holder: ROW_LOCKED_HOLDER.to_owned(),
        remaining: Duration::ZERO,
    })
}

pub(super) fn is_lock_not_available(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "55P03")
}

/// Errors only a connection pooler causes become [`Error::Backend`] saying
/// so and naming the setting to change; transient failures (and a closed
/// pool) [`Error::Unavailable`]; everything else [`Error::Backend`].
pub(crate) fn classify(e: sqlx::Error) -> Error {
    let e = match pooler::explain(e) {
        Ok(explained) => return Error::backend(explained).in_store(STORE),
        Err(e) => e,
    };
    let transient = is_transient_pg_error(&e) || matches!(e, sqlx::Error::PoolClosed);
    Error::from_store(STORE, transient, e)
}
