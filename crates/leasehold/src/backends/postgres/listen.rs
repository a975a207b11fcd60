//! The separate `LISTEN` connection of a pooled [`PostgresBackend`](super::PostgresBackend)
//! (`max_connections` above 1, `from_pool`, a listen URL, a transaction
//! pooler; at the defaults `session.rs` listens on the process's one
//! connection instead), run by the core's notifier engine (`notifier.rs`):
//! started by the first waiter, shared by every backend on the same listen
//! URL in the process (see `shared.rs`), reconnected with a backoff of 1 s
//! to 30 s after failed attempts, and waking every waiter once `LISTEN` is
//! back after a gap.

use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::Connection;

use super::names::CHANNEL;
use crate::backend::BoxFuture;
use crate::error::BoxError;
use crate::key::Key;
use crate::notifier::{Feed, News, Notifier, Refused, Source, Timing};
use crate::notify::{HandOff, Subscription};
use crate::owner::OwnerId;

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

/// How patient the engine is with the listening connection.
const TIMING: Timing = Timing {
    // How long a waiter waits for the first LISTEN connection.
    first_wait: Duration::from_secs(5),
    // A server (or pooler) that accepts but never answers must not stall
    // the task forever.
    connect_timeout: Duration::from_secs(10),
    // Many processes must not keep a full server busy refusing them.
    after_failure: (Duration::from_secs(1), Duration::from_secs(30)),
    after_drop: (Duration::from_millis(100), Duration::from_secs(5)),
};

/// The listener of a pooled backend: the engine, or nothing (behind a
/// transaction pooler without a listen URL: waiters poll).
#[derive(Debug)]
pub(super) enum Listener {
    Listening(Notifier),
    Nowhere,
}

impl Listener {
    pub(super) fn new(source: ListenSource) -> Self {
        match source {
            ListenSource::None => Listener::Nowhere,
            source => Listener::Listening(Notifier::new(Listen(source), TIMING)),
        }
    }

    /// Wakes this process's waiters of `key` now, without waiting for the
    /// notification to come back from the server.
    pub(super) fn wake_local(&self, key: &Key) {
        if let Listener::Listening(notifier) = self {
            notifier.wake_local(key.as_str());
        }
    }

    /// Tells this process's waiter of `key` registered as `owner` (if it
    /// is here) of a grant handed over to it, before the notification
    /// comes back from the server.
    pub(super) fn hand_over_local(&self, key: &Key, owner: OwnerId, grant: HandOff) {
        if let Listener::Listening(notifier) = self {
            notifier.hand_over_local(key.as_str(), owner, grant);
        }
    }

    /// Registers a waiter for `key`: live once `LISTEN` is in place, a
    /// subscription that never fires (the waiter polls) otherwise.
    pub(super) async fn subscribe(&self, key: &Key) -> Subscription {
        match self {
            Listener::Listening(notifier) => notifier.subscribe(key.as_str()).await,
            Listener::Nowhere => {
                if !TOLD_WHY_POLLING.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        target: WAKEUP_TARGET,
                        "PostgreSQL behind a transaction-mode pooler without listen_url: LISTEN needs \
                         a session, so waiters poll until the holder's ttl ends; add \
                         ?listen_url=postgres://... (the server, past the pooler) to be woken at release"
                    );
                }
                Subscription::never()
            }
        }
    }
}

/// The `tracing` target of the warning that waiters poll instead of being
/// woken (a transaction pooler without `listen_url`): a stable name, so an
/// application (and the CLI, at its default level) can show it even when
/// it silences the rest of the library.
pub const WAKEUP_TARGET: &str = "leasehold::wakeup";

/// How long the listening connection may take to open before the listener
/// asks the server directly whether it refuses connections: sqlx's pool
/// retries a refusal (`too many clients`) in silence, several times a
/// second, until its timeout.
const SUSPECT_AFTER: Duration = Duration::from_millis(250);

/// The engine's source: `LISTEN` on a connection from the pool or the URL.
struct Listen(ListenSource);

impl Source for Listen {
    fn connect(&self, retrying: bool) -> BoxFuture<'_, Result<Box<dyn Feed>, Refused>> {
        Box::pin(async move {
            match connect(&self.0, retrying).await {
                Ok(listener) => Ok(Box::new(Notifications(listener)) as Box<dyn Feed>),
                // The backend's pool was closed: nothing to listen with.
                Err(sqlx::Error::PoolClosed) => Err(Refused::Never("the pool is closed".into())),
                Err(e) => Err(Refused::Retry(Box::new(e))),
            }
        })
    }
}

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
                .acquire_timeout(TIMING.connect_timeout)
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

/// The notifications of one `LISTEN` connection.
struct Notifications(PgListener);

impl Feed for Notifications {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<News, BoxError>>> {
        Box::pin(async move {
            Some(match self.0.try_recv().await {
                Ok(Some(notification)) => Ok(News::Released(notification.payload().to_owned())),
                // The connection dropped and sqlx has already reconnected and
                // re-issued LISTEN (eager reconnect): what was announced in
                // between is lost.
                Ok(None) => Ok(News::Gap),
                // An error message before the connection closes (e.g. 57P01
                // on pg_terminate_backend), a failed reconnect, a closed
                // pool: start over with a new listener.
                Err(e) => Err(Box::new(e) as BoxError),
            })
        })
    }
}
