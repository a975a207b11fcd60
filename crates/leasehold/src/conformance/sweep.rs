//! Group `sweep`: the records of idle keys go at a sweep pass, never from
//! under a live grant, and a key that comes back takes tokens above every
//! token it had (docs/storage.md). For a store that deletes idle records
//! in passes it runs on demand ([`TestStore::with_sweep`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{prefix, TestStore, LONG};
use crate::guard::LeaseGuard;
use crate::lock::Locks;

/// How long the properties wait for a pass to see every idle key go (a
/// store may need two: one to note where it began, one to delete).
const PASSES_FOR: Duration = Duration::from_secs(10);

/// The kinds a key of these properties is used as.
#[derive(Clone, Copy, Debug)]
enum Use {
    Mutex,
    Permit,
    Writer,
}

/// Gives back the grant `taken` (which `what` says must have come) and
/// returns its token.
async fn give_back(taken: crate::Result<LeaseGuard>, what: &str) -> u64 {
    let guard = taken.expect(what);
    let token = guard.token();
    guard.release().await.expect("release");
    token
}

/// Takes `key` once as `kind` (a semaphore of 2, an rw lock's writer
/// after a reader) and gives it back; the highest token handed out.
async fn use_once(locks: &Locks, key: &str, kind: Use) -> u64 {
    match kind {
        Use::Mutex => give_back(locks.try_acquire(key).await, "free key").await,
        Use::Permit => {
            let semaphore = locks.semaphore(key, 2).expect("valid semaphore");
            let a = semaphore.try_acquire().await.expect("free permit");
            let b = semaphore.try_acquire().await.expect("second permit");
            let top = a.token().max(b.token());
            a.release().await.expect("release");
            b.release().await.expect("release");
            top
        }
        Use::Writer => {
            let rw = locks.rw_lock(key).expect("valid rw lock");
            give_back(rw.try_read().await, "free reader").await;
            give_back(rw.try_write().await, "free writer").await
        }
    }
}

/// Runs passes until the store keeps no record under `prefix`.
async fn sweep_until_gone(store: &TestStore, prefix: &str) {
    let deadline = tokio::time::Instant::now() + PASSES_FOR;
    loop {
        store.sweep().await.expect("a pass runs");
        let left = store.records(prefix).await;
        if left == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} records of idle keys under {prefix:?} left after passes for {PASSES_FOR:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Mutex, semaphore and rw keys used and released lose every record at a
/// pass; a held mutex, a live permit, a live reader and a half-held
/// semaphore keep theirs and stay held (each renews); every idle key that
/// comes back takes a token above every token it had.
pub async fn sweep_idle_keys_go_and_come_back_above_every_token(store: &TestStore) {
    let locks = store.locks();
    let p = prefix();
    let (idle, live) = (format!("{p}idle/"), format!("{p}live/"));
    let mut before = Vec::new();
    for i in 0..4 {
        for kind in [Use::Mutex, Use::Permit, Use::Writer] {
            let key = format!("{idle}{kind:?}/{i}");
            before.push((key.clone(), kind, use_once(&locks, &key, kind).await));
        }
    }
    // A mutex key that became a semaphore's keeps rising across the change.
    let changed = format!("{idle}changed");
    let mutex_token = use_once(&locks, &changed, Use::Mutex).await;
    let permit_token = use_once(&locks, &changed, Use::Permit).await;
    assert!(
        permit_token > mutex_token,
        "{permit_token} after {mutex_token}"
    );
    before.push((changed, Use::Permit, permit_token));

    let held = locks
        .try_acquire(&format!("{live}mutex"))
        .await
        .expect("free key");
    let permit = locks
        .semaphore(&format!("{live}sem"), 2)
        .expect("valid semaphore")
        .try_acquire()
        .await
        .expect("free permit");
    let reader = locks
        .rw_lock(&format!("{live}rw"))
        .expect("valid rw lock")
        .try_read()
        .await
        .expect("free reader");
    let half = locks
        .semaphore(&format!("{live}half"), 2)
        .expect("valid semaphore");
    let half_held = half.try_acquire().await.expect("free permit");
    give_back(half.try_acquire().await, "second permit").await;

    // Past the shortest window (1 ms) of every store's sweep.
    tokio::time::sleep(Duration::from_millis(20)).await;
    sweep_until_gone(store, &idle).await;
    // A held key keeps its records (a pass may still drop the row of a
    // released slot beside a live one).
    let guards: [&LeaseGuard; 4] = [&held, &permit, &reader, &half_held];
    for guard in guards {
        let records = store.records(guard.key().as_str()).await;
        assert!(records > 0, "{}: a pass took every record", guard.key());
        assert!(!guard.is_lost(), "{}", guard.key());
        assert!(
            store
                .backend
                .renew(guard.lease(), LONG)
                .await
                .expect("store answers"),
            "{}: a pass freed it",
            guard.key()
        );
    }
    for (key, kind, top) in before {
        let token = use_once(&locks, &key, kind).await;
        assert!(token > top, "{key} ({kind:?}): {token} after {top}");
    }
    for guard in [held, permit, reader, half_held] {
        guard.release().await.expect("release");
    }
}

/// A key a force-release freed counts its idle window from the break, as
/// a released one does from its release: a pass with a window of an hour
/// leaves its records as they were, and its next grant is above the broken
/// one. (SQLite and PostgreSQL once wrote no time at a break, which a pass
/// read as idle since the epoch.)
pub async fn sweep_keeps_a_force_released_key_for_its_window(store: &TestStore) {
    let locks = store.locks();
    let key = format!("{}broken", prefix());
    let broken = locks.try_acquire(&key).await.expect("free key");
    assert!(locks.force_release(&key).await.expect("store answers"));
    // Broken again while free: nothing held to break.
    assert!(!locks.force_release(&key).await.expect("store answers"));
    let kept = store.records(&key).await;
    store
        .sweep_with(Duration::from_secs(3600))
        .await
        .expect("a pass runs");
    assert_eq!(
        store.records(&key).await,
        kept,
        "a pass took the records of a key broken inside its window"
    );
    let next = locks.try_acquire(&key).await.expect("free key");
    assert!(
        next.token() > broken.token(),
        "{} after {}",
        next.token(),
        broken.token()
    );
    next.release().await.expect("release");
    drop(broken);
}

/// Passes in a loop race grants, renewals and releases of two semaphore
/// and two rw keys: no semaphore ever has more than its permits live, no
/// writer meets another holder, no key hands out a token twice, and no
/// mutex grant meets a live slot (a pass never deleted a key's records
/// from under a grant).
pub async fn sweep_racing_grants_never_break_a_live_slot(store: &TestStore) {
    let locks = store.locks();
    let p = prefix();
    let holders: Arc<Vec<AtomicI64>> = Arc::new((0..4).map(|_| AtomicI64::new(0)).collect());
    let tokens = Arc::new(Mutex::new(HashSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let passes = async {
        let mut deleted = 0;
        while !stop.load(Ordering::Relaxed) {
            deleted += store.sweep().await.expect("a pass runs");
            tokio::task::yield_now().await;
        }
        deleted
    };
    let mut workers = Vec::new();
    for w in 0..6_u64 {
        let (locks, holders, tokens, p) =
            (locks.clone(), holders.clone(), tokens.clone(), p.clone());
        workers.push(tokio::spawn(async move {
            for round in 0..25_u64 {
                let k = ((w + round) % 4) as usize;
                let writer = k >= 2 && round % 3 == 0;
                let (key, guard) = if k < 2 {
                    let key = format!("{p}sem/{k}");
                    let semaphore = locks.semaphore(&key, 2).expect("valid semaphore");
                    (
                        key,
                        semaphore.acquire(LONG).await.expect("a permit in time"),
                    )
                } else {
                    let key = format!("{p}rw/{k}");
                    let rw = locks.rw_lock(&key).expect("valid rw lock");
                    let guard = if writer {
                        rw.write(LONG).await
                    } else {
                        rw.read(LONG).await
                    };
                    (key, guard.expect("a grant in time"))
                };
                // A writer counts as the whole lock (100), a reader or a
                // permit as one.
                let weight = if writer { 100 } else { 1 };
                let now = holders[k].fetch_add(weight, Ordering::SeqCst) + weight;
                let limit = match (k < 2, writer) {
                    (true, _) => 2,
                    (false, true) => 100,
                    (false, false) => 99,
                };
                assert!(now <= limit, "{key}: {now} at once");
                assert!(
                    tokens.lock().unwrap().insert((key.clone(), guard.token())),
                    "{key}: token {} twice",
                    guard.token()
                );
                // One key is one lock: while a slot is live, the key is
                // never a mutex's.
                if let Ok(mutex) = locks.try_acquire(&key).await {
                    panic!(
                        "{key}: a mutex grant ({}) beside a live slot",
                        mutex.token()
                    );
                }
                holders[k].fetch_sub(weight, Ordering::SeqCst);
                assert!(!guard.is_lost(), "{key}");
                guard.release().await.expect("release");
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }));
    }
    let work = async {
        for worker in workers {
            worker.await.expect("a worker kept every rule");
        }
        stop.store(true, Ordering::Relaxed);
    };
    let ((), deleted) = tokio::join!(work, passes);
    assert!(deleted > 0, "the passes never met an idle key");
}
