//! The embedded SQLite store (`sqlite://PATH`), the default: no server, and
//! correct across processes on one host.
//!
//! One table, one row per key, never deleted (the fence lives there). Each
//! operation is one statement, which SQLite runs as one write transaction
//! (in WAL mode an autocommit write takes the write lock before it reads).
//! Expiry uses the host's boot clock, anchored to the Unix epoch once per
//! boot and shared by every process on the host through the file (see
//! `clock.rs`): a step of the wall clock moves no lease. Waiters in other
//! processes are woken through a wake directory of Unix datagram sockets
//! (see `wake.rs`).

mod busy;
mod busy_wait;
mod connect;
mod errors;
mod options;
mod wake;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqlitePool;

use crate::backend::{
    duration_to_millis, listing, token_to_i64, Acquire, AcquireRequest, Backend, BoxFuture,
    KeyKind, Lease, LeaseInfo, OwnerId, Subscription,
};
use crate::error::Result;
use crate::key::Key;
pub use options::SqliteOptions;
use wake::SharedWakeDir;

/// The name errors carry ([`Error::store`]).
const STORE: &str = "sqlite";

// `clock` first, for `now_ms!` (the store's clock in milliseconds since
// the Unix epoch), which the statements use; then `sweep`, for
// `first_fence!` (a new record's fence); then `slots`, for `slot_tables!`.
#[macro_use]
mod clock;
#[macro_use]
mod sweep;
#[macro_use]
mod slots;
// `queue` before `sql`, for `queued_ahead!` and `queue_head!`.
#[macro_use]
mod queue;
mod kind;
mod rwlock;
mod semaphore;
mod sql;

use busy::acquire_on;
pub(crate) use errors::classify;
use errors::{busy, is_locked, write_locked};
use sql::{info_from_row, Query, FORCE_RELEASE, INSPECT, LIST, RENEW, WAS_LIVE};

/// Lock store in an SQLite database file.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    pool: SqlitePool,
    path: PathBuf,
    wake: SharedWakeDir,
    /// The connection's busy timeout outside acquisitions.
    busy_timeout: Duration,
    /// When the next pass over idle records is due (see `sweep.rs`).
    sweeper: Arc<sweep::Sweeper>,
}

impl Backend for SqliteBackend {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        match req.permit_kind().map(|kind| kind.rw_side()) {
            None => {
                let wake = self.wake.clone();
                self.bounded_acquire(req, move |conn, req| acquire_on(conn, req, wake))
            }
            Some(None) => self.bounded_acquire(req, semaphore::acquire_on),
            Some(Some(side)) => {
                self.bounded_acquire(req, move |conn, req| rwlock::acquire_on(conn, req, side))
            }
        }
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                return self.renew_slot(slot_tables(lease), lease, ttl).await;
            }
            let renew = sqlx::query(RENEW)
                .bind(lease.key().as_str())
                .bind(lease.owner().to_string())
                .bind(token_to_i64(lease.token())?)
                .bind(duration_to_millis(ttl));
            self.run_renew(renew).await
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if lease.slot().is_some() {
                return self.release_slot(slot_tables(lease), lease).await;
            }
            self.release_mutex(lease).await
        })
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Box::pin(async move {
            let row = sqlx::query(INSPECT)
                .bind(key.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(classify)?;
            row.as_ref().map(info_from_row).transpose()
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Box::pin(async move {
            let rows = sqlx::query(LIST)
                .bind(prefix)
                .fetch_all(&self.pool)
                .await
                .map_err(classify)?;
            let mutexes = rows.iter().map(info_from_row).collect::<Result<_>>()?;
            let permits = self.list_slots(&semaphore::TABLES, prefix).await?;
            let rw = self.list_slots(&rwlock::TABLES, prefix).await?;
            Ok(listing(mutexes, permits.into_iter().chain(rw)))
        })
    }

    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            // BEGIN IMMEDIATE takes the write lock first, so the liveness read
            // and the update are one atomic step.
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(classify)?;
            let anchor: Option<(Option<String>, Option<bool>)> = sqlx::query_as(WAS_LIVE)
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(classify)?;
            let Some((kind, mutex_live)) = anchor else {
                return Ok(false);
            };
            // One key is one lock: whatever holds it is broken.
            let was_live = match kind::decode(key, kind.as_deref())? {
                KeyKind::Mutex => {
                    sqlx::query(FORCE_RELEASE)
                        .bind(key.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                    mutex_live == Some(true)
                }
                KeyKind::Semaphore => {
                    slots::force_release(&mut tx, &semaphore::TABLES, key.as_str()).await?
                }
                KeyKind::ReaderWriter => {
                    sqlx::query(rwlock::UNMARK)
                        .bind(key.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                    slots::force_release(&mut tx, &rwlock::TABLES, key.as_str()).await?
                }
            };
            tx.commit().await.map_err(classify)?;
            self.wake.wake(key);
            Ok(was_live)
        })
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async move { Ok(self.wake.subscribe(key)) })
    }

    /// A datagram to every process's wake socket, as a release sends.
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.wake.wake(key);
            Ok(true)
        })
    }

    fn queues(&self) -> bool {
        true
    }

    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.leave_queue_of(key, owner))
    }
}

/// A semaphore permit's tables, or an rw lock grant's.
fn slot_tables(lease: &Lease) -> &'static slots::SlotTables {
    match lease.rw_side() {
        Some(_) => &rwlock::TABLES,
        None => &semaphore::TABLES,
    }
}

#[cfg(test)]
mod tests {
    use super::busy::BoundedBusy;
    use super::*;
    use crate::error::Error;
    use crate::lock::Locks;

    #[tokio::test]
    async fn a_missing_directory_is_refused_and_not_created() {
        let tmp = tempfile::tempdir().unwrap();
        let typo = tmp.path().join("lcoks");
        let url = format!("sqlite://{}/locks.db", typo.display());
        let error = Locks::open(&url).await.unwrap_err();
        assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
        let text = error.to_string();
        assert!(
            text.contains(&format!("directory {} of ", typo.display()))
                && text.contains("does not exist: create it first"),
            "{text}"
        );
        assert!(!typo.exists(), "no directory is created");

        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let url = format!("sqlite://{}/locks.db", file.display());
        let text = Locks::open(&url).await.unwrap_err().to_string();
        assert!(text.contains("is not a directory"), "{text}");

        // An existing directory is all it needs.
        let url = format!("sqlite://{}/locks.db", tmp.path().display());
        let locks = Locks::open(&url).await.unwrap();
        locks
            .try_acquire("k")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    std::thread_local! {
        /// Fails the next setting of a busy timeout on this thread.
        pub(super) static FAIL_SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A grant whose connection cannot get its busy timeout back is still
    /// the caller's (the connection is closed): before, the error replaced
    /// the grant, which the store then held for its ttl with no guard.
    #[tokio::test]
    async fn a_grant_survives_a_failed_busy_timeout_restore() {
        let tmp = tempfile::tempdir().unwrap();
        let backend = SqliteBackend::open(tmp.path().join("x.db")).await.unwrap();
        let key = Key::new("k").unwrap();
        let req = AcquireRequest::new(key.clone(), Duration::from_secs(30), "h").unwrap();
        // `BoundedBusy::new` sets the bound; the restore after the grant
        // is the next `set`.
        let conn = BoundedBusy::new(&backend.pool, &req).await.unwrap();
        FAIL_SET.with(|fail| fail.set(true));
        assert!(
            conn.restore(backend.busy_timeout).await.is_err(),
            "the hook fails a restore"
        );
        FAIL_SET.with(|fail| fail.set(false));

        let acquire = backend.bounded_acquire(&req, |conn, req| {
            FAIL_SET.with(|fail| fail.set(true));
            acquire_on(conn, req, backend.wake.clone())
        });
        let answer = acquire.await;
        FAIL_SET.with(|fail| fail.set(false));
        let Ok(Acquire::Granted(lease)) = answer else {
            panic!("the grant is the caller's: {answer:?}");
        };
        let info = backend.inspect(&key).await.unwrap().expect("held");
        assert_eq!(info.token, lease.token());
        backend.release(&lease).await.unwrap();
        assert!(
            backend.inspect(&key).await.unwrap().is_none(),
            "released by its guard"
        );
        // The next acquisition runs on a connection with its timeout set.
        let again = AcquireRequest::new(key, Duration::from_secs(30), "h").unwrap();
        assert!(matches!(
            backend.try_acquire(&again).await,
            Ok(Acquire::Granted(_))
        ));
    }
}
