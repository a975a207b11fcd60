//! Taking a data connection for one statement, failing fast when the
//! server refuses new connections.
//!
//! sqlx's pool retries a connection refused with `too many clients`
//! (53300) or `connection refused` in silence until the acquire timeout,
//! then says only "pool timed out". A lock operation should instead tell
//! its caller at once, with the cause, that it may retry: so when no
//! connection comes quickly although not all of ours are busy (the pool
//! must then be opening one), one direct attempt asks the server why.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Postgres};

use super::classify;
use crate::error::Result;

/// How long a connection may take before the pool is suspected of
/// retrying a refusal: several local connects, one slow remote one.
const SUSPECT_AFTER: Duration = Duration::from_millis(250);
/// Bound on the direct attempt.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The backend's pool, and how many of its connections our operations hold.
#[derive(Debug)]
pub(super) struct Checkout {
    pool: PgPool,
    busy: Arc<AtomicUsize>,
    probe: tokio::sync::Mutex<()>,
}

/// A pooled connection held by one operation.
pub(super) struct DataConn {
    conn: PoolConnection<Postgres>,
    busy: Arc<AtomicUsize>,
}

impl Drop for DataConn {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Deref for DataConn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for DataConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Checkout {
    pub(super) fn new(pool: PgPool) -> Self {
        Checkout {
            pool,
            busy: Arc::new(AtomicUsize::new(0)),
            probe: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A connection for one operation.
    ///
    /// # Errors
    /// [`Error::Unavailable`](crate::Error::Unavailable) naming the cause
    /// (`too many clients`, refused) soon after the server refuses a new
    /// connection; the pool's timeout otherwise.
    pub(super) async fn get(&self) -> Result<DataConn> {
        let acquire = self.pool.acquire();
        tokio::pin!(acquire);
        let conn = tokio::select! {
            biased;
            conn = &mut acquire => conn.map_err(classify)?,
            () = tokio::time::sleep(SUSPECT_AFTER) => {
                // Not every connection is busy with our operations, so the
                // pool is opening one (even with an idle one back by now:
                // sqlx does not switch to it).
                let size = self.pool.options().get_max_connections() as usize;
                if self.busy.load(Ordering::Relaxed) < size {
                    self.ask_server().await?;
                }
                acquire.await.map_err(classify)?
            }
        };
        self.busy.fetch_add(1, Ordering::Relaxed);
        Ok(DataConn {
            conn,
            busy: self.busy.clone(),
        })
    }

    /// One direct connection attempt: its refusal is the operation's error;
    /// if it succeeds the server has room and the pool's attempt goes on.
    /// One at a time, so a burst of operations makes one extra attempt.
    async fn ask_server(&self) -> Result<()> {
        let _one = self.probe.lock().await;
        let options = self.pool.connect_options();
        match tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(&options)).await {
            Ok(Err(e)) => Err(classify(e)),
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
            Err(_) => Ok(()),
        }
    }
}
