//! Waiters of one process behind a guard of that same process: a lost guard
//! does not keep the key from its own process, and a wait that timed out
//! behind one says so.

use std::time::Duration;

use leasehold::backends::memory::MemoryBackend;
use leasehold::{Error, Locks};
use tokio::runtime::Handle;

/// After `force_release`, the store considers the key free: a waiter of
/// the same `Locks` gets it although the broken guard still lives, as a
/// waiter of another process would.
#[tokio::test]
async fn a_broken_guard_does_not_block_its_own_process() {
    let locks = Locks::new(MemoryBackend::new());
    // Taken by a waiter (with a wait bound), as most guards are.
    let broken = locks.acquire("k", Duration::from_secs(1)).await.unwrap();
    assert!(locks.force_release("k").await.unwrap());
    let next = locks
        .acquire("k", Duration::from_secs(5))
        .await
        .expect("the key is free at the store; the local waiter gets it");
    assert!(next.token() > broken.token());
    drop(broken);
}

/// The same when the lease ran out without being released (a stalled
/// holder): the waiter's turn begins when the store frees the key.
#[tokio::test(start_paused = true)]
async fn an_expired_guard_does_not_block_its_own_process() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let options = leasehold::AcquireOptions::new()
        .with_ttl(Duration::from_secs(1))
        .with_wait(Duration::from_secs(1))
        .with_auto_renew(false);
    let expired = locks.acquire_with("k", &options).await.unwrap();
    let next = locks
        .acquire("k", Duration::from_secs(5))
        .await
        .expect("the lease expired at the store; the local waiter gets it");
    assert!(expired.is_lost());
    assert!(next.token() > expired.token());
}

/// The error of a 200 ms wait for `k`, which must not be granted.
async fn timed_out(locks: &Locks) -> Error {
    locks
        .acquire("k", Duration::from_millis(200))
        .await
        .unwrap_err()
}

/// Whether a `Timeout` says a guard of this process holds the key.
fn held_here(e: &Error) -> bool {
    match e {
        Error::Timeout { held_here, .. } => *held_here,
        other => panic!("expected Timeout, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_timeout_behind_a_guard_of_this_process_says_so() {
    let backend = std::sync::Arc::new(MemoryBackend::new());
    // On the paused test runtime: its clock drives renewal too.
    let here = Locks::from_arc(backend.clone()).with_background_runtime(Handle::current());
    let elsewhere = Locks::from_arc(backend).with_background_runtime(Handle::current());
    let guard = here.acquire("k", Duration::from_secs(1)).await.unwrap();

    let e = timed_out(&here).await;
    assert!(held_here(&e), "{e:?}");
    assert!(
        e.to_string()
            .contains("a guard of this same process holds it"),
        "{e}"
    );
    // Another handle (as another process) is not behind this process.
    let e = timed_out(&elsewhere).await;
    assert!(!held_here(&e), "{e:?}");
    drop(guard);
}

/// A task that releases and re-acquires at once still queues behind the
/// local waiter that was there first.
#[tokio::test]
async fn a_releasing_holder_queues_behind_the_waiting_neighbour() {
    let locks = Locks::new(MemoryBackend::new());
    let first = locks.acquire("k", Duration::from_secs(1)).await.unwrap();
    let neighbour = tokio::spawn({
        let locks = locks.clone();
        async move { locks.acquire("k", Duration::from_secs(5)).await }
    });
    // Let the neighbour reach the store and wait there.
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await.unwrap();
    let again = locks.acquire("k", Duration::from_millis(300)).await;
    let neighbour = neighbour.await.unwrap().expect("the neighbour got the key");
    assert!(
        matches!(
            again,
            Err(Error::Timeout {
                held_here: true,
                ..
            })
        ),
        "{again:?}"
    );
    drop(neighbour);
}

/// A waiter behind a guard of its own process subscribes before it asks
/// the store: one busy answer, then it waits for the release (a waiter
/// subscribed after its busy answer must ask once more, lest a release in
/// between go unnoticed: that is a store round trip per grant of a key its
/// own tasks take turns on).
#[tokio::test(start_paused = true)]
async fn a_waiter_behind_its_own_process_asks_the_store_once_before_it_waits() {
    use leasehold::testing::{Faulty, Op};
    let store = Faulty::default();
    let locks = Locks::new(store.clone()).with_background_runtime(Handle::current());
    let held = locks.try_acquire("k").await.unwrap();
    let before = store.calls(Op::TryAcquire);
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { locks.acquire("k", Duration::from_secs(5)).await }
    });
    // On paused time the clock moves only when every task waits: by 1 ms
    // the waiter has done all it does before it sleeps, and its
    // safety-net poll (25 ms at the earliest) has not come.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!waiter.is_finished());
    assert_eq!(
        store.calls(Op::TryAcquire) - before,
        1,
        "one busy answer before waiting"
    );
    held.release().await.unwrap();
    let next = waiter.await.unwrap().expect("woken by the release");
    assert_eq!(store.calls(Op::TryAcquire) - before, 2, "then the grant");
    next.release().await.unwrap();
}
