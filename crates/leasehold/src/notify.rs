//! Release notifications inside one process: the [`Subscription`] a waiter
//! holds, and the [`WakeHub`] a backend feeds when it learns of a release.
//!
//! Backends differ only in how the news of a release reaches the process
//! (a direct call, `LISTEN/NOTIFY`, pub/sub, a datagram); from there on every
//! backend hands it to one `WakeHub`, which fans it out to the waiters of that
//! key.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// A waiter's registration for release notifications of one key.
///
/// Created before the waiter's acquisition attempt, so a release that
/// happens between the attempt and the wait is not missed.
pub struct Subscription {
    rx: Option<watch::Receiver<u64>>,
    // Dropped after `rx` (field order), so cleanup sees the receiver gone.
    _cleanup: Option<Box<dyn Any + Send + Sync>>,
}

impl Subscription {
    /// A subscription that never fires: the backend cannot notify, and
    /// waiters poll.
    pub fn never() -> Self {
        Subscription {
            rx: None,
            _cleanup: None,
        }
    }

    /// Whether this subscription can fire at all.
    pub fn is_live(&self) -> bool {
        self.rx.is_some()
    }

    /// Resolves at the next release notification since the last call (or
    /// since the subscription was made). Pending forever for
    /// [`Subscription::never`] or once the notifier is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: a notification that arrives while the future is dropped
    /// is kept for the next call.
    pub async fn notified(&mut self) {
        match &mut self.rx {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("live", &self.is_live())
            .finish()
    }
}

/// Per-process fan-out of release notifications to the waiters of each key.
///
/// Cheap to clone; clones share the same waiters.
#[derive(Clone, Default)]
pub struct WakeHub {
    keys: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
}

impl WakeHub {
    /// An empty hub.
    pub fn new() -> Self {
        WakeHub::default()
    }

    /// Registers a waiter for `key`.
    pub fn subscribe(&self, key: &str) -> Subscription {
        let rx = {
            let mut keys = self.lock();
            keys.entry(key.to_owned())
                .or_insert_with(|| watch::channel(0).0)
                .subscribe()
        };
        Subscription {
            rx: Some(rx),
            _cleanup: Some(Box::new(Unsubscribe {
                hub: self.clone(),
                key: key.to_owned(),
            })),
        }
    }

    /// Wakes every waiter of `key`. Returns whether anyone was waiting.
    pub fn notify(&self, key: &str) -> bool {
        let keys = self.lock();
        match keys.get(key) {
            Some(tx) => {
                tx.send_modify(|generation| *generation = generation.wrapping_add(1));
                true
            }
            None => false,
        }
    }

    /// Wakes every waiter of every key; returns how many keys had waiters.
    ///
    /// For a backend that may have missed notifications (its listening
    /// connection dropped): a spurious wake costs a waiter one retry, a
    /// missed one costs it a polling interval.
    pub fn notify_all(&self) -> usize {
        let keys = self.lock();
        for tx in keys.values() {
            tx.send_modify(|generation| *generation = generation.wrapping_add(1));
        }
        keys.len()
    }

    /// Whether any waiter of `key` exists in this process.
    pub fn is_watched(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// How many keys have waiters in this process (a notifier may close its
    /// connection when none has).
    pub fn watched_keys(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (every update is a single insert or remove), so poison is ignored.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for WakeHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeHub")
            .field("watched_keys", &self.lock().len())
            .finish()
    }
}

/// Removes a key's channel when its last waiter goes, so the hub does not
/// grow with every key ever waited for.
struct Unsubscribe {
    hub: WakeHub,
    key: String,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let mut keys = self.hub.lock();
        if keys
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn notify_reaches_waiters_of_that_key_only() {
        let hub = WakeHub::new();
        let mut a = hub.subscribe("a");
        let mut b = hub.subscribe("b");
        assert!(hub.notify("a"));
        tokio::time::timeout(Duration::from_secs(1), a.notified())
            .await
            .expect("waiter of a is woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), b.notified())
                .await
                .is_err(),
            "waiter of b must not be woken"
        );
    }

    #[tokio::test]
    async fn notification_before_wait_is_kept() {
        let hub = WakeHub::new();
        let mut s = hub.subscribe("k");
        hub.notify("k");
        tokio::time::timeout(Duration::from_secs(1), s.notified())
            .await
            .unwrap();
    }

    #[test]
    fn last_waiter_leaving_removes_the_key() {
        let hub = WakeHub::new();
        let s1 = hub.subscribe("k");
        let s2 = hub.subscribe("k");
        drop(s1);
        assert!(hub.is_watched("k"));
        drop(s2);
        assert!(!hub.is_watched("k"));
        assert!(!hub.notify("k"));
    }

    #[tokio::test]
    async fn notify_all_reaches_every_key() {
        let hub = WakeHub::new();
        let mut a = hub.subscribe("a");
        let mut b = hub.subscribe("b");
        assert_eq!(hub.notify_all(), 2);
        for s in [&mut a, &mut b] {
            tokio::time::timeout(Duration::from_secs(1), s.notified())
                .await
                .expect("woken");
        }
    }

    #[tokio::test]
    async fn never_stays_pending() {
        let mut s = Subscription::never();
        assert!(!s.is_live());
        assert!(
            tokio::time::timeout(Duration::from_millis(10), s.notified())
                .await
                .is_err()
        );
    }
}
