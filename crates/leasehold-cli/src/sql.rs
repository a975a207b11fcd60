//! The CLI's own tables in an SQL lock store (the demo's product, the
//! torture's fenced counter and its log), written once for SQLite and
//! PostgreSQL.
//!
//! Statements use `$N` placeholders, which sqlx binds on both. What really
//! differs is in [`Dialect`]; a pool of either store is one [`SqlDb`], and
//! each query is run on whichever pool it holds. Behind a transaction-mode
//! pooler (`?pooler=transaction`) every statement runs unnamed inside a
//! transaction, which keeps it on one server connection: what
//! docs/postgres.md tells an application to do with its own queries there.

use std::str::FromStr;
use std::time::Duration;

use leasehold::backends::postgres::{parse_store_url, Pooler, PostgresOptions};
use leasehold::scheme::{Scheme, StoreUrl};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Database, Encode, FromRow, Postgres, Sqlite, Transaction, Type};

use crate::exit::{error_chain, CliError, EX_UNAVAILABLE};

/// What is written differently on the two stores.
#[derive(Debug)]
pub struct Dialect {
    /// Starts a transaction that holds the write lock before its first
    /// read (SQLite locks the whole file; PostgreSQL locks rows instead).
    begin_write: &'static str,
    /// Appended to a `SELECT` inside [`begin_write`](Self::begin_write)'s
    /// transaction to lock what it read until the end.
    for_update: &'static str,
    /// An integer primary key the database numbers in insertion order.
    pub serial_key: &'static str,
    /// After a table's column list.
    pub table_options: &'static str,
}

const SQLITE: Dialect = Dialect {
    begin_write: "BEGIN IMMEDIATE",
    for_update: "",
    serial_key: "INTEGER PRIMARY KEY AUTOINCREMENT",
    table_options: " WITHOUT ROWID",
};

const POSTGRES: Dialect = Dialect {
    begin_write: "BEGIN",
    for_update: " FOR UPDATE",
    serial_key: "BIGSERIAL PRIMARY KEY",
    table_options: "",
};

/// A statement parameter.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Int(i64),
    Text(&'a str),
    Bool(bool),
}

/// One value per store, e.g. a pool or a transaction.
#[derive(Clone)]
enum Either<S, P> {
    Sqlite(S),
    Postgres(P),
}

/// Runs `$body` with `$c` bound to whichever store's value `$either` holds;
/// the body is compiled once per store.
macro_rules! on_either {
    ($either:expr, $c:ident => $body:expr) => {
        match $either {
            Either::Sqlite($c) => $body,
            Either::Postgres($c) => $body,
        }
    };
}

/// A row type both stores decode (tuples of `i64`, `String`, `bool`, or a
/// `#[derive(sqlx::FromRow)]` struct of them).
pub trait SqlRow:
    for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
}
impl<T> SqlRow for T where
    T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
}

/// How long an SQLite statement waits for another process's write lock.
#[derive(Debug, Clone, Copy)]
pub struct BusyTimeout(pub Duration);

/// A pool on the SQL store of a lock-store URL.
#[derive(Clone)]
pub struct SqlDb {
    pool: Either<SqlitePool, PgPool>,
    pub dialect: &'static Dialect,
    pooler: Pooler,
}

impl SqlDb {
    /// Connects to the store `url` names, for the CLI's own tables; `what`
    /// names them in errors. `None` for a store that is not SQL.
    ///
    /// # Errors
    /// Usage error (64) for a URL the driver cannot parse; unavailable (69)
    /// if the store cannot be reached.
    pub async fn open(url: &str, what: &str, busy: BusyTimeout) -> Result<Option<SqlDb>, CliError> {
        let (scheme, parsed) = Scheme::parse(url)?;
        let unavailable =
            |e: sqlx::Error| CliError::new(EX_UNAVAILABLE, format!("{what}: {}", error_chain(&e)));
        if let Some(problem) =
            missing_directory(&parsed).filter(|_| matches!(scheme, Scheme::Sqlite))
        {
            return Err(CliError::usage(format!("{what}: {problem}")));
        }
        Ok(Some(match scheme {
            Scheme::Sqlite => SqlDb {
                pool: Either::Sqlite(sqlite_pool(&parsed, busy).await.map_err(unavailable)?),
                dialect: &SQLITE,
                pooler: Pooler::None,
            },
            Scheme::Postgres => {
                let (connect, options) =
                    parse_store_url(parsed.backend_url(), PostgresOptions::new())
                        .map_err(|e| CliError::usage(format!("{what}: {e}")))?;
                let pool = PgPoolOptions::new()
                    // One worker runs one order or decision at a time; the
                    // orchestrator only resets and reads.
                    .max_connections(2)
                    // Fail like the lock store does when the server is down.
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_with(connect)
                    .await
                    .map_err(unavailable)?;
                SqlDb {
                    pool: Either::Postgres(pool),
                    dialect: &POSTGRES,
                    pooler: options.pooler(),
                }
            }
            _ => return Ok(None),
        }))
    }

    /// `pool`, a PostgreSQL pool with direct connections to the server.
    pub fn from_postgres_pool(pool: PgPool) -> SqlDb {
        SqlDb {
            pool: Either::Postgres(pool),
            dialect: &POSTGRES,
            pooler: Pooler::None,
        }
    }

    /// The PostgreSQL pool and its pooler, for the library's row-lock
    /// helpers; `None` on SQLite.
    pub fn postgres(&self) -> Option<(&PgPool, Pooler)> {
        match &self.pool {
            Either::Postgres(pool) => Some((pool, self.pooler)),
            Either::Sqlite(_) => None,
        }
    }

    /// Named, cached statements; not behind a transaction pooler.
    pub fn persistent(&self) -> bool {
        self.pooler != Pooler::Transaction
    }

    /// Runs `sql`; returns the rows it changed.
    pub async fn execute(&self, sql: &str, args: &[Arg<'_>]) -> sqlx::Result<u64> {
        if !self.persistent() {
            let mut tx = self.begin().await?;
            let changed = tx.execute(sql, args).await?;
            tx.commit().await?;
            return Ok(changed);
        }
        on_either!(&self.pool, pool => Ok(bind(sqlx::query(sql), args)
            .execute(pool)
            .await?
            .rows_affected()))
    }

    /// Runs `sql`; returns its rows.
    pub async fn fetch_all<T: SqlRow>(&self, sql: &str, args: &[Arg<'_>]) -> sqlx::Result<Vec<T>> {
        if !self.persistent() {
            let mut tx = self.begin().await?;
            let rows = tx.fetch_all(sql, args).await?;
            tx.commit().await?;
            return Ok(rows);
        }
        on_either!(&self.pool, pool => bind(sqlx::query(sql), args)
            .fetch_all(pool)
            .await?
            .iter()
            .map(T::from_row)
            .collect())
    }

    /// Runs `sql`; returns its one row.
    pub async fn fetch_one<T: SqlRow>(&self, sql: &str, args: &[Arg<'_>]) -> sqlx::Result<T> {
        self.fetch_all(sql, args)
            .await?
            .into_iter()
            .next()
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// A transaction.
    pub async fn begin(&self) -> sqlx::Result<SqlTx> {
        Ok(SqlTx {
            tx: match &self.pool {
                Either::Sqlite(pool) => Either::Sqlite(pool.begin().await?),
                Either::Postgres(pool) => Either::Postgres(pool.begin().await?),
            },
            persistent: self.persistent(),
            dialect: self.dialect,
        })
    }

    /// A transaction in which a `SELECT ...` with
    /// [`Dialect::for_update`] locks what it reads until the end.
    pub async fn begin_write(&self) -> sqlx::Result<SqlTx> {
        let begin = self.dialect.begin_write;
        Ok(SqlTx {
            tx: match &self.pool {
                Either::Sqlite(pool) => Either::Sqlite(pool.begin_with(begin).await?),
                Either::Postgres(pool) => Either::Postgres(pool.begin_with(begin).await?),
            },
            persistent: self.persistent(),
            dialect: self.dialect,
        })
    }

    /// Creates tables with `ddl` (`CREATE TABLE IF NOT EXISTS ...`), safe
    /// while other processes do the same: on PostgreSQL concurrent twins
    /// collide (a duplicate `pg_type` row) unless they queue on an advisory
    /// lock first.
    pub async fn create_tables(&self, ddl: &[String]) -> sqlx::Result<()> {
        let mut tx = self.begin().await?;
        if self.postgres().is_some() {
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext('leasehold_cli_tables'))",
                &[],
            )
            .await?;
        }
        for statement in ddl {
            tx.execute(statement, &[]).await?;
        }
        tx.commit().await
    }
}

/// A transaction on an [`SqlDb`].
pub struct SqlTx {
    tx: Either<Transaction<'static, Sqlite>, Transaction<'static, Postgres>>,
    persistent: bool,
    dialect: &'static Dialect,
}

impl SqlTx {
    /// Runs `sql`; returns the rows it changed.
    pub async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> sqlx::Result<u64> {
        let persistent = self.persistent;
        on_either!(&mut self.tx, tx => Ok(bind(sqlx::query(sql), args)
            .persistent(persistent)
            .execute(&mut **tx)
            .await?
            .rows_affected()))
    }

    /// Runs `sql`; returns its rows.
    pub async fn fetch_all<T: SqlRow>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> sqlx::Result<Vec<T>> {
        let persistent = self.persistent;
        on_either!(&mut self.tx, tx => bind(sqlx::query(sql), args)
            .persistent(persistent)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(T::from_row)
            .collect())
    }

    /// Runs `sql`; returns its first row, if any.
    pub async fn fetch_optional<T: SqlRow>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> sqlx::Result<Option<T>> {
        Ok(self.fetch_all(sql, args).await?.into_iter().next())
    }

    /// Runs `sql`; returns its first row.
    pub async fn fetch_one<T: SqlRow>(&mut self, sql: &str, args: &[Arg<'_>]) -> sqlx::Result<T> {
        self.fetch_optional(sql, args)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs `select` (one integer column of one row, `$1` bound to `id`)
    /// and locks what it read until the transaction ends (see
    /// [`SqlDb::begin_write`]).
    pub async fn select_for_update(&mut self, select: &str, id: &str) -> sqlx::Result<i64> {
        let sql = format!("{select}{}", self.dialect.for_update);
        let (value,) = self.fetch_one(&sql, &[Arg::Text(id)]).await?;
        Ok(value)
    }

    pub async fn commit(self) -> sqlx::Result<()> {
        on_either!(self.tx, tx => tx.commit().await)
    }
}

/// Binds `args` in order.
fn bind<'q, DB: Database>(
    mut query: sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>,
    args: &[Arg<'q>],
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    i64: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
{
    for arg in args {
        query = match *arg {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v),
            Arg::Bool(v) => query.bind(v),
        };
    }
    query
}

/// Why an SQLite file cannot be made where `url` puts it, as the library's
/// store says it: its directory is missing or a file.
fn missing_directory(url: &StoreUrl) -> Option<String> {
    let path = std::path::Path::new(url.path().unwrap_or_default());
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty())?;
    let problem = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => return None,
        Ok(_) => "is not a directory",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist",
        Err(_) => return None,
    };
    Some(format!(
        "invalid sqlite path: directory {} of {} {problem}: create it first",
        dir.display(),
        path.display()
    ))
}

/// One connection, as the library's SQLite store keeps: SQLite admits one
/// writer at a time, and queueing on the pool is fair.
async fn sqlite_pool(url: &StoreUrl, busy: BusyTimeout) -> sqlx::Result<SqlitePool> {
    // No directory is created here (as in the library): `main` makes the
    // default store's, and any other path must name an existing one.
    let path = url.path().unwrap_or_default();
    let connect = SqliteConnectOptions::from_str("sqlite://")?
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(match url.option("synchronous") {
            Some("normal") => SqliteSynchronous::Normal,
            _ => SqliteSynchronous::Full,
        })
        .busy_timeout(busy.0);
    SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(busy.0 + Duration::from_secs(5))
        .connect_with(connect)
        .await
}
