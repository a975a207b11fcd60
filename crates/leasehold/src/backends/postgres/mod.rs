//! The PostgreSQL store (`postgres://`, `postgresql://`; feature `postgres`).
//!
//! One lease table, one row per key (the fence lives in it; deleted once
//! idle, see `sweep.rs`), and beside it the permits', rw locks' and fair
//! waiters' tables (`semaphore.rs`, `queue.rs`).
//! Session advisory locks are not used: they pin a connection per held lock
//! and break behind PgBouncer in transaction mode. Every operation is one
//! statement, so the store needs no session state and works through any
//! pooler; expiry is decided by the server's `clock_timestamp()`.
//! Needs PostgreSQL 11 or later.
//!
//! **Migration.** On connect the backend runs [`PostgresBackend::migration_sql`]
//! (and the tables beside it: [`PostgresBackend::queue_migration_sql`] and
//! the others; `CREATE TABLE IF NOT EXISTS ...`, serialized by a transaction-scoped
//! advisory lock so concurrent first starts do not race). Turn it off with
//! [`PostgresOptions::with_migrate`] and run that SQL yourself if the
//! application's role may not create tables.
//!
//! **Waiting.** Releases `pg_notify` on the channel [`CHANNEL`] in the same
//! statement. At the default settings one connection per URL per process
//! `LISTEN`s and carries the lock statements, shared by every backend (and
//! so every [`Locks`](crate::Locks)) connected to that URL. It needs a
//! session: behind PgBouncer in transaction mode, point `LISTEN` at the
//! server directly with [`PostgresOptions::with_listen_url`].
//!
//! **Connection budget.** At the defaults a process holds 1 connection per
//! URL (none once idle: no statement for `idle_timeout` and nobody
//! waiting). A statement on it waits at most 50 ms for a row another
//! transaction locks (acquire, renew; an acquire then answers busy) or 1 s
//! (release, force-release), since the others queue behind it.
//! [`max_connections`](PostgresOptions::with_max_connections) above 1, a
//! listen URL, a transaction pooler or [`from_pool`](PostgresBackend::from_pool)
//! give the lock statements a pool and the listener a connection beside it
//! (N + 1). When the server refuses a connection (`too many clients`), an
//! operation fails with a retryable [`Error::Unavailable`] naming it
//! within about a quarter of a second; the process then asks the server at
//! most once a second, and the listener retries with a backoff of up to
//! 30 s while waiters poll.
//!
//! **Behind a transaction-mode pooler** (PgBouncer `pool_mode =
//! transaction`): say so with `?pooler=transaction` in the URL (or
//! [`PostgresOptions::with_pooler`]). Statements then go unprepared, one
//! message each (see [`Pooler`]); `LISTEN` runs only on a
//! `?listen_url=postgres://...` connection past the pooler, and without one
//! waiters poll at the holder's remaining ttl (with a warning, once).
//! Errors only a pooler causes say so and name the setting to change.
//!
//! **Same-transaction check.** [`PostgresBackend::check_in`] verifies, inside
//! your transaction, that a lease is still held, and keeps it from being
//! taken over until that transaction ends.

mod checkout;
mod connect;
mod errors;
mod exec;
mod listen;
mod names;
mod options;
mod pooler;
mod queue;
mod semaphore;
mod session;
mod sql;
mod store_url;
mod sweep;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool, PgQueryResult, PgRow};
use sqlx::{FromRow, Row};

use crate::backend::renew_attempt_timeout;
use crate::backend::{
    duration_to_millis, listing, millis_to_duration, token_to_i64, Acquire, AcquireRequest,
    Backend, BoxFuture, Busy, HandOff, KeyKind, Lease, LeaseInfo, OwnerId, RecordDecoder, RwSide,
    Subscription,
};
use crate::error::{Error, Result};
use crate::key::Key;
use checkout::Checkout;
pub(crate) use errors::classify;
pub use errors::is_transient_pg_error;
use errors::{is_lock_not_available, row_locked};
use exec::Param;
use listen::Listener;
pub use listen::WAKEUP_TARGET;
pub use names::{CHANNEL, DEFAULT_TABLE};
pub use options::{PostgresOptions, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use pooler::Pooler;
use session::{Failed, Session, Statement};
pub use sql::quote_table_name;
use sql::Statements;
pub use store_url::parse_store_url;

/// The name errors carry ([`Error::store`]).
const STORE: &str = "postgres";

/// Lock store in a PostgreSQL table. Clones share the pool and the `LISTEN`
/// connection.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: DataPath,
    sql: Statements,
    pooler: Pooler,
    /// When the next pass over idle rows is due (see `sweep.rs`).
    sweeper: sweep::Sweeper,
    /// Keys whose next release goes to the hand-off statement at once.
    hints: queue::HandOffHints,
}

/// Where the lock statements go, and how waiters hear of releases.
#[derive(Debug)]
enum DataPath {
    /// The default (one data connection, no pooler, no listen URL): the
    /// process's one connection for this URL, which also listens. `pool`
    /// is for the application's own queries and connects only when used.
    Shared { session: Arc<Session>, pool: PgPool },
    /// A pool of the backend's own (or the caller's), with a listener
    /// beside it: for `max_connections > 1`, `from_pool`, a listen URL or
    /// a transaction-mode pooler.
    Pooled {
        data: Checkout,
        listener: Arc<Listener>,
    },
}

impl PostgresBackend {
    /// Deletes now, in one pass, the rows of mutex keys idle longer than
    /// `window` (what the background sweep does after releases, once per
    /// half window); a key that comes back starts its fence at the server's
    /// clock, above every token it had (docs/storage.md). Returns how many
    /// rows it deleted.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a zero
    /// window; store errors otherwise (the rows stay; run it again).
    pub async fn sweep_idle(&self, window: std::time::Duration) -> Result<u64> {
        crate::backend::check_sweep_window(window)?;
        self.inner.sweep(window).await
    }

    /// The pool, for your own queries (fenced writes, [`check_in`](Self::check_in)).
    /// Made by [`connect`](Self::connect) at the default settings it is a
    /// pool of one connection apart from the lock operations (which share
    /// the process's connection), opened only when you use it; with
    /// [`PostgresOptions::with_max_connections`] above 1 it is the pool the
    /// lock operations use, so a transaction you hold on it makes them wait.
    pub fn pool(&self) -> &PgPool {
        match &self.inner.path {
            DataPath::Shared { pool, .. } => pool,
            DataPath::Pooled { data, .. } => data.pool(),
        }
    }

    /// The idempotent `CREATE TABLE IF NOT EXISTS` for this backend's table
    /// (semaphores need [`permits_migration_sql`](Self::permits_migration_sql)
    /// too, reader-writer locks [`rw_migration_sql`](Self::rw_migration_sql)).
    pub fn migration_sql(&self) -> &str {
        &self.inner.sql.migrate
    }

    /// The idempotent `CREATE TABLE IF NOT EXISTS` for the semaphores' table
    /// beside the lease table (`<table>_permits`).
    pub fn permits_migration_sql(&self) -> &str {
        &self.inner.sql.permits.migrate
    }

    /// The idempotent `CREATE TABLE IF NOT EXISTS` for the queue of waiters'
    /// table beside the lease table (`<table>_queue`, docs/fairness.md):
    /// every acquire and release reads it, so every store needs it.
    pub fn queue_migration_sql(&self) -> &str {
        &self.inner.sql.queue.migrate
    }

    /// The idempotent `CREATE TABLE IF NOT EXISTS` for the reader-writer
    /// locks' table beside the lease table (`<table>_rw`).
    pub fn rw_migration_sql(&self) -> &str {
        &self.inner.sql.rw.migrate
    }

    /// Inside the caller's transaction, checks that `lease` still holds its
    /// key (owner, token, and expiry by the server's clock) and locks the
    /// lease row `FOR SHARE`: until the transaction ends, nobody can acquire,
    /// force-release, renew or release the key, so a write made in the same
    /// transaction commits only while the lease is held.
    ///
    /// Keep the transaction short: the holder's own renewal waits for it
    /// too. Do not release the guard before committing (that would wait for
    /// this very transaction).
    ///
    /// ```no_run
    /// use leasehold::backends::postgres::PostgresBackend;
    /// use leasehold::{sqlx, LeaseGuard};
    ///
    /// // A `sqlx::Error` converts into `leasehold::Error`, so `?` works on
    /// // both; in your own error type, match a lost lease with
    /// // `Error::is_lease_lost()`.
    /// async fn debit(backend: &PostgresBackend, guard: &LeaseGuard) -> leasehold::Result<()> {
    ///     let mut tx = backend.pool().begin().await?;
    ///     backend.check_in(&mut tx, guard.lease()).await?; // Err(LeaseLost): tx rolls back on drop
    ///     sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     tx.commit().await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// `examples/postgres_fenced_write.rs` runs this against a stale holder.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease expired, was released, broken or
    /// taken over: roll back. Store errors as usual (a serialization failure
    /// in a REPEATABLE READ or SERIALIZABLE transaction is
    /// [`Error::Unavailable`]).
    ///
    /// # Cancel safety
    /// Cancel safe, but the transaction may then hold the row lock: roll it
    /// back.
    pub async fn check_in(&self, conn: &mut PgConnection, lease: &Lease) -> Result<()> {
        let owner = lease.owner().to_string();
        let params = [
            Param::Text(lease.key().as_str()),
            Param::Text(&owner),
            Param::Int(token_as_i64(lease)?),
        ];
        // The check matches the key's one row or none.
        let held = exec::fetch_all(conn, self.inner.pooler, &self.inner.sql.check, &params)
            .await
            .map_err(classify)?;
        if held.is_empty() {
            return Err(Error::LeaseLost {
                key: lease.key().to_string(),
            });
        }
        Ok(())
    }
}

fn token_as_i64(lease: &Lease) -> Result<i64> {
    token_to_i64(lease.token())
}

/// A row of the inspect or list statement (key, owner, holder, fence,
/// remaining ms), every field checked.
fn info_from_row(row: &PgRow) -> Result<LeaseInfo> {
    let key: String = row.try_get(0).map_err(classify)?;
    let record = RecordDecoder::new(STORE, &key);
    record.lease_info(
        &row.try_get::<String, _>(1).map_err(classify)?,
        row.try_get(2).map_err(classify)?,
        row.try_get(3).map_err(classify)?,
        row.try_get(4).map_err(classify)?,
    )
}

impl Inner {
    /// Runs one of the store's statements and returns its rows.
    async fn fetch_all(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<PgRow>, Failed> {
        match &self.path {
            DataPath::Shared { session, .. } => {
                session.fetch_all(Statement::new(sql, params)).await
            }
            DataPath::Pooled { data, .. } => {
                let mut conn = data.get().await.map_err(Failed::Store)?;
                exec::fetch_all(&mut conn, self.pooler, sql, params)
                    .await
                    .map_err(Failed::Sql)
            }
        }
    }

    /// Runs one of the store's statements, at most one row, and returns it.
    async fn fetch_optional(&self, sql: &str, params: &[Param<'_>]) -> Result<Option<PgRow>> {
        let rows = self
            .fetch_all(sql, params)
            .await
            .map_err(Failed::into_error)?;
        Ok(rows.into_iter().next())
    }

    /// Runs one of the store's statements and returns what it changed.
    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<PgQueryResult> {
        match &self.path {
            DataPath::Shared { session, .. } => session
                .execute(Statement::new(sql, params))
                .await
                .map_err(Failed::into_error),
            DataPath::Pooled { data, .. } => {
                let mut conn = data.get().await?;
                exec::execute(&mut conn, self.pooler, sql, params)
                    .await
                    .map_err(classify)
            }
        }
    }

    /// How long a statement may wait for a row another transaction holds,
    /// when the caller would wait `wanted`: on the shared connection
    /// everything queued behind the statement waits too (session.rs).
    fn row_lock_wait(&self, wanted: Duration) -> Duration {
        match &self.path {
            DataPath::Shared { .. } => wanted.min(session::ROW_LOCK_WAIT),
            DataPath::Pooled { .. } => wanted,
        }
    }

    fn wake_local(&self, key: &Key) {
        match &self.path {
            DataPath::Shared { session, .. } => session.wake_local(key),
            DataPath::Pooled { listener, .. } => listener.wake_local(key),
        }
    }

    /// Tells this process's waiter registered as `owner` (if it is here)
    /// of `key` handed over to it, before the server's notification.
    fn hand_over_local(&self, key: &Key, owner: OwnerId, grant: HandOff) {
        match &self.path {
            DataPath::Shared { session, .. } => session.hand_over_local(key, owner, grant),
            DataPath::Pooled { listener, .. } => listener.hand_over_local(key, owner, grant),
        }
    }

    /// The release of `key`'s grant to `owner` with `fence`: frees the
    /// key, or hands it to the head of its queue (sql.rs). A key with no
    /// live waiter queued is freed by the plain statement; one with a
    /// queue (or not held any more) takes a second, which hands over. A
    /// key whose last release here handed over skips the plain statement
    /// (queue.rs, `HandOffHints`).
    async fn release_mutex(self: &Arc<Self>, key: &Key, owner: &str, fence: i64) -> Result<()> {
        let params = [
            Param::Text(key.as_str()),
            Param::Text(owner),
            Param::Int(fence),
        ];
        if !self.hints.expects_queue(key.as_str()) {
            let freed = self
                .fetch_all(&self.sql.release, &params)
                .await
                .map_err(Failed::into_error)?;
            if !freed.is_empty() {
                self.wake_local(key);
                // A row may have just gone idle: time for a pass, perhaps.
                self.poke_sweeper();
                return Ok(());
            }
        }
        let rows = self
            .fetch_all(&self.sql.release_handing, &params)
            .await
            .map_err(Failed::into_error)?;
        // No row: the lease was gone, nothing freed or handed over.
        let Some(row) = rows.first() else {
            self.hints.note(key.as_str(), false);
            return Ok(());
        };
        let head: Option<String> = row.try_get(0).map_err(classify)?;
        self.hints.note(key.as_str(), head.is_some());
        match head {
            None => {
                self.wake_local(key);
                // A row may have just gone idle: time for a pass, perhaps.
                self.poke_sweeper();
            }
            Some(head) => {
                let record = RecordDecoder::new(STORE, key.as_str());
                let fence: i64 = row.try_get(1).map_err(classify)?;
                let ticket: Option<i64> = row.try_get(2).map_err(classify)?;
                let (head, grant) = record.hand_off(&head, fence, ticket)?;
                self.hand_over_local(key, head, grant);
            }
        }
        Ok(())
    }

    async fn subscribe(&self, key: &Key) -> Subscription {
        match &self.path {
            DataPath::Shared { session, .. } => session.subscribe(key).await,
            DataPath::Pooled { listener, .. } => listener.subscribe(key).await,
        }
    }
}

impl Backend for PostgresBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            if req.permit_kind().is_some() {
                return self.inner.acquire_permit(req).await;
            }
            // A waiter's later attempts go straight to the queued attempt
            // (queue.rs), which grants a free key to its head too.
            if req.queue_ticket().is_some_and(|ticket| ticket > 0) {
                if let Some(answer) = self.inner.queued_attempt(req).await? {
                    return Ok(answer);
                }
            }
            let owner = req.owner().to_string();
            let lock_wait = self.inner.row_lock_wait(req.lock_wait());
            let lock_wait = duration_to_millis(lock_wait).to_string();
            let params = [
                Param::Text(req.key().as_str()),
                Param::Text(&owner),
                Param::Text(req.holder()),
                Param::Int(duration_to_millis(req.ttl())),
                Param::Text(&lock_wait),
            ];
            let rows = match self.inner.fetch_all(&self.inner.sql.acquire, &params).await {
                Ok(rows) => rows,
                // Another transaction kept the row locked for the whole
                // wait: the key is not free to take, so it is busy.
                Err(Failed::Sql(e)) if is_lock_not_available(&e) => return Ok(row_locked()),
                Err(e) => return Err(e.into_error()),
            };
            let row = rows
                .first()
                .map(<(Option<i64>, Option<String>, Option<i64>, Option<String>)>::from_row)
                .transpose()
                .map_err(classify)?;
            let record = RecordDecoder::new(STORE, req.key().as_str());
            Ok(match row {
                Some((Some(fence), _, _, _)) => Acquire::Granted(req.granted(record.token(fence)?)),
                Some((None, _, _, Some(kind))) => Acquire::OtherKind(decode_kind(&record, &kind)?),
                Some((None, holder, remaining, None)) => {
                    // Refused while free: waiters are queued ahead (or the
                    // key was taken after this statement's snapshot). The
                    // queued attempt hands it to the head, and enters a
                    // request that queues.
                    let free = holder.is_none() || remaining.is_none_or(|ms| ms <= 0);
                    if free || req.queue_entry_ttl().is_some() {
                        if let Some(answer) = self.inner.queued_attempt(req).await? {
                            return Ok(answer);
                        }
                    }
                    Acquire::Busy(Busy {
                        holder: holder.unwrap_or_default(),
                        remaining: millis_to_duration(remaining.unwrap_or(0)),
                    })
                }
                // Taken by a transaction that committed after this
                // statement's snapshot: busy, retry at once.
                None => Acquire::Busy(Busy {
                    holder: String::new(),
                    remaining: Duration::ZERO,
                }),
            })
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                return self.inner.renew_permit(lease, ttl).await;
            }
            let owner = lease.owner().to_string();
            // The row-lock wait of one renewal attempt (sql.rs).
            let lock_wait = self.inner.row_lock_wait(renew_attempt_timeout(ttl));
            let lock_wait = duration_to_millis(lock_wait).to_string();
            let params = [
                Param::Text(lease.key().as_str()),
                Param::Text(&owner),
                Param::Int(token_as_i64(lease)?),
                Param::Int(duration_to_millis(ttl)),
                Param::Text(&lock_wait),
            ];
            let done = self.inner.execute(&self.inner.sql.renew, &params).await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                if self.inner.release_permit(lease).await? {
                    // The key may have just gone idle.
                    self.inner.poke_sweeper();
                }
                return Ok(());
            }
            let owner = lease.owner().to_string();
            self.inner
                .release_mutex(lease.key(), &owner, token_as_i64(lease)?)
                .await
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let row = self
                .inner
                .fetch_optional(&self.inner.sql.inspect, &[Param::Text(key.as_str())])
                .await?;
            row.as_ref().map(info_from_row).transpose()
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            let rows = self
                .inner
                .fetch_all(&self.inner.sql.list, &[Param::Text(prefix)])
                .await
                .map_err(Failed::into_error)?;
            let mutexes = rows.iter().map(info_from_row).collect::<Result<_>>()?;
            Ok(listing(mutexes, self.inner.list_permits(prefix).await?))
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let row = self
                .inner
                .fetch_optional(&self.inner.sql.force_release, &[Param::Text(key.as_str())])
                .await?;
            let Some(row) = row else { return Ok(false) };
            let kind: Option<String> = row.try_get(2).map_err(classify)?;
            let was_live = match kind {
                // One key is one lock: a reader-writer lock's or a
                // semaphore's key is broken in its permits' table (its
                // kind is never set back, so a second statement is safe).
                Some(kind) => {
                    let record = RecordDecoder::new(STORE, key.as_str());
                    let rw = match decode_kind(&record, &kind)? {
                        KeyKind::ReaderWriter => Some(RwSide::Write),
                        _ => None,
                    };
                    self.inner.force_release_permits(key, rw).await?
                }
                None => row.try_get::<bool, _>(0).map_err(classify)?,
            };
            self.inner.wake_local(key);
            Ok(was_live)
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move { Ok(self.inner.subscribe(key).await) })
    }

    fn queues(&self) -> bool {
        true
    }

    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.inner.leave_queue(key, owner))
    }

    /// `pg_notify` on the channel releases use; this process's observers
    /// are woken directly.
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.inner
                .fetch_optional(&self.inner.sql.announce, &[Param::Text(key.as_str())])
                .await?;
            self.inner.wake_local(key);
            Ok(true)
        })
    }
}

/// A stored kind read back ([`KeyKind::from_stored`]); one no version of
/// the library writes is a damaged record.
fn decode_kind(record: &RecordDecoder<'_>, stored: &str) -> Result<KeyKind> {
    KeyKind::from_stored(Some(stored))
        .ok_or_else(|| record.corrupt(format!("unknown kind {stored:?}")))
}
