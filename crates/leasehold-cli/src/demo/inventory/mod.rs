//! Where the demo keeps its product: one row (or document, or hash) with the
//! stock, a version for the optimistic strategy and a fence for the lease
//! strategy, in the same store as the locks.

#[cfg(feature = "mongodb")]
mod mongodb;
mod postgres;
mod redis;
mod sqlite;

use std::time::Duration;

use leasehold::backend::BoxFuture;

use super::Strategy;
use crate::exit::CliError;

/// The product record as read.
#[derive(Debug, Clone, Copy)]
pub struct Stock {
    pub stock: i64,
    pub version: i64,
}

/// One store's product record and the writes each strategy makes.
pub trait Inventory: Send + Sync {
    /// Puts the product back to `stock` items (version and fence to 0).
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> BoxFuture<'a, Result<(), CliError>>;

    /// Reads stock and version.
    fn read<'a>(&'a self, product: &'a str) -> BoxFuture<'a, Result<Stock, CliError>>;

    /// Writes the stock with no check at all: the race the demo shows.
    fn write_unchecked<'a>(
        &'a self,
        product: &'a str,
        stock: i64,
    ) -> BoxFuture<'a, Result<(), CliError>>;

    /// Writes the stock only if `token` is not older than the last token
    /// written (`... WHERE fence <= token`). Returns whether it was accepted.
    fn write_fenced<'a>(
        &'a self,
        product: &'a str,
        stock: i64,
        token: u64,
    ) -> BoxFuture<'a, Result<bool, CliError>>;

    /// Writes the stock only if the version is still `version`, bumping it.
    /// Returns whether it matched.
    fn write_versioned<'a>(
        &'a self,
        product: &'a str,
        stock: i64,
        version: i64,
    ) -> BoxFuture<'a, Result<bool, CliError>>;

    /// The store's pessimistic strategy: lock the record, read, pay, write,
    /// commit. Returns whether an item was sold (false: sold out). Only
    /// called for stores whose [`strategies`] include `RowLock`.
    fn buy_row_locked<'a>(
        &'a self,
        product: &'a str,
        pay: Duration,
    ) -> BoxFuture<'a, Result<bool, CliError>>;
}

/// The stores the demo names when refusing a URL.
const SUPPORTED: &str = "sqlite://PATH, postgres://USER@HOST/DB, redis://HOST or mongodb://HOST/DB";

/// The stores the demo can keep its product in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Sqlite,
    Postgres,
    Redis,
    #[cfg(feature = "mongodb")]
    Mongo,
}

impl Store {
    /// Picks the store from the URL scheme, before any I/O.
    fn of(url: &str) -> Result<Store, CliError> {
        let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
        match scheme {
            "sqlite" => Ok(Store::Sqlite),
            "postgres" | "postgresql" => Ok(Store::Postgres),
            "redis" | "redis+unix" => Ok(Store::Redis),
            #[cfg(feature = "mongodb")]
            "mongodb" | "mongodb+srv" => Ok(Store::Mongo),
            "memory" => Err(CliError::usage(format!(
                "the demo runs worker processes, which cannot share a memory:// store; use {SUPPORTED}"
            ))),
            other => Err(CliError::usage(format!(
                "the demo does not support store {other:?}; use {SUPPORTED}"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "sqlite",
            Store::Postgres => "postgres",
            Store::Redis => "redis",
            #[cfg(feature = "mongodb")]
            Store::Mongo => "mongodb",
        }
    }

    /// What the store offers, in the order the demo runs them.
    fn strategies(self) -> &'static [Strategy] {
        match self {
            Store::Sqlite | Store::Postgres => &[
                Strategy::None,
                Strategy::Lease,
                Strategy::RowLock,
                Strategy::Optimistic,
            ],
            // Redis has no lock that spans a read, a pause and a write (a
            // script cannot wait for the payment); the lease is the way.
            Store::Redis => &[Strategy::None, Strategy::Lease, Strategy::Optimistic],
            #[cfg(feature = "mongodb")]
            Store::Mongo => &[
                Strategy::None,
                Strategy::Lease,
                Strategy::RowLock,
                Strategy::Optimistic,
            ],
        }
    }
}

/// The strategies to run on the store named by `url`: `wanted`, or all the
/// store offers when `wanted` is empty. Known from the scheme alone, so a
/// strategy the store lacks is refused (64) before any I/O.
pub fn strategies(url: &str, wanted: &[Strategy]) -> Result<Vec<Strategy>, CliError> {
    let store = Store::of(url)?;
    let offered = store.strategies();
    if wanted.is_empty() {
        return Ok(offered.to_vec());
    }
    if let Some(missing) = wanted.iter().find(|s| !offered.contains(s)) {
        let names: Vec<_> = offered.iter().map(|s| s.name()).collect();
        return Err(CliError::usage(format!(
            "strategy {} is not available on {}; choose from: {}",
            missing.name(),
            store.name(),
            names.join(", ")
        )));
    }
    Ok(wanted.to_vec())
}

/// Opens the inventory in the store named by `url`.
pub async fn open(url: &str) -> Result<Box<dyn Inventory>, CliError> {
    Ok(match Store::of(url)? {
        Store::Sqlite => Box::new(sqlite::SqliteInventory::open(url).await?),
        Store::Postgres => Box::new(postgres::PostgresInventory::open(url).await?),
        Store::Redis => Box::new(redis::RedisInventory::open(url).await?),
        #[cfg(feature = "mongodb")]
        Store::Mongo => Box::new(mongodb::MongoInventory::open(url).await?),
    })
}

/// Maps a driver error of the demo's own data to a store error.
pub fn store_error(e: impl std::error::Error) -> CliError {
    CliError::new(
        crate::exit::EX_UNAVAILABLE,
        format!("demo inventory: {}", crate::exit::error_chain(&e)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_store_offers_its_strategies_and_refuses_the_rest_before_io() {
        let all = strategies("sqlite:///tmp/x.db", &[]).unwrap();
        assert_eq!(all.len(), 4);
        let redis = strategies("redis://127.0.0.1:1", &[]).unwrap();
        assert_eq!(
            redis,
            [Strategy::None, Strategy::Lease, Strategy::Optimistic]
        );
        // Port 1 is never dialled: the answer comes from the scheme.
        let e =
            strategies("redis://127.0.0.1:1", &[Strategy::Lease, Strategy::RowLock]).unwrap_err();
        assert_eq!(e.code, crate::exit::EX_USAGE);
        assert_eq!(
            e.to_string(),
            "strategy row-lock is not available on redis; choose from: none, lease, optimistic"
        );
        assert_eq!(
            strategies("sqlite:///tmp/x.db", &[Strategy::RowLock]).unwrap(),
            [Strategy::RowLock]
        );
        assert!(strategies("memory://", &[]).is_err());
    }
}
