//! Permit and reader-writer grants on etcd claim a lock they presume empty
//! without reading it first (one transaction whose else branch reads the
//! lock: slots.rs, hints.rs). These tests give a backend a stale guess
//! (the lock looked empty to it, another backend changed it since) and
//! check that etcd's compares, not the guess, decide: the rules of
//! docs/semaphore.md and docs/rw-lock.md hold, tokens rise. Each backend
//! is on a prefix of the test's own. Reads `LEASEHOLD_TEST_ETCD`.
#![cfg(all(feature = "conformance", feature = "etcd"))]

#[path = "support/etcd.rs"]
mod etcd_fixtures;

use std::time::Duration;

use leasehold::backends::etcd::EtcdBackend;
use leasehold::conformance::server_url;
use leasehold::{Error, LeaseGuard, Locks};

/// A backend of its own (its own guesses) on `prefix`.
async fn open(url: &str, prefix: &str, window: Option<Duration>) -> (EtcdBackend, Locks) {
    let backend = etcd_fixtures::on_prefix(url, prefix, window).await;
    (
        backend.clone(),
        Locks::new(backend).with_holder_label("test"),
    )
}

fn prefix(name: &str) -> String {
    format!("slots-{name}-{:016x}/", rand::random::<u64>())
}

fn is_busy(result: &leasehold::Result<LeaseGuard>) -> bool {
    matches!(result, Err(Error::Busy { .. }))
}

/// `locks` takes and gives back a permit of `key` (of `permits`): its
/// backend has seen the lock empty and of its kind, so its next grant
/// there claims slot 0 unread.
async fn warm_permit(locks: &Locks, key: &str, permits: u32) {
    let guard = locks.semaphore(key, permits).unwrap().try_acquire().await;
    let guard = guard.expect("the warm-up permit");
    assert_eq!(guard.slot(), Some(0));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_presumed_claim_meets_taken_slots() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let p = prefix("taken");
    let (_, a) = open(&url, &p, None).await;
    let (_, b) = open(&url, &p, None).await;
    warm_permit(&a, "pool", 3).await;
    let first = b.semaphore("pool", 3).unwrap().try_acquire().await.unwrap();
    assert_eq!(first.slot(), Some(0));
    // A presumes the lock empty: its claim of slot 0 fails, and the same
    // round trip's read gives it slot 1.
    let pool = a.semaphore("pool", 3).unwrap();
    let second = pool.try_acquire().await.unwrap();
    assert_eq!(second.slot(), Some(1));
    assert!(second.token() > first.token());
    let third = pool.try_acquire().await.unwrap();
    assert_eq!(third.slot(), Some(2));
    assert!(third.token() > second.token());
    // Every permit taken: busy, from either backend.
    assert!(is_busy(&pool.try_acquire().await));
    assert!(is_busy(
        &b.semaphore("pool", 3).unwrap().try_acquire().await
    ));
    // The lowest free slot again once slot 0 is free.
    first.release().await.unwrap();
    let again = pool.try_acquire().await.unwrap();
    assert_eq!(again.slot(), Some(0));
    assert!(again.token() > third.token());
    for g in [second, third, again] {
        g.release().await.unwrap();
    }
    // Empty again: A's next grant (after a look that found the lock held)
    // reads first, and its next after that presumes again; both slot 0.
    for _ in 0..2 {
        let g = pool.try_acquire().await.unwrap();
        assert_eq!(g.slot(), Some(0));
        g.release().await.unwrap();
    }
}

/// A caller that counts fewer permits than are live is never granted, even
/// with slot 0 free and a guess that the lock is empty.
#[tokio::test]
async fn a_presumed_claim_keeps_a_smaller_count() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let p = prefix("count");
    let (_, a) = open(&url, &p, None).await;
    let (_, b) = open(&url, &p, None).await;
    warm_permit(&a, "pool", 1).await;
    let wide = b.semaphore("pool", 2).unwrap();
    let s0 = wide.try_acquire().await.unwrap();
    let s1 = wide.try_acquire().await.unwrap();
    assert_eq!((s0.slot(), s1.slot()), (Some(0), Some(1)));
    s0.release().await.unwrap();
    // Slot 0 is free, one permit is live: a count of 1 is full.
    assert!(is_busy(
        &a.semaphore("pool", 1).unwrap().try_acquire().await
    ));
    // A count of 2 has room, in slot 0.
    let g = a.semaphore("pool", 2).unwrap().try_acquire().await.unwrap();
    assert_eq!(g.slot(), Some(0));
    assert!(g.token() > s1.token());
    g.release().await.unwrap();
    s1.release().await.unwrap();
}

/// A waiting writer's marker turns away a reader that presumes the lock
/// empty, though reader slot 0 is free.
#[tokio::test]
async fn a_waiting_writer_turns_away_a_presumed_reader() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let p = prefix("writer");
    let (_, a) = open(&url, &p, None).await;
    let (_, b) = open(&url, &p, None).await;
    let (c_backend, c) = open(&url, &p, None).await;
    // A has seen the lock empty (a read taken and given back).
    let warm = a.rw_lock("doc").unwrap().try_read().await.unwrap();
    assert_eq!(warm.slot(), Some(0));
    warm.release().await.unwrap();
    let readers = b.rw_lock("doc").unwrap();
    let r0 = readers.try_read().await.unwrap();
    let r1 = readers.try_read().await.unwrap();
    assert_eq!((r0.slot(), r1.slot()), (Some(0), Some(1)));
    r0.release().await.unwrap();
    // The writer waits behind r1, its marker set.
    let writer = tokio::spawn(async move {
        let lock = c.rw_lock("doc").unwrap();
        lock.write(Duration::from_secs(20)).await
    });
    let marker = format!("{p}R/doc\0mark");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = c_backend
            .client()
            .kv_client()
            .get(marker.as_str(), None)
            .await
            .unwrap();
        if found.count() > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer sets its marker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lock = a.rw_lock("doc").unwrap();
    assert!(
        is_busy(&lock.try_read().await),
        "the marker turns readers away"
    );
    assert!(is_busy(&lock.try_read().await), "also after a look");
    let r1_token = r1.token();
    r1.release().await.unwrap();
    let w = writer.await.unwrap().expect("the writer gets the lock");
    let w_token = w.token();
    assert!(w_token > r1_token);
    assert!(is_busy(&lock.try_read().await), "the writer holds it");
    w.release().await.unwrap();
    let after = lock.try_read().await.unwrap();
    assert_eq!(after.slot(), Some(0));
    assert!(after.token() > w_token);
    after.release().await.unwrap();
}

/// A guess of the key's kind that went stale (its kind record swept, the
/// key a mutex's since) is refused by etcd: busy behind the mutex, then a
/// semaphore again once the mutex is free; and a key of another kind is
/// refused whatever was guessed.
#[tokio::test]
async fn a_stale_kind_guess_is_refused() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let p = prefix("kind");
    let (a_backend, a) = open(&url, &p, Some(Duration::from_millis(1))).await;
    let (_, b) = open(&url, &p, None).await;
    warm_permit(&a, "pool", 2).await;
    // Passes a window apart delete the idle kind record (a background
    // pass after the release may be first).
    let kind_record = format!("{p}K/pool");
    let mut swept = false;
    for _ in 0..100 {
        a_backend.sweep_idle().await.unwrap();
        let found = a_backend
            .client()
            .kv_client()
            .get(kind_record.as_str(), None)
            .await
            .unwrap();
        if found.count() == 0 {
            swept = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(swept, "the kind record of the idle key goes");
    let mutex = b.try_acquire("pool").await.expect("a mutex key now");
    let mutex_token = mutex.token();
    let pool = a.semaphore("pool", 2).unwrap();
    assert!(is_busy(&pool.try_acquire().await), "behind the mutex");
    mutex.release().await.unwrap();
    let permit = pool.try_acquire().await.expect("a semaphore again");
    assert_eq!(permit.slot(), Some(0));
    assert!(permit.token() > mutex_token);
    assert!(matches!(
        b.try_acquire("pool").await,
        Err(Error::KindMismatch { .. })
    ));
    assert!(matches!(
        b.rw_lock("pool").unwrap().try_read().await,
        Err(Error::KindMismatch { .. })
    ));
    permit.release().await.unwrap();
    // A backend that guessed "semaphore" for an rw lock's key.
    let (_, fresh) = open(&url, &p, None).await;
    let rw = b.rw_lock("doc").unwrap().try_write().await.unwrap();
    rw.release().await.unwrap();
    assert!(matches!(
        fresh.semaphore("doc", 2).unwrap().try_acquire().await,
        Err(Error::KindMismatch { .. })
    ));
    assert!(matches!(
        a.semaphore("doc", 2).unwrap().try_acquire().await,
        Err(Error::KindMismatch { .. })
    ));
}
