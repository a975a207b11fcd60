//! The one `LISTEN` connection of a listen URL in this process, shared by
//! the waiters of every [`PostgresBackend`](super::PostgresBackend) on it
//! through a [`WakeHub`].
//!
//! Started on the first `subscribe`, so a process that never waits never
//! holds a listening connection. If the connection drops, sqlx's
//! `PgListener` reconnects and re-issues `LISTEN`; releases announced while
//! it was down are lost, so every waiter is woken to retry at once. While it
//! cannot reconnect, waiters still wake at the holder's expiry or their
//! polling backoff (see `Locks::acquire_with`). A listener that cannot
//! start (the server refuses connections) tries again only after a backoff
//! of 1 s doubling to 30 s; meanwhile waiters poll.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::Connection;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
    /// After a failed start: when to try again, and the backoff after that.
    retry: std::sync::Mutex<Option<(Instant, Backoff)>>,
}

/// How long the listener's own connection may take to open: its pool
/// would otherwise retry a refusal for sqlx's default 30 s while the
/// waiters queue behind it.
const LISTEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the first connection may take before the listener asks the
/// server directly whether it refuses connections.
const SUSPECT_AFTER: Duration = Duration::from_millis(250);

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
            retry: std::sync::Mutex::new(None),
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
            if self.backing_off() {
                return Subscription::never();
            }
            match self.start().await {
                Ok(listener) => {
                    let hub = self.hub.clone();
                    *task = Some(AbortOnDrop(tokio::spawn(receive(listener, hub))));
                    *self.retry_state() = None;
                }
                Err(e) => {
                    let delay = self.back_off();
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot LISTEN for releases; waiters will poll");
                    return Subscription::never();
                }
            }
        }
        self.hub.subscribe(key.as_str())
    }

    fn retry_state(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Backoff)>> {
        self.retry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the last start failed too recently to try again.
    fn backing_off(&self) -> bool {
        self.retry_state()
            .as_ref()
            .is_some_and(|(at, _)| Instant::now() < *at)
    }

    /// Schedules the next start after a failure; returns the delay.
    fn back_off(&self) -> Duration {
        let mut retry = self.retry_state();
        let (_, backoff) = retry.get_or_insert_with(|| {
            (
                Instant::now(),
                Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
            )
        });
        let delay = backoff.next_delay();
        *retry = Some((Instant::now() + delay, backoff.clone()));
        delay
    }

    async fn start(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = match &self.source {
            ListenSource::Pool(pool) => PgListener::connect_with(pool).await?,
            ListenSource::Url(url) => {
                let options = PgConnectOptions::from_str(url)?;
                if self.retry_state().is_some() {
                    // After a failure, one direct attempt first: the pool
                    // below would retry a refusal (`too many clients`)
                    // several times a second until its timeout. Not on the
                    // first start, where it would cost a connection more.
                    PgConnection::connect_with(&options).await?.close().await?;
                }
                // A pool of one that is never reaped: the listening session.
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .min_connections(0)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .acquire_timeout(LISTEN_CONNECT_TIMEOUT)
                    .connect_lazy_with(options.clone());
                let listen = PgListener::connect_with(&pool);
                tokio::pin!(listen);
                tokio::select! {
                    biased;
                    listener = &mut listen => listener?,
                    () = tokio::time::sleep(SUSPECT_AFTER) => {
                        // Slow: maybe the pool is retrying refusals in
                        // silence. One direct attempt tells.
                        PgConnection::connect_with(&options).await?.close().await?;
                        listen.await?
                    }
                }
            }
        };
        listener.listen(CHANNEL).await?;
        Ok(listener)
    }
}

async fn receive(mut listener: PgListener, hub: WakeHub) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                hub.notify(notification.payload());
                backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
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
