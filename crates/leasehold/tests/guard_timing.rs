//! Renewal, the lost-lease signal and waiting, on paused tokio time: every
//! instant below is exact, and no test really sleeps.

use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::testing::{Fault, Faulty, Op};
use leasehold::time::trusted_for;
use leasehold::{AcquireOptions, Backend, Error, Key, Locks};
use tokio::runtime::Handle;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

/// The renewal failure the guard tests switch on.
fn down() -> Fault {
    Fault::Unavailable("connection refused".into())
}

/// The memory store with faults to switch on, and a handle on it.
fn setup() -> (Faulty, Locks) {
    let store = Faulty::default();
    // On the test's runtime, whose paused clock must drive renewal too
    // (the library's own background thread runs on real time).
    let locks = Locks::new(store.clone()).with_background_runtime(Handle::current());
    (store, locks)
}

fn ttl(secs: u64) -> AcquireOptions {
    AcquireOptions::new().with_ttl(Duration::from_secs(secs))
}

#[tokio::test(start_paused = true)]
async fn renews_in_the_background_for_many_ttls() {
    let (store, locks) = setup();
    let guard = locks.acquire_with("k", &ttl(3)).await.unwrap();
    sleep(Duration::from_secs(60)).await;
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > Instant::now());
    // One renewal per ttl/3 = 1 s.
    let calls = store.calls(Op::Renew);
    assert!((59..=61).contains(&calls), "{calls} renewals in 60 s");
    assert!(matches!(
        locks.try_acquire("k").await,
        Err(Error::Busy { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn lost_fires_exactly_at_valid_until_when_the_store_is_down() {
    let (store, locks) = setup();
    let acquired_at = Instant::now();
    let guard = locks.acquire_with("k", &ttl(3)).await.unwrap();
    assert_eq!(
        guard.valid_until(),
        acquired_at + trusted_for(Duration::from_secs(3))
    );
    store.set(Op::Renew, down());
    guard.lost().await;
    let fired = Instant::now();
    assert_eq!(fired, acquired_at + trusted_for(Duration::from_secs(3)));
    // Before the store-side expiry (acquired_at + ttl).
    assert!(fired < acquired_at + Duration::from_secs(3));
    assert!(guard.is_lost());
    assert!(matches!(guard.check(), Err(Error::LeaseLost { .. })));
    // Renewal has stopped for good.
    let calls = store.calls(Op::Renew);
    store.clear(Op::Renew);
    sleep(Duration::from_secs(30)).await;
    assert_eq!(store.calls(Op::Renew), calls);
}

#[tokio::test(start_paused = true)]
async fn lost_fires_at_valid_until_when_a_renewal_hangs() {
    let (store, locks) = setup();
    let acquired_at = Instant::now();
    let guard = locks.acquire_with("k", &ttl(6)).await.unwrap();
    store.set(Op::Renew, Fault::Hang);
    guard.lost().await;
    assert_eq!(
        Instant::now(),
        acquired_at + trusted_for(Duration::from_secs(6))
    );
}

#[tokio::test(start_paused = true)]
async fn lost_fires_at_the_next_renewal_after_a_force_release() {
    let (_, locks) = setup();
    let acquired_at = Instant::now();
    let guard = locks.acquire_with("k", &ttl(3)).await.unwrap();
    assert!(locks.force_release("k").await.unwrap());
    // The store does not tell the holder: nothing flips until the renewal.
    sleep(Duration::from_millis(999)).await;
    assert!(!guard.is_lost());
    guard.lost().await;
    assert_eq!(Instant::now(), acquired_at + Duration::from_secs(1));
    assert!(guard.is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_retried_and_the_lease_kept() {
    let (store, locks) = setup();
    let guard = locks.acquire_with("k", &ttl(3)).await.unwrap();
    sleep(Duration::from_millis(900)).await;
    store.set(Op::Renew, down());
    sleep(Duration::from_millis(800)).await; // a few failed attempts
    store.clear(Op::Renew);
    sleep(Duration::from_secs(10)).await;
    assert!(!guard.is_lost());
}

#[tokio::test(start_paused = true)]
async fn without_auto_renew_the_lease_lasts_one_ttl() {
    let (store, locks) = setup();
    let acquired_at = Instant::now();
    let guard = locks
        .acquire_with("k", &ttl(3).with_auto_renew(false))
        .await
        .unwrap();
    guard.lost().await;
    assert_eq!(
        Instant::now(),
        acquired_at + trusted_for(Duration::from_secs(3))
    );
    assert_eq!(store.calls(Op::Renew), 0);
}

#[tokio::test(start_paused = true)]
async fn waiter_takes_a_crashed_holders_key_when_its_ttl_ends() {
    let (store, locks) = setup();
    // A holder that crashed: granted, never renewed, never released.
    let req =
        AcquireRequest::new(Key::new("k").unwrap(), Duration::from_secs(5), "crashed").unwrap();
    assert!(matches!(
        store.try_acquire(&req).await.unwrap(),
        Acquire::Granted(_)
    ));
    let started = Instant::now();
    let guard = locks.acquire("k", Duration::from_secs(60)).await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(5), "{waited:?}");
    assert!(
        waited <= Duration::from_millis(5_010),
        "woke {waited:?} after start"
    );
    assert_eq!(guard.token(), 2);
}

#[tokio::test(start_paused = true)]
async fn release_wakes_the_waiter_at_once() {
    let (_, locks) = setup();
    let holder = locks.acquire_with("k", &ttl(30)).await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let guard = locks.acquire("k", Duration::from_secs(60)).await.unwrap();
            (guard.token(), Instant::now())
        })
    };
    sleep(Duration::from_secs(1)).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (token, acquired_at) = waiter.await.unwrap();
    assert_eq!(token, 2);
    assert_eq!(
        acquired_at, released_at,
        "no timer between release and hand-off"
    );
}

#[tokio::test(start_paused = true)]
async fn wait_bound_is_exact() {
    let (_, locks) = setup();
    let _holder = locks.acquire_with("k", &ttl(30)).await.unwrap();
    let started = Instant::now();
    match locks.acquire("k", Duration::from_secs(2)).await {
        Err(Error::Timeout { waited, .. }) => assert_eq!(waited, Duration::from_secs(2)),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_huge_wait_bound_does_not_overflow() {
    let (_, locks) = setup();
    let holder = locks.acquire_with("k", &ttl(1)).await.unwrap();
    drop(holder);
    let guard = locks.acquire("k", Duration::MAX).await.unwrap();
    assert_eq!(guard.token(), 2);
}

#[tokio::test(start_paused = true)]
async fn cancellation_stops_the_wait() {
    let (_, locks) = setup();
    let _holder = locks.acquire_with("k", &ttl(30)).await.unwrap();
    let cancel = CancellationToken::new();
    let opts = AcquireOptions::new()
        .with_wait(Duration::from_secs(20))
        .with_cancel(cancel.clone());
    let canceller = tokio::spawn(async move {
        sleep(Duration::from_secs(1)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    assert!(matches!(
        locks.acquire_with("k", &opts).await,
        Err(Error::Cancelled { .. })
    ));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    canceller.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropping_the_guard_releases_best_effort() {
    let (_, locks) = setup();
    let guard = locks.acquire_with("k", &ttl(30)).await.unwrap();
    drop(guard);
    tokio::task::yield_now().await;
    let next = locks.try_acquire("k").await.expect("released on drop");
    assert_eq!(next.token(), 2);
}

#[tokio::test(start_paused = true)]
async fn release_does_not_fire_lost() {
    let (_, locks) = setup();
    let guard = locks.acquire_with("k", &ttl(3)).await.unwrap();
    let lost = guard.lost();
    guard.release().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(10), lost)
            .await
            .is_err(),
        "an explicit release is not a lost lease"
    );
}
