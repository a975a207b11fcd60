//! In-process queueing of waiters: tasks of one process that wait for the
//! same key line up here in FIFO order, and only the first of them waits at
//! the store.
//!
//! Without it, a task that releases a key and asks for it again at once
//! beats its woken neighbours to the store every time (they are still being
//! scheduled), starving them; and N local waiters would each poll the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::key::Key;

/// The per-key queues of one [`Locks`](crate::Locks) handle and its clones.
#[derive(Debug, Default)]
pub(crate) struct LocalQueues {
    queues: Mutex<HashMap<Key, Arc<Semaphore>>>,
}

/// A task's turn at the front of its key's local queue. Held by the waiter
/// while it waits at the store, then by the guard until release.
#[derive(Debug)]
pub(crate) struct LocalTurn {
    permit: Option<OwnedSemaphorePermit>,
    queues: Arc<LocalQueues>,
    key: Key,
}

impl LocalQueues {
    /// Waits for this task's turn on `key`. Cancel safe: dropping the future
    /// leaves the queue.
    pub(crate) async fn turn(self: &Arc<Self>, key: &Key) -> LocalTurn {
        let queue = self
            .lock()
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone();
        // The semaphore is never closed, so acquiring cannot fail.
        let permit = queue.acquire_owned().await.ok();
        LocalTurn {
            permit,
            queues: self.clone(),
            key: key.clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Semaphore>>> {
        // Every update is a single insert or remove: a panic cannot leave
        // the map half-changed, so poison is ignored.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for LocalTurn {
    fn drop(&mut self) {
        drop(self.permit.take());
        // Forget the key's queue when nobody else is in it, so the map does
        // not grow with every key ever waited for.
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
}
