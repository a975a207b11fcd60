//! Where the demo keeps its product: one row (or document, or hash) with the
//! stock, a version for the optimistic strategy and a fence for the lease
//! strategy, in the same store as the locks.

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "mongodb")]
mod mongodb;
mod redis;
mod sql;

use std::time::Duration;

use futures_util::future::BoxFuture;
use leasehold::scheme::Scheme;

use super::Strategy;
use crate::exit::CliError;

/// The product record as read.
#[derive(Debug, Clone, Copy)]
pub struct Stock {
    pub stock: i64,
    pub version: i64,
}

/// What a write of the stock checks first.
#[derive(Debug, Clone, Copy)]
pub enum Check {
    /// Nothing at all: the race the demo shows.
    None,
    /// That the lease's fencing token is not older than the last token
    /// written (`... WHERE fence <= token`); the write records it.
    Fence(u64),
    /// That the version is still the one read; the write bumps it.
    Version(i64),
}

/// What a store answers, later.
pub type Answer<'a, T> = BoxFuture<'a, Result<T, CliError>>;

/// One store's product record and the writes each strategy makes.
pub trait Inventory: Send + Sync {
    /// Puts the product back to `stock` items (version and fence to 0).
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> Answer<'a, ()>;

    /// Reads stock and version.
    fn read<'a>(&'a self, product: &'a str) -> Answer<'a, Stock>;

    /// Writes the stock if `check` passes; returns whether it did.
    fn write<'a>(&'a self, product: &'a str, stock: i64, check: Check) -> Answer<'a, bool>;

    /// The store's pessimistic strategy: lock the record, read, pay, write,
    /// commit. Returns whether an item was sold (false: sold out). Only
    /// called for stores whose [`strategies`] include `RowLock`; the others
    /// (Redis) keep this refusal.
    fn buy_row_locked<'a>(&'a self, _product: &'a str, _pay: Duration) -> Answer<'a, bool> {
        Box::pin(async {
            Err(CliError::usage(
                "strategy row-lock is not available on this store",
            ))
        })
    }
}

/// The stores the demo names when refusing a URL.
const SUPPORTED: &str =
    "sqlite://PATH, postgres://USER@HOST/DB, redis://HOST, mongodb://HOST/DB or etcd://HOST";

const ALL: &[Strategy] = &[
    Strategy::None,
    Strategy::Lease,
    Strategy::RowLock,
    Strategy::Optimistic,
];

/// What `scheme`'s store offers, in the order the demo runs them.
fn offered(scheme: Scheme) -> Result<&'static [Strategy], CliError> {
    Ok(match scheme {
        Scheme::Sqlite | Scheme::Postgres => ALL,
        #[cfg(feature = "mongodb")]
        Scheme::Mongodb => ALL,
        // Redis has no lock that spans a read, a pause and a write (a
        // script cannot wait for the payment); the lease is the way.
        Scheme::Redis => &[Strategy::None, Strategy::Lease, Strategy::Optimistic],
        // etcd neither: a transaction is one step with no pause inside.
        #[cfg(feature = "etcd")]
        Scheme::Etcd => &[Strategy::None, Strategy::Lease, Strategy::Optimistic],
        Scheme::Memory => {
            return Err(CliError::usage(format!(
            "the demo runs worker processes, which cannot share a memory:// store; use {SUPPORTED}"
        )))
        }
        other => {
            return Err(CliError::usage(format!(
                "the demo does not support store {:?}; use {SUPPORTED}",
                other.name()
            )))
        }
    })
}

/// The strategies to run on the store named by `url`: `wanted`, or all the
/// store offers when `wanted` is empty. Known from the scheme alone, so a
/// strategy the store lacks is refused (64) before any I/O.
pub fn strategies(url: &str, wanted: &[Strategy]) -> Result<Vec<Strategy>, CliError> {
    let (scheme, _) = Scheme::parse(url)?;
    let offered = offered(scheme)?;
    if wanted.is_empty() {
        return Ok(offered.to_vec());
    }
    if let Some(missing) = wanted.iter().find(|s| !offered.contains(s)) {
        let names: Vec<_> = offered.iter().map(|s| s.name()).collect();
        return Err(CliError::usage(format!(
            "strategy {} is not available on {scheme}; choose from: {}",
            missing.name(),
            names.join(", ")
        )));
    }
    Ok(wanted.to_vec())
}

/// Opens the inventory in the store named by `url`.
pub async fn open(url: &str) -> Result<Box<dyn Inventory>, CliError> {
    let (scheme, parsed) = Scheme::parse(url)?;
    offered(scheme)?;
    Ok(match scheme {
        Scheme::Redis => Box::new(redis::RedisInventory::open(&parsed).await?),
        #[cfg(feature = "mongodb")]
        Scheme::Mongodb => Box::new(mongodb::MongoInventory::open(&parsed).await?),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Box::new(etcd::EtcdInventory::open(url, &parsed).await?),
        _ => match sql::SqlInventory::open(url).await? {
            Some(inventory) => Box::new(inventory),
            None => {
                return Err(CliError::usage(format!(
                    "the demo does not support store {scheme}"
                )))
            }
        },
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
