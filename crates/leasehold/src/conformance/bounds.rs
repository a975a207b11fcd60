//! Waits against a blocked store (group `blocking`): another transaction
//! keeps the key's record locked (a row lock, the database's write lock).
//! The store bounds its own lock wait by the caller's, and a grant that
//! waited is not born expired.

use std::time::Duration;

use tokio::time::{sleep, timeout, Instant};

use super::{grant, held, key, prefix, request, TestStore, LONG, ROUND_TRIP_SLACK};
use crate::backend::Acquire;
use crate::error::Error;
use crate::lock::AcquireOptions;

/// Far beyond every bound asserted while the store is blocked.
const GIVE_UP: Duration = Duration::from_secs(10);

/// While the key's record is blocked, a wait ends at its bound with
/// `Timeout` and a try-once call answers `Busy` in about one round trip
/// (not after the store's own lock timeout); once unblocked, all is as
/// before.
pub async fn a_blocked_store_bounds_waits_and_try_once_calls(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let holder = grant(store, &k, LONG).await;
    let unblock = store.block(&k).await;
    let locks = store.locks();

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let outcome = timeout(GIVE_UP, locks.acquire(k.as_str(), wait))
        .await
        .expect("the wait ends while the store is blocked");
    let took = started.elapsed();
    assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    assert!(
        took < wait + ROUND_TRIP_SLACK,
        "wait of {wait:?} took {took:?}"
    );

    let started = Instant::now();
    let outcome = timeout(GIVE_UP, locks.try_acquire(k.as_str()))
        .await
        .expect("a try-once call ends while the store is blocked");
    let took = started.elapsed();
    // Busy (the HTTP layer's reject mode answers 409), not a store error.
    assert!(matches!(outcome, Err(Error::Busy { .. })), "{outcome:?}");
    assert!(took < ROUND_TRIP_SLACK, "try-once took {took:?}");

    unblock().await;
    store.backend.release(&holder).await.unwrap();
    let next = locks.try_acquire(k.as_str()).await.expect("free again");
    next.release().await.unwrap();
}

/// A grant that waited for a block longer than its ttl expires a ttl after
/// it was taken (the store computes the expiry once it holds the record),
/// both at the store and as the core hands it out.
pub async fn a_grant_after_a_block_is_live(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    // A free record that exists, for stores that lock records.
    let first = grant(store, &k, LONG).await;
    store.backend.release(&first).await.unwrap();
    let ttl = Duration::from_secs(1);
    let blocked_for = ttl + Duration::from_millis(800);

    let unblocking = block_for(store, &k, blocked_for).await;
    let req = request(&k, ttl).with_lock_deadline(Instant::now() + GIVE_UP);
    let started = Instant::now();
    // A store may wait out the block in one attempt (a pooled PostgreSQL
    // connection waits for the row lock up to the deadline) or answer busy
    // while it lasts and grant the attempt after it (the shared PostgreSQL
    // connection caps a row-lock wait at 50 ms): either way the grant that
    // follows the block must be live.
    let lease = loop {
        match store.backend.try_acquire(&req).await.unwrap() {
            Acquire::Granted(lease) => break lease,
            Acquire::Busy(busy) => {
                assert!(
                    started.elapsed() < blocked_for + ROUND_TRIP_SLACK,
                    "a free key after the block: {busy:?}"
                );
                sleep(Duration::from_millis(20)).await;
            }
            other => panic!("a mutex key answered {other:?}"),
        }
    };
    assert!(
        started.elapsed() >= blocked_for - Duration::from_millis(100),
        "the grant waited for the block"
    );
    let live = held(store, &k, "the grant was born expired at the store").await;
    assert_eq!(live.token, lease.token());
    unblocking.await.unwrap();
    store.backend.release(&lease).await.unwrap();

    let unblocking = block_for(store, &k, blocked_for).await;
    let options = AcquireOptions::new().with_ttl(ttl).with_wait(GIVE_UP);
    let guard = store
        .locks()
        .acquire_with(k.as_str(), &options)
        .await
        .unwrap();
    assert!(!guard.is_lost(), "a guard is never born lost");
    let live = held(store, &k, "the guard's lease is not at the store").await;
    assert_eq!(live.token, guard.token());
    unblocking.await.unwrap();
    guard.release().await.unwrap();
}

/// Blocks `k` now and ends the block after `held`, on a task.
async fn block_for(
    store: &TestStore,
    k: &crate::key::Key,
    held: Duration,
) -> tokio::task::JoinHandle<()> {
    let unblock = store.block(k).await;
    tokio::spawn(async move {
        sleep(held).await;
        unblock().await;
    })
}
