//! Choosing a store from a URL, so the CLI and middleware can pick one at
//! run time.
//!
//! | URL | store | feature |
//! |---|---|---|
//! | `memory://` | a fresh in-process store | always |
//! | `sqlite://PATH` (`sqlite:///abs/path.db`, `sqlite://rel/path.db`) | SQLite file | `sqlite` (default) |
//! | `mongodb://HOST[:PORT]/[DB][?driver options]` | collection `leasehold_locks` in DB (default `leasehold`) | `mongodb` |
//! | `postgres://user@host:port/db`, `postgresql://...` | PostgreSQL, table `leasehold_locks` | `postgres` |
//! | `redis://[user:pass@]host[:port][/db]`, `redis+unix:///path` | Redis | `redis` |
//!
//! Every URL accepts `listen=off`: waiters then hold no listening
//! connection and poll instead, waking at the holder's expiry or after a
//! backoff of up to 250 ms (see docs/performance.md for what a hand-off
//! costs each way).
//!
//! SQLite accepts `?synchronous=full` (default) or `?synchronous=normal`.
//! PostgreSQL URLs take sqlx's parameters (`sslmode`, `application_name`,
//! ...), leasehold's `pooler=transaction` (behind PgBouncer in transaction
//! mode) and `listen_url=postgres://...` (a separate `LISTEN` connection),
//! and the connection budget's `max_connections=N` (data connections,
//! default 1), `idle_timeout=5s` and `acquire_timeout=5s`; a server that
//! does not answer fails with [`Error::Unavailable`] within 5 s. For
//! another table, build a
//! [`PostgresBackend`](crate::backends::postgres::PostgresBackend) yourself.
//! Redis accepts `?prefix=NAME` (the key prefix, default `leasehold`); other
//! query parameters go to the `redis` crate (e.g. `protocol=resp3`).
//! `rediss://` (TLS) is not compiled in: use a TLS proxy, or build a client
//! yourself and use `RedisBackend::from_manager`.

use std::sync::Arc;

use crate::backend::Backend;
use crate::backends::memory::MemoryBackend;
use crate::error::{Error, Result};

/// Stores this build knows by scheme, compiled in or not.
const KNOWN_SCHEMES: &[(&str, &str)] = &[
    ("memory", "always available"),
    ("sqlite", "sqlite"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("redis", "redis"),
    ("redis+unix", "redis"),
    ("rediss", "redis"),
    ("mongodb", "mongodb"),
    ("mongodb+srv", "mongodb"),
];

/// Opens the store named by `url`.
///
/// # Errors
/// [`Error::InvalidInput`] for a URL without a scheme, an unknown scheme, a
/// store not compiled into this build, or bad options; [`Error::Unavailable`]
/// if the store cannot be reached.
pub async fn open_backend(url: &str) -> Result<Arc<dyn Backend>> {
    open_any(url).await.map_err(|e| e.without_secrets_of(url))
}

async fn open_any(url: &str) -> Result<Arc<dyn Backend>> {
    let (url, listen) = split_listen(url)?;
    let backend = open_store(&url).await?;
    Ok(if listen {
        backend
    } else {
        Arc::new(crate::backends::polling::PollingOnly::new(backend))
    })
}

/// Takes `listen=on|off` out of the URL's query string: whether waiters
/// keep a listening connection (default) or poll with the holder's
/// remaining ttl and a backoff.
fn split_listen(url: &str) -> Result<(String, bool)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), true));
    };
    let mut listen = true;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("listen", "on")) => listen = true,
            Some(("listen", "off")) => listen = false,
            Some(("listen", other)) => {
                return Err(Error::invalid(
                    "store url",
                    format!("listen must be on or off, got {other:?}"),
                ))
            }
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, listen))
}

async fn open_store(url: &str) -> Result<Arc<dyn Backend>> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::invalid(
            "store url",
            format!(
                "{:?} has no scheme; expected e.g. sqlite://PATH or memory://",
                crate::redact::redact_url(url)
            ),
        ));
    };
    match scheme {
        "memory" => {
            if !rest.is_empty() {
                return Err(Error::invalid(
                    "store url",
                    format!("memory:// takes nothing after the scheme, got {rest:?}"),
                ));
            }
            Ok(Arc::new(MemoryBackend::new()))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => open_sqlite(rest).await,
        #[cfg(feature = "mongodb")]
        "mongodb" | "mongodb+srv" => Ok(Arc::new(
            crate::backends::mongodb::MongoBackend::connect(url).await?,
        )),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(
            crate::backends::postgres::PostgresBackend::connect(url).await?,
        )),
        #[cfg(feature = "redis")]
        "redis" | "redis+unix" | "rediss" => open_redis(url).await,
        _ => Err(unknown_scheme(scheme)),
    }
}

fn unknown_scheme(scheme: &str) -> Error {
    match KNOWN_SCHEMES.iter().find(|(s, _)| *s == scheme) {
        Some((_, feature)) => Error::invalid(
            "store url",
            format!("store {scheme:?} is not compiled into this build; enable cargo feature {feature:?}"),
        ),
        None => Error::invalid(
            "store url",
            format!(
                "unknown scheme {scheme:?}; expected one of: {}",
                KNOWN_SCHEMES
                    .iter()
                    .map(|(s, _)| *s)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(rest: &str) -> Result<Arc<dyn Backend>> {
    use crate::backends::sqlite::SqliteBackend;

    let (path, options) = parse_sqlite(rest)?;
    Ok(Arc::new(SqliteBackend::open_with(path, options).await?))
}

/// Splits the part of a `sqlite://` URL after the scheme into the file path
/// and the options its query string sets.
///
/// # Errors
/// [`Error::InvalidInput`] for an empty path or an unknown option.
#[cfg(feature = "sqlite")]
fn parse_sqlite(rest: &str) -> Result<(&str, crate::backends::sqlite::SqliteOptions)> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err(Error::invalid(
            "store url",
            "sqlite:// needs a file path, e.g. sqlite:///var/lib/app/locks.db",
        ));
    }
    let mut options = crate::backends::sqlite::SqliteOptions::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("synchronous", "full")) => options = options.with_synchronous_full(true),
            Some(("synchronous", "normal")) => options = options.with_synchronous_full(false),
            _ => {
                return Err(Error::invalid(
                    "store url",
                    format!("unknown sqlite option {pair:?}; allowed: synchronous=full|normal"),
                ))
            }
        }
    }
    Ok((path, options))
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str) -> Result<Arc<dyn Backend>> {
    use crate::backends::redis::{RedisBackend, RedisOptions};

    let mut options = RedisOptions::new();
    let url = match url.split_once('?') {
        None => url.to_owned(),
        Some((base, query)) => {
            // Our own parameter comes out; the crate's stay in the URL.
            let mut rest = Vec::new();
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                match pair.strip_prefix("prefix=") {
                    Some(prefix) => options = options.with_prefix(prefix),
                    None => rest.push(pair),
                }
            }
            if rest.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{}", rest.join("&"))
            }
        }
    };
    Ok(Arc::new(RedisBackend::connect_with(&url, options).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn problem(url: &str) -> String {
        open_backend(url).await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn rejects_bad_urls_with_specific_messages() {
        assert!(problem("locks.db").await.contains("has no scheme"));
        assert!(problem("ftp://x").await.contains("unknown scheme \"ftp\""));
        assert!(problem("memory://x").await.contains("takes nothing"));
        #[cfg(feature = "sqlite")]
        {
            assert!(problem("sqlite://").await.contains("needs a file path"));
            assert!(problem("sqlite:///tmp/x.db?mode=rw")
                .await
                .contains("unknown sqlite option"));
        }
        #[cfg(feature = "mongodb")]
        assert!(problem("mongodb://a:b:c:d")
            .await
            .starts_with("invalid store url"));
        #[cfg(feature = "redis")]
        {
            assert!(problem("rediss://127.0.0.1").await.contains("TLS"));
            assert!(problem("redis://127.0.0.1?prefix=a{b")
                .await
                .contains("invalid redis key prefix: must not contain braces"));
            assert!(problem("redis://127.0.0.1:notaport")
                .await
                .contains("invalid store url"));
        }
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_urls_are_parsed_before_io() {
        assert!(problem("postgres://u@h:notaport/db")
            .await
            .starts_with("invalid store url: not a PostgreSQL URL"));
    }

    #[tokio::test]
    async fn listen_option_is_checked_and_taken_out() {
        assert_eq!(
            split_listen("redis://h?listen=off&prefix=a").unwrap(),
            ("redis://h?prefix=a".to_owned(), false)
        );
        assert_eq!(
            split_listen("memory://").unwrap(),
            ("memory://".to_owned(), true)
        );
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
