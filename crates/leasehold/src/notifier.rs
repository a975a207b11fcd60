//! The notifier engine: the one loop that turns a store's release news into
//! wake-ups, for every store that listens on a connection of its own
//! (PostgreSQL's separate `LISTEN` connection, Redis pub/sub, MongoDB change
//! streams).
//!
//! A store supplies only a [`Source`]: "connect, and yield released keys".
//! The engine does the rest, once: it starts lazily on the first waiter,
//! stops when the last backend using it goes, reports its state so a waiter
//! waits only for the very first connection (bounded) and polls after a
//! failed attempt, reconnects with a backoff (longer after a failed attempt
//! than after a dropped connection, so many processes do not keep a full
//! server busy refusing them), and wakes every waiter once the feed is back
//! after a gap: not before (a waiter woken earlier could retry, find the key
//! still held, and miss the release that follows while nobody listens).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

use crate::backend::BoxFuture;
use crate::error::BoxError;
use crate::notify::{HandOff, Subscription, WakeHub};
use crate::owner::OwnerId;
use crate::time::Backoff;

/// What a feed brings.
#[derive(Debug)]
pub(crate) enum News {
    /// A message of the store's release channel: a released key, or a
    /// hand-off ([`WakeHub::deliver`] reads both).
    Released(String),
    /// News may have been lost (the source reconnected by itself, a queue
    /// overflowed): every waiter should look again.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Gap,
}

/// An open feed of release news.
pub(crate) trait Feed: Send {
    /// The next news; `None` or an error once the connection is lost.
    fn next(&mut self) -> BoxFuture<'_, Option<Result<News, BoxError>>>;
}

/// Why a source could not open its feed.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Try again later (server down, refused, timed out).
    Retry(BoxError),
    /// The store cannot notify here at all: waiters poll from now on.
    #[cfg_attr(not(any(feature = "postgres", feature = "mongodb")), allow(dead_code))]
    Never(BoxError),
}

/// A store's notification channel: connect, and yield released keys.
pub(crate) trait Source: Send + Sync + 'static {
    /// Opens the feed. `retrying` says the last attempt failed (a source
    /// may then try more cheaply first).
    fn connect(&self, retrying: bool) -> BoxFuture<'_, Result<Box<dyn Feed>, Refused>>;
}

/// How patient the engine is with a source.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// How long a waiter waits for the first connection before it polls.
    pub first_wait: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// Backoff after a failed attempt: (first, cap).
    pub after_failure: (Duration, Duration),
    /// Backoff after a feed that ended: (first, cap).
    pub after_drop: (Duration, Duration),
}

/// The state of the feed, as waiters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// The first connection is being made.
    Connecting,
    /// News is heard.
    Up,
    /// The last attempt failed or the feed ended; retrying.
    Down,
    /// The store cannot notify: the engine stopped.
    Never,
}

/// One store's notifier: a [`WakeHub`] and the task that feeds it.
pub(crate) struct Notifier {
    hub: WakeHub,
    source: Arc<dyn Source>,
    timing: Timing,
    running: Mutex<State>,
}

enum State {
    Idle,
    Running(Running),
    /// Stopped by [`Notifier::close`]: waiters poll.
    #[cfg_attr(not(any(feature = "mongodb", feature = "etcd")), allow(dead_code))]
    Closed,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("hub", &self.hub)
            .field("timing", &self.timing)
            .finish()
    }
}

/// The feeding task and its reported state.
struct Running {
    task: AbortOnDrop,
    link: watch::Receiver<Link>,
}

/// A task that stops when its handle goes.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Notifier {
    pub(crate) fn new(source: impl Source, timing: Timing) -> Self {
        Notifier {
            hub: WakeHub::new(),
            source: Arc::new(source),
            timing,
            running: Mutex::new(State::Idle),
        }
    }

    /// Wakes this process's waiters of `key` now, without waiting for the
    /// news to come back from the store.
    pub(crate) fn wake_local(&self, key: &str) {
        self.hub.notify(key);
    }

    /// Tells this process's waiter of `key` registered as `owner` (if it
    /// is here) of a grant handed over to it, without waiting for the
    /// news to come back from the store.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "redis", feature = "mongodb")),
        allow(dead_code)
    )]
    pub(crate) fn hand_over_local(&self, key: &str, owner: OwnerId, grant: HandOff) {
        self.hub.hand_over(key, owner, grant);
    }

    /// Registers a waiter for `key`. Live once the feed is open, so no
    /// release after this returns is missed; a subscription that never fires
    /// (the waiter polls) if the feed is not there (yet, or at all).
    pub(crate) async fn subscribe(&self, key: &str) -> Subscription {
        let mut link = self.start_once();
        // Register first: news between the feed opening and this is seen.
        let subscription = self.hub.subscribe(key);
        let up = timeout(
            self.timing.first_wait,
            link.wait_for(|link| *link != Link::Connecting),
        )
        .await
        .is_ok_and(|r| r.is_ok_and(|link| *link == Link::Up));
        if up {
            subscription
        } else {
            tracing::debug!(key, "no release notifications right now; this waiter polls");
            Subscription::never()
        }
    }

    /// Stops the task and waits until it is gone (with it, whatever the
    /// feed holds on the server). Waiters poll from now on.
    #[cfg_attr(not(any(feature = "mongodb", feature = "etcd")), allow(dead_code))]
    pub(crate) async fn close(&self) {
        let state = std::mem::replace(&mut *self.lock(), State::Closed);
        if let State::Running(mut running) = state {
            running.task.0.abort();
            let _ = (&mut running.task.0).await;
        }
    }

    /// Starts the task unless it runs (a task of a runtime that shut down
    /// has finished and is started again; one that gave up for good has
    /// said so in its link).
    fn start_once(&self) -> watch::Receiver<Link> {
        let mut state = self.lock();
        match &*state {
            State::Running(r) if !r.task.0.is_finished() || *r.link.borrow() == Link::Never => {
                return r.link.clone();
            }
            State::Closed => return watch::channel(Link::Never).1,
            _ => {}
        }
        let (tx, link) = watch::channel(Link::Connecting);
        let task = tokio::spawn(feed(self.source.clone(), self.hub.clone(), tx, self.timing));
        *state = State::Running(Running {
            task: AbortOnDrop(task),
            link: link.clone(),
        });
        link
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Connects, forwards, and after a failure connects again.
async fn feed(source: Arc<dyn Source>, hub: WakeHub, link: watch::Sender<Link>, timing: Timing) {
    let backoff = |(first, cap)| Backoff::new(first, cap);
    let (mut after_failure, mut after_drop) =
        (backoff(timing.after_failure), backoff(timing.after_drop));
    let mut failed = false;
    loop {
        match timeout(timing.connect_timeout, source.connect(failed)).await {
            Ok(Ok(mut news)) => {
                // Waiters that came while the first connection was being
                // made retry right after subscribing anyway; after an
                // outage, everyone may have missed a release.
                if link.send_replace(Link::Up) == Link::Down {
                    let woken = hub.notify_all();
                    tracing::info!(woken, "release notifications back; waking all waiters");
                }
                (after_failure, after_drop) =
                    (backoff(timing.after_failure), backoff(timing.after_drop));
                failed = false;
                loop {
                    match news.next().await {
                        Some(Ok(News::Released(message))) => {
                            hub.deliver(&message);
                        }
                        Some(Ok(News::Gap)) => {
                            let woken = hub.notify_all();
                            tracing::info!(
                                woken,
                                "release notifications may have been lost; waking all waiters"
                            );
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "release notifications lost; reconnecting");
                            break;
                        }
                        None => {
                            tracing::debug!("release notification feed ended; reconnecting");
                            break;
                        }
                    }
                }
            }
            Ok(Err(Refused::Never(e))) => {
                tracing::info!(error = %e, "the store cannot notify releases; waiters poll");
                link.send_replace(Link::Never);
                hub.notify_all();
                return;
            }
            Ok(Err(Refused::Retry(e))) => {
                failed = true;
                tracing::warn!(error = %e, "cannot listen for releases; waiters poll");
            }
            Err(_) => {
                failed = true;
                tracing::warn!(
                    "no release notification connection within {:?}; waiters poll",
                    timing.connect_timeout
                );
            }
        }
        link.send_replace(Link::Down);
        let delay = if failed {
            after_failure.next_delay()
        } else {
            after_drop.next_delay()
        };
        sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::mpsc;

    /// What the fake store does at each connection attempt.
    enum Plan {
        Open(mpsc::UnboundedReceiver<News>),
        Retry,
        Never,
    }

    struct Fake {
        plans: Mutex<VecDeque<Plan>>,
        attempts: Arc<AtomicUsize>,
    }

    struct FakeFeed(mpsc::UnboundedReceiver<News>);

    impl Feed for FakeFeed {
        fn next(&mut self) -> BoxFuture<'_, Option<Result<News, BoxError>>> {
            Box::pin(async move { self.0.recv().await.map(Ok) })
        }
    }

    impl Source for Fake {
        fn connect(&self, _retrying: bool) -> BoxFuture<'_, Result<Box<dyn Feed>, Refused>> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let plan = self.plans.lock().unwrap().pop_front();
            Box::pin(async move {
                match plan {
                    Some(Plan::Open(rx)) => Ok(Box::new(FakeFeed(rx)) as Box<dyn Feed>),
                    Some(Plan::Never) => Err(Refused::Never("no notifications here".into())),
                    // Out of plans: refused, like a server that is down.
                    Some(Plan::Retry) | None => Err(Refused::Retry("refused".into())),
                }
            })
        }
    }

    const QUICK: Timing = Timing {
        first_wait: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        after_failure: (Duration::from_millis(20), Duration::from_millis(20)),
        after_drop: (Duration::from_millis(20), Duration::from_millis(20)),
    };

    fn notifier(plans: Vec<Plan>) -> (Notifier, Arc<AtomicUsize>) {
        let attempts = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            plans: Mutex::new(plans.into()),
            attempts: attempts.clone(),
        };
        (Notifier::new(fake, QUICK), attempts)
    }

    async fn woken(sub: &mut Subscription) -> bool {
        timeout(Duration::from_secs(2), sub.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn news_reaches_its_key_and_a_gap_wakes_everyone_once_back() {
        let (first, first_rx) = mpsc::unbounded_channel();
        let (second, second_rx) = mpsc::unbounded_channel();
        let (n, attempts) = notifier(vec![Plan::Open(first_rx), Plan::Open(second_rx)]);
        let mut a = n.subscribe("a").await;
        let mut b = n.subscribe("b").await;
        assert!(a.is_live() && b.is_live());
        first.send(News::Released("a".into())).unwrap();
        assert!(woken(&mut a).await, "a's release wakes a");
        assert!(
            timeout(Duration::from_millis(50), b.notified())
                .await
                .is_err(),
            "but not b"
        );
        // The feed ends (connection lost); the next one wakes everybody.
        drop(first);
        assert!(woken(&mut b).await, "b is woken once the feed is back");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        second.send(News::Gap).unwrap();
        assert!(woken(&mut a).await, "a gap wakes every waiter");
    }

    #[tokio::test]
    async fn a_refused_first_connection_leaves_waiters_polling_until_a_retry_succeeds() {
        let (_news, rx) = mpsc::unbounded_channel();
        let (n, attempts) = notifier(vec![Plan::Retry, Plan::Open(rx)]);
        assert!(
            !n.subscribe("k").await.is_live(),
            "polls after a failed attempt"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while !n.subscribe("k").await.is_live() {
            assert!(tokio::time::Instant::now() < deadline, "never retried");
            sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_store_that_cannot_notify_is_asked_once_and_close_stops_the_feed() {
        let (n, attempts) = notifier(vec![Plan::Never]);
        assert!(!n.subscribe("k").await.is_live());
        sleep(Duration::from_millis(60)).await;
        assert!(!n.subscribe("k").await.is_live());
        assert_eq!(attempts.load(Ordering::SeqCst), 1, "not asked again");

        let (_news, rx) = mpsc::unbounded_channel();
        let (n, _) = notifier(vec![Plan::Open(rx)]);
        assert!(n.subscribe("k").await.is_live());
        n.close().await;
        assert!(!n.subscribe("k").await.is_live(), "closed: waiters poll");
    }
}
