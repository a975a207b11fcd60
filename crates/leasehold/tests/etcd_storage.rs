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

fn prefix(name: &str) -> String {
    format!("storage-{name}-{}/", std::process::id())
}

#[tokio::test]
async fn releases_start_the_passes() {
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let prefix = prefix("passes");
    let backend = on_prefix(&url, &prefix, Some(Duration::from_millis(200))).await;
    let locks = Locks::new(backend.clone());
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
    let Some(url) = server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let prefix = prefix("kept");
    let backend = on_prefix(&url, &prefix, None).await;
    let locks = Locks::new(backend.clone());
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
