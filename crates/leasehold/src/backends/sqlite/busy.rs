//! An acquisition's bound on SQLite's busy timeout: the wait for another
//! connection's write lock follows the caller's wait, and the mutex's
//! acquire statements run under it.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool};

use super::busy_wait::{set_busy_wait, BusyWait};
use super::queue::{queued_attempt, HELD_BY, LEAVE};
use super::sql::{Query, ACQUIRE, BUSY_INFO, RELEASE};
use super::wake::{SharedWakeDir, WakeDir};
use super::{busy, classify, is_locked, write_locked, SqliteBackend, STORE};
use crate::backend::{
    duration_to_millis, token_to_i64, Acquire, AcquireRequest, BoxFuture, KeyKind, Lease, OwnerId,
    RecordDecoder, TRY_ONCE_LOCK_WAIT,
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
            self.sweeper.poke(&self.pool);
        }
        Ok(())
    }

    /// Runs a mutex's `RELEASE`: a key handed over to the head of its
    /// queue wakes that waiter alone (its entry deleted), a freed key
    /// every waiter.
    pub(super) async fn release_mutex(&self, lease: &Lease) -> Result<()> {
        let owner = lease.owner().to_string();
        self.release_held(lease.key(), &owner, token_to_i64(lease.token())?)
            .await
    }

    /// [`Backend::leave_queue`](crate::backend::Backend::leave_queue): the
    /// entry goes, then a grant handed over to `owner` that it still holds
    /// is released (and handed on).
    pub(super) async fn leave_queue_of(&self, key: &Key, owner: OwnerId) -> Result<()> {
        let owner = owner.to_string();
        // Bounded like a try-once attempt: behind another writer's lock
        // the entry is simply left to end with its lease, instead of
        // holding a connection of the pool for the whole busy timeout.
        let mut conn = BoundedBusy::with_timeout(&self.pool, TRY_ONCE_LOCK_WAIT).await?;
        let left = sqlx::query(LEAVE)
            .bind(key.as_str())
            .bind(&owner)
            .execute(&mut *conn.conn())
            .await;
        if let Err(e) = conn.restore(self.busy_timeout).await {
            tracing::debug!(%key, error = %e, "could not restore the busy timeout; connection closed");
        }
        match left {
            Err(e) if is_locked(&e) => return Ok(()),
            other => other.map_err(classify)?,
        };
        let held: Option<i64> = sqlx::query_scalar(HELD_BY)
            .bind(key.as_str())
            .bind(&owner)
            .fetch_optional(&self.pool)
            .await
            .map_err(classify)?;
        match held {
            Some(fence) => self.release_held(key, &owner, fence).await,
            None => Ok(()),
        }
    }

    /// `RELEASE` of `key`'s grant to `owner` with `fence`.
    async fn release_held(&self, key: &Key, owner: &str, fence: i64) -> Result<()> {
        let row: Option<(i64, Option<String>, Option<i64>)> = sqlx::query_as(RELEASE)
            .bind(key.as_str())
            .bind(owner)
            .bind(fence)
            .fetch_optional(&self.pool)
            .await
            .map_err(classify)?;
        let Some((fence, head, ticket)) = row else {
            return Ok(());
        };
        match head {
            None => self.wake.wake(key),
            Some(head) => {
                let record = RecordDecoder::new(STORE, key.as_str());
                let (owner, grant) = record.hand_off(&head, fence, ticket)?;
                self.wake.hand_over(key, owner, grant);
            }
        }
        self.sweeper.poke(&self.pool);
        Ok(())
    }
}

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
            // some of the wait already. A fair waiter's attempt writes its
            // queue entry: it tries for the lock again soon, so that
            // entries land in the order the waiters called (busy_wait.rs).
            let wait = match req.queue_entry_ttl() {
                Some(_) => BusyWait::Prompt,
                None => BusyWait::Sqlite,
            };
            bounded.set(req.lock_wait(), wait).await?;
            Ok(bounded)
        })
    }

    /// A connection whose busy timeout is `timeout`.
    pub(super) fn with_timeout(
        pool: &SqlitePool,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Self>> {
        Box::pin(async move {
            let mut bounded = BoundedBusy {
                conn: Some(pool.acquire().await.map_err(classify)?),
            };
            bounded.set(timeout, BusyWait::Sqlite).await?;
            Ok(bounded)
        })
    }

    pub(super) fn conn(&mut self) -> &mut SqliteConnection {
        self.conn
            .as_mut()
            .expect("connection taken only by restore")
    }

    fn set(&mut self, timeout: Duration, wait: BusyWait) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            #[cfg(test)]
            if super::tests::FAIL_SET.with(|fail| fail.replace(false)) {
                return Err(
                    crate::error::Error::unavailable("injected: busy_timeout not set")
                        .in_store(STORE),
                );
            }
            set_busy_wait(self.conn(), timeout, wait)
                .await
                .map_err(classify)
        })
    }

    /// Puts the backend's own busy timeout back and returns the connection
    /// to the pool.
    pub(super) fn restore(mut self, busy_timeout: Duration) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            self.set(busy_timeout, BusyWait::Sqlite).await?;
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
    wake: SharedWakeDir,
) -> BoxFuture<'a, Result<Acquire>> {
    Box::pin(acquire_statements(conn, req, wake))
}

async fn acquire_statements(
    conn: &mut SqliteConnection,
    req: &AcquireRequest,
    wake: SharedWakeDir,
) -> Result<Acquire> {
    let granted: Option<i64> = match sqlx::query_scalar(ACQUIRE)
        .bind(req.key().as_str())
        .bind(req.owner().to_string())
        .bind(req.holder())
        .bind(duration_to_millis(req.ttl()))
        .fetch_optional(&mut *conn)
        .await
    {
        Ok(granted) => granted,
        Err(e) if is_locked(&e) => return Ok(write_locked()),
        Err(e) => return Err(classify(e)),
    };
    if let Some(fence) = granted {
        let token = RecordDecoder::new(STORE, req.key().as_str()).token(fence)?;
        return Ok(Acquire::Granted(req.granted(token)));
    }
    if req.queue_entry_ttl().is_some() {
        return settle_queued(conn, req, &wake).await;
    }
    let row: Option<(Option<String>, Option<String>, Option<i64>)> = sqlx::query_as(BUSY_INFO)
        .bind(req.key().as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(classify)?;
    let (kind, holder, remaining) = row.unwrap_or_default();
    match super::kind::decode(req.key(), kind.as_deref())? {
        // Free, but refused: waiters are queued ahead, and the key goes
        // to the first of them.
        KeyKind::Mutex if holder.is_none() || remaining.is_some_and(|ms| ms <= 0) => {
            settle_queued(conn, req, &wake).await
        }
        KeyKind::Mutex => Ok(busy(holder, remaining)),
        other => Ok(Acquire::OtherKind(other)),
    }
}

/// [`queued_attempt`], and the head told of a grant handed over to it.
async fn settle_queued(
    conn: &mut SqliteConnection,
    req: &AcquireRequest,
    wake: &WakeDir,
) -> Result<Acquire> {
    let (answer, handed) = queued_attempt(conn, req).await?;
    if let Some(handed) = handed {
        handed.tell(wake, req.key());
    }
    Ok(answer)
}
