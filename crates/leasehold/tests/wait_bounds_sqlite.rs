//! SQLite at the edges of a wait: while another connection holds the
//! database's write lock (`BEGIN IMMEDIATE`), an acquisition waits for it
//! only as long as its caller's bound (not the backend's 5 s busy timeout)
//! and reports the key busy, and the backend's other statements keep their
//! own busy timeout.
#![cfg(feature = "sqlite")]

use std::time::Duration;

use leasehold::backends::sqlite::SqliteBackend;
use leasehold::{AcquireOptions, Error, Locks};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::Connection;
use tokio::time::{timeout, Instant};

/// Slack for "one round trip" on a loaded 2-core machine; the old code
/// waited out the 5 s busy timeout.
const ROUND_TRIP_SLACK: Duration = Duration::from_millis(700);

/// Opens a second connection to the database and takes its write lock.
async fn busy_writer(path: &std::path::Path) -> SqliteConnection {
    let mut writer = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut writer)
        .await
        .unwrap();
    writer
}

#[tokio::test]
async fn a_busy_writer_bounds_waits_and_try_once_calls_by_the_callers_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::open(&path).await.unwrap();
    let locks = Locks::new(backend);
    let held = locks.try_acquire("renewed").await.unwrap();
    let mut writer = busy_writer(&path).await;

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let outcome = timeout(Duration::from_secs(10), locks.acquire("k", wait))
        .await
        .expect("the wait ends while the writer holds the lock");
    let took = started.elapsed();
    assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    assert!(
        took < wait + ROUND_TRIP_SLACK,
        "wait of {wait:?} took {took:?}"
    );

    let started = Instant::now();
    let outcome = timeout(Duration::from_secs(10), locks.try_acquire("k"))
        .await
        .expect("a try-once call ends while the writer holds the lock");
    let took = started.elapsed();
    assert!(matches!(outcome, Err(Error::Busy { .. })), "{outcome:?}");
    assert!(took < ROUND_TRIP_SLACK, "try-once took {took:?}");

    // The writer commits within the backend's own busy timeout: a release
    // then waits for it instead of failing with the acquisition's short one.
    let release = tokio::spawn(async move { held.release().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
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
async fn a_grant_that_waited_for_a_writer_expires_a_ttl_after_it_was_taken() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::open(&path).await.unwrap();
    let pool = backend.pool().clone();
    let locks = Locks::new(backend);
    // An expired lease: the row exists and is free to take.
    let short = AcquireOptions::new()
        .with_ttl(Duration::from_millis(100))
        .with_auto_renew(false);
    drop(locks.acquire_with("k", &short).await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A writer keeps the database locked for longer than the next ttl.
    let ttl = Duration::from_secs(1);
    let locked_for = ttl + Duration::from_millis(800);
    let mut writer = busy_writer(&path).await;
    let unlock = tokio::spawn(async move {
        tokio::time::sleep(locked_for).await;
        sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
    });
    let options = AcquireOptions::new()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(10));
    let started = Instant::now();
    let guard = locks.acquire_with("k", &options).await.unwrap();
    assert!(started.elapsed() >= locked_for - Duration::from_millis(100));
    assert!(!guard.is_lost(), "a guard is never born lost");
    let remaining_ms: i64 = sqlx::query_scalar(
        "SELECT expires_at_ms - CAST(unixepoch('subsec') * 1000 AS INTEGER) \
         FROM leasehold_locks WHERE key = 'k'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        remaining_ms > 0,
        "granted already expired: {remaining_ms} ms left"
    );
    unlock.await.unwrap();
    guard.release().await.unwrap();
}
