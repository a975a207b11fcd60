//! Choosing a store from a URL, so the CLI and middleware can pick one at
//! run time.
//!
//! | URL | store | feature |
//! |---|---|---|
//! | `memory://` | a fresh in-process store | always |
//! | `sqlite://PATH` (`sqlite:///abs/path.db`, `sqlite://rel/path.db`) | SQLite file | `sqlite` (default) |
//! | `mongodb://HOST[:PORT]/[DB][?driver options]` | collection `leasehold_locks` in DB (default `leasehold`) | `mongodb` |
//!
//! SQLite accepts `?synchronous=full` (default) or `?synchronous=normal`.

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
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::invalid(
            "store url",
            format!("{url:?} has no scheme; expected e.g. sqlite://PATH or memory://"),
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
    use crate::backends::sqlite::{SqliteBackend, SqliteOptions};

    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err(Error::invalid(
            "store url",
            "sqlite:// needs a file path, e.g. sqlite:///var/lib/app/locks.db",
        ));
    }
    let mut options = SqliteOptions::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("synchronous", "full")) => options = options.synchronous_full(true),
            Some(("synchronous", "normal")) => options = options.synchronous_full(false),
            _ => {
                return Err(Error::invalid(
                    "store url",
                    format!("unknown sqlite option {pair:?}; allowed: synchronous=full|normal"),
                ))
            }
        }
    }
    Ok(Arc::new(SqliteBackend::open_with(path, options).await?))
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
    }

    #[tokio::test]
    async fn memory_opens() {
        assert!(open_backend("memory://").await.is_ok());
    }
}
