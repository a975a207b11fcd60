//! SQLite's busy timeouts: an acquisition waits for another connection's
//! write lock only as long as its caller's bound (the conformance suite's
//! `blocking` group), while the backend's other statements keep their own
//! busy timeout (5 s), as this file checks; a fair waiter's attempts wait
//! under the backend's own busy handler, with the same bound.
#![cfg(feature = "sqlite")]

#[path = "support/sqlite.rs"]
mod sqlite;

use std::time::Duration;

use leasehold::backends::sqlite::SqliteBackend;
use leasehold::{AcquireOptions, Error, Locks};

#[tokio::test]
async fn a_release_behind_a_busy_writer_waits_the_backends_busy_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let locks = Locks::new(SqliteBackend::open(&path).await.unwrap());
    let held = locks.try_acquire("k").await.unwrap();
    let writer = sqlite::busy_writer_at(&path).await;
    // The writer commits within the backend's own busy timeout: a release
    // then waits for it instead of failing with an acquisition's short one.
    let release = tokio::spawn(async move { held.release().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlite::commit(writer).await;
    release
        .await
        .unwrap()
        .expect("the release kept the 5 s busy timeout");
    let guard = locks
        .try_acquire("k")
        .await
        .expect("free once the writer is done");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_fair_waiter_behind_a_busy_writer_keeps_its_bound_then_gets_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let locks = Locks::new(SqliteBackend::open(&path).await.unwrap());
    let writer = sqlite::busy_writer_at(&path).await;
    // A wait shorter than the writer's hold: the fair attempt gives up at
    // its bound, not at the backend's 5 s busy timeout.
    let short = AcquireOptions::new()
        .with_wait(Duration::from_millis(300))
        .with_fair(true);
    let started = std::time::Instant::now();
    let refused = locks.acquire_with("k", &short).await.unwrap_err();
    // A timeout, not the engine's backstop for a store that did not answer.
    assert!(matches!(refused, Error::Timeout { .. }), "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "waited {:?}, past its 300 ms bound and into the backend's 5 s",
        started.elapsed()
    );
    // A longer wait gets the key once the writer commits.
    let long = AcquireOptions::new()
        .with_wait(Duration::from_secs(10))
        .with_fair(true);
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire_with("k", &long).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlite::commit(writer).await;
    let guard = waiter
        .await
        .unwrap()
        .expect("granted once the writer is done");
    guard.release().await.unwrap();
}
