//! All-or-nothing multi-locks ([`Locks::acquire_many`](crate::Locks::acquire_many))
//! on a real store: all keys or none, no deadlock between overlapping sets
//! taken in opposite orders, loss of one key is loss of the set.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, timeout};

use super::{grant, held, key, prefix, TestStore, LONG};
use crate::error::Error;
use crate::key::Key;
use crate::lock::AcquireOptions;

/// None of `keys` is held at the store.
async fn none_held(store: &TestStore, keys: &[Key], after: &str) {
    for k in keys {
        let info = store.backend.inspect(k).await.expect("store answers");
        assert!(
            info.is_none(),
            "{k:?} is still held after {after}: {info:?}"
        );
    }
}

/// A key held by somebody else makes the whole call busy (trying once) or
/// time out (waiting), and leaves none of the other keys held; once it is
/// free the call takes every key, each with its own fencing token, and
/// its release frees them all.
pub async fn acquire_many_is_all_or_nothing(store: &TestStore) {
    let p = prefix();
    // The held key sorts in the middle, so keys before it were taken and
    // must be given back, and keys after it never asked for.
    let names: Vec<String> = ["d", "a", "c", "b"]
        .iter()
        .map(|s| format!("{p}{s}"))
        .collect();
    let keys: Vec<Key> = names.iter().map(|n| key(n.clone())).collect();
    let others: Vec<Key> = keys
        .iter()
        .filter(|k| !k.as_str().ends_with('c'))
        .cloned()
        .collect();
    let blocker = grant(store, &key(format!("{p}c")), LONG).await;
    let locks = store.locks();

    match locks.try_acquire_many(&names).await {
        Err(Error::Busy { key, .. }) => assert_eq!(key, format!("{p}c")),
        other => panic!("expected Busy on the held key, got {other:?}"),
    }
    none_held(store, &others, "a busy try_acquire_many").await;

    let waiting = AcquireOptions::new().with_wait(Duration::from_millis(300));
    match locks.acquire_many(&names, &waiting).await {
        Err(Error::Timeout { key, waited, .. }) => {
            assert_eq!(key, format!("{p}c"));
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected Timeout on the held key, got {other:?}"),
    }
    none_held(store, &others, "a timed-out acquire_many").await;

    store.backend.release(&blocker).await.unwrap();
    // Every key is free: the wait only bounds a slow store (a loaded
    // machine's SQLite took over 300 ms here).
    let free = AcquireOptions::new().with_wait(Duration::from_secs(10));
    let guard = locks
        .acquire_many(&names, &free)
        .await
        .expect("every key is free now");
    let tokens: Vec<(String, u64)> = guard
        .tokens()
        .map(|(k, t)| (k.as_str().to_owned(), t))
        .collect();
    let mut sorted_names = names.clone();
    sorted_names.sort();
    assert_eq!(
        tokens.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        sorted_names,
        "tokens are listed in canonical key order"
    );
    for (name, token) in &tokens {
        let info = held(store, &key(name.clone()), "acquire_many returned").await;
        assert_eq!(info.token, *token, "{name}");
    }
    assert!(
        guard.token(&format!("{p}c")).unwrap() > blocker.token(),
        "the blocked key's new token is above the blocker's"
    );
    guard.release().await.unwrap();
    none_held(store, &keys, "MultiGuard::release").await;
}

/// Tasks, each its own client (a `Locks` of its own, as separate processes
/// are), take overlapping key sets given in opposite orders, again and
/// again. Canonical ordering means nobody waits in a cycle: every call
/// succeeds well within its bound, and no key ever has two holders.
pub async fn acquire_many_overlapping_sets_do_not_deadlock(store: &TestStore) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 4;
    let p = prefix();
    let names: Vec<String> = (0..5).map(|i| format!("{p}sku{i}")).collect();
    let holding: Arc<Vec<AtomicBool>> =
        Arc::new(names.iter().map(|_| AtomicBool::new(false)).collect());
    let options = AcquireOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            // Three consecutive keys starting at t % 3, forward for even
            // tasks and backward for odd ones: every pair of sets overlaps.
            let mut set: Vec<usize> = (t % 3..t % 3 + 3).collect();
            if t % 2 == 1 {
                set.reverse();
            }
            let names = names.clone();
            let holding = holding.clone();
            let options = options.clone();
            let locks = store.locks();
            tokio::spawn(async move {
                let mine: Vec<&str> = set.iter().map(|&i| names[i].as_str()).collect();
                for round in 0..ROUNDS {
                    let guard = locks
                        .acquire_many(&mine, &options)
                        .await
                        .unwrap_or_else(|e| panic!("task {t} round {round}: {e}"));
                    for &i in &set {
                        assert!(
                            !holding[i].swap(true, Ordering::SeqCst),
                            "{} has two holders",
                            names[i]
                        );
                    }
                    sleep(Duration::from_millis(5)).await;
                    for &i in &set {
                        holding[i].store(false, Ordering::SeqCst);
                    }
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.expect("task finished without panicking");
        }
    };
    timeout(Duration::from_secs(60), all)
        .await
        .expect("overlapping acquire_many calls finish (no deadlock)");
}

/// Losing one key (broken by an admin, then taken by another client) fires
/// the multi-guard's `lost()`, and `check()` names that key.
pub async fn acquire_many_loss_of_one_fires_lost(store: &TestStore) {
    let p = prefix();
    let names: Vec<String> = ["x", "y", "z"].iter().map(|s| format!("{p}{s}")).collect();
    let ttl = Duration::from_millis(900);
    let guard = store
        .locks()
        .acquire_many(&names, &AcquireOptions::new().with_ttl(ttl))
        .await
        .expect("free keys");
    let lost = guard.lost();
    assert!(!guard.is_lost());
    let victim = key(format!("{p}y"));
    assert!(store.backend.force_release(&victim).await.unwrap());
    let thief = grant(store, &victim, LONG).await;
    // The next renewal (ttl/3) finds the lease gone.
    timeout(Duration::from_secs(5), lost)
        .await
        .expect("the multi-guard reports the loss of one key");
    assert!(guard.is_lost());
    match guard.check() {
        Err(Error::LeaseLost { key }) => assert_eq!(key, victim.as_str()),
        other => panic!("expected LeaseLost for {victim:?}, got {other:?}"),
    }
    // The other keys are still ours until released.
    for name in [&names[0], &names[2]] {
        let info = held(store, &key(name.clone()), "only y was broken").await;
        assert_eq!(Some(info.token), guard.token(name));
    }
    guard.release().await.unwrap();
    let info = held(store, &victim, "releasing the set freed the thief's key").await;
    assert_eq!(info.token, thief.token());
    store.backend.release(&thief).await.unwrap();
}
