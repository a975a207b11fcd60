//! Permit and reader-writer grants on etcd claim a lock they presume empty
//! without reading it first (one transaction whose else branch reads the
//! lock: slots.rs, hints.rs). A stale guess of a lock's slots (another
//! client took slot 0, filled a smaller count, or set a writer's marker)
//! is every store's matter: the conformance suite's `*_stale_view_*` and
//! `rw_waiting_writer_turns_away_a_stale_reader` properties. The test here
//! needs etcd's sweep window: a guess of the key's kind that went stale
//! when the kind record was swept. Each backend is on a prefix of the
//! test's own. Reads `LEASEHOLD_TEST_ETCD`.
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
