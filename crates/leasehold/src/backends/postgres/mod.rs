//! The PostgreSQL store (`postgres://`, `postgresql://`; feature `postgres`).
//!
//! One lease table, one row per key, never deleted (the fence lives in it).
//! Session advisory locks are not used: they pin a connection per held lock
//! and break behind PgBouncer in transaction mode. Every operation is one
//! statement, so the store needs no session state and works through any
//! pooler; expiry is decided by the server's `clock_timestamp()`.
//! Needs PostgreSQL 11 or later.
//!
//! **Migration.** On connect the backend runs [`PostgresBackend::migration_sql`]
//! (`CREATE TABLE IF NOT EXISTS ...`, serialized by a transaction-scoped
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
mod exec;
mod listen;
mod options;
mod pooler;
mod semaphore;
mod session;
mod sql;
mod store_url;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgQueryResult, PgRow};
use sqlx::{FromRow, Row};

use crate::backend::{
    duration_to_millis, millis_to_duration, token_to_i64, Acquire, AcquireRequest, Backend,
    BoxFuture, Busy, Lease, LeaseInfo, PermitInfo, RecordDecoder, Subscription,
};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::renewal::renew_attempt_timeout;
use checkout::Checkout;
use exec::Param;
pub use listen::WAKEUP_TARGET;
use listen::{ListenSource, Listener};
pub use options::{PostgresOptions, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use pooler::Pooler;
use session::{Failed, Session, Statement};
use sql::Statements;
pub use sql::{quote_table_name, CHANNEL, DEFAULT_TABLE};
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

/// The listeners of this process, one per listen URL.
static LISTENERS: crate::shared::Registry<Listener> = crate::shared::Registry::new();
/// The shared connections of this process, one per URL and settings.
static SESSIONS: crate::shared::Registry<Session> = crate::shared::Registry::new();

impl PostgresBackend {
    /// Connects to `url` with default [`PostgresOptions`].
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind but an idle pool.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects a new pool to `url` (`postgres://user@host:port/db?...`) and
    /// runs the migration unless disabled. The URL's `pooler` and
    /// `listen_url` options override `options` (see [`parse_store_url`]),
    /// and so do `max_connections=N`, `idle_timeout=5s` and
    /// `acquire_timeout=5s`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for a URL or listen URL sqlx
    /// cannot parse, a bad `pooler` option, a bad table name, a pool of no
    /// connections, or a zero acquire timeout; [`Error::Unavailable`] if no
    /// connection is made within the acquire timeout (server down), naming
    /// the cause such as a refused connection (finding it out takes at most
    /// 2 s more);
    /// [`Error::Backend`] for a refused login, a failed migration, or a
    /// pooler that rejects a startup parameter (the message names the
    /// setting to change).
    ///
    /// # Cancel safety
    /// Cancel safe; the migration is one transaction.
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self> {
        // A listen URL in the store URL's query is redacted with it.
        let listen_url = options.listen_url.clone().unwrap_or_default();
        Self::connect_to(url, options)
            .await
            .map_err(|e| e.without_secrets_of(url).without_secrets_of(&listen_url))
    }

    async fn connect_to(url: &str, options: PostgresOptions) -> Result<Self> {
        let (url, options) = options.split_url_options(url)?;
        let (connect, mut options) = parse_store_url(&url, options)?;
        if options.max_connections == 0 {
            return Err(Error::invalid("max_connections", "must be at least 1"));
        }
        if options.acquire_timeout.is_zero() {
            return Err(Error::invalid("acquire_timeout", "must be more than 0s"));
        }
        if options.max_connections == 1
            && options.pooler != Pooler::Transaction
            && options.listen_url.is_none()
        {
            return Self::shared(&url, connect, options).await;
        }
        // The listener is a connection of its own, not one of the pool's
        // (behind a transaction pooler there is none without a listen URL).
        if options.pooler != Pooler::Transaction {
            options.listen_url.get_or_insert(url);
        }
        let sql = validate(&options, Some(options.max_connections))?;
        let pool = match PgPoolOptions::new()
            .max_connections(options.max_connections)
            .min_connections(0)
            .idle_timeout(Some(options.idle_timeout))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone())
            .await
        {
            Ok(pool) => pool,
            Err(sqlx::Error::PoolTimedOut) => return Err(connect_failure(&connect).await),
            Err(e) => return Err(classify(e)),
        };
        Self::finish(pool, sql, options).await
    }

    /// Uses your own pool, so leases and your data share connections and
    /// [`check_in`](Self::check_in) can run in your transactions. Runs the
    /// migration unless disabled.
    ///
    /// `pool` is a sqlx 0.8 `PgPool`: build it with the re-export
    /// [`leasehold::sqlx`](crate::sqlx), or with your own dependency on
    /// `sqlx = { version = "0.8", features = ["runtime-tokio", "postgres"] }`
    /// (the same major version, so the types match).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for a bad table name, a bad
    /// listen URL, or a pool of fewer than 2 connections without a listen URL
    /// (the listener keeps one); store errors from the migration.
    ///
    /// Behind a transaction-mode pooler, build the pool from
    /// [`parse_store_url`]'s connect options and pass its options here.
    ///
    /// # Cancel safety
    /// Cancel safe; the migration is one transaction.
    pub async fn from_pool(pool: PgPool, options: PostgresOptions) -> Result<Self> {
        let sql = validate(&options, Some(pool.options().get_max_connections()))?;
        Self::finish(pool, sql, options).await
    }

    /// The default set-up: the lock statements and `LISTEN` share the
    /// process's one connection to `url` (see `session.rs`).
    async fn shared(
        url: &str,
        connect: PgConnectOptions,
        options: PostgresOptions,
    ) -> Result<Self> {
        let sql = validate(&options, None)?;
        // Backends with other timeouts get a connection of their own.
        let name = format!(
            "{url} idle_timeout={:?} acquire_timeout={:?}",
            options.idle_timeout, options.acquire_timeout
        );
        let session = SESSIONS.get_or_insert_with(&name, || {
            Session::new(
                connect.clone(),
                options.idle_timeout,
                options.acquire_timeout,
            )
        });
        if options.migrate {
            let lock_name = format!("leasehold migrate {}", options.table);
            let steps = vec![
                Statement::new(
                    "SELECT pg_advisory_xact_lock(hashtext($1))",
                    &[Param::Text(&lock_name)],
                ),
                Statement::new(&sql.migrate, &[]),
                Statement::new(&sql.permits.migrate, &[]),
                Statement::new(&sql.rw.migrate, &[]),
            ];
            session
                .transaction(steps)
                .await
                .map_err(Failed::into_error)?;
        } else {
            session.connect().await.map_err(Failed::into_error)?;
        }
        // For the application's own queries (`pool()`, `check_in`): no
        // connection until it is used.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(Some(options.idle_timeout))
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect);
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                path: DataPath::Shared { session, pool },
                sql,
                pooler: options.pooler,
            }),
        })
    }

    async fn finish(pool: PgPool, sql: Statements, options: PostgresOptions) -> Result<Self> {
        if options.migrate {
            migrate(&pool, options.pooler, &options.table, &sql.migrate).await?;
            migrate(&pool, options.pooler, &options.table, &sql.permits.migrate).await?;
            migrate(&pool, options.pooler, &options.table, &sql.rw.migrate).await?;
        }
        // Data connections never LISTEN behind a transaction pooler: the
        // server connection would keep listening for its next client. A
        // listen URL's listener is shared by the process.
        let listener = match (options.listen_url, options.pooler) {
            (Some(url), _) => {
                LISTENERS.get_or_insert_with(&url, || Listener::new(ListenSource::Url(url.clone())))
            }
            (None, Pooler::Transaction) => Arc::new(Listener::new(ListenSource::None)),
            (None, _) => Arc::new(Listener::new(ListenSource::Pool(pool.clone()))),
        };
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                path: DataPath::Pooled {
                    data: Checkout::new(pool),
                    listener,
                },
                sql,
                pooler: options.pooler,
            }),
        })
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

/// Why the pool could not connect. The pool retries a refused connection
/// until its timeout and then only says it timed out; one direct attempt
/// names the cause (connection refused, unknown host, ...) for the message.
async fn connect_failure(connect: &PgConnectOptions) -> Error {
    use sqlx::Connection;
    match tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(connect)).await {
        Ok(Err(e)) => classify(e),
        // Unreachable in time too, or back up just now: the pool's verdict.
        _ => Error::unavailable(sqlx::Error::PoolTimedOut).in_store(STORE),
    }
}

/// Bound on [`connect_failure`]'s attempt, on top of the acquire timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Checks everything in `options` before any I/O and builds the statements
/// (`pool_size`: of the pool lock statements go to, if they go to one).
fn validate(options: &PostgresOptions, pool_size: Option<u32>) -> Result<Statements> {
    let sql = Statements::new(&quote_table_name(&options.table)?);
    if let Some(url) = &options.listen_url {
        store_url::parse_listen_url(url)?;
    } else if let Some(pool_size) =
        pool_size.filter(|&n| options.pooler != Pooler::Transaction && n < 2)
    {
        // The first waiter keeps one pool connection for LISTEN; with a
        // single connection every other operation would wait for it forever.
        return Err(Error::invalid(
            "max_connections",
            format!("must be at least 2 (one is kept for LISTEN) unless a listen url is set, got {pool_size}"),
        ));
    }
    Ok(sql)
}

async fn migrate(pool: &PgPool, pooler: Pooler, table: &str, ddl: &str) -> Result<()> {
    // Concurrent CREATE TABLE IF NOT EXISTS can fail on the catalog's unique
    // index; a transaction-scoped lock (released at commit, fine behind any
    // pooler) makes first starts take turns.
    let mut tx = pool.begin().await.map_err(classify)?;
    let name = format!("leasehold migrate {table}");
    exec::execute(
        &mut tx,
        pooler,
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[Param::Text(&name)],
    )
    .await
    .map_err(classify)?;
    exec::execute(&mut tx, pooler, ddl, &[])
        .await
        .map_err(classify)?;
    tx.commit().await.map_err(classify)
}

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
fn row_locked() -> Acquire {
    Acquire::Busy(Busy {
        holder: ROW_LOCKED_HOLDER.to_owned(),
        remaining: Duration::ZERO,
    })
}

fn is_lock_not_available(e: &sqlx::Error) -> bool {
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
    if is_transient_pg_error(&e) || matches!(e, sqlx::Error::PoolClosed) {
        Error::unavailable(e)
    } else {
        Error::backend(e)
    }
    .in_store(STORE)
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
                .map(<(Option<i64>, Option<String>, Option<i64>)>::from_row)
                .transpose()
                .map_err(classify)?;
            Ok(match row {
                Some((Some(fence), _, _)) => {
                    let record = RecordDecoder::new(STORE, req.key().as_str());
                    Acquire::Granted(req.granted(record.token(fence)?))
                }
                Some((None, holder, remaining)) => Acquire::Busy(Busy {
                    holder: holder.unwrap_or_default(),
                    remaining: millis_to_duration(remaining.unwrap_or(0)),
                }),
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
            let owner = lease.owner().to_string();
            let params = [
                Param::Text(lease.key().as_str()),
                Param::Text(&owner),
                Param::Int(token_as_i64(lease)?),
            ];
            let freed = self
                .inner
                .fetch_all(&self.inner.sql.release, &params)
                .await
                .map_err(Failed::into_error)?;
            if !freed.is_empty() {
                self.inner.wake_local(lease.key());
            }
            Ok(())
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
            rows.iter().map(info_from_row).collect()
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let row = self
                .inner
                .fetch_optional(&self.inner.sql.force_release, &[Param::Text(key.as_str())])
                .await?;
            let Some(row) = row else { return Ok(false) };
            self.inner.wake_local(key);
            row.try_get::<bool, _>(0).map_err(classify)
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move { Ok(self.inner.subscribe(key).await) })
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

    fn try_acquire_permit<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(self.inner.acquire_permit(req))
    }

    fn renew_permit<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.inner.renew_permit(lease, ttl))
    }

    fn release_permit<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.inner.release_permit(lease))
    }

    fn list_permits<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<PermitInfo>>> {
        Box::pin(self.inner.list_permits(prefix))
    }
}
