//! Idle records go away, and tokens still only grow (docs/storage.md).
//!
//! A record (a key's anchor, and for a semaphore or reader-writer lock its
//! permits) is deleted once nobody has held the key for the idle window.
//! Deleting it raises the store's floor to its fence, under the anchors'
//! lock, and a record created anew starts at the floor under the same lock:
//! a key that comes back takes tokens above every token it had. No clock is
//! involved in that argument, only in when a record goes.
//!
//! A pass walks the map in steps of [`STEP`] keys, one step per release,
//! so that no release holds the lock for a scan of the whole map; a pass
//! starts after a release no sooner than half the window after the last
//! one began, so a record is gone between one and one and a half windows
//! after its key went idle, given enough releases to carry the walk (N
//! keys take N / [`STEP`] of them). [`MemoryBackend::sweep_idle`] walks
//! the whole map at once.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use super::{Anchors, MemoryBackend};
use crate::backend::KeyKind;
use crate::key::Key;

/// Keys one release's step of a pass looks at.
const STEP: usize = 64;

/// Whether a release has a step to take: while a pass walks, always; else
/// once the next pass is due. Read with one atomic load, so the releases
/// between passes (nearly all of them) never take the anchors' lock for
/// the sweep.
#[derive(Debug)]
pub(super) struct Gate {
    /// What the times below count from.
    base: Instant,
    /// Nanoseconds after `base` from which a release steps (0: at once).
    open_from: AtomicU64,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            base: Instant::now(),
            open_from: AtomicU64::new(0),
        }
    }
}

impl Gate {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn is_open(&self, now: Instant) -> bool {
        self.nanos(now) >= self.open_from.load(Ordering::Relaxed)
    }

    /// Opens from `at` on (`None`: at once).
    fn open_at(&self, at: Option<Instant>) {
        let from = at.map_or(0, |at| self.nanos(at));
        self.open_from.store(from, Ordering::Relaxed);
    }
}

/// Where a pass stands: the key its last step stopped after (`None`:
/// at the start of the map).
#[derive(Debug)]
pub(super) struct Walk {
    after: Option<Key>,
}

impl MemoryBackend {
    /// One step of the pass under way, or of a new one if one is due.
    pub(super) fn sweep_step(&self, now: Instant) {
        let Some(window) = self.idle_window else {
            return;
        };
        let Some(cutoff) = now.checked_sub(window) else {
            return;
        };
        let mut anchors = self.anchors();
        let walk = match anchors.walk.take() {
            Some(walk) => walk,
            None if anchors
                .last_pass
                .is_some_and(|at| now.duration_since(at) < window / 2) =>
            {
                self.sweep_gate
                    .open_at(anchors.last_pass.map(|at| at + window / 2));
                return;
            }
            None => {
                anchors.last_pass = Some(now);
                Walk { after: None }
            }
        };
        let (idle, last) = self.idle_in(&anchors, walk.after.as_ref(), STEP, cutoff, now);
        self.delete(&mut anchors, idle);
        anchors.walk = last.map(|after| Walk { after: Some(after) });
        // Walking: every release steps; done: none until the next pass.
        let next = match anchors.walk {
            Some(_) => None,
            None => anchors.last_pass.map(|at| at + window / 2),
        };
        self.sweep_gate.open_at(next);
    }

    /// Deletes the records of every key nobody has held for the idle window
    /// now (none if the store keeps them forever), and answers how many.
    pub fn sweep_idle(&self) -> usize {
        let now = Instant::now();
        let Some(cutoff) = self.idle_cutoff(now) else {
            return 0;
        };
        let mut anchors = self.anchors();
        let (idle, _) = self.idle_in(&anchors, None, usize::MAX, cutoff, now);
        let deleted = idle.len();
        self.delete(&mut anchors, idle);
        deleted
    }

    /// The number of keys that have a record (held, or idle inside the
    /// window): what the store keeps.
    pub fn record_count(&self) -> usize {
        self.anchors().records.len()
    }

    /// The instant a key must have been idle since to go, if records go.
    fn idle_cutoff(&self, now: Instant) -> Option<Instant> {
        now.checked_sub(self.idle_window?)
    }

    /// Up to `limit` keys after `after`, those idle since `cutoff` with
    /// their fences (a permit kind's permits are deleted here, their fence
    /// taken into the key's), and the last key looked at if the walk goes
    /// on after it.
    fn idle_in(
        &self,
        anchors: &Anchors,
        after: Option<&Key>,
        limit: usize,
        cutoff: Instant,
        now: Instant,
    ) -> (Vec<(Key, u64)>, Option<Key>) {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut idle = Vec::new();
        let mut last: Option<&Key> = None;
        let keys = anchors.records.range::<Key, _>((start, Bound::Unbounded));
        for (seen, (key, record)) in keys.enumerate() {
            if seen == limit {
                return (idle, last.cloned());
            }
            last = Some(key);
            let fence = match record.kind {
                KeyKind::Mutex => record
                    .idle_since(now)
                    .filter(|since| *since <= cutoff)
                    .map(|_| record.fence),
                kind => self
                    .permits
                    .take_if_idle(key, kind, cutoff, now)
                    .map(|permits| permits.max(record.fence)),
            };
            if let Some(fence) = fence {
                idle.push((key.clone(), fence));
            }
        }
        (idle, None)
    }

    /// Deletes the records of `idle` and raises the floor to their fences.
    fn delete(&self, anchors: &mut Anchors, idle: Vec<(Key, u64)>) {
        for (key, fence) in idle {
            anchors.records.remove(&key);
            anchors.floor = anchors.floor.max(fence);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::backend::{Acquire, AcquireRequest, Backend, RwSide};
    use crate::backends::memory::MemoryBackend;
    use crate::key::Key;

    const WINDOW: Duration = Duration::from_secs(60);
    const TTL: Duration = Duration::from_secs(5);

    fn store() -> MemoryBackend {
        MemoryBackend::new().with_idle_window(Some(WINDOW)).unwrap()
    }

    async fn grant(store: &MemoryBackend, req: &AcquireRequest) -> crate::backend::Lease {
        match store.try_acquire(req).await.unwrap() {
            Acquire::Granted(lease) => lease,
            other => panic!("{:?}: {other:?}", req.key()),
        }
    }

    /// Acquires and releases `key` as `kind`: 0 mutex, 1 semaphore permit,
    /// 2 reader, 3 writer. Its token.
    async fn cycle(store: &MemoryBackend, key: &str, kind: usize) -> u64 {
        let key = Key::new(key).unwrap();
        let req = match kind {
            0 => AcquireRequest::new(key, TTL, "t"),
            1 => AcquireRequest::permit(key, TTL, "t", 3),
            2 => AcquireRequest::rw(key, TTL, "t", RwSide::Read),
            _ => AcquireRequest::rw(key, TTL, "t", RwSide::Write),
        }
        .unwrap();
        let lease = grant(store, &req).await;
        store.release(&lease).await.unwrap();
        lease.token()
    }

    #[tokio::test(start_paused = true)]
    async fn releases_walk_the_idle_keys_away_and_tokens_still_grow() {
        let store = store();
        let mut before = Vec::new();
        for i in 0..400 {
            // Each key used a few times, so its fence is above the others'.
            let key = format!("order/{i:03}");
            let mut token = 0;
            for _ in 0..=(i % 4) {
                token = cycle(&store, &key, i % 4).await;
            }
            before.push((key, i % 4, token));
        }
        assert_eq!(store.record_count(), 400);
        tokio::time::advance(WINDOW / 2).await;
        for _ in 0..100 {
            cycle(&store, "busy", 0).await;
        }
        assert_eq!(
            store.record_count(),
            401,
            "nothing is idle for the window yet"
        );
        tokio::time::advance(WINDOW / 2 + Duration::from_millis(1)).await;
        // A pass is due again (half a window after the last began); it
        // walks 401 keys in 7 releases.
        for _ in 0..7 {
            cycle(&store, "busy", 0).await;
        }
        assert_eq!(store.record_count(), 1, "only the key in use stays");
        for (key, kind, token) in before {
            let again = cycle(&store, &key, kind).await;
            assert!(again > token, "{key}: {again} after {token}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_key_and_its_permits_stay() {
        let store = store();
        let held = Key::new("held").unwrap();
        let lease = AcquireRequest::new(held.clone(), WINDOW, "t").unwrap();
        let lease = grant(&store, &lease).await;
        let sem = Key::new("sem").unwrap();
        let permit = AcquireRequest::permit(sem.clone(), WINDOW * 3, "t", 2).unwrap();
        let permit = grant(&store, &permit).await;
        let reader = AcquireRequest::rw(Key::new("rw").unwrap(), WINDOW * 3, "t", RwSide::Read);
        let reader = grant(&store, &reader.unwrap()).await;
        for _ in 0..3 {
            tokio::time::advance(WINDOW / 2).await;
            assert!(store.renew(&lease, WINDOW).await.unwrap());
            assert_eq!(store.sweep_idle(), 0);
        }
        assert!(store.renew(&lease, TTL).await.unwrap());
        assert!(store.renew(&permit, TTL).await.unwrap());
        assert!(store.renew(&reader, TTL).await.unwrap());
        assert_eq!(store.record_count(), 3);
        // Expired, then idle for the window: gone, and the next grant of
        // each key is above its last.
        tokio::time::advance(TTL + WINDOW).await;
        assert_eq!(store.sweep_idle(), 3);
        assert_eq!(store.record_count(), 0);
        assert!(
            !store.renew(&lease, TTL).await.unwrap(),
            "its record is gone"
        );
        assert!(cycle(&store, "held", 0).await > lease.token());
        assert!(cycle(&store, "sem", 1).await > permit.token());
        assert!(cycle(&store, "rw", 3).await > reader.token());
    }

    #[tokio::test(start_paused = true)]
    async fn never_keeps_every_record() {
        let store = MemoryBackend::new().with_idle_window(None).unwrap();
        for i in 0..20 {
            cycle(&store, &format!("k{i}"), 0).await;
        }
        tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
        cycle(&store, "other", 0).await;
        assert_eq!(store.sweep_idle(), 0);
        assert_eq!(store.record_count(), 21);
        assert!(MemoryBackend::new()
            .with_idle_window(Some(Duration::ZERO))
            .is_err());
    }
}
