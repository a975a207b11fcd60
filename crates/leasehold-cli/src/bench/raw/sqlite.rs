//! SQLite: the library's two statements by hand, on the library's own connection.
use std::time::Duration;

use leasehold::backends::sqlite::{SqliteBackend, ACQUIRE, RELEASE};
use leasehold::{BoxFuture, Locks, OwnerId};
use sqlx::SqlitePool;

use super::{baseline_error as driver, Baseline, Held, Measured};
use crate::exit::CliError;

/// The library's two statements issued by hand on the very connection
/// the library uses, so only the library's own work differs.
struct TwoStatements {
    pool: SqlitePool,
}

pub async fn open(url: &str) -> Result<Measured, CliError> {
    let rest = url.strip_prefix("sqlite://").unwrap_or(url);
    let (path, options) = leasehold::open::parse_sqlite(rest)?;
    let backend = SqliteBackend::open_with(path, options).await?;
    let pool = backend.pool().clone();
    Ok(Measured {
        locks: Locks::new(backend),
        baselines: vec![Box::new(TwoStatements { pool })],
        handoff_peers: Vec::new(),
    })
}

impl Baseline for TwoStatements {
    fn name(&self) -> &'static str {
        "two sqlite statements by hand"
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
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
