//! Releases that a dropped guard started in the background and that have
//! not reached the store yet, per key, so that a later acquisition of the
//! same key through the same [`Locks`](crate::Locks) waits for them instead
//! of racing them to the store and finding its own old lease there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::key::Key;

/// The in-flight releases of one `Locks` handle and its clones.
#[derive(Debug, Default)]
pub(crate) struct PendingReleases {
    /// How many releases are in flight in all; lets acquisitions skip the
    /// map (and its lock) in the common case of none.
    in_flight: AtomicUsize,
    keys: Mutex<HashMap<Key, Entry>>,
}

#[derive(Debug)]
struct Entry {
    count: usize,
    done: Arc<Notify>,
}

/// One release in flight; dropping it (when the release has been answered
/// or given up) lets waiters for its key go on.
#[derive(Debug)]
pub(crate) struct PendingRelease {
    releases: Arc<PendingReleases>,
    key: Key,
}

impl PendingReleases {
    /// Records that a release of `key` is on its way to the store.
    pub(crate) fn begin(self: &Arc<Self>, key: &Key) -> PendingRelease {
        let mut keys = self.lock();
        keys.entry(key.clone())
            .or_insert_with(|| Entry {
                count: 0,
                done: Arc::default(),
            })
            .count += 1;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        PendingRelease {
            releases: self.clone(),
            key: key.clone(),
        }
    }

    /// Resolves once no release of `key` is in flight (one that starts while
    /// it waits is waited for too). Cancel safe.
    pub(crate) async fn settled(&self, key: &Key) {
        loop {
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            let done = match self.lock().get(key) {
                Some(entry) => entry.done.clone(),
                None => return,
            };
            let notified = done.notified();
            tokio::pin!(notified);
            // Registered before looking again, so a release that ends in
            // between still wakes this task.
            notified.as_mut().enable();
            let same_entry = self
                .lock()
                .get(key)
                .is_some_and(|entry| Arc::ptr_eq(&entry.done, &done));
            if !same_entry {
                // Ended in between (and maybe a newer release began, whose
                // entry has its own notifier): look again.
                continue;
            }
            notified.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        // Each update is one insert, decrement or remove: a panic cannot
        // leave the map half-changed, so poison is ignored.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for PendingRelease {
    fn drop(&mut self) {
        let mut keys = self.releases.lock();
        if let Some(entry) = keys.get_mut(&self.key) {
            entry.count -= 1;
            if entry.count == 0 {
                let done = entry.done.clone();
                keys.remove(&self.key);
                done.notify_waiters();
            }
        }
        self.releases.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_releases_of_its_key_only() {
        let releases = Arc::new(PendingReleases::default());
        let (a, b) = (Key::new("a").unwrap(), Key::new("b").unwrap());
        // Nothing in flight: no wait.
        releases.settled(&a).await;
        let first = releases.begin(&a);
        let second = releases.begin(&a);
        let other = releases.begin(&b);
        let waiter = {
            let releases = releases.clone();
            let a = a.clone();
            tokio::spawn(async move { releases.settled(&a).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(first);
        drop(other);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "one release of a is still in flight");
        drop(second);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken when the last release of a ended")
            .unwrap();
        assert!(releases.lock().is_empty());
        assert_eq!(releases.in_flight.load(Ordering::SeqCst), 0);
    }
}
