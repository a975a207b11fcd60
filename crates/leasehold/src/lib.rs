//! Distributed lease locks with fencing tokens, on the database you already run.
//!
//! Many processes share one database and must not oversell the last item, run
//! the nightly job twice, or interleave a multi-document update. `leasehold`
//! gives them a lock that is correct across processes and hosts:
//!
//! - **Leases, not flags.** A lock is held for a ttl and renewed in the
//!   background every ttl/3. A crashed holder's lock frees itself.
//! - **Owners.** Every acquisition gets 128 random owner bits; only that
//!   owner can renew or release.
//! - **Fencing tokens.** Every grant carries a token larger than every
//!   earlier grant of that key, across release, expiry, force-release and
//!   store restarts.
//! - **A lost-lease signal.** [`LeaseGuard::lost`] resolves the moment the
//!   holder can no longer rely on its lease.
//! - **Waiting that is woken, not polled.** A waiter sleeps until the store
//!   tells it the key was released (or the holder's ttl runs out).
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{AcquireOptions, Error, Locks};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! let locks = Locks::open("memory://").await?; // or "sqlite:///var/lib/app/locks.db"
//!
//! let guard = locks.acquire("nightly-report", Duration::from_secs(5)).await?;
//! println!("holding {} with fencing token {}", guard.key(), guard.token());
//!
//! // Somebody else trying now is told who holds it and for how long.
//! match locks.try_acquire("nightly-report").await {
//!     // lock "nightly-report" is held by HOST:PID for up to 30s more
//!     Err(busy @ Error::Busy { .. }) => println!("{busy}"),
//!     other => unreachable!("{other:?}"),
//! }
//!
//! // Race the work against the lost-lease signal.
//! tokio::select! {
//!     _ = guard.lost() => eprintln!("lease lost: stop writing"),
//!     _ = tokio::time::sleep(Duration::from_millis(10)) => { /* the work */ }
//! }
//! guard.release().await?;
//!
//! let opts = AcquireOptions::new().with_ttl(Duration::from_secs(10)).with_wait(Duration::from_secs(1));
//! let again = locks.acquire_with("nightly-report", &opts).await?;
//! assert!(again.token() > 1);
//! # again.release().await?; Ok(()) }
//! ```
//!
//! # What a lease lock can and cannot promise
//!
//! No lease lock can guarantee that two processes never *believe* they hold
//! the same lock: a process that pauses (a GC pause, `SIGSTOP`, a swapped-out
//! page, a slow disk) can wake up after its lease expired and another process
//! took the key, and carry on writing. Any lock with expiry has this hole;
//! a lock without expiry deadlocks when its holder crashes instead.
//!
//! What `leasehold` guarantees, and tests, is:
//!
//! 1. **Tokens are monotonic**: a later holder always has a larger token.
//! 2. **A holder learns it lost the lease by its local deadline**:
//!    [`LeaseGuard::valid_until`] is computed from the moment the last good
//!    request was *sent* minus a safety margin (1 % of the ttl + 2 ms), so it
//!    is never later than the store-side expiry; [`LeaseGuard::lost`] fires
//!    then at the latest.
//! 3. **A resource that checks tokens never accepts a stale write.** Store the
//!    highest token you accepted beside the data and refuse lower ones:
//!
//! ```sql
//! -- the fenced write: succeeds only for the newest holder
//! UPDATE products SET stock = ?, fence = ?token
//!  WHERE id = ? AND fence <= ?token;     -- 0 rows: a newer holder exists, abort
//! ```
//!
//! # Stores
//!
//! | URL | store | feature | wakes waiters by |
//! |---|---|---|---|
//! | `memory://` | in-process ([`backends::memory`]) | always | in-process channel |
//! | `sqlite://PATH` | SQLite file, across processes on one host | `sqlite` (default) | Unix datagrams in a wake directory |
//! | `postgres://...`, `postgresql://...` | PostgreSQL lease table ([`backends::postgres`]), across hosts | `postgres` | `LISTEN/NOTIFY`, one connection per process and URL |
//! | `redis://host[:port][/db]` | Redis, Lua scripts, fence keys never deleted; use AOF | `redis` | one pub/sub connection per process and server |
//! | `mongodb://HOST/DB` | MongoDB collection ([`backends::mongodb`]), expiry on the server's clock as estimated from `hello` | `mongodb` | a change stream (polling where the server has none) |
//! | `etcd://HOST:PORT[,HOST:PORT...]`, `etcds://` | etcd v3 cluster ([`backends::etcd`]), one `Txn` per grant, tokens from etcd revisions, expiry on the clients' clocks | `etcd` | one watch stream per backend |
//!
//! # Features
//!
//! Every store but `memory://` sits behind a Cargo feature of its own, and
//! so do [`http`], `testing` and `conformance`. What each feature adds, and
//! which driver it re-exports, is listed once, in the table "Cargo features
//! and supported versions" of the README (this crate's page on crates.io),
//! beside the minimum Rust and server versions.
//!
//! # The drivers, re-exported
//!
//! Each store is built on one driver, re-exported under its own name behind
//! the store's feature: `leasehold::sqlx` (sqlx 0.8, with `runtime-tokio`
//! and the `sqlite`/`postgres` features that are on), `leasehold::redis`
//! (redis 1.8) and `leasehold::mongodb` (mongodb 3). Use them to build the
//! pool, connection manager or client you hand to a store's `from_*`
//! constructor, so its types are the ones leasehold was built with:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn f() -> leasehold::Result<()> {
//! use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
//! use leasehold::sqlx::postgres::PgPoolOptions;
//!
//! let pool = PgPoolOptions::new()
//!     .max_connections(10)
//!     .connect("postgres://app@db.internal/app")
//!     .await?; // a sqlx::Error converts into leasehold::Error
//! let backend = PostgresBackend::from_pool(pool, PostgresOptions::new()).await?;
//! let locks = leasehold::Locks::new(backend);
//! # drop(locks); Ok(()) }
//! ```
//!
//! A direct dependency on the same driver works as well, as long as it is
//! the same major version (sqlx `0.8`, redis `1`, mongodb `3`): Cargo then
//! builds one copy and the types match. Features you enable on your own
//! dependency (say sqlx's `chrono`) apply to leasehold's copy too.
//!
//! # Using a store, and writing one
//!
//! The crate root is the API for applications: [`Locks`],
//! [`AcquireOptions`], [`LeaseGuard`], [`Key`], [`Error`], and the types
//! their methods name ([`Backend`] for [`Locks::new`], [`Lease`],
//! [`LeaseInfo`], [`OwnerId`]). The stores are in [`backends`].
//!
//! Writing a store of your own takes the module [`backend`]: the
//! [`Backend`] trait (a handful of atomic operations, see its
//! `# Contract`), the request and answer types it exchanges with the core,
//! release notifications ([`backend::WakeHub`]), and the conversions and
//! record checks the built-in stores share. Any such type works with
//! [`Locks::new`]; the `conformance` module (feature `conformance`) checks
//! it.
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

// First, so every module below can use its macro.
#[macro_use]
mod setters;

pub mod backend;
pub mod backends;
mod background;
mod cause;
#[cfg(feature = "conformance")]
pub mod conformance;
mod election;
mod error;
mod events;
mod guard;
#[cfg(feature = "http")]
pub mod http;
mod key;
mod kind;
mod local;
mod lock;
#[cfg(feature = "metrics")]
pub mod metrics;
mod multi;
#[cfg(any(
    feature = "postgres",
    feature = "redis",
    feature = "mongodb",
    feature = "etcd"
))]
mod notifier;
mod notify;
mod observe;
pub mod occ;
pub mod open;
mod owner;
mod pending;
mod percent;
mod queue;
pub mod redact;
mod renewal;
#[cfg(feature = "postgres")]
pub mod rowlock;
mod rwlock;
pub mod scheme;
mod semaphore;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod shared;
mod stats;
#[cfg(feature = "conformance")]
mod test_server;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod time;
#[cfg(test)]
mod validation_tests;

// The user API. What only a store's implementation names lives in
// `backend` alone (the rule is in docs/architecture.md).
pub use backend::{
    validate_permits, Backend, KeyKind, Lease, LeaseInfo, OwnerId, PermitInfo, RwSide, MAX_PERMITS,
};
pub use cause::error_chain;
pub use election::{Election, Leader, Leadership, Observer, MAX_CANDIDATE_BYTES};
pub use error::{BoxError, Error, LockKind, Result};
pub use guard::LeaseGuard;
pub use key::{validate_prefix, Key, MAX_KEY_BYTES};
pub use lock::{AcquireOptions, Locks, CLOSE_BOUND, STORE_ANSWER_GRACE};
pub use multi::{canonical_keys, MultiGuard, MAX_MULTI_KEYS};
pub use redact::{redact_secrets, redact_url};
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use stats::{AcquireCounts, LostCounts, Quantiles, RenewalCounts, Stats};

#[cfg(feature = "etcd")]
pub use etcd_client;
#[cfg(feature = "mongodb")]
pub use mongodb;
#[cfg(feature = "redis")]
pub use redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sqlx;

/// Every code block of README.md and docs/*.md, compiled (and run unless
/// marked `no_run`) as doctests, so the documentation cannot drift from the
/// code: `cargo test --doc -p leasehold --all-features` (part of
/// `scripts/test.sh`). Blocks in other languages are tagged (`sh`, `sql`,
/// `toml`, `text`, ...), which rustdoc skips. A page whose blocks need a
/// store's feature is compiled only with it.
#[cfg(doctest)]
mod markdown {
    #[doc = include_str!("../../../README.md")]
    struct Readme;

    #[doc = include_str!("../../../docs/architecture.md")]
    struct Architecture;

    #[doc = include_str!("../../../docs/performance.md")]
    struct Performance;

    #[doc = include_str!("../../../docs/multi-lock.md")]
    struct MultiLock;

    #[doc = include_str!("../../../docs/election.md")]
    struct Election;
    #[doc = include_str!("../../../docs/semaphore.md")]
    struct Semaphore;

    #[doc = include_str!("../../../docs/rw-lock.md")]
    struct RwLock;

    #[doc = include_str!("../../../docs/fairness.md")]
    struct Fairness;

    #[cfg(feature = "postgres")]
    #[doc = include_str!("../../../docs/postgres.md")]
    struct Postgres;

    #[cfg(feature = "redis")]
    #[doc = include_str!("../../../docs/redis.md")]
    struct Redis;

    #[cfg(feature = "mongodb")]
    #[doc = include_str!("../../../docs/mongodb.md")]
    struct Mongodb;

    #[cfg(feature = "etcd")]
    #[doc = include_str!("../../../docs/etcd.md")]
    struct Etcd;

    #[cfg(all(feature = "http", feature = "sqlite"))]
    #[doc = include_str!("../../../docs/http.md")]
    struct Http;

    #[doc = include_str!("../../../docs/metrics.md")]
    struct Metrics;

    #[doc = include_str!("../../../docs/storage.md")]
    struct Storage;
}

#[cfg(test)]
mod tests {
    /// A page added to docs/ must be added to the `markdown` doctests too.
    #[test]
    fn every_markdown_page_is_a_doctest() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let lib = include_str!("lib.rs");
        let mut pages = vec!["README.md".to_owned()];
        for entry in std::fs::read_dir(root.join("docs")).expect("docs/ exists") {
            let name = entry.expect("docs/ is readable").file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".md") {
                pages.push(format!("docs/{name}"));
            }
        }
        for page in pages {
            let include = format!("include_str!(\"../../../{page}\")");
            assert!(lib.contains(&include), "{page} is not in mod markdown");
        }
    }
}
