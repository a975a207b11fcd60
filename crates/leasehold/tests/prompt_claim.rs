//! `AcquireOptions::with_prompt_claim`: a grant handed over by the store's
//! queue lasts only its claim window until the guard claims it with a
//! renewal. By default that renewal comes a third into the window; with a
//! prompt claim it is sent as the guard is made, so `valid_until` covers
//! the whole ttl one round trip after the hand-off (the CLI's `run` plans
//! its command's SIGTERM from it).

use std::time::Duration;

use leasehold::backends::memory::MemoryBackend;
use leasehold::{AcquireOptions, LeaseGuard, Locks};
use tokio::time::{sleep, timeout, Instant};

const TTL: Duration = Duration::from_secs(60);

/// The longest claim window a store gives a hand-off (the queue entry's
/// lease), with room for the clock's margins.
const CLAIM_WINDOW_AT_MOST: Duration = Duration::from_millis(2500);

/// A fair waiter's guard for "k", handed over by a release; with the
/// waiter's handle, whose stats count its renewals.
async fn handed_over(prompt_claim: bool) -> (Locks, LeaseGuard) {
    let waiter = Locks::new(MemoryBackend::new()).with_fair(true);
    let holder = Locks::from_arc(waiter.backend().clone());
    let held = holder.try_acquire("k").await.unwrap();
    let waiting = waiter.clone();
    let options = AcquireOptions::new()
        .with_ttl(TTL)
        .with_wait(Duration::from_secs(10))
        .with_prompt_claim(prompt_claim);
    let acquiring = tokio::spawn(async move { waiting.acquire_with("k", &options).await });
    // Its first attempt has reached the store and queued.
    sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    let guard = acquiring.await.unwrap().unwrap();
    assert_eq!(waiter.stats().handed_over, 1, "built from the hand-off");
    (waiter, guard)
}

#[tokio::test]
async fn a_prompt_claim_renews_a_handed_over_grant_at_once() {
    let (locks, guard) = handed_over(true).await;
    // The claim is one in-process renewal away; without it the first
    // renewal would come a third into the claim window (about 667 ms).
    let claimed = timeout(Duration::from_millis(400), async {
        while locks.stats().renewals.ok == 0 {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        claimed.is_ok(),
        "claimed before a third of the claim window"
    );
    assert!(
        guard.valid_until() > Instant::now() + CLAIM_WINDOW_AT_MOST,
        "the claim gave the grant its whole ttl"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn by_default_a_handed_over_grant_lasts_its_claim_window_until_its_first_renewal() {
    let (locks, guard) = handed_over(false).await;
    assert_eq!(locks.stats().renewals.ok, 0, "no claim sent with the guard");
    assert!(
        guard.valid_until() <= Instant::now() + CLAIM_WINDOW_AT_MOST,
        "valid for the claim window, not yet the ttl"
    );
    // The first renewal, a third into the window, claims it.
    timeout(Duration::from_secs(5), async {
        while locks.stats().renewals.ok == 0 {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("claimed at the first renewal");
    assert!(guard.valid_until() > Instant::now() + CLAIM_WINDOW_AT_MOST);
    guard.release().await.unwrap();
}
