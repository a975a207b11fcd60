//! The MongoDB data helpers: fenced writes, versioned updates and retried
//! transactions. Against `LEASEHOLD_TEST_MONGODB` (skipped when unset,
//! unless `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(feature = "mongodb")]

#[path = "support/common.rs"]
mod common;
#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::time::Duration;

use common::grant;
use leasehold::backends::mongodb::helpers;
use leasehold::backends::mongodb::MongoBackend;
use leasehold::occ::{RetryError, RetryPolicy};
use leasehold::{Backend, Error};
use mongodb::bson::{doc, Document};
use mongodb::Collection;
use mongodb_fixtures::{fresh_backend, key, products};

/// A backend on a fresh collection and a fresh `products` collection (see
/// [`products`]); `None` (the test skips) without a server.
async fn fresh_products() -> Option<(MongoBackend, Collection<Document>)> {
    let b = fresh_backend().await?;
    let coll = products(&b).await;
    Some((b, coll))
}

/// Up to `attempts` tries, 1 to 20 ms apart: contention on one document
/// clears fast.
fn retries(attempts: u32) -> RetryPolicy {
    RetryPolicy::new(
        attempts,
        Duration::from_millis(1),
        Duration::from_millis(20),
    )
    .unwrap()
}

/// A write with a stale token is refused once a newer holder wrote.
#[tokio::test]
async fn fenced_write_refuses_a_stale_token() {
    let Some((b, coll)) = fresh_products().await else {
        return;
    };
    let k = key("fenced");
    let old = grant(&b, k.as_str(), Duration::from_secs(30)).await;
    b.force_release(&k).await.unwrap();
    let new = grant(&b, k.as_str(), Duration::from_secs(30)).await;
    assert!(
        helpers::fenced_update_one(&coll, "sku", new.token(), doc! { "stock": 9_i64 })
            .await
            .unwrap()
    );
    assert!(
        !helpers::fenced_update_one(&coll, "sku", old.token(), doc! { "stock": 0_i64 })
            .await
            .unwrap(),
        "stale holder's write accepted"
    );
    // The same holder may write again.
    assert!(
        helpers::fenced_update_one(&coll, "sku", new.token(), doc! { "stock": 8_i64 })
            .await
            .unwrap()
    );
    let d = coll.find_one(doc! { "_id": "sku" }).await.unwrap().unwrap();
    assert_eq!(
        (
            d.get_i64("stock").unwrap(),
            d.get_i64("fence").unwrap() as u64
        ),
        (8, new.token())
    );
    let e = helpers::fenced_update_one(&coll, "sku", u64::MAX, doc! { "stock": 1_i64 }).await;
    assert!(
        matches!(e, Err(Error::InvalidInput { what: "token", .. })),
        "{e:?}"
    );
}

/// Concurrent optimistic decrements lose no update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versioned_updates_lose_nothing_under_contention() {
    let Some((_backend, coll)) = fresh_products().await else {
        return;
    };
    let policy = retries(200);
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (coll, policy) = (coll.clone(), policy.clone());
            tokio::spawn(async move {
                helpers::update_versioned(&coll, "sku", &policy, |d| {
                    let stock = d.get_i64("stock").unwrap();
                    (stock > 0).then(|| doc! { "stock": stock - 1 })
                })
                .await
            })
        })
        .collect();
    let mut retried = 0;
    for t in tasks {
        let done = t.await.unwrap().expect("within the bound");
        assert!(done.value.is_some());
        retried += done.attempts - 1;
    }
    let d = coll.find_one(doc! { "_id": "sku" }).await.unwrap().unwrap();
    assert_eq!(d.get_i64("stock").unwrap(), 0, "retries: {retried}");
    assert_eq!(d.get_i64("version").unwrap(), 10);
    // Sold out: the closure declines and nothing is written.
    let done = helpers::update_versioned(&coll, "sku", &policy, |_| None)
        .await
        .unwrap();
    assert_eq!((done.value, done.attempts), (None, 1));
    let r = helpers::update_versioned(&coll, "missing", &policy, |_| None).await;
    assert!(
        matches!(
            r,
            Err(RetryError::Failed {
                error: Error::Backend { .. },
                ..
            })
        ),
        "{r:?}"
    );
}

/// Concurrent transactions that read then write one document conflict, are
/// retried, and lose no update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_retry_conflicts_and_lose_nothing() {
    let Some((_backend, coll)) = fresh_products().await else {
        return;
    };
    let client = coll.client().clone();
    let policy = retries(100);
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (client, policy, mut coll) = (client.clone(), policy.clone(), coll.clone());
            tokio::spawn(async move {
                helpers::run_transaction(&client, &policy, &mut coll, |session, coll| {
                    Box::pin(async move {
                        let d = coll
                            .find_one(doc! { "_id": "sku" })
                            .session(&mut *session)
                            .await?;
                        let stock = d.unwrap().get_i64("stock").unwrap();
                        // Widen the window so the transactions overlap.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        coll.update_one(
                            doc! { "_id": "sku" },
                            doc! { "$set": { "stock": stock - 1 } },
                        )
                        .session(&mut *session)
                        .await?;
                        Ok(stock)
                    })
                })
                .await
            })
        })
        .collect();
    let mut retried = 0;
    for t in tasks {
        retried += t.await.unwrap().expect("within the bound").attempts - 1;
    }
    let d = coll.find_one(doc! { "_id": "sku" }).await.unwrap().unwrap();
    assert_eq!(d.get_i64("stock").unwrap(), 0);
    assert!(retried > 0, "overlapping transactions must have conflicted");
    // A permanent error is returned at once, not retried.
    let mut ctx = coll.clone();
    let r = helpers::run_transaction(&client, &policy, &mut ctx, |session, coll| {
        Box::pin(async move {
            coll.insert_one(doc! { "_id": "sku" })
                .session(&mut *session)
                .await?;
            Ok(())
        })
    })
    .await;
    assert!(
        matches!(r, Err(RetryError::Failed { attempts: 1, .. })),
        "{r:?}"
    );
}
