//! The one `LISTEN` connection of a [`PostgresBackend`](super::PostgresBackend),
//! shared by all its waiters through a [`WakeHub`].
//!
//! Started on the first `subscribe`, so a process that never waits never
//! holds a listening connection. If the connection drops, sqlx's
//! `PgListener` reconnects and re-issues `LISTEN`; releases announced while
//! it was down are lost, so every waiter is woken to retry at once. While it
//! cannot reconnect, waiters still wake at the holder's expiry or their
//! polling backoff (see `Locks::acquire_with`).

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::task::JoinHandle;

use super::sql::CHANNEL;
use crate::key::Key;
use crate::notify::{Subscription, WakeHub};
use crate::time::Backoff;

/// Where the listening connection comes from.
#[derive(Clone)]
pub(super) enum ListenSource {
    /// A connection taken from the backend's pool (and kept).
    Pool(PgPool),
    /// A dedicated URL: for a pool behind PgBouncer in transaction mode,
    /// where `LISTEN` needs a direct (or session-mode) connection.
    Url(String),
}

/// By hand: the URL's password stays out of `{:?}`.
impl std::fmt::Debug for ListenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenSource::Pool(pool) => f.debug_tuple("Pool").field(pool).finish(),
            ListenSource::Url(url) => f
                .debug_tuple("Url")
                .field(&crate::redact::redact_url(url))
                .finish(),
        }
    }
}

#[derive(Debug)]
pub(super) struct Listener {
    source: ListenSource,
    hub: WakeHub,
    task: tokio::sync::Mutex<Option<AbortOnDrop>>,
}

/// Stops the listening task when the last clone of the backend goes.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Listener {
    pub(super) fn new(source: ListenSource) -> Self {
        Listener {
            source,
            hub: WakeHub::new(),
            task: tokio::sync::Mutex::new(None),
        }
    }

    /// Wakes this process's waiters of `key` now, without waiting for the
    /// notification to come back from the server.
    pub(super) fn wake_local(&self, key: &Key) {
        self.hub.notify(key.as_str());
    }

    /// Registers a waiter for `key` once `LISTEN` is in place, so no release
    /// committed after this returns is missed. Falls back to a subscription
    /// that never fires (waiters poll) if listening is impossible.
    pub(super) async fn subscribe(&self, key: &Key) -> Subscription {
        let mut task = self.task.lock().await;
        // Start listening, or restart after the connection dropped.
        if task.as_ref().is_none_or(|t| t.0.is_finished()) {
            match self.start().await {
                Ok(listener) => {
                    let hub = self.hub.clone();
                    *task = Some(AbortOnDrop(tokio::spawn(receive(listener, hub))));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot LISTEN for releases; waiters will poll");
                    return Subscription::never();
                }
            }
        }
        self.hub.subscribe(key.as_str())
    }

    async fn start(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = match &self.source {
            ListenSource::Pool(pool) => PgListener::connect_with(pool).await?,
            ListenSource::Url(url) => PgListener::connect(url).await?,
        };
        listener.listen(CHANNEL).await?;
        Ok(listener)
    }
}

async fn receive(mut listener: PgListener, hub: WakeHub) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                hub.notify(notification.payload());
                backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
            }
            // The connection dropped and sqlx re-established it (and its
            // LISTEN): anything announced in between is lost.
            Ok(None) => {
                tracing::info!("LISTEN connection re-established; waking all waiters");
                hub.notify_all();
            }
            Err(sqlx::Error::PoolClosed) => {
                tracing::debug!("pool closed; LISTEN task ends, waiters will poll");
                hub.notify_all();
                return;
            }
            // An error message before the connection closes (e.g. 57P01 on
            // pg_terminate_backend) or a failed reconnect: the next call
            // reads EOF and reconnects, or tries to connect again.
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                hub.notify_all();
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}
