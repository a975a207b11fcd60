//! The permit rules of docs/semaphore.md, part of the protocol that
//! [`conformance_tests!`](crate::conformance_tests) runs on every store.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

use super::{
    answered_busy, attempt, busy_for, handed_off, key, permits_listed, prefix, slots_of, TestStore,
    LONG, SHORT,
};
use crate::backend::{Acquire, AcquireRequest, Backend, Lease, OwnerId, MAX_PERMITS};
use crate::error::Error;
use crate::key::Key;
use crate::lock::{AcquireOptions, Locks};

fn permit_request(k: &Key, ttl: Duration, permits: u32) -> AcquireRequest {
    AcquireRequest::permit(k.clone(), ttl, "conformance", permits).expect("valid request")
}

async fn permit(backend: &dyn Backend, k: &Key, ttl: Duration, permits: u32) -> Lease {
    match attempt(backend, &permit_request(k, ttl, permits)).await {
        Acquire::Granted(lease) => lease,
        b => panic!("expected a free permit of {k:?} ({permits}): {b:?}"),
    }
}

async fn busy(backend: &dyn Backend, k: &Key, permits: u32) -> bool {
    busy_for(backend, &permit_request(k, LONG, permits)).await
}

/// The slots the store reports live for `k`.
async fn live_slots(store: &TestStore, k: &Key) -> BTreeSet<u32> {
    slots_of(store, k).await.iter().map(|p| p.slot).collect()
}

/// Many attempts at once, from two clients, on a semaphore of 3: exactly 3
/// granted, in distinct slots below 3, and the store lists exactly those.
pub async fn semaphore_never_more_than_n_live(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let clients: [Arc<dyn Backend>; 2] = [store.backend.clone(), store.second_arc()];
    let mut tasks = Vec::new();
    for i in 0..24 {
        let backend = clients[i % 2].clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            attempt(backend.as_ref(), &permit_request(&k, LONG, 3)).await
        }));
    }
    let mut slots = BTreeSet::new();
    let mut tokens = BTreeSet::new();
    for task in tasks {
        if let Acquire::Granted(lease) = task.await.unwrap() {
            assert!(slots.insert(lease.slot().expect("a permit has a slot")));
            assert!(tokens.insert(lease.token()), "tokens are unique");
        }
    }
    assert_eq!(slots, BTreeSet::from([0, 1, 2]), "exactly 3 of 24 granted");
    assert_eq!(live_slots(store, &k).await, slots);
}

/// A semaphore of N hands out N permits one after another (slots 0..N),
/// then reports busy naming a holder and a remaining time within the ttl.
pub async fn semaphore_reaches_n(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let mut slots = BTreeSet::new();
    for _ in 0..5 {
        slots.insert(
            permit(store.backend.as_ref(), &k, LONG, 5)
                .await
                .slot()
                .unwrap(),
        );
    }
    assert_eq!(slots, (0..5).collect());
    match attempt(store.backend.as_ref(), &permit_request(&k, LONG, 5)).await {
        Acquire::Busy(b) => {
            assert_eq!(b.holder, "conformance");
            assert!(b.remaining > Duration::ZERO && b.remaining <= LONG, "{b:?}");
        }
        l => panic!("a sixth permit of 5: {l:?}"),
    }
}

/// A permit nobody renews or releases (a crashed holder) comes back after
/// its ttl, by the store's clock.
pub async fn semaphore_crashed_permit_returns_after_ttl(store: &TestStore) {
    // Long enough for the second grant and the busy check to land inside
    // it on a loaded server (three round trips; with SHORT, 200 ms, a slow
    // MongoDB test server let it expire first).
    let crash_ttl = SHORT * 5;
    let k = key(format!("{}sem", prefix()));
    let crashed = permit(store.backend.as_ref(), &k, crash_ttl, 2).await;
    permit(store.backend.as_ref(), &k, LONG, 2).await;
    assert!(busy(store.backend.as_ref(), &k, 2).await);
    sleep(store.past_expiry(crash_ttl + Duration::from_millis(150))).await;
    let back = permit(store.backend.as_ref(), &k, LONG, 2).await;
    assert_eq!(
        back.slot(),
        crashed.slot(),
        "the expired slot is the free one"
    );
    assert!(back.token() > crashed.token());
    assert!(!store.backend.renew(&crashed, LONG).await.unwrap());
}

/// Tokens of a key's permits grow with every grant, whatever the slot, and
/// so within each slot, across release, expiry and reuse of slots.
pub async fn semaphore_fence_never_goes_backwards(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let backend = store.backend.as_ref();
    let mut last = 0;
    let mut last_in_slot = [0u64; 2];
    for round in 0..6 {
        let ttl = if round % 3 == 2 { SHORT } else { LONG };
        let lease = permit(backend, &k, ttl, 2).await;
        let slot = lease.slot().unwrap() as usize;
        assert!(lease.token() > last, "token {} after {last}", lease.token());
        assert!(lease.token() > last_in_slot[slot]);
        last = lease.token();
        last_in_slot[slot] = last;
        if ttl == SHORT {
            sleep(store.past_expiry(SHORT + Duration::from_millis(150))).await;
        } else {
            backend.release(&lease).await.unwrap();
        }
    }
    // One key is one lock: the key is a semaphore now, and a mutex
    // request of it is answered so (conformance/kinds.rs has the rest).
    let mutex = backend
        .try_acquire(&super::request(&k, LONG))
        .await
        .unwrap();
    assert!(
        matches!(
            mutex,
            Acquire::OtherKind(crate::backend::KeyKind::Semaphore)
        ),
        "{mutex:?}"
    );
}

/// Renew and release act only for the permit's owner and token; renew
/// never revives an expired permit; release is idempotent and wakes.
pub async fn semaphore_owner_checked_renew_release(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let backend = store.backend.as_ref();
    let lease = permit(backend, &k, LONG, 1).await;
    let slot = lease.slot().unwrap();
    let stranger = permit_request(&k, LONG, 1)
        .with_owner(OwnerId::random())
        .granted_permit(slot, lease.token());
    let old_token = permit_request(&k, LONG, 1)
        .with_owner(lease.owner())
        .granted_permit(slot, lease.token() - 1);
    let other_slot = permit_request(&k, LONG, 1)
        .with_owner(lease.owner())
        .granted_permit(slot + 1, lease.token());
    for forged in [&stranger, &old_token, &other_slot] {
        assert!(!backend.renew(forged, LONG).await.unwrap(), "{forged:?}");
        backend.release(forged).await.unwrap();
        assert!(
            busy(backend, &k, 1).await,
            "a forged release freed {forged:?}"
        );
    }
    assert!(backend.renew(&lease, LONG).await.unwrap());
    backend.release(&lease).await.unwrap();
    backend.release(&lease).await.unwrap();
    assert!(!backend.renew(&lease, LONG).await.unwrap());
    let short = permit(backend, &k, SHORT, 1).await;
    sleep(store.past_expiry(SHORT + Duration::from_millis(150))).await;
    assert!(!backend.renew(&short, LONG).await.unwrap(), "revived");
    assert!(live_slots(store, &k).await.is_empty());
}

/// A permit released by another client wakes a waiter through the core
/// long before the holders' ttl, and the waiter gets the freed slot.
pub async fn semaphore_release_wakes_a_waiter(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let other = store.second_client();
    let first = permit(other, &k, LONG, 2).await;
    permit(other, &k, LONG, 2).await;
    let sem = store.locks().semaphore(k.as_str(), 2).unwrap();
    let waiter = async move { sem.acquire(Duration::from_secs(20)).await };
    let guard = handed_off(waiter, other, &first, "the waiter gets the released permit").await;
    assert_eq!(guard.slot(), first.slot());
    assert!(guard.token() > first.token());
    guard.release().await.unwrap();
}

/// Holders that count different permits: a request for `n` is granted
/// only while fewer than `n` are live, in a slot below `n`.
pub async fn semaphore_disagreeing_permits(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let backend = store.backend.as_ref();
    let mut threes = Vec::new();
    for _ in 0..3 {
        threes.push(permit(backend, &k, LONG, 3).await);
    }
    assert!(busy(backend, &k, 3).await);
    let fives = [
        permit(backend, &k, LONG, 5).await,
        permit(backend, &k, LONG, 5).await,
    ];
    let five_slots: BTreeSet<u32> = fives.iter().map(|l| l.slot().unwrap()).collect();
    assert_eq!(five_slots, BTreeSet::from([3, 4]));
    assert!(busy(backend, &k, 5).await, "5 live: a count of 5 is full");
    assert!(
        busy(backend, &k, 4).await,
        "5 live: a count of 4 gets nothing"
    );
    // Down to 3 live (slots 2, 3, 4): a count of 3 still waits.
    for lease in &threes[..2] {
        backend.release(lease).await.unwrap();
    }
    assert!(
        busy(backend, &k, 3).await,
        "3 live: a count of 3 gets nothing"
    );
    backend.release(&fives[0]).await.unwrap();
    let late = permit(backend, &k, LONG, 3).await;
    assert!(late.slot().unwrap() < 3, "{late:?}");
    assert_eq!(live_slots(store, &k).await.len(), 3);
}

/// Two clients of `store`, the first with a view of `k` about to go
/// stale: it took and gave back a permit (of `permits`), so it has seen the
/// lock empty and of its kind. A store may act on such a view (etcd's next
/// grant there claims slot 0 unread: backends/etcd/hints.rs); the
/// `*_stale_view_*` properties change the lock through the second client,
/// so that the store's own checks, not the view, must decide.
async fn stale_view(store: &TestStore, k: &Key, permits: u32) -> (Locks, Locks) {
    let (a, b) = (store.locks(), store.second_locks());
    let warm = a
        .semaphore(k.as_str(), permits)
        .unwrap()
        .try_acquire()
        .await;
    let warm = warm.expect("the warm-up permit");
    assert_eq!(warm.slot(), Some(0));
    warm.release().await.unwrap();
    (a, b)
}

/// A client whose view of a semaphore went stale (it saw it empty, another
/// client took slot 0 since) gets the lowest free slot and a higher token;
/// with every permit taken both clients are busy; slot 0 is given again
/// once free, and again after the lock is empty.
pub async fn semaphore_stale_view_meets_taken_slots(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let (a, b) = stale_view(store, &k, 3).await;
    let first = b.semaphore(k.as_str(), 3).unwrap().try_acquire().await;
    let first = first.unwrap();
    assert_eq!(first.slot(), Some(0));
    let pool = a.semaphore(k.as_str(), 3).unwrap();
    let second = pool.try_acquire().await.unwrap();
    assert_eq!(second.slot(), Some(1));
    assert!(second.token() > first.token());
    let third = pool.try_acquire().await.unwrap();
    assert_eq!(third.slot(), Some(2));
    assert!(third.token() > second.token());
    // Every permit taken: busy, from either client.
    assert!(answered_busy(&pool.try_acquire().await));
    let from_b = b.semaphore(k.as_str(), 3).unwrap().try_acquire().await;
    assert!(answered_busy(&from_b));
    // The lowest free slot again once slot 0 is free.
    first.release().await.unwrap();
    let again = pool.try_acquire().await.unwrap();
    assert_eq!(again.slot(), Some(0));
    assert!(again.token() > third.token());
    for g in [second, third, again] {
        g.release().await.unwrap();
    }
    // Empty again: the next grants (on etcd, one after a look that found
    // the lock held, then one that presumes it empty again) take slot 0.
    for _ in 0..2 {
        let g = pool.try_acquire().await.unwrap();
        assert_eq!(g.slot(), Some(0));
        g.release().await.unwrap();
    }
}

/// A client that counts fewer permits than are live is never granted, even
/// with slot 0 free and a stale view that the lock is empty.
pub async fn semaphore_stale_view_keeps_a_smaller_count(store: &TestStore) {
    let k = key(format!("{}sem", prefix()));
    let (a, b) = stale_view(store, &k, 1).await;
    let wide = b.semaphore(k.as_str(), 2).unwrap();
    let s0 = wide.try_acquire().await.unwrap();
    let s1 = wide.try_acquire().await.unwrap();
    assert_eq!((s0.slot(), s1.slot()), (Some(0), Some(1)));
    s0.release().await.unwrap();
    // Slot 0 is free, one permit is live: a count of 1 is full.
    let narrow = a.semaphore(k.as_str(), 1).unwrap().try_acquire().await;
    assert!(answered_busy(&narrow), "{narrow:?}");
    // A count of 2 has room, in slot 0.
    let g = a.semaphore(k.as_str(), 2).unwrap().try_acquire().await;
    let g = g.unwrap();
    assert_eq!(g.slot(), Some(0));
    assert!(g.token() > s1.token());
    g.release().await.unwrap();
    s1.release().await.unwrap();
}

/// Bad semaphore input fails with `InvalidInput` before any I/O: nothing
/// reaches the store (its permits stay untouched).
pub async fn semaphore_bad_input_rejected_before_io(store: &TestStore) {
    let locks = store.locks();
    let p = prefix();
    for permits in [0, MAX_PERMITS + 1, u32::MAX] {
        match locks.semaphore(&format!("{p}sem"), permits) {
            Err(Error::InvalidInput {
                what: "permits", ..
            }) => {}
            other => panic!("permits {permits}: expected InvalidInput, got {other:?}"),
        }
    }
    for bad in ["", "a\nb", &"k".repeat(300)] {
        assert!(matches!(
            locks.semaphore(bad, 3),
            Err(Error::InvalidInput { what: "key", .. })
        ));
    }
    let sem = locks.semaphore(&format!("{p}sem"), MAX_PERMITS).unwrap();
    for ttl in [Duration::ZERO, Duration::from_millis(99), Duration::MAX] {
        match sem.acquire_with(&AcquireOptions::new().with_ttl(ttl)).await {
            Err(Error::InvalidInput { what: "ttl", .. }) => {}
            other => panic!("ttl {ttl:?}: expected InvalidInput, got {other:?}"),
        }
    }
    assert!(matches!(
        locks.list_permits("x\u{7}").await,
        Err(Error::InvalidInput { what: "prefix", .. })
    ));
    assert!(permits_listed(store.backend.as_ref(), &p)
        .await
        .unwrap()
        .is_empty());
}
