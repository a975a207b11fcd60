//! Concurrency control for your own rows in PostgreSQL (feature `postgres`):
//! pessimistic row locks and optimistic retries.
//!
//! Behind a transaction-mode pooler (PgBouncer `pool_mode = transaction`)
//! both work, as everything they do stays inside one transaction: set
//! [`RowLockOptions::with_pooler`], and mark your own queries in `work`
//! `.persistent(false)` (see docs/postgres.md, "Behind a pooler").
//!
//! Both are shown on the inventory example: `products(id BIGINT PRIMARY
//! KEY, stock INT, version BIGINT)`, and many processes selling the last
//! items without overselling.
//!
//! **Pessimistic** ([`with_locked_rows`]): lock the rows first, then read and
//! write them in the same transaction.
//!
//! ```no_run
//! use leasehold::rowlock::{with_locked_rows, LockMode, RowLockOptions};
//! use sqlx::Row;
//! # async fn demo(pool: sqlx::PgPool) -> leasehold::Result<()> {
//! let options = RowLockOptions::new()
//!     .with_mode(LockMode::NoWait) // or Wait (optionally with_lock_timeout), SkipLocked
//!     .with_label("products:42");
//! let sold = with_locked_rows(
//!     &pool,
//!     &options,
//!     "SELECT stock FROM products WHERE id = $1",
//!     |q| q.bind(42_i64),
//!     |tx, rows| Box::pin(async move {
//!         let stock: i32 = match rows.first() { Some(r) => r.try_get(0)?, None => return Ok(false) };
//!         if stock == 0 { return Ok(false); }
//!         sqlx::query("UPDATE products SET stock = stock - 1 WHERE id = $1")
//!             .bind(42_i64).execute(&mut *tx).await?;
//!         Ok(true)
//!     }),
//! )
//! .await?; // Err(Error::Busy { .. }) if another transaction holds the row (NOWAIT)
//! # let _ = sold; Ok(()) }
//! ```
//!
//! **Optimistic** ([`retry_transaction`]): read the version, write
//! `... WHERE id = $1 AND version = $2`, and report a conflict when that
//! matched no row; the loop retries with bounded, jittered backoff (the
//! core's [`occ`](crate::occ)), and also retries serialization failures and
//! deadlocks ([`is_transient_pg_error`]).
//!
//! ```no_run
//! use leasehold::occ::{Attempt, RetryPolicy};
//! use leasehold::rowlock::{retry_transaction, Isolation};
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let done = retry_transaction(&pool, &RetryPolicy::default(), Isolation::ReadCommitted, |tx, _attempt| {
//!     Box::pin(async move {
//!         let (stock, version): (i32, i64) =
//!             sqlx::query_as("SELECT stock, version FROM products WHERE id = $1")
//!                 .bind(42_i64).fetch_one(&mut *tx).await?;
//!         if stock == 0 { return Ok(Attempt::Committed(false)); }
//!         let updated = sqlx::query(
//!             "UPDATE products SET stock = stock - 1, version = version + 1 WHERE id = $1 AND version = $2")
//!             .bind(42_i64).bind(version).execute(&mut *tx).await?;
//!         Ok(if updated.rows_affected() == 0 { Attempt::Conflict } else { Attempt::Committed(true) })
//!     })
//! })
//! .await?;
//! println!("sold: {}, after {} attempt(s)", done.value, done.attempts);
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnection, PgPool, PgRow, Postgres};
use sqlx::query::Query;
use sqlx::Executor;

use crate::backend::BoxFuture;
pub use crate::backends::postgres::is_transient_pg_error;
use crate::backends::postgres::{classify, Pooler};
use crate::error::{Error, Result};
use crate::occ::{retry_optimistic_with, Attempt, Committed, RetryError, RetryPolicy};

/// How [`with_locked_rows`] treats rows another transaction has locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LockMode {
    /// `FOR UPDATE`: wait for them (bounded by the lock timeout, if set).
    #[default]
    Wait,
    /// `FOR UPDATE NOWAIT`: fail at once with [`Error::Busy`].
    NoWait,
    /// `FOR UPDATE SKIP LOCKED`: leave them out of the result (job queues).
    SkipLocked,
}

impl LockMode {
    fn clause(self) -> &'static str {
        match self {
            LockMode::Wait => " FOR UPDATE",
            LockMode::NoWait => " FOR UPDATE NOWAIT",
            LockMode::SkipLocked => " FOR UPDATE SKIP LOCKED",
        }
    }
}

/// How [`with_locked_rows`] locks.
#[derive(Debug, Clone)]
pub struct RowLockOptions {
    mode: LockMode,
    lock_timeout: Option<Duration>,
    label: String,
    pooler: Pooler,
}

impl Default for RowLockOptions {
    fn default() -> Self {
        RowLockOptions {
            mode: LockMode::Wait,
            lock_timeout: None,
            label: "rows".to_owned(),
            pooler: Pooler::None,
        }
    }
}

impl RowLockOptions {
    /// Defaults: wait for locked rows, no lock timeout, label `rows`.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// What to do about rows locked by another transaction.
        with_mode(mode: LockMode) => mode = mode;

        /// `SET LOCAL lock_timeout` for the whole transaction: waiting longer for
        /// any lock fails with [`Error::Busy`]. At least 1 ms (checked on use).
        with_lock_timeout(timeout: Duration) => lock_timeout = Some(timeout);

        /// Names the locked rows in [`Error::Busy`] (its `key` field).
        with_label(label: &str) => label = label.to_owned();

        /// [`Pooler::Transaction`] when `pool` goes through a transaction-mode
        /// pooler: the locking `SELECT` is then sent as an unnamed statement
        /// (safe inside the transaction, which keeps its server connection)
        /// instead of a named one that would stay on the server connection.
        /// Queries in `work` are yours: mark them `.persistent(false)` too.
        with_pooler(pooler: Pooler) => pooler = pooler;
    }
}

/// Runs `select` with the mode's locking clause appended
/// (`FOR UPDATE [NOWAIT | SKIP LOCKED]`) in a new transaction, hands the
/// locked rows and the transaction's connection to `work`, and commits if it
/// returns `Ok` (rolls back on `Err`).
///
/// `select` is a `SELECT` (or `WITH ... SELECT`) without a locking clause or
/// trailing `;`; `bind` binds its parameters.
///
/// # Errors
/// [`Error::InvalidInput`] (before any I/O) for an empty or malformed
/// `select` or a lock timeout under 1 ms. [`Error::Busy`] (holder
/// `another transaction`, remaining zero: PostgreSQL does not say how long)
/// when a row is locked in `NoWait` mode or the lock timeout passed
/// (SQLSTATE 55P03), whether in the `SELECT` or in `work`. Other database
/// errors, from the locking or from `work`, as [`Error::Unavailable`] if
/// transient, else [`Error::Backend`].
///
/// # Cancel safety
/// Cancel safe: a dropped future rolls the transaction back.
pub async fn with_locked_rows<T, B, F>(
    pool: &PgPool,
    options: &RowLockOptions,
    select: &str,
    bind: B,
    work: F,
) -> Result<T>
where
    B: for<'q> FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments>,
    F: for<'c> FnOnce(&'c mut PgConnection, Vec<PgRow>) -> BoxFuture<'c, Result<T, sqlx::Error>>,
{
    let sql = locking_select(select, options.mode)?;
    let timeout = options.lock_timeout.map(timeout_setting).transpose()?;
    let busy = |e: sqlx::Error| lock_error(e, &options.label);
    let mut tx = pool.begin().await.map_err(busy)?;
    if let Some(timeout) = timeout {
        // Transaction-local, and unprepared (the value is a number we
        // formatted): nothing outlives the transaction, behind any pooler.
        (&mut *tx)
            .execute(format!("SET LOCAL lock_timeout = '{timeout}'").as_str())
            .await
            .map_err(busy)?;
    }
    let select = sqlx::query(&sql).persistent(options.pooler != Pooler::Transaction);
    let rows = bind(select).fetch_all(&mut *tx).await.map_err(busy)?;
    let value = work(&mut tx, rows).await.map_err(busy)?;
    tx.commit().await.map_err(busy)?;
    Ok(value)
}

fn locking_select(select: &str, mode: LockMode) -> Result<String> {
    let trimmed = select.trim();
    let lower = trimmed.to_ascii_lowercase();
    let problem = if trimmed.is_empty() {
        "must not be empty"
    } else if !(lower.starts_with("select") || lower.starts_with("with")) {
        "must be a SELECT (or WITH ... SELECT)"
    } else if trimmed.ends_with(';') {
        "must not end with ';': the locking clause is appended"
    } else if lower.contains(" for update") || lower.contains(" for share") {
        "must not have a locking clause of its own: the mode adds it"
    } else {
        return Ok(format!("{trimmed}{}", mode.clause()));
    };
    Err(Error::invalid("select", problem))
}

fn timeout_setting(timeout: Duration) -> Result<String> {
    let ms = timeout.as_millis();
    if ms == 0 {
        // lock_timeout = 0 would mean "wait forever" to PostgreSQL.
        return Err(Error::invalid(
            "lock_timeout",
            format!("must be at least 1ms, got {timeout:?}"),
        ));
    }
    Ok(format!("{ms}ms"))
}

/// Lock-not-available (55P03: NOWAIT, lock timeout) becomes [`Error::Busy`].
fn lock_error(e: sqlx::Error, label: &str) -> Error {
    let lock_not_available = e
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "55P03");
    if lock_not_available {
        Error::Busy {
            key: label.to_owned(),
            holder: "another transaction".to_owned(),
            remaining: Duration::ZERO,
            kind: crate::error::LockKind::Mutex,
        }
    } else {
        classify(e)
    }
}

/// The isolation level of each [`retry_transaction`] attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Isolation {
    /// PostgreSQL's default; enough for a version-checked update.
    #[default]
    ReadCommitted,
    /// One snapshot per attempt; concurrent updates fail with 40001.
    RepeatableRead,
    /// Full serializability; anomalies fail with 40001 and are retried.
    Serializable,
}

impl Isolation {
    fn begin(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Isolation::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// Runs `work(tx, attempt)` in a transaction at `isolation`, attempt 1, 2,
/// ... up to the policy's bound: [`Attempt::Committed`] commits and returns,
/// [`Attempt::Conflict`] (e.g. a versioned update matched 0 rows) rolls back
/// and retries after a jittered backoff, and so does a transient error
/// ([`is_transient_pg_error`]: 40001 serialization failure, 40P01 deadlock,
/// a dropped connection), including one raised by the commit.
///
/// The returned [`Committed::attempts`] (or the error's `attempts`) tells how
/// many transactions it took.
///
/// # Errors
/// [`RetryError::Exhausted`] when every attempt conflicted;
/// [`RetryError::Failed`] with the first permanent error, or a transient
/// error on the last attempt.
///
/// # Cancel safety
/// Cancel safe: the open attempt's transaction is rolled back; earlier
/// attempts were rolled back already.
pub async fn retry_transaction<T, F>(
    pool: &PgPool,
    policy: &RetryPolicy,
    isolation: Isolation,
    work: F,
) -> std::result::Result<Committed<T>, RetryError<sqlx::Error>>
where
    F: for<'c> FnMut(&'c mut PgConnection, u32) -> BoxFuture<'c, Result<Attempt<T>, sqlx::Error>>,
{
    // Each attempt's future borrows `work`; a lock lets it do so mutably
    // from the `FnMut` the core loop takes.
    let work = tokio::sync::Mutex::new(work);
    let work = &work;
    retry_optimistic_with(policy, is_transient_pg_error, |n| async move {
        let mut work = work.lock().await;
        let mut tx = pool.begin_with(isolation.begin()).await?;
        match (*work)(&mut tx, n).await? {
            Attempt::Committed(value) => {
                tx.commit().await?;
                Ok(Attempt::Committed(value))
            }
            Attempt::Conflict => {
                tx.rollback().await?;
                Ok(Attempt::Conflict)
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_are_checked_before_io() {
        assert_eq!(
            locking_select(" SELECT 1 ", LockMode::SkipLocked).unwrap(),
            "SELECT 1 FOR UPDATE SKIP LOCKED"
        );
        assert!(locking_select("with x as (select 1) select * from x", LockMode::Wait).is_ok());
        for (bad, why) in [
            ("", "empty"),
            ("UPDATE t SET a = 1", "must be a SELECT"),
            ("SELECT 1;", "';'"),
            ("SELECT * FROM t FOR UPDATE", "locking clause"),
        ] {
            let e = locking_select(bad, LockMode::Wait).unwrap_err().to_string();
            assert!(e.starts_with("invalid select: ") && e.contains(why), "{e}");
        }
        assert!(timeout_setting(Duration::from_micros(999)).is_err());
        assert_eq!(timeout_setting(Duration::from_secs(1)).unwrap(), "1000ms");
    }
}
