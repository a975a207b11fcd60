//! SQLite's busy timeouts: an acquisition waits for another connection's
//! write lock only as long as its caller's bound (the conformance suite's
//! `blocking` group), while the backend's other statements keep their own
//! busy timeout (5 s), as this file checks.
#![cfg(feature = "sqlite")]

#[path = "support/sqlite.rs"]
mod sqlite;

use std::time::Duration;

use leasehold::backends::sqlite::SqliteBackend;
use leasehold::Locks;

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
