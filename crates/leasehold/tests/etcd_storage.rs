//! Storage bounded by the keys in use on etcd: grants are deleted with
//! their leases, and the kind record of a semaphore or rw lock key with no
//! grant left and no release for the idle window goes at a sweep pass,
//! never from under a live grant.
//! Tokens are etcd revisions, so a key that comes back is above every token
//! it had. Reads `LEASEHOLD_TEST_ETCD`.
//! What every sweeping store shares (idle keys of every kind go, passes
//! never break a live grant) is the conformance group `sweep`
//! (conformance_etcd.rs); this file has what is etcd's own.
#![cfg(all(feature = "conformance", feature = "etcd"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/etcd.rs"]
mod etcd_fixtures;

use std::time::Duration;

use etcd_fixtures::on_prefix;
use leasehold::backends::etcd::{EtcdBackend, EtcdOptions};
use leasehold::conformance::server_url;
use leasehold::Locks;

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

/// The shared server on the fresh prefix `storage-<name>-<pid>/` with
/// idle window `window`: the prefix, the backend and a `Locks` on it;
/// `None` (the test skips) without `LEASEHOLD_TEST_ETCD`.
async fn store(name: &str, window: Option<Duration>) -> Option<(String, EtcdBackend, Locks)> {
    let url = server_url("LEASEHOLD_TEST_ETCD")?;
    let prefix = format!("storage-{name}-{}/", std::process::id());
    let backend = on_prefix(&url, &prefix, window).await;
    let locks = Locks::new(backend.clone());
    Some((prefix, backend, locks))
}

#[tokio::test]
async fn releases_start_the_passes() {
    let Some((prefix, backend, locks)) = store("passes", Some(Duration::from_millis(200))).await
    else {
        return;
    };
    for i in 0..20 {
        let permit = common::permit(&locks, &format!("pool/{i}"), 1).await;
        permit.release().await.unwrap();
    }
    common::wait_until_swept(
        &locks,
        common::Tick::Permit,
        Duration::from_secs(20),
        "records",
        || records(&backend, &prefix),
    )
    .await;
}

#[tokio::test]
async fn without_a_window_kind_records_stay() {
    let Some((prefix, backend, locks)) = store("kept", None).await else {
        return;
    };
    let permit = common::permit(&locks, "pool", 1).await;
    permit.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(backend.sweep_idle().await.unwrap(), 0);
    assert_eq!(records(&backend, &prefix).await, 1);
    // The key is still a semaphore's.
    assert!(locks.try_acquire("pool").await.is_err());
}

#[tokio::test]
async fn bad_windows_are_refused_before_any_io() {
    common::assert_bad_windows_refused(
        EtcdBackend::connect_with(
            "etcd://127.0.0.1:1",
            EtcdOptions::new().with_idle_window(Some(Duration::ZERO)),
        ),
        &["etcd://127.0.0.1:1?idle_window=soon"],
    )
    .await;
}

/// The etcd leases of the keys under `prefix` (0 for a key on none).
async fn leases_under(backend: &EtcdBackend, prefix: &str) -> Vec<i64> {
    let options = etcd_client::GetOptions::new().with_prefix();
    let mut answer = backend
        .client()
        .kv_client()
        .get(prefix, Some(options))
        .await
        .unwrap();
    answer.take_kvs().iter().map(|kv| kv.lease()).collect()
}

/// A released grant's lease is kept alive and serves a later grant instead
/// of being revoked (spares.rs): twenty rounds of a mutex grant and a
/// semaphore permit, one at a time, put their grants on a handful of etcd
/// leases, where a lease each would be forty; and no lease carries a key
/// once every grant is released.
#[tokio::test]
async fn released_grants_leases_carry_later_grants() {
    let Some((prefix, backend, locks)) = store("recycled", None).await else {
        return;
    };
    let semaphore = locks.semaphore("pool", 2).unwrap();
    let mut used = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let mutex = locks.try_acquire("job").await.unwrap();
        let permit = semaphore.try_acquire().await.unwrap();
        let on: Vec<i64> = leases_under(&backend, &prefix)
            .await
            .into_iter()
            .filter(|&lease| lease != 0)
            .collect();
        assert_eq!(on.len(), 2, "one lease for each grant: {on:?}");
        assert_ne!(on[0], on[1], "two grants never share a lease");
        used.extend(on);
        mutex.release().await.unwrap();
        permit.release().await.unwrap();
        // Time for the background keep-alives to bring the leases back.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        used.len() <= 5,
        "{} leases for 40 grants: released leases were not reused",
        used.len()
    );
    assert!(
        leases_under(&backend, &prefix)
            .await
            .iter()
            .all(|&l| l == 0),
        "a released grant's key is gone, whatever became of its lease"
    );
    for &lease in &used {
        let answer = backend
            .client()
            .lease_client()
            .time_to_live(
                lease,
                Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
            )
            .await
            .unwrap();
        assert!(
            answer.keys().is_empty(),
            "lease {lease} still carries {:?}",
            answer.keys()
        );
    }
}
