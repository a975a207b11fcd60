//! SQLite: the library's two statements by hand, on the library's own connection.
use std::time::Duration;

use leasehold::backend::BoxFuture;
use leasehold::backends::sqlite::{SqliteBackend, SqliteOptions};
use leasehold::{Locks, OwnerId};
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
    let (path, options) = parse(rest)?;
    let backend = SqliteBackend::open_with(path, options).await?;
    let pool = backend.pool().clone();
    Ok(Measured {
        locks: Locks::new(backend),
        baselines: vec![Box::new(TwoStatements { pool })],
        handoff_peers: Vec::new(),
    })
}

/// The file path and options of a `sqlite://` URL's rest.
fn parse(rest: &str) -> Result<(&str, SqliteOptions), CliError> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut options = SqliteOptions::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        options = match pair {
            "synchronous=full" => options.with_synchronous_full(true),
            "synchronous=normal" => options.with_synchronous_full(false),
            _ => {
                return Err(CliError::usage(format!(
                    "invalid store url: unknown sqlite option {pair:?}; allowed: synchronous=full|normal"
                )))
            }
        };
    }
    Ok((path, options))
}

/// The library's acquire, written out: parameters key, owner hex, holder
/// label, ttl ms; returns the new fence when granted.
const ACQUIRE: &str = "INSERT INTO leasehold_locks (key, fence, owner, holder, expires_at_ms) \
    VALUES (?1, 1, ?2, ?3, CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?4) \
    ON CONFLICT (key) DO UPDATE SET fence = fence + 1, owner = excluded.owner, \
    holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
    WHERE owner IS NULL OR expires_at_ms <= CAST(unixepoch('subsec') * 1000 AS INTEGER) \
    RETURNING fence";

/// The library's release, written out: parameters key, owner hex, fence.
const RELEASE: &str = "UPDATE leasehold_locks SET owner = NULL, holder = NULL, \
    expires_at_ms = NULL WHERE key = ?1 AND owner = ?2 AND fence = ?3";

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
