//! MongoDB's queue of waiters (issue 31), what is the store's own beyond
//! the conformance group `queue`: the hand-off reaches another process's
//! head through the change stream, the uncontended path leaves no trace of
//! a queue in the document, the sweep keeps a document while a waiter
//! lives, and fair waiters from two clients hammering a key never overlap.
//! Against `LEASEHOLD_TEST_MONGODB` (skipped when unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(feature = "mongodb")]

#[path = "support/mongodb.rs"]
mod mongodb_fixtures;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::{Acquire, QUEUE_ENTRY_TTL};
use leasehold::backends::mongodb::MongoBackend;
use leasehold::{AcquireOptions, Backend, Locks};
use mongodb::bson::doc;
use mongodb_fixtures::{backend_with, key, options, request, url};
use tokio::time::{sleep, timeout};

const LONG: Duration = Duration::from_secs(30);

/// Two clients (two pools, two change streams) of one collection.
async fn two_clients() -> Option<(MongoBackend, MongoBackend)> {
    let url = url()?;
    let opts = options();
    Some((
        backend_with(&url, opts.clone()).await,
        backend_with(&url, opts).await,
    ))
}

async fn granted(
    backend: &MongoBackend,
    req: &leasehold::backend::AcquireRequest,
) -> leasehold::Lease {
    match backend.try_acquire(req).await.unwrap() {
        Acquire::Granted(lease) => lease,
        other => panic!("expected a grant: {other:?}"),
    }
}

/// The head waits on one client, the holder releases on the other: only
/// the change stream can tell the head, and it tells the head alone.
#[tokio::test]
async fn a_hand_off_reaches_the_head_of_another_process_alone() {
    let Some((a, b)) = two_clients().await else {
        return;
    };
    let k = key("handed");
    let holder = granted(&a, &request(&k, LONG)).await;
    let head = request(&k, LONG).with_queue_entry(QUEUE_ENTRY_TTL, 5);
    let next = request(&k, LONG).with_queue_entry(QUEUE_ENTRY_TTL, 0);
    let mut told = b.subscribe(&k).await.unwrap();
    assert!(told.is_live(), "the change stream is open");
    assert!(told.expect_hand_off(head.owner()));
    let mut untold = b.subscribe(&k).await.unwrap();
    untold.expect_hand_off(next.owner());
    for waiter in [&head, &next] {
        assert!(matches!(
            b.try_acquire(waiter).await.unwrap(),
            Acquire::Busy(_)
        ));
    }
    a.release(&holder).await.unwrap();
    timeout(Duration::from_secs(2), told.notified())
        .await
        .expect("the head hears of its grant");
    let grant = told.hand_off().expect("a hand-off, not a wake-up");
    assert_eq!(grant.ticket, 5);
    assert!(grant.token > holder.token());
    assert!(
        timeout(Duration::from_millis(300), untold.notified())
            .await
            .is_err(),
        "the waiter behind the head sleeps on"
    );
    let info = a.inspect(&k).await.unwrap().expect("held by the head");
    assert_eq!(info.token, grant.token);
}

/// A key nobody waits for is acquired and released as before queues: no
/// queue field is ever written, and a queue that drained counts none.
#[tokio::test]
async fn the_uncontended_path_writes_no_queue() {
    let Some((a, _)) = two_clients().await else {
        return;
    };
    let k = key("plain");
    let lease = granted(&a, &request(&k, LONG)).await;
    a.release(&lease).await.unwrap();
    let read = || async {
        a.collection()
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .unwrap()
    };
    let d = read().await;
    for field in ["q", "qn", "qe", "qseq", "handoff"] {
        assert!(!d.contains_key(field), "{field} written: {d}");
    }

    let holder = granted(&a, &request(&k, LONG)).await;
    let waiter = request(&k, LONG).with_queue_entry(QUEUE_ENTRY_TTL, 0);
    assert!(matches!(
        a.try_acquire(&waiter).await.unwrap(),
        Acquire::Busy(_)
    ));
    a.release(&holder).await.unwrap();
    let handed = match a.try_acquire(&waiter).await.unwrap() {
        Acquire::Granted(lease) => lease,
        other => panic!("the head's repeat is its grant: {other:?}"),
    };
    a.release(&handed).await.unwrap();
    let d = read().await;
    assert_eq!(d.get_i64("qn").unwrap(), 0, "the queue drained: {d}");
    assert!(d.get_document("q").unwrap().is_empty());
    // So the next grant and release take the plain path again.
    let lease = granted(&a, &request(&k, LONG)).await;
    a.release(&lease).await.unwrap();
    assert!(a.inspect(&k).await.unwrap().is_none());
}

/// The sweep keeps the document of an idle key while a waiter's entry
/// lives, and deletes it (entries and all) once every entry is dead.
#[tokio::test]
async fn the_sweep_keeps_a_key_with_a_live_waiter() {
    let Some((a, _)) = two_clients().await else {
        return;
    };
    let k = key("swept");
    let short = Duration::from_millis(200);
    granted(&a, &request(&k, short)).await;
    let entry = Duration::from_millis(1500);
    let waiter = request(&k, LONG).with_queue_entry(entry, 0);
    assert!(matches!(
        a.try_acquire(&waiter).await.unwrap(),
        Acquire::Busy(_)
    ));
    sleep(short + Duration::from_millis(100)).await;
    assert_eq!(
        a.sweep_idle(Duration::from_millis(1)).await.unwrap(),
        0,
        "a live waiter"
    );
    sleep(entry).await;
    assert_eq!(
        a.sweep_idle(Duration::from_millis(1)).await.unwrap(),
        1,
        "all dead"
    );
}

/// Fair waiters of two clients take one key over and over: never two
/// holders at once, every acquisition served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_of_two_clients_never_overlap() {
    let Some((a, b)) = two_clients().await else {
        return;
    };
    let clients = [Locks::new(a), Locks::new(b)];
    let held = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let (tasks, rounds) = (8, 6);
    let mut running = Vec::new();
    for i in 0..tasks {
        let locks = clients[i % 2].clone();
        let (held, served) = (held.clone(), served.clone());
        running.push(tokio::spawn(async move {
            let fair = AcquireOptions::new().with_wait(LONG).with_fair(true);
            for _ in 0..rounds {
                let guard = locks.acquire_with("hammered", &fair).await.unwrap();
                assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                sleep(Duration::from_millis(5)).await;
                held.store(false, Ordering::SeqCst);
                served.fetch_add(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in running {
        timeout(Duration::from_secs(60), task)
            .await
            .expect("served")
            .unwrap();
    }
    assert_eq!(served.load(Ordering::SeqCst), tasks * rounds);
}
