//! Storage bounded by the keys in use on etcd: grants are deleted with
//! their leases, and the kind record of a semaphore or rw lock key with no
//! grant left and no release for the idle window goes at a sweep pass,
//! never from under a live grant.
//! Tokens are etcd revisions, so a key that comes back is above every token
//! it had. Reads `LEASEHOLD_TEST_ETCD`.
#![cfg(all(feature = "conformance", feature = "etcd"))]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backends::etcd::{EtcdBackend, EtcdOptions};
use leasehold::conformance::server_url;
use leasehold::Locks;

/// A backend on its own prefix, so that counts are this test's alone.
async fn open(url: &str, prefix: &str, window: Option<Duration>) -> (EtcdBackend, Locks) {
    let backend = EtcdBackend::connect_with(
        url,
        EtcdOptions::new()
            .with_prefix(prefix)
            .with_idle_window(window),
    )
    .await
    .expect("the etcd test server answers");
    (backend.clone(), Locks::new(backend))
}

/// Runs passes until `prefix` holds `left` keys (or fails after 10 s).
async fn sweep_until(backend: &EtcdBackend, prefix: &str, left: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        backend.sweep_idle().await.unwrap();
        let now = records(backend, prefix).await;
        if now == left {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{now} records left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many etcd keys are under `prefix`.
async fn records(backend: &EtcdBackend, prefix: &str) -> i64 {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    backend
        .client()
        .kv_client()
        .get(prefix, Some(options))
        .await
        .unwrap()
        .count()
}

fn prefix(name: &str) -> String {
    format!("storage-{name}-{}/", std::process::id())
}

#[tokio::test]
async fn kind_records_of_free_keys_go_and_live_ones_stay() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let prefix = prefix("kinds");
    let window = Duration::from_millis(300);
    let (backend, locks) = open(&url, &prefix, Some(window)).await;
    assert_eq!(backend.idle_window(), Some(window));
    let mut before = Vec::new();
    for i in 0..5 {
        let semaphore = locks.semaphore(&format!("pool/{i}"), 2).unwrap();
        let permit = semaphore.try_acquire().await.unwrap();
        before.push((format!("pool/{i}"), permit.token()));
        permit.release().await.unwrap();
        let rw = locks.rw_lock(&format!("doc/{i}")).unwrap();
        let write = rw.try_write().await.unwrap();
        before.push((format!("doc/{i}"), write.token()));
        write.release().await.unwrap();
        let mutex = locks.try_acquire(&format!("order/{i}")).await.unwrap();
        mutex.release().await.unwrap();
    }
    let live_permit = locks
        .semaphore("live-sem", 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let live_read = locks.rw_lock("live-rw").unwrap().try_read().await.unwrap();
    // 12 kind records, and the two live grants.
    assert_eq!(records(&backend, &prefix).await, 14);

    // Not before the window has passed.
    assert_eq!(backend.sweep_idle().await.unwrap(), 0);
    assert_eq!(records(&backend, &prefix).await, 14);
    sweep_until(&backend, &prefix, 4).await;
    assert!(!live_permit.is_lost() && !live_read.is_lost());

    for (key, top) in before {
        let token = if key.starts_with("pool/") {
            let permit = locks
                .semaphore(&key, 2)
                .unwrap()
                .try_acquire()
                .await
                .unwrap();
            let token = permit.token();
            permit.release().await.unwrap();
            token
        } else {
            // A free key is of no kind: now a mutex's.
            let mutex = locks.try_acquire(&key).await.unwrap();
            let token = mutex.token();
            mutex.release().await.unwrap();
            token
        };
        assert!(token > top, "{key}: {token} after {top}");
    }
    live_permit.release().await.unwrap();
    live_read.release().await.unwrap();
    sweep_until(&backend, &prefix, 0).await;
}

#[tokio::test]
async fn releases_start_the_passes() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let prefix = prefix("passes");
    let backend = EtcdBackend::connect_with(
        &url,
        EtcdOptions::new()
            .with_prefix(&prefix)
            .with_idle_window(Some(Duration::from_millis(200))),
    )
    .await
    .unwrap();
    let locks = Locks::new(backend.clone());
    for i in 0..20 {
        let permit = locks
            .semaphore(&format!("pool/{i}"), 1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        permit.release().await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let tick = locks
            .semaphore("tick", 1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        tick.release().await.unwrap();
        let left = records(&backend, &prefix).await;
        if left <= 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} records left"
        );
    }
}

/// Sweeps race grants and releases of a few semaphore and rw keys: no
/// mutex grant ever meets a live slot, and no key repeats a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweeps_racing_grants_never_free_a_held_key() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let prefix = prefix("racing");
    let (backend, locks) = open(&url, &prefix, Some(Duration::from_millis(1))).await;
    let holders: Arc<Vec<AtomicI64>> = Arc::new((0..4).map(|_| AtomicI64::new(0)).collect());
    let tokens = Arc::new(Mutex::new(HashSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sweeper = {
        let (backend, stop) = (backend.clone(), stop.clone());
        tokio::spawn(async move {
            let mut deleted = 0;
            while !stop.load(Ordering::Relaxed) {
                deleted += backend.sweep_idle().await.unwrap();
            }
            deleted
        })
    };
    let mut workers = Vec::new();
    for w in 0..6_u64 {
        let (locks, holders, tokens) = (locks.clone(), holders.clone(), tokens.clone());
        workers.push(tokio::spawn(async move {
            for round in 0..25_u64 {
                let k = ((w + round) % 4) as usize;
                let (key, guard) = if k < 2 {
                    let key = format!("sem/{k}");
                    let semaphore = locks.semaphore(&key, 2).unwrap();
                    (
                        key,
                        semaphore.acquire(Duration::from_secs(30)).await.unwrap(),
                    )
                } else {
                    let key = format!("rw/{k}");
                    let guard = locks
                        .rw_lock(&key)
                        .unwrap()
                        .read(Duration::from_secs(30))
                        .await
                        .unwrap();
                    (key, guard)
                };
                let now = holders[k].fetch_add(1, Ordering::SeqCst) + 1;
                assert!(k >= 2 || now <= 2, "{key}: {now} at once");
                assert!(
                    tokens.lock().unwrap().insert((key.clone(), guard.token())),
                    "{key}: token {} twice",
                    guard.token()
                );
                if let Ok(mutex) = locks.try_acquire(&key).await {
                    panic!(
                        "{key}: a mutex grant ({}) beside a live slot",
                        mutex.token()
                    );
                }
                holders[k].fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let deleted = sweeper.await.unwrap();
    assert!(deleted > 0, "the sweeps never met a free key");
}

#[tokio::test]
async fn without_a_window_kind_records_stay() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let prefix = prefix("kept");
    let (backend, locks) = open(&url, &prefix, None).await;
    let permit = locks
        .semaphore("pool", 1)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    permit.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(backend.sweep_idle().await.unwrap(), 0);
    assert_eq!(records(&backend, &prefix).await, 1);
    // The key is still a semaphore's.
    assert!(locks.try_acquire("pool").await.is_err());
}

#[tokio::test]
async fn bad_windows_are_refused_before_any_io() {
    let e = EtcdBackend::connect_with(
        "etcd://127.0.0.1:1",
        EtcdOptions::new().with_idle_window(Some(Duration::ZERO)),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("idle_window"), "{e}");
    let e = Locks::open("etcd://127.0.0.1:1?idle_window=soon")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("idle_window"), "{e}");
}
