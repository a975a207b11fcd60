//! `Locks::with_fair`: a handle whose mutex waiters queue at the store
//! unless an acquire's options say otherwise. Observed from another
//! process's point of view (a third handle on the same store): a release
//! hands the key to a queued waiter at once, so a `try_acquire` right
//! after it finds the key taken; a waiter that races leaves it free until
//! its own attempt lands.

use std::time::Duration;

use leasehold::backends::memory::MemoryBackend;
use leasehold::{AcquireOptions, Error, Locks};

/// `waiter` waits for "k" with `options` while `holder` holds it; then
/// the holder releases and a third handle tries at once. Returns whether
/// that try found the key taken (handed over to the waiter).
async fn handed_over_at_release(waiter: Locks, options: AcquireOptions) -> bool {
    let backend = waiter.backend().clone();
    let holder = Locks::from_arc(backend.clone());
    let third = Locks::from_arc(backend);
    let held = holder.try_acquire("k").await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire_with("k", &options).await.unwrap();
        guard.release().await.unwrap();
    });
    // Its first attempt has reached the store (and queued, if fair).
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    // No await in between lets the waiter run first (current-thread
    // runtime): only a hand-off in the release can have taken the key.
    let taken = match third.try_acquire("k").await {
        Ok(guard) => {
            guard.release().await.unwrap();
            false
        }
        Err(Error::Busy { .. }) => true,
        Err(e) => panic!("{e}"),
    };
    waiting.await.unwrap();
    taken
}

fn waits() -> AcquireOptions {
    AcquireOptions::new().with_wait(Duration::from_secs(10))
}

#[tokio::test(flavor = "current_thread")]
async fn a_fair_handle_queues_its_waiters() {
    let fair = Locks::new(MemoryBackend::new()).with_fair(true);
    assert!(handed_over_at_release(fair, waits()).await);
}

#[tokio::test(flavor = "current_thread")]
async fn an_acquire_that_says_not_fair_races_on_a_fair_handle() {
    let fair = Locks::new(MemoryBackend::new()).with_fair(true);
    assert!(!handed_over_at_release(fair, waits().with_fair(false)).await);
}

#[tokio::test(flavor = "current_thread")]
async fn a_handle_races_by_default_and_an_acquire_may_ask_to_queue() {
    let plain = Locks::new(MemoryBackend::new());
    assert!(!handed_over_at_release(plain.clone(), waits()).await);
    let plain = Locks::new(MemoryBackend::new());
    assert!(handed_over_at_release(plain, waits().with_fair(true)).await);
}
