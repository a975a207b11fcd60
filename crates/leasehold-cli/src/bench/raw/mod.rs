//! The baselines leasehold is measured against: the same atomic operations
//! issued by hand with the store's driver, and other lock implementations.
//! One module per store below; `open` picks by URL.

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "mongodb")]
mod mongodb;
mod postgres;
mod redis;
mod sqlite;
mod statements;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use leasehold::scheme::Scheme;
use leasehold::{LeaseGuard, Locks};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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

/// A lock that hands over without leasehold, for the hand-off comparison
/// (PostgreSQL's blocking `pg_advisory_lock`, rslock on Redis).
pub trait HandoffPeer: Send + Sync {
    /// Shown in the report.
    fn name(&self) -> &'static str;

    /// `rounds` hand-offs: a holder takes the lock, a waiter blocks on it,
    /// the holder lets go; each sample is release call to waiter holding.
    fn handoffs(&self, rounds: usize) -> BoxFuture<'_, Result<Vec<Duration>, CliError>>;
}

/// A driver error inside a baseline: the store is failing.
pub fn baseline_error(e: impl std::fmt::Display) -> CliError {
    CliError::new(crate::exit::EX_UNAVAILABLE, format!("baseline: {e}"))
}

/// What a baseline needs to release: the key, its owner string and token.
#[derive(Debug, Clone)]
pub struct Held {
    pub key: String,
    pub owner: String,
    pub token: i64,
}

impl Held {
    /// `key`, held by a lock that keeps its owner itself (a session, a
    /// client's own value) and has no fencing token.
    pub fn key_only(key: &str) -> Held {
        Held {
            key: key.to_owned(),
            owner: String::new(),
            token: 0,
        }
    }
}

/// leasehold itself reached another way (a direct connection beside a
/// pooler, another connection type), measured as a baseline: the guards
/// `try_acquire` handed out are kept by key until `release`.
pub struct LeaseholdBaseline {
    name: &'static str,
    locks: Locks,
    held: Mutex<HashMap<String, LeaseGuard>>,
}

impl LeaseholdBaseline {
    pub fn new(name: &'static str, locks: Locks) -> LeaseholdBaseline {
        LeaseholdBaseline {
            name,
            locks,
            held: Mutex::default(),
        }
    }
}

impl Baseline for LeaseholdBaseline {
    fn name(&self) -> &'static str {
        self.name
    }

    fn try_acquire<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Held>, CliError>> {
        Box::pin(async move {
            let guard = match self.locks.try_acquire(key).await {
                Ok(guard) => guard,
                Err(leasehold::Error::Busy { .. }) => return Ok(None),
                Err(e) => return Err(baseline_error(e)),
            };
            let held = Held {
                token: i64::try_from(guard.token()).map_err(baseline_error)?,
                ..Held::key_only(key)
            };
            self.held.lock().await.insert(key.to_owned(), guard);
            Ok(Some(held))
        })
    }

    fn release(&self, held: Held) -> BoxFuture<'_, Result<(), CliError>> {
        Box::pin(async move {
            if let Some(guard) = self.held.lock().await.remove(&held.key) {
                guard.release().await.map_err(baseline_error)?;
            }
            Ok(())
        })
    }
}

/// The store under test: how to get independent clients of it, and its
/// baselines (the first is *the* raw baseline the ratios refer to).
pub struct BenchStore {
    url: String,
    /// Clients of `memory://` must share one store.
    shared: Option<Locks>,
    pub baselines: Vec<Box<dyn Baseline>>,
    pub handoff_peers: Vec<Box<dyn HandoffPeer>>,
}

impl BenchStore {
    /// A new client of the store (its own data connection; the process's
    /// listener is shared).
    pub async fn client(&self) -> Result<Locks, CliError> {
        match &self.shared {
            Some(locks) => Ok(locks.clone()),
            None => Ok(Locks::open(&self.url).await?),
        }
    }

    /// The URL with its credentials masked, for reports.
    pub fn display_url(&self) -> String {
        leasehold::redact_url(&self.url)
    }
}

/// What a store module provides: the client under test and its baselines.
pub struct Measured {
    pub locks: Locks,
    pub baselines: Vec<Box<dyn Baseline>>,
    pub handoff_peers: Vec<Box<dyn HandoffPeer>>,
}

impl Measured {
    /// leasehold alone: no baseline to compare with.
    pub fn alone(locks: Locks) -> Measured {
        Measured {
            locks,
            baselines: Vec::new(),
            handoff_peers: Vec::new(),
        }
    }

    /// leasehold and one baseline, without a hand-off peer.
    pub fn with_baseline(locks: Locks, baseline: impl Baseline + 'static) -> Measured {
        Measured {
            baselines: vec![Box::new(baseline)],
            ..Measured::alone(locks)
        }
    }
}

/// One hand-off, timed the same way for every peer: `waiter` is a task
/// blocking on the lock the holder has; 15 ms on (time to be queued),
/// `release` lets go (a future: nothing is sent before it is awaited, after
/// the clock is read). The sample runs from the release call to the moment
/// the waiter holds.
pub async fn timed_handoff<E: std::fmt::Display, T, F: std::fmt::Display>(
    waiter: JoinHandle<Result<Instant, E>>,
    release: impl Future<Output = Result<T, F>>,
) -> Result<Duration, CliError> {
    tokio::time::sleep(Duration::from_millis(15)).await;
    let released = Instant::now();
    release.await.map_err(baseline_error)?;
    let acquired = waiter
        .await
        .map_err(baseline_error)?
        .map_err(baseline_error)?;
    Ok(acquired.saturating_duration_since(released))
}

/// Opens the store and the baselines that exist for it.
pub async fn open(url: &str) -> Result<(BenchStore, Locks), CliError> {
    let (scheme, parsed) = Scheme::parse(url)?;
    let measured = match scheme {
        Scheme::Sqlite => sqlite::open(url).await?,
        Scheme::Postgres => postgres::open(url).await?,
        Scheme::Redis => redis::open(url, &parsed).await?,
        #[cfg(feature = "mongodb")]
        Scheme::Mongodb => mongodb::open(url).await?,
        #[cfg(feature = "etcd")]
        Scheme::Etcd => etcd::open(url).await?,
        other => {
            if other != Scheme::Memory {
                eprintln!(
                    "leasehold: no hand-written baseline for {other}://; reporting leasehold alone"
                );
            }
            Measured::alone(Locks::open(url).await?)
        }
    };
    let store = BenchStore {
        url: url.to_owned(),
        // Clients of `memory://` must share one store.
        shared: (scheme == Scheme::Memory).then(|| measured.locks.clone()),
        baselines: measured.baselines,
        handoff_peers: measured.handoff_peers,
    };
    Ok((store, measured.locks))
}
