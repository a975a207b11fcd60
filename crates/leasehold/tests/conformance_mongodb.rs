//! The shared conformance suite and MongoDB-specific properties, against
//! the server in `LEASEHOLD_TEST_MONGODB` (skipped when unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(feature = "mongodb")]

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::mongodb::{helpers, MongoBackend, MongoOptions};
use leasehold::conformance::{server_url, TestStore};
use leasehold::occ::{RetryError, RetryPolicy};
use leasehold::{Backend, Error, Key};
use mongodb::bson::{doc, Document};

fn url() -> Option<String> {
    server_url("LEASEHOLD_TEST_MONGODB")
}

/// A fresh collection per test, so tests run in parallel on one server.
fn options() -> MongoOptions {
    MongoOptions::new().with_collection(format!("locks_{:016x}", rand::random::<u64>()))
}

async fn backend_with(url: &str, options: MongoOptions) -> MongoBackend {
    MongoBackend::connect_with(url, options)
        .await
        .expect("the test server is reachable")
}

async fn store() -> Option<TestStore> {
    let url = url()?;
    Some(TestStore::new(Arc::new(
        backend_with(&url, options()).await,
    )))
}

leasehold::conformance_tests!(store);

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

fn request(k: &Key, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(k.clone(), ttl, "test").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_race_for_a_fresh_key_300_times() {
    let Some(url) = url() else { return };
    // Two clients (two pools), as two processes would be.
    let opts = options();
    let a = Arc::new(backend_with(&url, opts.clone()).await);
    let b = Arc::new(backend_with(&url, opts).await);
    for round in 0..300 {
        let k = key(&format!("race:{round}"));
        let attempt = |backend: Arc<MongoBackend>| {
            let req = request(&k, Duration::from_secs(30));
            tokio::spawn(async move { backend.try_acquire(&req).await })
        };
        let (ra, rb) = (attempt(a.clone()), attempt(b.clone()));
        let winners = [ra.await.unwrap(), rb.await.unwrap()]
            .into_iter()
            .map(|r| r.expect("a race is not an error"))
            .filter(|r| matches!(r, Acquire::Granted(_)))
            .count();
        assert_eq!(winners, 1, "round {round}: exactly one winner");
    }
}

/// Clients whose wall clocks are 5 minutes fast and 5 minutes slow contend
/// for one key: neither takes a live lease, and each takes an expired one
/// promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_wrong_clocks_neither_steal_nor_starve() {
    let Some(url) = url() else { return };
    let five_min = 5 * 60 * 1000;
    let base = options();
    let fast = backend_with(&url, base.clone().with_simulated_clock_skew_ms(five_min)).await;
    let slow = backend_with(&url, base.with_simulated_clock_skew_ms(-five_min)).await;
    // The offset to the server clock cancels the simulated error.
    for (b, skew) in [(&fast, five_min), (&slow, -five_min)] {
        let offset = b.clock_estimate().offset_ms;
        assert!(
            (offset + skew).abs() < 1000,
            "offset {offset} ms for skew {skew} ms"
        );
    }
    let ttl = Duration::from_secs(1);
    for (holder, contender) in [(&slow, &fast), (&fast, &slow)] {
        let k = key(&format!("skew:{:x}", rand::random::<u32>()));
        let lease = match holder.try_acquire(&request(&k, ttl)).await.unwrap() {
            Acquire::Granted(l) => l,
            Acquire::Busy(b) => panic!("fresh key busy: {b:?}"),
        };
        // A fast clock would see the slow client's lease as expired for
        // 5 minutes, if it trusted its own clock.
        match contender.try_acquire(&request(&k, ttl)).await.unwrap() {
            Acquire::Busy(b) => assert!(b.remaining <= ttl && b.remaining > ttl / 2, "{b:?}"),
            Acquire::Granted(_) => panic!("a live lease was stolen"),
        }
        let info = contender.inspect(&k).await.unwrap().expect("live");
        assert_eq!(info.token, lease.token());
        // Renewing keeps it live past the first ttl.
        tokio::time::sleep(ttl / 2).await;
        assert!(holder.renew(&lease, ttl).await.unwrap());
        tokio::time::sleep(ttl * 3 / 4).await;
        assert!(
            matches!(
                contender.try_acquire(&request(&k, ttl)).await.unwrap(),
                Acquire::Busy(_)
            ),
            "a renewed lease was stolen"
        );
        // A slow clock would wait 5 more minutes, if it trusted its own clock.
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        match contender.try_acquire(&request(&k, ttl)).await.unwrap() {
            Acquire::Granted(next) => assert!(next.token() > lease.token()),
            Acquire::Busy(b) => panic!("an expired lease was not taken: {b:?}"),
        }
        assert!(
            !holder.renew(&lease, ttl).await.unwrap(),
            "expired lease renewed"
        );
    }
}

#[tokio::test]
async fn operator_looking_keys_are_stored_as_plain_strings() {
    let Some(url) = url() else { return };
    let b = backend_with(&url, options()).await;
    for k in ["$where", "a.b", "{\"$ne\":1}", "$gt", "a.$[]"] {
        let k = key(k);
        let lease = match b
            .try_acquire(&request(&k, Duration::from_secs(30)))
            .await
            .unwrap()
        {
            Acquire::Granted(l) => l,
            Acquire::Busy(busy) => panic!("{k:?} busy: {busy:?}"),
        };
        let stored = b
            .collection()
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .expect("one document with the key as its _id");
        assert_eq!(stored.get_str("_id").unwrap(), k.as_str());
        assert_eq!(stored.get_i64("fence").unwrap() as u64, lease.token());
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

#[tokio::test]
async fn bad_options_are_rejected_before_io() {
    // A closed port: only a check that runs before connecting can answer.
    let url = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=60000";
    for (opts, what) in [
        (MongoOptions::new().with_collection(""), "collection name"),
        (
            MongoOptions::new().with_collection("a$b"),
            "collection name",
        ),
        (
            MongoOptions::new().with_collection("system.locks"),
            "collection name",
        ),
        (
            MongoOptions::new().with_write_concern(mongodb::options::WriteConcern::nodes(0)),
            "write concern",
        ),
    ] {
        let started = std::time::Instant::now();
        match MongoBackend::connect_with(url, opts).await {
            Err(Error::InvalidInput { what: w, .. }) => assert_eq!(w, what),
            other => panic!("expected InvalidInput({what}), got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no server selection happened"
        );
    }
    match MongoBackend::connect("http://localhost").await {
        Err(Error::InvalidInput {
            what: "store url", ..
        }) => {}
        other => panic!("expected a store url error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_closed_port_is_unavailable_within_seconds() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // closed again when the listener drops
    let started = std::time::Instant::now();
    let r = MongoBackend::connect(&format!("mongodb://127.0.0.1:{port}/")).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(r.unwrap_err().is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

async fn products(b: &MongoBackend) -> mongodb::Collection<Document> {
    let coll = b
        .collection()
        .client()
        .database("leasehold")
        .collection::<Document>(&format!("products_{:016x}", rand::random::<u64>()));
    coll.insert_one(doc! { "_id": "sku", "stock": 10_i64, "version": 0_i64, "fence": 0_i64 })
        .await
        .unwrap();
    coll
}

/// A write with a stale token is refused once a newer holder wrote.
#[tokio::test]
async fn fenced_write_refuses_a_stale_token() {
    let Some(url) = url() else { return };
    let b = backend_with(&url, options()).await;
    let coll = products(&b).await;
    let k = key("fenced");
    let old = match b
        .try_acquire(&request(&k, Duration::from_secs(30)))
        .await
        .unwrap()
    {
        Acquire::Granted(l) => l,
        Acquire::Busy(_) => unreachable!(),
    };
    b.force_release(&k).await.unwrap();
    let new = match b
        .try_acquire(&request(&k, Duration::from_secs(30)))
        .await
        .unwrap()
    {
        Acquire::Granted(l) => l,
        Acquire::Busy(_) => unreachable!(),
    };
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
    let Some(url) = url() else { return };
    let b = backend_with(&url, options()).await;
    let coll = products(&b).await;
    let policy =
        RetryPolicy::new(200, Duration::from_millis(1), Duration::from_millis(20)).unwrap();
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
    let Some(url) = url() else { return };
    let b = backend_with(&url, options()).await;
    let coll = products(&b).await;
    let client = coll.client().clone();
    let policy =
        RetryPolicy::new(100, Duration::from_millis(1), Duration::from_millis(20)).unwrap();
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

/// A release by another client reaches a waiter through the change stream
/// (the conformance suite releases through the waiter's own backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_another_client_wakes_the_waiter() {
    let Some(url) = url() else { return };
    let opts = options();
    let waiter = backend_with(&url, opts.clone()).await;
    let releaser = backend_with(&url, opts).await;
    let k = key("wake");
    for release_by_force in [false, true] {
        let lease = match releaser
            .try_acquire(&request(&k, Duration::from_secs(60)))
            .await
            .unwrap()
        {
            Acquire::Granted(l) => l,
            Acquire::Busy(b) => panic!("busy: {b:?}"),
        };
        let mut sub = waiter.subscribe(&k).await.unwrap();
        assert!(sub.is_live(), "the test server offers change streams");
        // A renewal is not a release: no wake-up.
        assert!(releaser
            .renew(&lease, Duration::from_secs(60))
            .await
            .unwrap());
        if release_by_force {
            assert!(releaser.force_release(&k).await.unwrap());
        } else {
            releaser.release(&lease).await.unwrap();
        }
        tokio::time::timeout(Duration::from_secs(5), sub.notified())
            .await
            .expect("the change stream delivers the release");
        // Exactly the release: nothing else is pending.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), sub.notified())
                .await
                .is_err(),
            "renewals must not wake waiters"
        );
    }
}

/// Contenders hammering one existing key: every attempt is answered (granted
/// or busy, never an error), and grants carry distinct tokens. Contention on
/// an existing document is where a wire-compatible server may answer an
/// applied upsert with "no document".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_on_an_existing_key_is_always_answered() {
    let Some(url) = url() else { return };
    let opts = options();
    let a = Arc::new(backend_with(&url, opts.clone()).await);
    let b = Arc::new(backend_with(&url, opts).await);
    let k = key("hammer");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let backend = if i % 2 == 0 { a.clone() } else { b.clone() };
            let k = k.clone();
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..40 {
                    match backend
                        .try_acquire(&request(&k, Duration::from_secs(30)))
                        .await
                    {
                        Ok(Acquire::Granted(lease)) => {
                            tokens.push(lease.token());
                            backend.release(&lease).await.unwrap();
                        }
                        Ok(Acquire::Busy(_)) => {}
                        Err(e) => panic!("an attempt failed: {e}"),
                    }
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for t in tasks {
        tokens.extend(t.await.unwrap());
    }
    let granted = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), granted, "two grants shared a token");
    assert!(granted > 8, "only {granted} grants");
    assert!(
        a.inspect(&k).await.unwrap().is_none(),
        "every grant was released"
    );
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
    let after = locks.clone();
    tokio::time::timeout(bound, locks.close())
        .await
        .expect("close returns with the change stream open");
    let result = tokio::time::timeout(bound, after.inspect("close:k"))
        .await
        .expect("an operation after close answers");
    assert!(result.is_err(), "the client is shut down: {result:?}");

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
