//! `?` on a `sqlx::Error`: the conversion into [`Error`] lives here, with
//! the SQL stores whose rules classify it, so the error type itself names
//! no store.

use crate::error::Error;

/// A SQL error from your own queries, in the function that also calls
/// leasehold (for example around `PostgresBackend::check_in`),
/// classified by the rules the SQL stores use: a transient failure
/// (connection lost, pool timeout, serialization failure, deadlock,
/// SQLite busy) is [`Error::Unavailable`], anything else [`Error::Backend`].
/// So `?` works on both in a function returning [`Result`], and
/// [`Error::is_retryable`] and [`Error::is_lease_lost`] still tell the cases
/// apart.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        #[cfg(feature = "sqlite")]
        if let sqlx::Error::Database(db) = &e {
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                return crate::backends::sqlite::classify(e);
            }
        }
        // PostgreSQL's rules when compiled in; errors that are not a
        // database's own (I/O, pool) are classified alike by both.
        #[cfg(feature = "postgres")]
        return crate::backends::postgres::classify(e);
        #[cfg(not(feature = "postgres"))]
        return crate::backends::sqlite::classify(e);
    }
}
