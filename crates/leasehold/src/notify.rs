//! Release notifications inside one process: the [`Subscription`] a waiter
//! holds, and the [`WakeHub`] a backend feeds when it learns of a release.
//!
//! Backends differ only in how the news of a release reaches the process
//! (a direct call, `LISTEN/NOTIFY`, pub/sub, a datagram); from there on every
//! backend hands it to one `WakeHub`, which fans it out to the waiters of that
//! key, or, for a key handed over to the head of its queue (issue 31), to
//! that one waiter only: [`WakeHub::hand_over`] reaches the subscription
//! that registered the head's owner id ([`Subscription::expect_hand_off`])
//! and wakes nobody else.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::owner::OwnerId;

/// A waiter's registration for release notifications of one key.
///
/// Created before the waiter's acquisition attempt, so a release that
/// happens between the attempt and the wait is not missed.
pub struct Subscription {
    rx: Option<watch::Receiver<u64>>,
    /// The grant handed over to this waiter's owner id, once one arrives
    /// (see [`Subscription::expect_hand_off`]).
    inbox: Option<watch::Receiver<Option<HandOff>>>,
    // Dropped after the receivers (field order), so cleanup sees them gone.
    cleanup: Option<Unsubscribe>,
}

impl Subscription {
    /// A subscription that never fires: the backend cannot notify, and
    /// waiters poll.
    pub fn never() -> Self {
        Subscription {
            rx: None,
            inbox: None,
            cleanup: None,
        }
    }

    /// Whether this subscription can fire at all.
    pub fn is_live(&self) -> bool {
        self.rx.is_some()
    }

    /// Registers this waiter as `owner`, the owner id of its requests: a
    /// grant the store hands over to `owner` (the head of the key's queue)
    /// reaches this subscription alone ([`WakeHub::hand_over`]), and
    /// [`hand_off`](Self::hand_off) reads its token. Returns whether it
    /// can arrive at all (not for [`Subscription::never`]). Registering
    /// again replaces the earlier owner.
    pub fn expect_hand_off(&mut self, owner: OwnerId) -> bool {
        let Some(cleanup) = self.cleanup.as_mut() else {
            return false;
        };
        let rx = {
            let mut keys = cleanup.hub.lock();
            let Some(waiters) = keys.get_mut(&cleanup.key) else {
                return false;
            };
            if let Some(earlier) = cleanup.owner.replace(owner) {
                waiters.owners.remove(&earlier);
            }
            let (tx, rx) = watch::channel(None);
            waiters.owners.insert(owner, tx);
            rx
        };
        self.inbox = Some(rx);
        true
    }

    /// The grant handed over to this waiter's owner, if one has arrived.
    pub fn hand_off(&self) -> Option<HandOff> {
        self.inbox.as_ref().and_then(|rx| *rx.borrow())
    }

    /// Resolves at the next release notification since the last call (or
    /// since the subscription was made), or when a grant is handed over
    /// to this waiter's owner. Pending forever for [`Subscription::never`]
    /// or once the notifier is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: a notification that arrives while the future is dropped
    /// is kept for the next call.
    pub async fn notified(&mut self) {
        let released = next_change(self.rx.as_mut());
        let handed = next_change(self.inbox.as_mut());
        tokio::select! {
            () = released => {}
            () = handed => {}
        }
    }
}

/// The next change of `rx`; pending forever without a channel or once its
/// sender is gone.
async fn next_change<T>(rx: Option<&mut watch::Receiver<T>>) {
    let changed = match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("live", &self.is_live())
            .field("hand_off", &self.hand_off())
            .finish()
    }
}

/// One key's waiters in this process.
struct KeyWaiters {
    /// Bumped at every release notification: wakes every waiter.
    released: watch::Sender<u64>,
    /// The waiters that registered their owner id, each told alone of a
    /// grant handed over to it.
    owners: HashMap<OwnerId, watch::Sender<Option<HandOff>>>,
}

/// A grant the store handed over to the head of a key's queue, as the
/// waiter learns of it: the grant's fencing token, and the ticket of the
/// waiter's attempt that last wrote its queue entry before the hand-off
/// ([`AcquireRequest::queue_ticket`](crate::backend::AcquireRequest::queue_ticket)),
/// which tells the waiter from when to count the grant's claim window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandOff {
    /// The fencing token of the handed-over grant.
    pub token: u64,
    /// The ticket its queue entry carried.
    pub ticket: u32,
}

/// Per-process fan-out of release notifications to the waiters of each key.
///
/// Cheap to clone; clones share the same waiters.
#[derive(Clone, Default)]
pub struct WakeHub {
    keys: Arc<Mutex<HashMap<String, KeyWaiters>>>,
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
                .or_insert_with(|| KeyWaiters {
                    released: watch::channel(0).0,
                    owners: HashMap::new(),
                })
                .released
                .subscribe()
        };
        Subscription {
            rx: Some(rx),
            inbox: None,
            cleanup: Some(Unsubscribe {
                hub: self.clone(),
                key: key.to_owned(),
                owner: None,
            }),
        }
    }

    /// Wakes every waiter of `key`. Returns whether anyone was waiting.
    pub fn notify(&self, key: &str) -> bool {
        let keys = self.lock();
        match keys.get(key) {
            Some(waiters) => {
                bump(&waiters.released);
                true
            }
            None => false,
        }
    }

    /// Tells the waiter of `key` registered as `owner` (and no other) that
    /// the store handed the key over to it. Returns whether that waiter is
    /// in this process.
    pub fn hand_over(&self, key: &str, owner: OwnerId, grant: HandOff) -> bool {
        let keys = self.lock();
        match keys.get(key).and_then(|w| w.owners.get(&owner)) {
            Some(inbox) => {
                inbox.send_replace(Some(grant));
                true
            }
            None => false,
        }
    }

    /// Acts on one message of a store's release channel (a `NOTIFY`
    /// payload, a pub/sub message, a datagram): a key alone is a release
    /// ([`notify`](Self::notify)); a hand-off (`hand_off_message`) goes to its head
    /// alone ([`hand_over`](Self::hand_over)). A garbled hand-off wakes
    /// nobody: its head finds the grant at its next attempt.
    pub fn deliver(&self, message: &str) {
        match message.strip_prefix(HAND_OFF_MARK) {
            None => {
                self.notify(message);
            }
            Some(rest) => {
                if let Some((key, owner, grant)) = parse_hand_off(rest) {
                    self.hand_over(key, owner, grant);
                }
            }
        }
    }

    /// Wakes every waiter of every key; returns how many keys had waiters.
    ///
    /// For a backend that may have missed notifications (its listening
    /// connection dropped): a spurious wake costs a waiter one retry, a
    /// missed one costs it a polling interval. A queued waiter that missed
    /// its hand-off finds the grant at that retry (a repeat of its request).
    pub fn notify_all(&self) -> usize {
        let keys = self.lock();
        for waiters in keys.values() {
            bump(&waiters.released);
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeyWaiters>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (every update is a single insert or remove), so poison is ignored.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The first character of a hand-off message (a key's never is: keys hold
/// no control characters).
pub const HAND_OFF_MARK: char = '\u{1}';

/// The message a store sends on its release channel when it hands `key`
/// over to the head of its queue: [`HAND_OFF_MARK`], then `<owner> <token>
/// <ticket> <key>` ([`WakeHub::deliver`] reads it). Stores that build it
/// in their own language (SQL, Lua) write the same text.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "mongodb", feature = "etcd")),
    allow(dead_code)
)]
pub fn hand_off_message(key: &str, owner: OwnerId, grant: HandOff) -> String {
    format!(
        "{HAND_OFF_MARK}{owner} {} {} {key}",
        grant.token, grant.ticket
    )
}

/// Reads `<owner> <token> <ticket> <key>` (a key may hold spaces: it is
/// the rest).
fn parse_hand_off(text: &str) -> Option<(&str, OwnerId, HandOff)> {
    let mut parts = text.splitn(4, ' ');
    let owner = OwnerId::from_hex(parts.next()?)?;
    let token = parts.next()?.parse().ok()?;
    let ticket = parts.next()?.parse().ok()?;
    Some((parts.next()?, owner, HandOff { token, ticket }))
}

fn bump(released: &watch::Sender<u64>) {
    released.send_modify(|generation| *generation = generation.wrapping_add(1));
}

impl fmt::Debug for WakeHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeHub")
            .field("watched_keys", &self.lock().len())
            .finish()
    }
}

/// Removes a waiter's owner registration, and its key's entry when its
/// last waiter goes, so the hub does not grow with every key ever waited
/// for.
struct Unsubscribe {
    hub: WakeHub,
    key: String,
    owner: Option<OwnerId>,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let mut keys = self.hub.lock();
        let Some(waiters) = keys.get_mut(&self.key) else {
            return;
        };
        if let Some(owner) = self.owner {
            waiters.owners.remove(&owner);
        }
        if waiters.released.receiver_count() == 0 && waiters.owners.is_empty() {
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

    /// A release message wakes every waiter of its key; a hand-off message
    /// reaches its head alone, with its grant; a garbled one wakes nobody.
    #[tokio::test]
    async fn delivered_messages_release_or_hand_over() {
        let hub = WakeHub::new();
        let (head, other) = (OwnerId::random(), OwnerId::random());
        let mut first = hub.subscribe("a key");
        assert!(first.expect_hand_off(head));
        let mut second = hub.subscribe("a key");
        assert!(second.expect_hand_off(other));
        let grant = HandOff {
            token: 42,
            ticket: 3,
        };
        hub.deliver(&format!("{HAND_OFF_MARK}{head} x 3 a key"));
        hub.deliver(&format!("{HAND_OFF_MARK}{head} 42 3"));
        hub.deliver(&hand_off_message("a key", head, grant));
        tokio::time::timeout(Duration::from_secs(1), first.notified())
            .await
            .expect("the head is told");
        assert_eq!(first.hand_off(), Some(grant));
        assert_eq!(second.hand_off(), None, "garbled messages reach nobody");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), second.notified())
                .await
                .is_err(),
            "only the head is woken"
        );
        hub.deliver("a key");
        tokio::time::timeout(Duration::from_secs(1), second.notified())
            .await
            .expect("a release wakes every waiter");
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

    #[tokio::test]
    async fn a_hand_over_reaches_its_owner_alone() {
        let hub = WakeHub::new();
        let (first, second) = (OwnerId::random(), OwnerId::random());
        let mut a = hub.subscribe("k");
        let mut b = hub.subscribe("k");
        assert!(a.expect_hand_off(first));
        assert!(b.expect_hand_off(second));
        let grant = HandOff {
            token: 7,
            ticket: 2,
        };
        assert!(hub.hand_over("k", first, grant));
        tokio::time::timeout(Duration::from_secs(1), a.notified())
            .await
            .expect("the owner is woken");
        assert_eq!(a.hand_off(), Some(grant));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), b.notified())
                .await
                .is_err(),
            "the other waiter sleeps on"
        );
        assert_eq!(b.hand_off(), None);
        assert!(!hub.hand_over("k", OwnerId::random(), grant), "nobody here");
        drop(a);
        assert!(
            !hub.hand_over("k", first, grant),
            "its registration left with it"
        );
        drop(b);
        assert!(!hub.is_watched("k"));
    }

    #[test]
    fn never_takes_no_hand_off() {
        let mut s = Subscription::never();
        assert!(!s.expect_hand_off(OwnerId::random()));
        assert_eq!(s.hand_off(), None);
    }
}
