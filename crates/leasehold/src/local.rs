//! In-process queueing of waiters: tasks of one process that wait for the
//! same key line up here in FIFO order, and only the first of them waits at
//! the store.
//!
//! Without it, a task that releases a key and asks for it again at once
//! beats its woken neighbours to the store every time (they are still being
//! scheduled), starving them; and N local waiters would each poll the store.
//!
//! The front waiter's turn ends when the store grants it the key, not when
//! the resulting guard is dropped: while this process holds the key, the
//! next local waiter already waits at the store, exactly as a waiter in
//! another process would. So a guard whose lease was lost (expired, broken by
//! `force_release`) never keeps its own process out of a key the store
//! considers free, and a holder that releases and re-acquires still queues
//! behind that waiter.
//!
//! The queue also counts the live guards of each key ([`LocalHold`]), so a
//! wait that times out can say that it waited behind this very process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::key::Key;

/// The per-key queues of one [`Locks`](crate::Locks) handle and its clones.
#[derive(Debug, Default)]
pub(crate) struct LocalQueues {
    queues: Mutex<HashMap<Key, Arc<KeyQueue>>>,
}

/// One key's local state.
#[derive(Debug)]
struct KeyQueue {
    /// One permit: the front of the queue, the waiter that goes to the store.
    front: Arc<Semaphore>,
    /// Live guards of this key in this process.
    holders: AtomicUsize,
}

/// A task's turn at the front of its key's local queue, held while it waits
/// at the store. Dropped once the store granted the key (or the wait ended).
#[derive(Debug)]
pub(crate) struct LocalTurn {
    _permit: Option<OwnedSemaphorePermit>,
    _entry: Entry,
}

/// A live guard's mark on its key.
#[derive(Debug)]
pub(crate) struct LocalHold {
    entry: Entry,
}

/// A counted reference to a key's queue; the last one removes the queue
/// from the map, so it does not grow with every key ever used.
#[derive(Debug)]
struct Entry {
    queues: Arc<LocalQueues>,
    key: Key,
    queue: Option<Arc<KeyQueue>>,
}

impl LocalQueues {
    /// Waits for this task's turn on `key`. Cancel safe: dropping the future
    /// leaves the queue.
    pub(crate) async fn turn(self: &Arc<Self>, key: &Key) -> LocalTurn {
        let entry = self.entry(key);
        let front = entry.queue().front.clone();
        // The semaphore is never closed, so acquiring cannot fail.
        let permit = front.acquire_owned().await.ok();
        LocalTurn {
            _permit: permit,
            _entry: entry,
        }
    }

    /// Whether a guard of this process holds `key` right now (the map's
    /// lock and a lookup; a waiter with its turn asks
    /// [`LocalTurn::behind_a_holder`] instead).
    pub(crate) fn is_held_here(&self, key: &Key) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|q| q.holders.load(Ordering::Relaxed) > 0)
    }

    /// Marks `key` as held by a guard of this process until the returned
    /// value is dropped.
    pub(crate) fn hold(self: &Arc<Self>, key: &Key) -> LocalHold {
        let entry = self.entry(key);
        entry.queue().holders.fetch_add(1, Ordering::Relaxed);
        LocalHold { entry }
    }

    fn entry(self: &Arc<Self>, key: &Key) -> Entry {
        let queue = self
            .lock()
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(KeyQueue {
                    front: Arc::new(Semaphore::new(1)),
                    holders: AtomicUsize::new(0),
                })
            })
            .clone();
        Entry {
            queues: self.clone(),
            key: key.clone(),
            queue: Some(queue),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<KeyQueue>>> {
        // Every update is a single insert or remove: a panic cannot leave
        // the map half-changed, so poison is ignored.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LocalTurn {
    /// Whether a guard of this process holds the turn's key right now:
    /// one atomic read of the key's queue this turn already holds.
    pub(crate) fn behind_a_holder(&self) -> bool {
        self._entry.queue().holders.load(Ordering::Relaxed) > 0
    }
}

impl Entry {
    fn queue(&self) -> &KeyQueue {
        // Only taken in drop.
        self.queue.as_deref().expect("entry in use")
    }
}

impl Drop for LocalHold {
    fn drop(&mut self) {
        self.entry.queue().holders.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        drop(self.queue.take());
        let mut queues = self.queues.lock();
        if queues
            .get(&self.key)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            queues.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn turns_are_first_come_first_served_and_cleaned_up() {
        let queues = Arc::new(LocalQueues::default());
        let key = Key::new("k").unwrap();
        let first = queues.turn(&key).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (q, k, o) = (queues.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let turn = q.turn(&k).await;
                o.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(turn);
            }));
            // Queue them in a known order.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        assert!(
            queues.lock().is_empty(),
            "queue removed after the last turn"
        );
    }

    #[tokio::test]
    async fn a_hold_does_not_block_the_next_turn_but_is_counted() {
        let queues = Arc::new(LocalQueues::default());
        let key = Key::new("k").unwrap();
        let hold = queues.hold(&key);
        assert!(queues.is_held_here(&key));
        let turn = tokio::time::timeout(Duration::from_secs(1), queues.turn(&key))
            .await
            .expect("a guard does not hold the queue");
        drop(hold);
        assert!(!queues.is_held_here(&key));
        drop(turn);
        assert!(queues.lock().is_empty());
    }
}
