//! An acquisition's bound on SQLite's busy timeout: the wait for another
//! connection's write lock follows the caller's wait, and the mutex's
//! acquire statements run under it.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool};

use super::sql::{Query, ACQUIRE, BUSY_INFO};
use super::{busy, classify, is_locked, write_locked, SqliteBackend, STORE};
use crate::backend::{
    duration_to_millis, Acquire, AcquireRequest, BoxFuture, KeyKind, RecordDecoder,
};
use crate::error::Result;
use crate::key::Key;

impl SqliteBackend {
    /// Runs `acquire` (a mutex's, a semaphore's or an rw lock's) on a pool
    /// connection whose busy timeout (how long SQLite waits for another
    /// connection's write lock) follows the caller's wait, not the
    /// backend's 5 s: the deadline wins.
    pub(super) fn bounded_acquire<'a, F>(
        &'a self,
        req: &'a AcquireRequest,
        acquire: F,
    ) -> BoxFuture<'a, Result<Acquire>>
    where
        F: for<'c> FnOnce(
                &'c mut SqliteConnection,
                &'c AcquireRequest,
            ) -> BoxFuture<'c, Result<Acquire>>
            + Send
            + 'a,
    {
        Box::pin(async move {
            let mut conn = BoundedBusy::new(&self.pool, req).await?;
            let outcome = acquire(conn.conn(), req).await;
            if let Err(e) = conn.restore(self.busy_timeout).await {
                // The connection is closed instead of pooled (see
                // `BoundedBusy`), so no later statement inherits the short
                // timeout. The answer stands: a grant dropped here would be
                // held at the store for its whole ttl by nobody.
                tracing::debug!(key = %req.key(), error = %e, "could not restore the busy timeout; connection closed");
            }
            outcome
        })
    }

    /// Runs a renew statement (a mutex's, a permit's or an rw lock's): true
    /// if it extended the lease, false if the lease was lost.
    pub(super) async fn run_renew(&self, renew: Query<'_>) -> Result<bool> {
        let done = renew.execute(&self.pool).await.map_err(classify)?;
        Ok(done.rows_affected() == 1)
    }

    /// Runs a release statement, and wakes `key`'s waiters if it freed
    /// the lease (not if the lease was already gone).
    pub(super) async fn run_release(&self, release: Query<'_>, key: &Key) -> Result<()> {
        let done = release.execute(&self.pool).await.map_err(classify)?;
        if done.rows_affected() == 1 {
            self.wake.wake(key);
            // A record may have just gone idle: time for a pass, perhaps.
            self.sweeper.poke(&self.pool);
        }
        Ok(())
    }
}

/// A pool connection whose busy timeout an acquisition has bounded by its
/// caller's wait. Dropped before [`restore`](Self::restore) (the acquire
/// future was cancelled), the connection is closed rather than pooled, so
/// no later statement runs with the short timeout.
pub(super) struct BoundedBusy {
    conn: Option<PoolConnection<Sqlite>>,
}

impl BoundedBusy {
    // Boxed futures here and below: with plain `async fn`s the compiler
    // cannot prove the backend's boxed future `Send` (rust-lang/rust#102211).
    pub(super) fn new<'a>(
        pool: &'a SqlitePool,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Self>> {
        Box::pin(async move {
            let mut bounded = BoundedBusy {
                conn: Some(pool.acquire().await.map_err(classify)?),
            };
            // Measured once the connection is ours: queueing for it spent
            // some of the wait already.
            bounded.set(req.lock_wait()).await?;
            Ok(bounded)
        })
    }

    pub(super) fn conn(&mut self) -> &mut SqliteConnection {
        self.conn
            .as_mut()
            .expect("connection taken only by restore")
    }

    fn set(&mut self, timeout: Duration) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            #[cfg(test)]
            if super::tests::FAIL_SET.with(|fail| fail.replace(false)) {
                return Err(
                    crate::error::Error::unavailable("injected: busy_timeout not set")
                        .in_store(STORE),
                );
            }
            // PRAGMA takes no parameters; the value is an integer, and a
            // non-persistent statement keeps these one-off texts out of the
            // prepared-statement cache.
            let sql = format!("PRAGMA busy_timeout = {}", duration_to_millis(timeout));
            let conn: &mut SqliteConnection = self.conn();
            sqlx::query(&sql)
                .persistent(false)
                .execute(&mut *conn)
                .await
                .map_err(classify)?;
            Ok(())
        })
    }

    /// Puts the backend's own busy timeout back and returns the connection
    /// to the pool.
    pub(super) fn restore(mut self, busy_timeout: Duration) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            self.set(busy_timeout).await?;
            self.conn.take();
            Ok(())
        })
    }
}

impl Drop for BoundedBusy {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

/// The acquire statements on a connection whose busy timeout is bounded.
pub(super) fn acquire_on<'a>(
    conn: &'a mut SqliteConnection,
    req: &'a AcquireRequest,
) -> BoxFuture<'a, Result<Acquire>> {
    Box::pin(acquire_statements(conn, req))
}

async fn acquire_statements(conn: &mut SqliteConnection, req: &AcquireRequest) -> Result<Acquire> {
    let granted: Option<i64> = match sqlx::query_scalar(ACQUIRE)
        .bind(req.key().as_str())
        .bind(req.owner().to_string())
        .bind(req.holder())
        .bind(duration_to_millis(req.ttl()))
        .fetch_optional(&mut *conn)
        .await
    {
        Ok(granted) => granted,
        // Another connection held the write lock for the whole wait: the
        // key cannot be taken now, so it is busy.
        Err(e) if is_locked(&e) => return Ok(write_locked()),
        Err(e) => return Err(classify(e)),
    };
    if let Some(fence) = granted {
        let token = RecordDecoder::new(STORE, req.key().as_str()).token(fence)?;
        return Ok(Acquire::Granted(req.granted(token)));
    }
    // Who holds it is for the waiter's schedule only; if the holder
    // left in between, report zero remaining so it retries at once.
    let row: Option<(Option<String>, Option<String>, Option<i64>)> = sqlx::query_as(BUSY_INFO)
        .bind(req.key().as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(classify)?;
    let (kind, holder, remaining) = row.unwrap_or_default();
    match super::kind::decode(req.key(), kind.as_deref())? {
        KeyKind::Mutex => Ok(busy(holder, remaining)),
        other => Ok(Acquire::OtherKind(other)),
    }
}
