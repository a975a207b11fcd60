//! The one `LISTEN` connection of a [`PostgresBackend`](super::PostgresBackend),
//! shared by all its waiters through a [`WakeHub`].
//!
//! Started on the first `subscribe`, so a process that never waits never
//! holds a listening connection. A background task owns it: it connects
//! (checking a connection out of the pool, or dialling the listen URL),
//! issues `LISTEN`, forwards notifications, and after a failure connects
//! again. No waiter ever waits on that checkout while holding a lock: a
//! waiter waits only for the first connection, for at most
//! [`FIRST_CONNECTION_WAIT`] (and never past its own deadline, see
//! `Locks::acquire_with`), and polls if it is not there by then or an
//! attempt has failed.
//!
//! One listener serves every backend on the same listen URL in the process
//! (see `shared.rs`). Failed connection attempts back off from 1 s to 30 s,
//! one attempt each.
//!
//! Releases announced while the connection is down are lost, so every
//! waiter is woken each time `LISTEN` is back in place: not before (a waiter
//! woken earlier could retry, find the key still held, and then miss the
//! release that follows while nobody listens).

use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::Connection;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use super::sql::CHANNEL;
use crate::key::Key;
use crate::notify::{Subscription, WakeHub};
use crate::time::Backoff;

/// How long a waiter waits for the first `LISTEN` connection before it
/// polls instead.
const FIRST_CONNECTION_WAIT: Duration = Duration::from_secs(5);
/// How long one attempt to connect and `LISTEN` may take: a server (or a
/// pooler) that accepts but never answers must not stall the task forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the listening connection comes from.
#[derive(Clone)]
pub(super) enum ListenSource {
    /// A connection taken from the backend's pool (and kept).
    Pool(PgPool),
    /// A dedicated URL: for a pool behind PgBouncer in transaction mode,
    /// where `LISTEN` needs a direct (or session-mode) connection.
    Url(String),
    /// Nowhere: the pool is behind a transaction-mode pooler and no listen
    /// URL was given. Waiters poll.
    None,
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
            ListenSource::None => f.write_str("None"),
        }
    }
}

/// Whether this process has said why its waiters poll (said once: every
/// waiter would say the same).
static TOLD_WHY_POLLING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The state of the listening connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// The first connection is being made.
    Connecting,
    /// `LISTEN` is in place.
    Up,
    /// The last attempt failed or the connection dropped; retrying.
    Down,
}

#[derive(Debug)]
pub(super) struct Listener {
    source: ListenSource,
    hub: WakeHub,
    task: std::sync::Mutex<Option<Running>>,
}

/// The listening task and its reported state. Stops the task when the last
/// clone of the backend goes.
#[derive(Debug)]
struct Running {
    task: JoinHandle<()>,
    link: watch::Receiver<Link>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    pub(super) fn new(source: ListenSource) -> Self {
        Listener {
            source,
            hub: WakeHub::new(),
            task: std::sync::Mutex::new(None),
        }
    }

    /// Wakes this process's waiters of `key` now, without waiting for the
    /// notification to come back from the server.
    pub(super) fn wake_local(&self, key: &Key) {
        self.hub.notify(key.as_str());
    }

    /// Registers a waiter for `key`. Live once `LISTEN` is in place, so no
    /// release committed after this returns is missed; a subscription that
    /// never fires (the waiter polls) if listening is impossible right now.
    pub(super) async fn subscribe(&self, key: &Key) -> Subscription {
        if let ListenSource::None = self.source {
            if !TOLD_WHY_POLLING.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "PostgreSQL behind a transaction-mode pooler without listen_url: LISTEN needs \
                     a session, so waiters poll until the holder's ttl ends; add \
                     ?listen_url=postgres://... (the server, past the pooler) to be woken at release"
                );
            }
            return Subscription::never();
        }
        let mut link = self.start_once();
        // Register first: a release between LISTEN and this is then seen.
        let subscription = self.hub.subscribe(key.as_str());
        let up = timeout(
            FIRST_CONNECTION_WAIT,
            link.wait_for(|link| *link != Link::Connecting),
        )
        .await
        .is_ok_and(|r| r.is_ok_and(|link| *link == Link::Up));
        if up {
            subscription
        } else {
            tracing::debug!(%key, "no LISTEN connection; this waiter polls");
            Subscription::never()
        }
    }

    /// Starts the listening task unless it runs (a task of a runtime that
    /// shut down has finished and is started again).
    fn start_once(&self) -> watch::Receiver<Link> {
        let mut running = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = running.as_ref().filter(|r| !r.task.is_finished()) {
            return r.link.clone();
        }
        let (tx, link) = watch::channel(Link::Connecting);
        let task = tokio::spawn(listen(self.source.clone(), self.hub.clone(), tx));
        *running = Some(Running {
            task,
            link: link.clone(),
        });
        link
    }
}

/// How long the listening connection may take to open before the listener
/// asks the server directly whether it refuses connections: sqlx's pool
/// retries a refusal (`too many clients`) in silence, several times a
/// second, until its timeout.
const SUSPECT_AFTER: Duration = Duration::from_millis(250);

/// Connects and listens. After a failed attempt (`retrying`), a URL source
/// first makes one direct attempt, so a server that refuses connections
/// sees one per backoff period, not the pool's retries.
async fn connect(source: &ListenSource, retrying: bool) -> Result<PgListener, sqlx::Error> {
    let mut listener = match source {
        ListenSource::Pool(pool) => PgListener::connect_with(pool).await?,
        ListenSource::Url(url) => {
            let options = PgConnectOptions::from_str(url)?;
            if retrying {
                PgConnection::connect_with(&options).await?.close().await?;
            }
            // A pool of one that is never reaped: the listening session.
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .min_connections(0)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect_lazy_with(options.clone());
            let listen = PgListener::connect_with(&pool);
            tokio::pin!(listen);
            tokio::select! {
                biased;
                listener = &mut listen => listener?,
                () = tokio::time::sleep(SUSPECT_AFTER) => {
                    // Slow: maybe refusals retried in silence. Ask once.
                    PgConnection::connect_with(&options).await?.close().await?;
                    listen.await?
                }
            }
        }
        ListenSource::None => return Err(sqlx::Error::PoolClosed),
    };
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Connects, listens, forwards; after a failure, connects again.
async fn listen(source: ListenSource, hub: WakeHub, link: watch::Sender<Link>) {
    let fresh = || Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut backoff = fresh();
    // After failed attempts (the server refuses or is down) the listener
    // backs off from 1 s to 30 s: many processes must not keep a full
    // server busy refusing them.
    let refused = || Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut after_failure = refused();
    let mut failed = false;
    loop {
        match timeout(CONNECT_TIMEOUT, connect(&source, failed)).await {
            Ok(Ok(mut listener)) => {
                // Waiters that came while the first connection was being
                // made retry right after subscribing anyway; after an
                // outage, everyone may have missed a release.
                if link.send_replace(Link::Up) == Link::Down {
                    let woken = hub.notify_all();
                    tracing::info!(woken, "LISTEN back in place; waking all waiters");
                }
                backoff = fresh();
                after_failure = refused();
                failed = false;
                match forward(&mut listener, &hub).await {
                    Ended::PoolClosed => {
                        tracing::debug!("pool closed; LISTEN task ends, waiters will poll");
                        link.send_replace(Link::Down);
                        hub.notify_all();
                        return;
                    }
                    Ended::Failed(e) => {
                        tracing::warn!(error = %e, "LISTEN connection failed; reconnecting")
                    }
                }
            }
            Ok(Err(sqlx::Error::PoolClosed)) => {
                link.send_replace(Link::Down);
                return;
            }
            Ok(Err(e)) => {
                failed = true;
                tracing::warn!(error = %e, "cannot LISTEN for releases; waiters poll");
            }
            Err(_) => {
                failed = true;
                tracing::warn!("LISTEN connection not made within 10s; waiters poll");
            }
        }
        link.send_replace(Link::Down);
        let delay = if failed {
            after_failure.next_delay()
        } else {
            backoff.next_delay()
        };
        tokio::time::sleep(delay).await;
    }
}

enum Ended {
    PoolClosed,
    Failed(sqlx::Error),
}

/// Forwards notifications until the connection fails for good.
async fn forward(listener: &mut PgListener, hub: &WakeHub) -> Ended {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                hub.notify(notification.payload());
            }
            // The connection dropped and sqlx has already reconnected and
            // re-issued LISTEN (eager reconnect): what was announced in
            // between is lost, and LISTEN is back, so wake everyone now.
            Ok(None) => {
                let woken = hub.notify_all();
                tracing::info!(
                    woken,
                    "LISTEN connection re-established; waking all waiters"
                );
            }
            Err(sqlx::Error::PoolClosed) => return Ended::PoolClosed,
            // An error message before the connection closes (e.g. 57P01 on
            // pg_terminate_backend) or a failed reconnect: start over with
            // a new listener, and wake waiters once it listens.
            Err(e) => return Ended::Failed(e),
        }
    }
}
