//! Choosing a store from a URL, so the CLI and middleware can pick one at
//! run time. The URL is taken apart by [`Scheme::parse`]; this module only
//! opens what it names.
//!
//! | URL | store | feature |
//! |---|---|---|
//! | `memory://` | a fresh in-process store | always |
//! | `sqlite://PATH` (`sqlite:///abs/path.db`, `sqlite://rel/path.db`) | SQLite file, created if missing; its directory must exist | `sqlite` (default) |
//! | `mongodb://HOST[:PORT]/[DB][?driver options]` | collection `leasehold_locks` in DB (default `leasehold`) | `mongodb` |
//! | `postgres://user@host:port/db`, `postgresql://...` | PostgreSQL, table `leasehold_locks` | `postgres` |
//! | `redis://[user:pass@]host[:port][/db]`, `redis+unix:///path` | Redis | `redis` |
//! | `redis+cluster://[user:pass@]host:port[,host:port...]` | Redis Cluster (seed nodes) | `redis` |
//!
//! Every URL accepts `listen=off`: waiters then hold no listening
//! connection and poll instead, waking at the holder's expiry or after a
//! backoff of up to 250 ms (see docs/performance.md for what a hand-off
//! costs each way).
//!
//! SQLite accepts `?synchronous=full` (default) or `?synchronous=normal`,
//! and `?idle_window=1h` (default; `never`, or `ms`, `s`, `m`, `h`).
//! PostgreSQL URLs take sqlx's parameters (`sslmode`, `application_name`,
//! ...), leasehold's `pooler=transaction` (behind PgBouncer in transaction
//! mode) and `listen_url=postgres://...` (a separate `LISTEN` connection),
//! and the connection budget's `max_connections=N` (data connections,
//! default 1), `idle_timeout=5s` and `acquire_timeout=5s`; a server that
//! does not answer fails with [`Error::Unavailable`] within 5 s. For
//! another table, build a
//! [`PostgresBackend`](crate::backends::postgres::PostgresBackend) yourself.
//! Redis and Redis Cluster accept `?prefix=NAME` (the key prefix, default
//! `leasehold`), `?min_replicas=N` (every call confirmed by `WAIT` on N
//! replicas, default 0) and `?max_connections=N` (command connections,
//! default 4; not on a cluster); other query parameters go to the `redis` crate (e.g.
//! `protocol=resp3`).
//! `rediss://` (TLS) is not compiled in: use a TLS proxy, or build a client
//! yourself and use `RedisBackend::from_manager`.

use std::sync::Arc;

use crate::backend::Backend;
use crate::backends::memory::MemoryBackend;
use crate::error::{Error, Result};
use crate::lock::Locks;
use crate::scheme::{Scheme, StoreUrl};

// Here rather than in lock/: the engine's handle knows no store; opening
// one by its URL is this floor's job.
impl Locks {
    /// Opens the store named by `url`: `memory://`, `sqlite://PATH` (see
    /// [`crate::open`] for the full syntax).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or a store that is not
    /// compiled in; [`Error::Unavailable`] if the store cannot be reached.
    pub async fn open(url: &str) -> Result<Self> {
        Ok(Self::from_arc(open_backend(url).await?))
    }
}

/// Opens the store named by `url`.
///
/// # Errors
/// [`Error::InvalidInput`] for a URL without a scheme, an unknown scheme, a
/// store not compiled into this build, or bad options (see
/// [`Scheme::parse`]); [`Error::Unavailable`] if the store cannot be reached.
pub async fn open_backend(url: &str) -> Result<Arc<dyn Backend>> {
    open_any(url).await.map_err(|e| e.without_secrets_of(url))
}

async fn open_any(url: &str) -> Result<Arc<dyn Backend>> {
    let (scheme, url) = Scheme::parse(url)?;
    let backend = open_store(scheme, &url).await?;
    Ok(if url.listen() {
        backend
    } else {
        Arc::new(crate::backends::polling::PollingOnly::new(backend))
    })
}

// A build with no store features opens `memory://` only.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "redis",
        feature = "mongodb",
        feature = "etcd"
    )),
    allow(unused_variables)
)]
async fn open_store(scheme: Scheme, url: &StoreUrl) -> Result<Arc<dyn Backend>> {
    match scheme {
        Scheme::Memory => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        Scheme::Sqlite => open_sqlite(url).await,
        #[cfg(feature = "postgres")]
        Scheme::Postgres => Ok(Arc::new(
            crate::backends::postgres::PostgresBackend::connect(url.backend_url()).await?,
        )),
        #[cfg(feature = "redis")]
        Scheme::Redis => open_redis(url).await,
        #[cfg(feature = "mongodb")]
        Scheme::Mongodb => Ok(Arc::new(
            crate::backends::mongodb::MongoBackend::connect(url.backend_url()).await?,
        )),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Ok(Arc::new(
            crate::backends::etcd::EtcdBackend::connect(url.backend_url()).await?,
        )),
        // `Scheme::parse` already refuses the stores this build lacks.
        #[allow(unreachable_patterns)]
        other => Err(Error::invalid(
            "store url",
            format!("store {other} is not compiled into this build"),
        )),
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(url: &StoreUrl) -> Result<Arc<dyn Backend>> {
    use crate::backends::sqlite::{SqliteBackend, SqliteOptions};

    let path = url.path().expect("an sqlite URL has a path");
    // `Scheme::parse` let only `full` and `normal` through.
    let full = url.option("synchronous") != Some("normal");
    let mut options = SqliteOptions::default().with_synchronous_full(full);
    if let Some(window) = url.option("idle_window") {
        options = options.with_idle_window(crate::scheme::parse_idle_window(window)?);
    }
    Ok(Arc::new(SqliteBackend::open_with(path, options).await?))
}

#[cfg(feature = "redis")]
async fn open_redis(url: &StoreUrl) -> Result<Arc<dyn Backend>> {
    use crate::backends::redis::{RedisBackend, RedisOptions};

    let options = RedisOptions::from_url(url)?;
    Ok(Arc::new(
        RedisBackend::connect_with(url.driver_url(), options).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn problem(url: &str) -> String {
        open_backend(url).await.unwrap_err().to_string()
    }

    /// Asserts that opening each URL fails with a message containing its
    /// text.
    async fn refused_with(cases: &[(&str, &str)]) {
        for (url, expected) in cases {
            let message = problem(url).await;
            assert!(message.contains(expected), "{url}: {message}");
        }
    }

    #[tokio::test]
    async fn rejects_bad_urls_with_specific_messages() {
        refused_with(&[
            ("locks.db", "has no scheme"),
            ("ftp://x", "unknown scheme \"ftp\""),
            ("memory://x", "takes nothing"),
            #[cfg(feature = "sqlite")]
            ("sqlite://", "needs a file path"),
            #[cfg(feature = "sqlite")]
            ("sqlite:///tmp/x.db?mode=rw", "unknown sqlite option"),
            #[cfg(feature = "redis")]
            ("rediss://127.0.0.1", "TLS"),
            #[cfg(feature = "redis")]
            (
                "redis://127.0.0.1?prefix=a{b",
                "invalid redis key prefix: must not contain braces",
            ),
            #[cfg(feature = "redis")]
            ("redis://127.0.0.1:notaport", "invalid store url"),
            #[cfg(feature = "redis")]
            ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
        ])
        .await;
        #[cfg(feature = "mongodb")]
        assert!(problem("mongodb://a:b:c:d")
            .await
            .starts_with("invalid store url"));
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_urls_are_parsed_before_io() {
        assert!(problem("postgres://u@h:notaport/db")
            .await
            .starts_with("invalid store url: not a PostgreSQL URL"));
    }

    /// Every store refuses an option it does not know, before any I/O
    /// (nothing listens on port 1).
    #[tokio::test]
    async fn unknown_url_options_are_refused_on_every_store() {
        refused_with(&[
            ("memory://?cache=1", "takes no option"),
            #[cfg(feature = "sqlite")]
            ("sqlite:///tmp/x.db?journal=wal", "unknown sqlite option"),
            #[cfg(feature = "postgres")]
            (
                "postgres://127.0.0.1:1/db?max_conections=4",
                "unknown postgres option \"max_conections\"",
            ),
            #[cfg(feature = "redis")]
            (
                "redis://127.0.0.1:1?prefx=a",
                "unknown redis option \"prefx\"",
            ),
            #[cfg(feature = "redis")]
            (
                "redis+cluster://127.0.0.1:1,127.0.0.1:2?min_replica=1",
                "unknown redis option \"min_replica\"",
            ),
        ])
        .await;
        #[cfg(feature = "mongodb")]
        {
            // The MongoDB driver refuses it itself (and names it in lower case).
            let message = problem("mongodb://127.0.0.1:1/?directConection=true").await;
            assert!(
                message.starts_with("invalid store url")
                    && message
                        .to_lowercase()
                        .contains("directconection is an invalid option"),
                "{message}"
            );
        }
    }

    #[tokio::test]
    async fn listen_option_is_checked_and_taken_out() {
        assert!(problem("memory://?listen=maybe")
            .await
            .contains("listen must be on or off, got \"maybe\""));
        assert!(open_backend("memory://?listen=off").await.is_ok());
    }

    #[tokio::test]
    async fn messages_never_show_the_password() {
        for url in [
            "app:hunter22@db/orders",
            "ftp://app:hunter22@host",
            "memory://app:hunter22@host",
            "sqlite://?password=hunter22",
            #[cfg(feature = "postgres")]
            "postgres://app:hunter22@db:notaport/orders",
            #[cfg(feature = "redis")]
            "redis://app:hunter22@cache:notaport",
            #[cfg(feature = "redis")]
            "redis+cluster://app:hunter22@a:1,cache:notaport",
            #[cfg(feature = "mongodb")]
            "mongodb://app:hunter22@h1:notaport,h2/locks",
        ] {
            let message = problem(url).await;
            assert!(!message.contains("hunter22"), "{url}: {message}");
        }
    }

    #[tokio::test]
    async fn memory_opens() {
        assert!(open_backend("memory://").await.is_ok());
    }
}
