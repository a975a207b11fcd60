//! Storage bounded by the keys in use on MongoDB: the documents of idle
//! keys (mutexes, semaphores, rw locks) go away, and a key that comes back takes tokens from the
//! server's clock, above every token it had, also in a collection written
//! by the previous scheme. Against `LEASEHOLD_TEST_MONGODB` (skipped when
//! unset, unless `LEASEHOLD_REQUIRE_SERVERS=1`).
//! What every sweeping store shares (idle keys of every kind go, passes
//! never break a live grant) is the conformance group `sweep`
//! (conformance_mongodb.rs); this file has what is the store's own.
#![cfg(all(feature = "conformance", feature = "mongodb"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::time::Duration;

use common::{
    assert_31_idle_keys_swept, assert_bad_windows_refused, assert_order_7_above,
    assert_order_keys_above, leave_31_idle_keys, use_order_keys_once, wait_until_swept, Tick,
};
use leasehold::backends::mongodb::{MongoBackend, MongoOptions};
use leasehold::{Backend, Locks};
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb_fixtures::{backend_with, options, url};

const TTL: Duration = Duration::from_secs(30);

/// A backend with `options` on the test server, and a `Locks` on it;
/// `None` skips.
async fn open(options: MongoOptions) -> Option<(MongoBackend, Locks)> {
    let backend = backend_with(&url()?, options).await;
    Some((backend.clone(), Locks::new(backend)))
}

/// [`open`] on a collection holding `documents` as the previous release
/// left them.
async fn open_seeded(documents: Vec<Document>) -> Option<(MongoBackend, Locks)> {
    let (backend, locks) = open(options().with_idle_window(None)).await?;
    backend.collection().insert_many(documents).await.unwrap();
    Some((backend, locks))
}

/// An expiry an hour from now, of a lease an earlier process holds.
fn in_an_hour() -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000)
}

async fn documents(backend: &MongoBackend) -> u64 {
    backend.collection().count_documents(doc! {}).await.unwrap()
}

#[tokio::test]
async fn idle_documents_go_and_the_keys_come_back_above_every_token() {
    let Some((backend, locks)) = open(options().with_idle_window(None)).await else {
        return;
    };
    let (before, held) = leave_31_idle_keys(&locks).await;
    // 30 keys, the held one, the semaphore's (slots inside).
    assert_eq!(documents(&backend).await, 32);

    assert_31_idle_keys_swept(|window| backend.sweep_idle(window)).await;
    // The held mutex stays.
    assert_eq!(documents(&backend).await, 1);
    assert!(!held.is_lost());
    assert!(backend.renew(held.lease(), TTL).await.unwrap());

    assert_order_keys_above(&locks, before).await;
    held.release().await.unwrap();
    backend.collection().drop().await.unwrap();
}

#[tokio::test]
async fn a_collection_of_the_previous_scheme_is_upgraded_in_place() {
    // As the previous release left them: a key freed at 41 (no base, no
    // expiry), and one held at 7 by a process of that release.
    let Some((backend, locks)) = open_seeded(
        vec![
            doc! { "_id": "order/1", "fence": 41_i64, "owner": Bson::Null,
                   "holder": Bson::Null, "expiresAt": Bson::Null },
            doc! { "_id": "order/2", "fence": 7_i64, "owner": "0123456789abcdef0123456789abcdef", "holder": "old",
                   "expiresAt": in_an_hour(), "ttlMs": 3_600_000_i64 },
        ],
    )
    .await
    else {
        return;
    };
    let guard = locks.try_acquire("order/1").await.unwrap();
    assert_eq!(guard.token(), 42, "the old counter goes on");
    assert!(
        backend.renew(guard.lease(), TTL).await.unwrap(),
        "renewed by its token"
    );
    guard.release().await.unwrap();
    let info = locks.inspect("order/2").await.unwrap().expect("still held");
    assert_eq!(info.token, 7);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend.sweep_idle(Duration::from_millis(10)).await.unwrap(),
        1,
        "the freed key goes, the held one stays"
    );
    let guard = locks.try_acquire("order/1").await.unwrap();
    assert!(guard.token() > 42, "{}", guard.token());
    guard.release().await.unwrap();
    backend.collection().drop().await.unwrap();
}

#[tokio::test]
async fn releases_start_the_sweep_that_empties_the_collection() {
    let window = Duration::from_millis(300);
    let Some((backend, locks)) = open(options().with_idle_window(Some(window))).await else {
        return;
    };
    let order_7 = use_order_keys_once(&locks, 200).await;
    wait_until_swept(
        &locks,
        Tick::Mutex,
        Duration::from_secs(30),
        "documents",
        || async { i64::try_from(documents(&backend).await).unwrap() },
    )
    .await;
    assert_order_7_above(&locks, order_7).await;
    backend.collection().drop().await.unwrap();
}

#[tokio::test]
async fn bad_windows_are_refused_before_any_io() {
    assert_bad_windows_refused(
        MongoBackend::connect_with(
            "mongodb://127.0.0.1:1/none",
            MongoOptions::new().with_idle_window(Some(Duration::ZERO)),
        ),
        &[
            "mongodb://127.0.0.1:1/none?idle_window=soon",
            "mongodb://127.0.0.1:1/none?idle_window=0s",
        ],
    )
    .await;
}

#[tokio::test]
async fn the_url_sets_the_window() {
    let Some(url) = url() else { return };
    let join = if url.contains('?') { '&' } else { '?' };
    for (option, window) in [("never", None), ("10m", Some(Duration::from_secs(600)))] {
        let backend = MongoBackend::connect(&format!("{url}{join}idle_window={option}"))
            .await
            .expect("idle_window is leasehold's, not the driver's");
        assert_eq!(backend.idle_window(), window, "{option}");
    }
    let backend = MongoBackend::connect(&url).await.unwrap();
    assert_eq!(backend.idle_window(), Some(Duration::from_secs(3600)));
}

#[tokio::test]
async fn semaphores_of_the_previous_layout_move_into_their_key_document() {
    // As the previous release left them: kind-only anchors, the slots in
    // documents of their own. pool/1 counted to 45, free; pool/2 has a
    // permit held by a process of that release; doc/1 (rw) counted to 60.
    let Some((backend, locks)) = open_seeded(
        vec![
            doc! { "_id": "pool/1", "kind": "sem", "base": 30_i64 },
            doc! { "_id": "\u{1}permits:pool/1", "fence": 45_i64, "releases": 3_i64,
                   "rev": 9_i64, "slots": {} },
            doc! { "_id": "pool/2", "kind": "sem", "base": 30_i64 },
            doc! { "_id": "\u{1}permits:pool/2", "fence": 50_i64, "releases": 0_i64,
                   "rev": 1_i64, "slots": { "0": { "owner": "0123456789abcdef0123456789abcdef",
                   "holder": "old", "token": 50_i64, "expiresAt": in_an_hour(), "ttlMs": 3_600_000_i64 } } },
            doc! { "_id": "doc/1", "kind": "rw", "base": 30_i64 },
            doc! { "_id": "\u{1}rw:doc/1", "fence": 60_i64, "releases": 0_i64, "rev": 2_i64, "slots": {} },
        ],
    )
    .await
    else {
        return;
    };
    let permit = common::permit(&locks, "pool/1", 2).await;
    assert_eq!(permit.token(), 46, "the old counter goes on");
    // Held by the earlier process: busy, and nothing moved.
    let pool_2 = locks.semaphore("pool/2", 1).unwrap();
    let busy = pool_2.try_acquire().await;
    assert!(busy.is_err(), "{busy:?}");
    let listed = pool_2.holders().await.unwrap();
    assert_eq!(listed.len(), 1, "the earlier process's permit is listed");
    let write = locks.rw_lock("doc/1").unwrap().try_write().await.unwrap();
    assert_eq!(write.token(), 61, "the old counter goes on");
    permit.release().await.unwrap();
    write.release().await.unwrap();
    // pool/1 and doc/1 have one document each now; pool/2 still two.
    assert_eq!(documents(&backend).await, 4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend.sweep_idle(Duration::from_millis(10)).await.unwrap(),
        2
    );
    assert_eq!(documents(&backend).await, 2, "pool/2's documents stay");
    let permit = common::permit(&locks, "pool/1", 2).await;
    assert!(permit.token() > 46, "{}", permit.token());
    permit.release().await.unwrap();
    backend.collection().drop().await.unwrap();
}
