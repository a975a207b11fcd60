//! The MongoDB store's documents and client: one document per key with the
//! key as its `_id`, and `close` shutting down only a client the store
//! made. Against `LEASEHOLD_TEST_MONGODB` (skipped when unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(feature = "mongodb")]

#[path = "support/common.rs"]
mod common;
#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::time::Duration;

use common::grant;
use leasehold::backends::mongodb::MongoBackend;
use leasehold::{Backend, Error};
use mongodb::bson::doc;
use mongodb_fixtures::{backend_with, fresh_backend, key, options, url};

#[tokio::test]
async fn operator_looking_keys_are_stored_as_plain_strings() {
    let Some(b) = fresh_backend().await else {
        return;
    };
    for k in ["$where", "a.b", "{\"$ne\":1}", "$gt", "a.$[]"] {
        let k = key(k);
        let lease = grant(&b, k.as_str(), Duration::from_secs(30)).await;
        let stored = b
            .collection()
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .expect("one document with the key as its _id");
        assert_eq!(stored.get_str("_id").unwrap(), k.as_str());
        // The token is the document's base (its creation time) plus its fence.
        let base = stored.get_i64("base").unwrap();
        assert_eq!(
            (base + stored.get_i64("fence").unwrap()) as u64,
            lease.token()
        );
        b.release(&lease).await.unwrap();
        let kept = b
            .collection()
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap();
        assert!(kept.is_some(), "release keeps the document and its fence");
    }
    // Only those documents exist: no key was read as a path or operator.
    assert_eq!(b.collection().count_documents(doc! {}).await.unwrap(), 5);
}

/// `locks.close()` returns (else fails with `returns`) and shuts down the
/// client: an operation on `key` after it fails, within ten seconds.
async fn closes_the_client(locks: leasehold::Locks, key: &str, returns: &str) {
    let bound = Duration::from_secs(10);
    let after = locks.clone();
    tokio::time::timeout(bound, locks.close())
        .await
        .expect(returns);
    let result = tokio::time::timeout(bound, after.inspect(key))
        .await
        .expect("an operation after close answers");
    assert!(result.is_err(), "the client is shut down: {result:?}");
}

/// `Locks::close` returns even with the change stream open, shuts down a
/// client the store made (later operations fail with an error, never a
/// panic), and leaves an application's own client working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_shuts_down_only_the_stores_own_client() {
    let Some(url) = url() else { return };
    let bound = Duration::from_secs(10);
    let locks = leasehold::Locks::new(backend_with(&url, options()).await);
    let held = locks.try_acquire("close:k").await.unwrap();
    // A wait that times out has opened the change stream.
    let waited = locks.acquire("close:k", Duration::from_millis(300)).await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    held.release().await.unwrap();
    closes_the_client(
        locks,
        "close:k",
        "close returns with the change stream open",
    )
    .await;

    // An application's client, lent to the store, is not shut down.
    let client = mongodb::Client::with_uri_str(&url).await.unwrap();
    let db = client.database("leasehold_close_test");
    let lent = leasehold::Locks::new(
        MongoBackend::from_database(db.clone(), options())
            .await
            .unwrap(),
    );
    lent.close().await;
    tokio::time::timeout(bound, db.list_collection_names())
        .await
        .expect("the application's client answers")
        .expect("the application's client still works");
}

/// With `listen=off` the store is wrapped (waiters poll), and `close` still
/// reaches the MongoDB client inside: later operations fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_reaches_the_store_behind_listen_off() {
    let Some(url) = url() else { return };
    let sep = if url.contains('?') { '&' } else { '?' };
    let locks = leasehold::Locks::open(&format!("{url}{sep}listen=off"))
        .await
        .unwrap();
    locks.inspect("close-polling:k").await.unwrap();
    closes_the_client(locks, "close-polling:k", "close returns").await;
}
