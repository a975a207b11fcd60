//! The baselines leasehold is measured against: the same atomic operations
//! issued by hand with the store's driver, and other lock implementations.
//! One module per store below; `open` picks by URL.

use leasehold::{BoxFuture, Locks};

use crate::exit::CliError;

/// A lock taken without leasehold: what a careful hand-written version does.
pub trait Baseline: Send + Sync {
    /// Shown in the report, e.g. "two sqlite statements by hand".
    fn name(&self) -> &'static str;

    /// One atomic attempt on `key`; `Some` when granted.
    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>>;

    /// Frees what `try_acquire` granted.
    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>>;
}

/// What a baseline needs to release: the key, its owner string and token.
#[derive(Debug, Clone)]
pub struct Held {
    pub key: String,
    pub owner: String,
    pub token: i64,
}

/// The store under test: how to get independent clients of it, and its
/// baselines (the first is *the* raw baseline the ratios refer to).
pub struct BenchStore {
    url: String,
    /// Clients of `memory://` must share one store.
    shared: Option<Locks>,
    pub baselines: Vec<Box<dyn Baseline>>,
}

impl BenchStore {
    /// A new, independent client of the store (its own connection), as
    /// another process would have.
    pub async fn client(&self) -> Result<Locks, CliError> {
        match &self.shared {
            Some(locks) => Ok(locks.clone()),
            None => Ok(Locks::open(&self.url).await?),
        }
    }

    /// The URL with any password masked, for reports.
    pub fn display_url(&self) -> String {
        mask_password(&self.url)
    }
}

/// Opens the store and the baselines that exist for it.
pub async fn open(url: &str) -> Result<(BenchStore, Locks), CliError> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    match scheme {
        "memory" => {
            let locks = Locks::open(url).await?;
            let store = BenchStore {
                url: url.to_owned(),
                shared: Some(locks.clone()),
                baselines: Vec::new(),
            };
            Ok((store, locks))
        }
        "sqlite" => {
            let (locks, baselines) = sqlite::open(url).await?;
            Ok((
                BenchStore {
                    url: url.to_owned(),
                    shared: None,
                    baselines,
                },
                locks,
            ))
        }
        _ => {
            let locks = Locks::open(url).await?;
            eprintln!("leasehold: no hand-written baseline for {scheme}:// yet; reporting leasehold alone");
            Ok((
                BenchStore {
                    url: url.to_owned(),
                    shared: None,
                    baselines: Vec::new(),
                },
                locks,
            ))
        }
    }
}

fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, None), |(a, p)| (a, Some(p)));
    let masked = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    match path {
        Some(p) => format!("{scheme}://{masked}/{p}"),
        None => format!("{scheme}://{masked}"),
    }
}

mod sqlite {
    use std::time::Duration;

    use leasehold::backends::sqlite::{SqliteBackend, ACQUIRE, RELEASE};
    use leasehold::{BoxFuture, Locks, OwnerId};
    use sqlx::SqlitePool;

    use super::{Baseline, Held};
    use crate::exit::CliError;

    /// The library's two statements issued by hand on the very connection
    /// the library uses, so only the library's own work differs.
    struct TwoStatements {
        pool: SqlitePool,
    }

    pub async fn open(url: &str) -> Result<(Locks, Vec<Box<dyn Baseline>>), CliError> {
        let rest = url.strip_prefix("sqlite://").unwrap_or(url);
        let (path, options) = leasehold::open::parse_sqlite(rest)?;
        let backend = SqliteBackend::open_with(path, options).await?;
        let pool = backend.pool().clone();
        Ok((Locks::new(backend), vec![Box::new(TwoStatements { pool })]))
    }

    fn driver(e: sqlx::Error) -> CliError {
        CliError::new(crate::exit::EX_UNAVAILABLE, format!("baseline: {e}"))
    }

    impl Baseline for TwoStatements {
        fn name(&self) -> &'static str {
            "two sqlite statements by hand"
        }

        fn try_acquire<'a>(
            &'a self,
            key: &'a str,
        ) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
            Box::pin(async move {
                let owner = OwnerId::random().to_string();
                let fence: Option<i64> = sqlx::query_scalar(ACQUIRE)
                    .bind(key)
                    .bind(&owner)
                    .bind("baseline")
                    .bind(Duration::from_secs(30).as_millis() as i64)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(driver)?;
                Ok(fence.map(|token| Held {
                    key: key.to_owned(),
                    owner,
                    token,
                }))
            })
        }

        fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
            Box::pin(async move {
                sqlx::query(RELEASE)
                    .bind(&held.key)
                    .bind(&held.owner)
                    .bind(held.token)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                Ok(())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mask_password;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            mask_password("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(mask_password("redis://:pw@h"), "redis://:***@h");
        assert_eq!(mask_password("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
    }
}
