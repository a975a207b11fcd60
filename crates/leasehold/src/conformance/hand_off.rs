//! Group `hand_off`: a store whose
//! [`hands_over_locally`](crate::backend::Backend::hands_over_locally) is
//! true releases a mutex and grants it to a given request in one atomic
//! operation ([`release_to`](crate::backend::Backend::release_to)), with the
//! next token, and changes nothing when it must not hand over.

use std::time::Duration;

use tokio::time::timeout;

use super::{attempt, grant, held, key, prefix, request, TestStore, LONG};
use crate::backend::{Acquire, AcquireRequest, Lease, QUEUE_ENTRY_TTL};

/// How long a waiter that must not be woken is watched.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// How soon a waiter that must be woken is.
const NOTIFIED_WITHIN: Duration = Duration::from_secs(5);

/// A fresh key for one test of the group, on a store that hands over.
fn hand_off_key(store: &TestStore) -> crate::Key {
    assert!(
        store.backend.hands_over_locally(),
        "group `hand_off` is for stores whose hands_over_locally() is true"
    );
    key(format!("{}k", prefix()))
}

/// `lease` released and `next` granted in one step, which must happen.
async fn hand(store: &TestStore, lease: &Lease, next: &AcquireRequest) -> Lease {
    store
        .backend
        .release_to(lease, next)
        .await
        .expect("store answers")
        .expect("a held key with nobody queued is handed over")
}

/// The release grants the request: the next token, its label, its owner
/// alone; the old lease is gone; a repeat of the request is the same grant;
/// its release frees the key.
pub async fn hand_off_grants_the_next_request_the_next_token(store: &TestStore) {
    let k = hand_off_key(store);
    let holder = grant(store, &k, LONG).await;
    let next = AcquireRequest::new(k.clone(), LONG, "next").unwrap();
    let handed = hand(store, &holder, &next).await;
    assert!(handed.token() > holder.token(), "the next token");
    assert_eq!(handed.owner(), next.owner());
    let info = held(store, &k, "the key was handed over, not freed").await;
    assert_eq!((info.holder.as_str(), info.token), ("next", handed.token()));
    assert!(
        !store.backend.renew(&holder, LONG).await.unwrap(),
        "the released lease is gone"
    );
    store.backend.release(&holder).await.unwrap();
    assert!(
        matches!(
            attempt(&*store.backend, &request(&k, LONG)).await,
            Acquire::Busy(_)
        ),
        "a late release of the old lease does not free the new grant"
    );
    match attempt(&*store.backend, &next).await {
        Acquire::Granted(again) => assert_eq!(again.token(), handed.token()),
        other => panic!("the request's repeat is its grant: {other:?}"),
    }
    assert!(store.backend.renew(&handed, LONG).await.unwrap());
    store.backend.release(&handed).await.unwrap();
    let after = grant(store, &k, LONG).await;
    assert!(after.token() > handed.token(), "tokens go on increasing");
    store.backend.release(&after).await.unwrap();
}

/// A handed grant hands over in its turn, and is released by another
/// client too (which knows nothing of where the first put it).
pub async fn hand_off_chains_and_any_client_releases(store: &TestStore) {
    let k = hand_off_key(store);
    let mut lease = grant(store, &k, LONG).await;
    for _ in 0..3 {
        let next = request(&k, LONG);
        let handed = hand(store, &lease, &next).await;
        assert!(handed.token() > lease.token());
        lease = handed;
    }
    store.second_arc().release(&lease).await.unwrap();
    let after = grant(store, &k, LONG).await;
    assert!(
        after.token() > lease.token(),
        "released by another client: the key is free"
    );
    store.backend.release(&after).await.unwrap();
}

/// A lease that no longer holds the key (released, or broken and the key
/// taken by another) hands nothing over and changes nothing.
pub async fn hand_off_of_a_lease_that_is_gone_changes_nothing(store: &TestStore) {
    let k = hand_off_key(store);
    let released = grant(store, &k, LONG).await;
    store.backend.release(&released).await.unwrap();
    let next = request(&k, LONG);
    let answer = store.backend.release_to(&released, &next).await.unwrap();
    assert!(answer.is_none(), "a released lease hands nothing over");
    assert!(
        store.backend.inspect(&k).await.unwrap().is_none(),
        "still free"
    );

    let broken = grant(store, &k, LONG).await;
    assert!(store.backend.force_release(&k).await.unwrap());
    let taker = grant(store, &k, LONG).await;
    let answer = store.backend.release_to(&broken, &next).await.unwrap();
    assert!(answer.is_none(), "a broken lease hands nothing over");
    let info = held(store, &k, "the taker's grant must stay").await;
    assert_eq!(info.token, taker.token());
    store.backend.release(&taker).await.unwrap();
}

/// While waiters queue at the store, the key is theirs first: a hand-off
/// to a request of this process changes nothing.
pub async fn hand_off_waits_for_waiters_queued_at_the_store(store: &TestStore) {
    let k = hand_off_key(store);
    if !store.backend.queues() {
        return;
    }
    let holder = grant(store, &k, LONG).await;
    let queued = request(&k, LONG).with_queue_entry(QUEUE_ENTRY_TTL, 0);
    let answer = attempt(&*store.backend, &queued).await;
    assert!(matches!(answer, Acquire::Busy(_)), "{answer:?}");
    let next = request(&k, LONG);
    let answer = store.backend.release_to(&holder, &next).await.unwrap();
    assert!(answer.is_none(), "the queued waiter comes first");
    let info = held(store, &k, "nothing changed").await;
    assert_eq!(info.token, holder.token());
    store.backend.release(&holder).await.unwrap();
    store.backend.leave_queue(&k, queued.owner()).await.unwrap();
}

/// A hand-off frees nothing, so it wakes nobody: a waiter of another
/// process (the second client, with notifications of its own) sleeps on,
/// and the release that does free the key wakes it.
pub async fn hand_off_wakes_no_waiter_of_another_process(store: &TestStore) {
    let k = hand_off_key(store);
    if !store.caps.notifies {
        return;
    }
    let other = store.second_client();
    let holder = grant(store, &k, LONG).await;
    let mut waiter = other.subscribe(&k).await.unwrap();
    let handed = hand(store, &holder, &request(&k, LONG)).await;
    assert!(
        timeout(QUIET_FOR, waiter.notified()).await.is_err(),
        "a hand-off must not wake another process's waiter: the key was never free"
    );
    store.backend.release(&handed).await.unwrap();
    timeout(NOTIFIED_WITHIN, waiter.notified())
        .await
        .expect("the release that frees the key wakes the waiter");
}
