//! The core's promises at the edges, on paused tokio time over the memory
//! store wrapped to misbehave: a wait never outlives its bound whatever the
//! store does, no guard is born lost, one stuck renewal request does not
//! lose the lease, and a dropped guard's release is not overtaken by the
//! next acquisition through the same handle.

use std::time::Duration;

use leasehold::testing::{Fault, Faulty, Op};
use leasehold::{AcquireOptions, Error, Locks, STORE_ANSWER_GRACE};
use tokio::runtime::Handle;
use tokio::time::{sleep, timeout, Instant};

/// The memory store with faults to switch on, and a handle on it.
fn setup() -> (Faulty, Locks) {
    let store = Faulty::default();
    // On the test's runtime, whose paused clock must drive renewal too
    // (the library's own background thread runs on real time).
    let locks = Locks::new(store.clone()).with_background_runtime(Handle::current());
    (store, locks)
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_arrives_after_its_lease_ended_is_given_back_and_retried() {
    let (store, locks) = setup();
    let ttl = Duration::from_secs(1);
    // The first answer takes longer than the whole ttl.
    store.set_next(
        Op::TryAcquire,
        1,
        Fault::Delay(Duration::from_millis(1_500)),
    );
    let options = AcquireOptions::new()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(10));
    let guard = locks.acquire_with("k", &options).await.unwrap();
    assert!(!guard.is_lost(), "a guard handed out is not born lost");
    assert!(guard.valid_until() > Instant::now());
    // The late grant (token 1) was released, so the retry got token 2 at once.
    assert_eq!(guard.token(), 2);
    let held = locks.inspect("k").await.unwrap().expect("held");
    assert_eq!(held.token, 2);
}

#[tokio::test(start_paused = true)]
async fn a_try_once_grant_that_arrives_dead_is_busy_not_a_lost_guard() {
    let (store, locks) = setup();
    // Slower than the shortest ttl, well within the core's backstop.
    let ttl = Duration::from_millis(100);
    assert!(ttl * 5 < STORE_ANSWER_GRACE);
    store.set_next(Op::TryAcquire, 1, Fault::Delay(ttl * 5));
    let options = AcquireOptions::new().with_ttl(ttl);
    match locks.acquire_with("k", &options).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(locks.inspect("k").await.unwrap(), None, "grant given back");
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_attempt_ends_one_grace_after_the_wait_bound() {
    let (store, locks) = setup();
    // Stuck far beyond any bound (but still answering, later, with a grant).
    store.set_next(Op::TryAcquire, 2, Fault::Delay(Duration::from_secs(20)));
    let started = Instant::now();
    let outcome = timeout(Duration::from_secs(15), locks.try_acquire("k"))
        .await
        .expect("try_acquire returns although the store does not answer");
    assert!(
        matches!(outcome, Err(Error::Unavailable { .. })),
        "{outcome:?}"
    );
    assert_eq!(started.elapsed(), STORE_ANSWER_GRACE);

    let started = Instant::now();
    let wait = Duration::from_millis(300);
    let outcome = timeout(Duration::from_secs(15), locks.acquire("k", wait))
        .await
        .expect("acquire returns although the store does not answer");
    assert!(
        matches!(outcome, Err(Error::Unavailable { .. })),
        "{outcome:?}"
    );
    assert_eq!(started.elapsed(), wait + STORE_ANSWER_GRACE);

    // Both abandoned attempts were granted in the end (the first one) or
    // found it busy; whatever they got was given back, not left to expire.
    sleep(Duration::from_secs(25)).await;
    assert_eq!(locks.inspect("k").await.unwrap(), None);
    let next = locks.try_acquire("k").await.unwrap();
    assert!(next.token() >= 2, "the abandoned grant had token 1");
}

#[tokio::test(start_paused = true)]
async fn a_stuck_renewal_request_is_retried_within_the_lease() {
    let (store, locks) = setup();
    let options = AcquireOptions::new().with_ttl(Duration::from_secs(3));
    let guard = locks.acquire_with("k", &options).await.unwrap();
    // The first renewal (at 1 s) never answers; the next request does.
    store.set_next(Op::Renew, 1, Fault::Hang);
    sleep(Duration::from_secs(30)).await;
    assert!(!guard.is_lost(), "one black-holed request lost the lease");
    assert!(store.calls(Op::Renew) >= 2);
    assert_eq!(locks.inspect("k").await.unwrap().unwrap().token, 1);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_after_a_drop_waits_for_the_drops_release() {
    let (store, locks) = setup();
    // The release a drop starts takes a round trip to land.
    store.set(Op::Release, Fault::Delay(Duration::from_millis(20)));
    let guard = locks.try_acquire("k").await.unwrap();
    drop(guard);
    let next = locks
        .try_acquire("k")
        .await
        .expect("the drop's release lands before the next attempt");
    assert_eq!(next.token(), 2);
    // The same through a clone of the handle, with a waiting acquisition's
    // guard dropped.
    drop(next);
    let clone = locks.clone();
    let again = clone
        .try_acquire("k")
        .await
        .expect("ordered for clones too");
    assert_eq!(again.token(), 3);
}
