//! The embedded SQLite store (`sqlite://PATH`), the default: no server, and
//! correct across processes on one host.
//!
//! One table, one row per key, never deleted (the fence lives there). Each
//! operation is one statement, which SQLite runs as one write transaction
//! (in WAL mode an autocommit write takes the write lock before it reads).
//! Expiry uses the host's boot clock, anchored to the Unix epoch once per
//! boot and shared by every process on the host through the file (see
//! `clock.rs`): a step of the wall clock moves no lease. Waiters in other processes are woken through a
//! wake directory of Unix datagram sockets (see `wake.rs`).

mod options;
mod wake;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;

use crate::backend::{
    duration_to_millis, millis_to_duration, token_to_i64, Acquire, AcquireRequest, Backend,
    BoxFuture, Busy, Lease, LeaseInfo, PermitInfo, RecordDecoder, Subscription,
};
use crate::error::{Error, Result};
use crate::key::Key;
use clock::StoreClock;
pub use options::SqliteOptions;
use wake::{SharedWakeDir, WakeDir};

/// The name errors carry ([`Error::store`]).
const STORE: &str = "sqlite";

// `clock` first, for `now_ms!` (the store's clock in milliseconds since
// the Unix epoch), which the statements use; then `slots`, for
// `slot_tables!`.
#[macro_use]
mod clock;
#[macro_use]
mod slots;
mod rwlock;
mod semaphore;

/// Creates the lease table; safe to run any number of times.
const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS leasehold_locks (
    key TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL,
    owner TEXT,
    holder TEXT,
    expires_at_ms INTEGER
) WITHOUT ROWID";

/// Grants the lease if the key is new, free or expired; returns the new
/// fence. A repeat by the owner that holds it live is the same grant, its
/// expiry counted from now (the fence stays). Parameters: key, owner,
/// holder, ttl in ms.
const ACQUIRE: &str = concat!(
    "INSERT INTO leasehold_locks (key, fence, owner, holder, expires_at_ms) VALUES (?1, 1, ?2, ?3, ",
    now_ms!(),
    " + ?4) ON CONFLICT (key) DO UPDATE SET fence = CASE WHEN owner = excluded.owner \
     AND expires_at_ms > ",
    now_ms!(),
    " THEN fence ELSE fence + 1 END, owner = excluded.owner, \
     holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
     WHERE owner IS NULL OR expires_at_ms <= ",
    now_ms!(),
    " OR owner = excluded.owner RETURNING fence"
);

/// Frees the key if owner and fence match. Parameters: key, owner, fence.
const RELEASE: &str =
    "UPDATE leasehold_locks SET owner = NULL, holder = NULL, expires_at_ms = NULL \
     WHERE key = ?1 AND owner = ?2 AND fence = ?3";

const BUSY_INFO: &str = concat!(
    "SELECT holder, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_locks WHERE key = ?1 AND owner IS NOT NULL"
);

const RENEW: &str = concat!(
    "UPDATE leasehold_locks SET expires_at_ms = ",
    now_ms!(),
    " + ?4 WHERE key = ?1 AND owner = ?2 AND fence = ?3 AND expires_at_ms > ",
    now_ms!()
);

const INSPECT: &str = concat!(
    "SELECT key, owner, holder, fence, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_locks WHERE key = ?1 AND owner IS NOT NULL AND expires_at_ms > ",
    now_ms!()
);

const LIST: &str = concat!(
    "SELECT key, owner, holder, fence, expires_at_ms - ",
    now_ms!(),
    " FROM leasehold_locks WHERE substr(key, 1, length(?1)) = ?1 \
     AND owner IS NOT NULL AND expires_at_ms > ",
    now_ms!(),
    " ORDER BY key"
);

const WAS_LIVE: &str = concat!(
    "SELECT owner IS NOT NULL AND expires_at_ms > ",
    now_ms!(),
    " FROM leasehold_locks WHERE key = ?1"
);

const FORCE_RELEASE: &str = "UPDATE leasehold_locks SET owner = NULL, holder = NULL, \
     expires_at_ms = NULL, fence = fence + 1 WHERE key = ?1";

/// Lock store in an SQLite database file.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    pool: SqlitePool,
    path: PathBuf,
    wake: SharedWakeDir,
    /// The connection's busy timeout outside acquisitions.
    busy_timeout: Duration,
}

impl SqliteBackend {
    /// Opens (creating if needed) the database at `path` with default options.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the file cannot be opened or created.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens (creating if needed) the database at `path`, and creates the
    /// lease table. The directory must exist: a mistyped path is an error,
    /// not a second, empty lock database.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty path, or one whose directory
    /// does not exist or is not a directory; [`Error::Unavailable`] if the
    /// file cannot be opened or created.
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref();
        if path.as_os_str().is_empty() {
            return Err(Error::invalid("sqlite path", "must not be empty"));
        }
        check_directory(path)?;
        let connect = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|e| Error::backend(e).in_store(STORE))?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(if options.synchronous_full() {
                SqliteSynchronous::Full
            } else {
                SqliteSynchronous::Normal
            })
            .busy_timeout(options.busy_timeout());
        // Switching a new file to WAL needs the database to itself and fails
        // at once ("database is locked", without the busy handler) while
        // another process is doing the same: retry within the busy timeout.
        let deadline = tokio::time::Instant::now() + options.busy_timeout();
        let pool = loop {
            match connect_and_migrate(connect.clone(), &options).await {
                Err(e) if is_locked(&e) && tokio::time::Instant::now() < deadline => {
                    let pause = Duration::from_millis(rand::random::<u64>() % 20 + 5);
                    tokio::time::sleep(pause).await;
                }
                result => break result.map_err(classify)?,
            }
        };
        Ok(SqliteBackend {
            pool,
            path: path.to_owned(),
            wake: Arc::new(WakeDir::for_database(path)),
            busy_timeout: options.busy_timeout(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection pool, for running fenced writes in the same database.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Refuses a path whose directory is missing (or a file). Creating it
/// would turn a typo into a second lock database that no other process
/// uses, so two processes would both "hold" one lock. Other failures
/// (permissions) are left to the open, which reports them.
fn check_directory(path: &Path) -> Result<()> {
    let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let problem = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "is not a directory",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist",
        Err(_) => return Ok(()),
    };
    Err(Error::invalid(
        "sqlite path",
        format!(
            "directory {} of {} {problem}: create it first (leasehold creates the database file, not its directory)",
            dir.display(),
            path.display()
        ),
    ))
}

/// A statement with its parameters bound.
type Query<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

impl SqliteBackend {
    /// Runs `acquire` (a mutex's, a semaphore's or an rw lock's) on a pool
    /// connection whose busy timeout (how long SQLite waits for another
    /// connection's write lock) follows the caller's wait, not the
    /// backend's 5 s: the deadline wins.
    fn bounded_acquire<'a, F>(
        &'a self,
        req: &'a AcquireRequest,
        acquire: F,
    ) -> BoxFuture<'a, Result<Acquire>>
    where
        F: for<'c> FnOnce(
                &'c mut SqliteConnection,
                &'c AcquireRequest,
            ) -> BoxFuture<'c, Result<Acquire>>
            + Send
            + 'a,
    {
        Box::pin(async move {
            let mut conn = BoundedBusy::new(&self.pool, req).await?;
            let outcome = acquire(conn.conn(), req).await;
            if let Err(e) = conn.restore(self.busy_timeout).await {
                // The connection is closed instead of pooled (see
                // `BoundedBusy`), so no later statement inherits the short
                // timeout. The answer stands: a grant dropped here would be
                // held at the store for its whole ttl by nobody.
                tracing::debug!(key = %req.key(), error = %e, "could not restore the busy timeout; connection closed");
            }
            outcome
        })
    }

    /// Runs a renew statement (a mutex's, a permit's or an rw lock's): true
    /// if it extended the lease, false if the lease was lost.
    async fn run_renew(&self, renew: Query<'_>) -> Result<bool> {
        let done = renew.execute(&self.pool).await.map_err(classify)?;
        Ok(done.rows_affected() == 1)
    }

    /// Runs a release statement, and wakes `key`'s waiters if it freed
    /// the lease (not if the lease was already gone).
    async fn run_release(&self, release: Query<'_>, key: &Key) -> Result<()> {
        let done = release.execute(&self.pool).await.map_err(classify)?;
        if done.rows_affected() == 1 {
            self.wake.wake(key);
        }
        Ok(())
    }
}

async fn connect_and_migrate(
    connect: SqliteConnectOptions,
    options: &SqliteOptions,
) -> std::result::Result<SqlitePool, sqlx::Error> {
    // One connection: SQLite admits one writer at a time anyway, and
    // queueing in-process writers on the pool is fair and wakes at once,
    // where SQLite's busy handler sleeps in growing steps.
    let clock = StoreClock::default();
    let registered = clock.clone();
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(options.busy_timeout() + Duration::from_secs(5))
        .after_connect(move |conn, _| {
            let clock = registered.clone();
            Box::pin(async move { clock.register(conn).await })
        })
        .connect_with(connect)
        .await?;
    sqlx::query(MIGRATION).execute(&pool).await?;
    semaphore::migrate(&pool).await?;
    rwlock::migrate(&pool).await?;
    clock.anchor(&pool).await?;
    Ok(pool)
}

/// SQLITE_BUSY or SQLITE_LOCKED, with any extended code.
fn is_locked(e: &sqlx::Error) -> bool {
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
    if transient {
        Error::unavailable(e)
    } else {
        Error::backend(e)
    }
    .in_store(STORE)
}

/// A row of INSPECT or LIST, every field checked: a column of the wrong
/// type (SQLite does not enforce them) is a corrupt record too.
fn info_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<LeaseInfo> {
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

/// The holder reported when another connection kept the database's write
/// lock for the whole wait (SQLite does not say whose, nor for how long).
const WRITE_LOCKED_HOLDER: &str = "another transaction (database locked)";

/// The answer when another connection kept the write lock for the whole
/// wait: the key cannot be taken now, so it is busy.
fn write_locked() -> Acquire {
    Acquire::Busy(Busy {
        holder: WRITE_LOCKED_HOLDER.to_owned(),
        remaining: Duration::ZERO,
    })
}

/// The answer for a held key: the holder that expires first and its time
/// left in ms, as the statements read them (none if it left meanwhile:
/// zero remaining, so the waiter retries at once).
fn busy(holder: Option<String>, remaining: Option<i64>) -> Acquire {
    Acquire::Busy(Busy {
        holder: holder.unwrap_or_default(),
        remaining: millis_to_duration(remaining.unwrap_or(0)),
    })
}

/// A pool connection whose busy timeout an acquisition has bounded by its
/// caller's wait. Dropped before [`restore`](Self::restore) (the acquire
/// future was cancelled), the connection is closed rather than pooled, so
/// no later statement runs with the short timeout.
struct BoundedBusy {
    conn: Option<PoolConnection<Sqlite>>,
}

impl BoundedBusy {
    // Boxed futures here and below: with plain `async fn`s the compiler
    // cannot prove the backend's boxed future `Send` (rust-lang/rust#102211).
    fn new<'a>(pool: &'a SqlitePool, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Self>> {
        Box::pin(async move {
            let mut bounded = BoundedBusy {
                conn: Some(pool.acquire().await.map_err(classify)?),
            };
            // Measured once the connection is ours: queueing for it spent
            // some of the wait already.
            bounded.set(req.lock_wait()).await?;
            Ok(bounded)
        })
    }

    fn conn(&mut self) -> &mut SqliteConnection {
        self.conn
            .as_mut()
            .expect("connection taken only by restore")
    }

    fn set(&mut self, timeout: Duration) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            #[cfg(test)]
            if tests::FAIL_SET.with(|fail| fail.replace(false)) {
                return Err(Error::unavailable("injected: busy_timeout not set").in_store(STORE));
            }
            // PRAGMA takes no parameters; the value is an integer, and a
            // non-persistent statement keeps these one-off texts out of the
            // prepared-statement cache.
            let sql = format!("PRAGMA busy_timeout = {}", duration_to_millis(timeout));
            let conn: &mut SqliteConnection = self.conn();
            sqlx::query(&sql)
                .persistent(false)
                .execute(&mut *conn)
                .await
                .map_err(classify)?;
            Ok(())
        })
    }

    /// Puts the backend's own busy timeout back and returns the connection
    /// to the pool.
    fn restore(mut self, busy_timeout: Duration) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            self.set(busy_timeout).await?;
            self.conn.take();
            Ok(())
        })
    }
}

impl Drop for BoundedBusy {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

/// The acquire statements on a connection whose busy timeout is bounded.
fn acquire_on<'a>(
    conn: &'a mut SqliteConnection,
    req: &'a AcquireRequest,
) -> BoxFuture<'a, Result<Acquire>> {
    Box::pin(acquire_statements(conn, req))
}

async fn acquire_statements(conn: &mut SqliteConnection, req: &AcquireRequest) -> Result<Acquire> {
    let granted: Option<i64> = match sqlx::query_scalar(ACQUIRE)
        .bind(req.key().as_str())
        .bind(req.owner().to_string())
        .bind(req.holder())
        .bind(duration_to_millis(req.ttl()))
        .fetch_optional(&mut *conn)
        .await
    {
        Ok(granted) => granted,
        // Another connection held the write lock for the whole wait: the
        // key cannot be taken now, so it is busy.
        Err(e) if is_locked(&e) => return Ok(write_locked()),
        Err(e) => return Err(classify(e)),
    };
    if let Some(fence) = granted {
        let token = RecordDecoder::new(STORE, req.key().as_str()).token(fence)?;
        return Ok(Acquire::Granted(req.granted(token)));
    }
    // Who holds it is for the waiter's schedule only; if the holder
    // left in between, report zero remaining so it retries at once.
    let row: Option<(Option<String>, Option<i64>)> = sqlx::query_as(BUSY_INFO)
        .bind(req.key().as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(classify)?;
    let (holder, remaining) = row.unwrap_or_default();
    Ok(busy(holder, remaining))
}

impl Backend for SqliteBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        self.bounded_acquire(req, acquire_on)
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let renew = sqlx::query(RENEW)
                .bind(lease.key().as_str())
                .bind(lease.owner().to_string())
                .bind(token_to_i64(lease.token())?)
                .bind(duration_to_millis(ttl));
            self.run_renew(renew).await
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let release = sqlx::query(RELEASE)
                .bind(lease.key().as_str())
                .bind(lease.owner().to_string())
                .bind(token_to_i64(lease.token())?);
            self.run_release(release, lease.key()).await
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let row = sqlx::query(INSPECT)
                .bind(key.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(classify)?;
            row.as_ref().map(info_from_row).transpose()
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            let rows = sqlx::query(LIST)
                .bind(prefix)
                .fetch_all(&self.pool)
                .await
                .map_err(classify)?;
            rows.iter().map(info_from_row).collect()
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            // BEGIN IMMEDIATE takes the write lock first, so the liveness read
            // and the update are one atomic step.
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(classify)?;
            let was_live: Option<bool> = sqlx::query_scalar(WAS_LIVE)
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(classify)?;
            sqlx::query(FORCE_RELEASE)
                .bind(key.as_str())
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            tx.commit().await.map_err(classify)?;
            if was_live.is_some() {
                self.wake.wake(key);
            }
            Ok(was_live.unwrap_or(false))
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move { Ok(self.wake.subscribe(key)) })
    }

    /// A datagram to every process's wake socket, as a release sends.
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.wake.wake(key);
            Ok(true)
        })
    }

    fn try_acquire_permit<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        match req.rw_side() {
            Some(side) => {
                self.bounded_acquire(req, move |conn, req| rwlock::acquire_on(conn, req, side))
            }
            None => self.bounded_acquire(req, semaphore::acquire_on),
        }
    }

    fn renew_permit<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.renew_slot(slot_tables(lease), lease, ttl))
    }

    fn release_permit<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.release_slot(slot_tables(lease), lease))
    }

    fn list_permits<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<PermitInfo>>> {
        Box::pin(async move {
            let permits = self.list_slots(&semaphore::TABLES, prefix).await?;
            Ok(crate::rwlock::merge_listings(
                permits,
                self.list_slots(&rwlock::TABLES, prefix).await?,
            ))
        })
    }
}

/// A semaphore permit's tables, or an rw lock grant's.
fn slot_tables(lease: &Lease) -> &'static slots::SlotTables {
    match lease.rw_side() {
        Some(_) => &rwlock::TABLES,
        None => &semaphore::TABLES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, Locks};

    #[tokio::test]
    async fn a_missing_directory_is_refused_and_not_created() {
        let tmp = tempfile::tempdir().unwrap();
        let typo = tmp.path().join("lcoks");
        let url = format!("sqlite://{}/locks.db", typo.display());
        let error = Locks::open(&url).await.unwrap_err();
        assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
        let text = error.to_string();
        assert!(
            text.contains(&format!("directory {} of ", typo.display()))
                && text.contains("does not exist: create it first"),
            "{text}"
        );
        assert!(!typo.exists(), "no directory is created");

        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let url = format!("sqlite://{}/locks.db", file.display());
        let text = Locks::open(&url).await.unwrap_err().to_string();
        assert!(text.contains("is not a directory"), "{text}");

        // An existing directory is all it needs.
        let url = format!("sqlite://{}/locks.db", tmp.path().display());
        let locks = Locks::open(&url).await.unwrap();
        locks
            .try_acquire("k")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    std::thread_local! {
        /// Fails the next `PRAGMA busy_timeout` on this thread.
        pub(super) static FAIL_SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A grant whose connection cannot get its busy timeout back is still
    /// the caller's (the connection is closed): before, the error replaced
    /// the grant, which the store then held for its ttl with no guard.
    #[tokio::test]
    async fn a_grant_survives_a_failed_busy_timeout_restore() {
        let tmp = tempfile::tempdir().unwrap();
        let backend = SqliteBackend::open(tmp.path().join("x.db")).await.unwrap();
        let key = Key::new("k").unwrap();
        let req = AcquireRequest::new(key.clone(), Duration::from_secs(30), "h").unwrap();
        // `BoundedBusy::new` sets the bound; the restore after the grant
        // is the next `set`.
        let conn = BoundedBusy::new(&backend.pool, &req).await.unwrap();
        FAIL_SET.with(|fail| fail.set(true));
        assert!(
            conn.restore(backend.busy_timeout).await.is_err(),
            "the hook fails a restore"
        );
        FAIL_SET.with(|fail| fail.set(false));

        let acquire = backend.bounded_acquire(&req, |conn, req| {
            FAIL_SET.with(|fail| fail.set(true));
            acquire_on(conn, req)
        });
        let answer = acquire.await;
        FAIL_SET.with(|fail| fail.set(false));
        let Ok(Acquire::Granted(lease)) = answer else {
            panic!("the grant is the caller's: {answer:?}");
        };
        let info = backend.inspect(&key).await.unwrap().expect("held");
        assert_eq!(info.token, lease.token());
        backend.release(&lease).await.unwrap();
        assert!(
            backend.inspect(&key).await.unwrap().is_none(),
            "released by its guard"
        );
        // The next acquisition runs on a connection with its timeout set.
        let again = AcquireRequest::new(key, Duration::from_secs(30), "h").unwrap();
        assert!(matches!(
            backend.try_acquire(&again).await,
            Ok(Acquire::Granted(_))
        ));
    }
}
