//! Connecting a PostgreSQL store: options checked before any I/O, the
//! process's shared session or a pool with a listener beside it, and the
//! migration.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};

use super::exec::{self, Param};
use super::listen::{ListenSource, Listener};
use super::session::{Failed, Session, Statement};
use super::sql::{quote_table_name, Statements};
use super::sweep::Sweeper;
use super::{
    classify, parse_store_url, store_url, Checkout, DataPath, Inner, Pooler, PostgresBackend,
    PostgresOptions, STORE,
};
use crate::backend::check_idle_window;
use crate::error::{Error, Result};

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
                Statement::new(&sql.queue.migrate, &[]),
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
                sweeper: Sweeper::new(options.idle_window),
                hints: Default::default(),
            }),
        })
    }

    async fn finish(pool: PgPool, sql: Statements, options: PostgresOptions) -> Result<Self> {
        if options.migrate {
            migrate(&pool, options.pooler, &options.table, &sql.migrate).await?;
            migrate(&pool, options.pooler, &options.table, &sql.permits.migrate).await?;
            migrate(&pool, options.pooler, &options.table, &sql.rw.migrate).await?;
            migrate(&pool, options.pooler, &options.table, &sql.queue.migrate).await?;
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
                sweeper: Sweeper::new(options.idle_window),
                hints: Default::default(),
            }),
        })
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
    check_idle_window(options.idle_window)?;
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
