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
    // A wait that ends before it asked the store (the front waiter behind
    // a guard of its own process waits for that guard's release first)
    // names no holder it did not hear of, and no remaining ttl it guessed.
    match here.acquire("k", Duration::from_millis(10)).await {
        Err(Error::Timeout {
            held_here: true,
            holder: None,
            remaining: None,
            ..
        }) => {}
        other => panic!("expected a Timeout naming no holder, got {other:?}"),
    }
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
    // A store that cannot hand over inside a release (memory can: see the
    // next test for what a waiter does there).
    let locks = Locks::new(NoHandOff(store.clone())).with_background_runtime(Handle::current());
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

/// `inner` as a store that cannot hand over inside a release.
#[derive(Debug)]
struct NoHandOff(leasehold::testing::Faulty);

impl leasehold::backends::decorator::Decorator for NoHandOff {
    fn inner(&self) -> &dyn leasehold::Backend {
        &self.0
    }
    fn hands_over_locally(&self) -> bool {
        false
    }
}

/// On a store that hands over inside a release (memory does), the front
/// local waiter behind a guard of its process does not ask the store: the
/// guard's release gives it the key in the same step (the next token,
/// counted as a hand-off).
#[tokio::test(start_paused = true)]
async fn a_release_hands_the_key_to_the_front_local_waiter() {
    use leasehold::testing::{Faulty, Op};
    let store = Faulty::default();
    let locks = Locks::new(store.clone()).with_background_runtime(Handle::current());
    let holder = locks.acquire("k", Duration::from_secs(1)).await.unwrap();
    let waiting = locks.clone();
    let waiter = tokio::spawn(async move { waiting.acquire("k", Duration::from_secs(10)).await });
    // Waiting by now (see the test above), its safety-net poll not yet due.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (before, asked) = (locks.stats(), store.calls(Op::TryAcquire));
    assert_eq!(
        asked, 1,
        "the holder's attempt only: the waiter did not ask"
    );
    let token = holder.token();
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().expect("handed over");
    assert_eq!(
        locks.stats().handed_over - before.handed_over,
        1,
        "one hand-off"
    );
    assert_eq!(store.calls(Op::TryAcquire), asked, "no attempt of its own");
    assert_eq!(next.token(), token + 1, "the next token");
    assert_eq!(store.calls(Op::Release), 1, "one release: the hand-off");
}

/// A process hands a key over at most `HAND_OFFS_IN_A_ROW` (4) times in a
/// row; the release after that frees it at the store, where other
/// processes' waiters race for it: ten waiters in line after a holder get
/// the key by 4 hand-offs, a release, 4 hand-offs, a release.
#[tokio::test(start_paused = true)]
async fn a_process_hands_a_key_over_at_most_four_times_in_a_row() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let holder = locks.acquire("k", Duration::from_secs(1)).await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..10 {
        let waiting = locks.clone();
        waiters.push(tokio::spawn(async move {
            let guard = waiting.acquire("k", Duration::from_secs(60)).await?;
            tokio::time::sleep(Duration::from_millis(10)).await;
            guard.release().await
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let before = locks.stats();
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    let after = locks.stats();
    assert_eq!(after.acquires.granted - before.acquires.granted, 10);
    assert_eq!(after.handed_over - before.handed_over, 8);
}

/// A waiter that gives up while a release is handing it the key (the
/// release slow at the store) does not keep that grant: the release gives
/// it back, and the key is free.
#[tokio::test(start_paused = true)]
async fn a_grant_handed_to_a_waiter_that_went_away_is_given_back() {
    use leasehold::testing::{Fault, Faulty, Op};
    let memory = std::sync::Arc::new(MemoryBackend::new());
    let faulty = std::sync::Arc::new(Faulty::new(memory.clone()));
    let locks = Locks::from_arc(faulty.clone()).with_background_runtime(Handle::current());
    let holder = locks.acquire("k", Duration::from_secs(1)).await.unwrap();
    let holder_token = holder.token();
    let waiter_locks = locks.clone();
    let waiter =
        tokio::spawn(async move { waiter_locks.acquire("k", Duration::from_millis(500)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    faulty.set_next(Op::Release, 1, Fault::Delay(Duration::from_secs(3)));
    holder.release().await.unwrap();
    let e = waiter.await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    let key = leasehold::Key::new("k").unwrap();
    assert!(
        leasehold::Backend::inspect(&*memory, &key)
            .await
            .unwrap()
            .is_none(),
        "the grant made for the waiter that left was given back"
    );
    // The grant was made (a plain release would not have drawn a token):
    // the next one is two past the holder's.
    let next = locks.try_acquire("k").await.unwrap();
    assert_eq!(next.token(), holder_token + 2, "a hand-off took a token");
}
