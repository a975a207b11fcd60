//! Where the demo keeps its product: one row (or document, or hash) with the
//! stock, a version for the optimistic strategy and a fence for the lease
//! strategy, in the same store as the locks.

mod postgres;
mod sqlite;

use std::time::Duration;

use leasehold::BoxFuture;

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
    /// commit. Returns whether an item was sold (false: sold out).
    fn buy_row_locked<'a>(
        &'a self,
        product: &'a str,
        pay: Duration,
    ) -> BoxFuture<'a, Result<bool, CliError>>;
}

/// Opens the inventory in the store named by `url`.
pub async fn open(url: &str) -> Result<Box<dyn Inventory>, CliError> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    match scheme {
        "sqlite" => Ok(Box::new(sqlite::SqliteInventory::open(url).await?)),
        "postgres" | "postgresql" => Ok(Box::new(postgres::PostgresInventory::open(url).await?)),
        "memory" => Err(CliError::usage(
            "the demo runs worker processes, which cannot share a memory:// store; use sqlite://PATH or postgres://...",
        )),
        other => Err(CliError::usage(format!(
            "the demo does not support store {other:?}; use sqlite://PATH or postgres://..."
        ))),
    }
}

/// Maps a driver error of the demo's own data to a store error.
pub fn store_error(e: impl std::error::Error) -> CliError {
    CliError::new(
        crate::exit::EX_UNAVAILABLE,
        format!("demo inventory: {}", crate::exit::error_chain(&e)),
    )
}
