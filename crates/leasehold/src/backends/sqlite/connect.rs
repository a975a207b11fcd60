//! Opening an SQLite store: the database file (never its directory), WAL
//! mode, the busy timeout, one pooled connection, and the tables.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::clock::StoreClock;
use super::sql::MIGRATION;
use super::sweep::{self, sweep, Sweeper};
use super::wake::WakeDir;
use super::{classify, is_locked, rwlock, semaphore, SqliteBackend, SqliteOptions, STORE};
use crate::backend::{check_idle_window, check_sweep_window};
use crate::error::{Error, Result};

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
        check_idle_window(options.idle_window())?;
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
            sweeper: Sweeper::new(options.idle_window()),
        })
    }

    /// Deletes now, in one pass, the records idle longer than `window`
    /// (what the background sweep does after releases, once per half
    /// window), raising the fence floor so that the keys that come back
    /// still get higher tokens. Returns how many records it deleted.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a zero window; [`Error::Unavailable`]
    /// if the file cannot be written (the records stay; run it again).
    pub async fn sweep_idle(&self, window: Duration) -> Result<u64> {
        check_sweep_window(window)?;
        sweep(&self.pool, window).await
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
    for statement in super::queue::MIGRATION.into_iter().chain(sweep::MIGRATION) {
        sqlx::query(statement).execute(&pool).await?;
    }
    super::kind::migrate(&pool).await?;
    semaphore::migrate(&pool).await?;
    rwlock::migrate(&pool).await?;
    clock.anchor(&pool).await?;
    Ok(pool)
}
