//! Storage bounded by the keys in use on SQLite: the records of idle keys
//! go away, and a key that comes back still gets a higher token, also
//! across a reopen and on a file written before records were ever deleted.
#![cfg(feature = "sqlite")]

#[path = "support/common.rs"]
mod common;
#[path = "support/sqlite.rs"]
mod sqlite;

use std::path::Path;
use std::time::Duration;

use leasehold::backends::sqlite::{SqliteBackend, SqliteOptions};
use leasehold::Locks;
use sqlx::sqlite::SqlitePool;

/// Every record the store keeps, over all its tables.
async fn records(pool: &SqlitePool) -> i64 {
    let mut total = 0;
    for table in sqlite::TABLES {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(pool)
            .await
            .unwrap();
        total += n;
    }
    total
}

async fn open(path: &Path, window: Option<Duration>) -> (SqliteBackend, Locks) {
    let backend = SqliteBackend::open_with(path, SqliteOptions::new().with_idle_window(window))
        .await
        .unwrap();
    let locks = Locks::new(backend.clone());
    (backend, locks)
}

/// Takes and gives back a mutex, a permit, a reader and a writer on
/// `key`-based keys; returns the highest token handed out.
async fn use_every_kind(locks: &Locks, key: &str) -> u64 {
    let mutex = locks.try_acquire(&format!("{key}/mutex")).await.unwrap();
    let permit = common::permit(locks, &format!("{key}/sem"), 3).await;
    let rw = locks.rw_lock(&format!("{key}/rw")).unwrap();
    let reader = rw.try_read().await.unwrap();
    let tokens = [mutex.token(), permit.token(), reader.token()];
    for guard in [mutex, permit, reader] {
        guard.release().await.unwrap();
    }
    let writer = rw.try_write().await.unwrap();
    let top = writer.token().max(tokens.into_iter().max().unwrap());
    writer.release().await.unwrap();
    top
}

#[tokio::test]
async fn idle_records_go_and_the_keys_come_back_above_every_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    // Kept forever here: this test sweeps by hand.
    let (backend, locks) = open(&path, None).await;
    let mut before = Vec::new();
    for i in 0..40 {
        // Each key used a few times, so its fence is above the first one.
        let mut top = 0;
        for _ in 0..3 {
            top = use_every_kind(&locks, &format!("k{i}")).await;
        }
        before.push(top);
    }
    let held = locks.try_acquire("held").await.unwrap();
    let permit_held = common::permit(&locks, "sem-held", 2).await;
    assert!(records(backend.pool()).await > 40 * 4);

    // Inside the window nothing goes.
    assert_eq!(
        backend.sweep_idle(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = backend
        .sweep_idle(Duration::from_millis(200))
        .await
        .unwrap();
    assert!(deleted > 40 * 4, "deleted {deleted}");
    // Left: the held mutex's row, the held permit's slot, fence and anchor.
    assert_eq!(records(backend.pool()).await, 4);
    assert!(locks.inspect("held").await.unwrap().is_some());
    assert!(!held.is_lost());

    for (i, top) in before.into_iter().enumerate() {
        let again = use_every_kind(&locks, &format!("k{i}")).await;
        assert!(again > top, "key k{i}: token {again} after {top}");
    }
    held.release().await.unwrap();
    permit_held.release().await.unwrap();
}

#[tokio::test]
async fn a_reopened_file_keeps_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (backend, locks) = open(&path, None).await;
    let mut top = 0;
    for _ in 0..5 {
        top = use_every_kind(&locks, "k").await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    backend.sweep_idle(Duration::from_millis(10)).await.unwrap();
    assert_eq!(records(backend.pool()).await, 0);
    drop(locks);
    backend.pool().close().await;
    drop(backend);

    let (_backend, locks) = open(&path, None).await;
    let again = use_every_kind(&locks, "k").await;
    assert!(again > top, "token {again} after {top}");
}

#[tokio::test]
async fn a_file_of_the_previous_scheme_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        // The tables as the previous release left them: a mutex row freed
        // with a NULL expiry at fence 41, a semaphore's fence at 17.
        let pool = SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
        for statement in [
            "CREATE TABLE leasehold_locks (key TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL, \
             owner TEXT, holder TEXT, expires_at_ms INTEGER, kind TEXT) WITHOUT ROWID",
            "INSERT INTO leasehold_locks VALUES ('order/1', 41, NULL, NULL, NULL, NULL)",
            "INSERT INTO leasehold_locks VALUES ('pool', 0, NULL, NULL, NULL, 'sem')",
            "CREATE TABLE leasehold_permit_fences (key TEXT PRIMARY KEY NOT NULL, \
             fence INTEGER NOT NULL) WITHOUT ROWID",
            "INSERT INTO leasehold_permit_fences VALUES ('pool', 17)",
        ] {
            sqlx::query(statement).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }
    let (backend, locks) = open(&path, None).await;
    // Before any sweep the old records go on counting.
    let guard = locks.try_acquire("order/1").await.unwrap();
    assert_eq!(guard.token(), 42);
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend.sweep_idle(Duration::from_millis(10)).await.unwrap(),
        3
    );
    assert_eq!(records(backend.pool()).await, 0);
    let guard = locks.try_acquire("order/1").await.unwrap();
    assert!(guard.token() > 42, "{}", guard.token());
    let permit = common::permit(&locks, "pool", 2).await;
    assert!(permit.token() > 42, "{}", permit.token());
}

#[tokio::test]
async fn releases_start_the_sweep_that_empties_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?idle_window=300ms",
        dir.path().join("l.db").display()
    );
    let locks = Locks::open(&url).await.unwrap();
    let order_7 = common::use_order_keys_once(&locks, 2000).await;
    let pool = SqlitePool::connect(&format!("sqlite://{}", dir.path().join("l.db").display()))
        .await
        .unwrap();
    assert!(records(&pool).await > 0, "kept inside the window");
    // Wait (bounded) for a pass to have emptied the table.
    common::wait_until_swept(
        &locks,
        common::Tick::Mutex,
        Duration::from_secs(20),
        "records",
        || records(&pool),
    )
    .await;
    common::assert_order_7_above(&locks, order_7).await;
}

#[tokio::test]
async fn bad_windows_are_refused_before_the_file_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.db");
    common::assert_bad_windows_refused(
        SqliteBackend::open_with(
            &path,
            SqliteOptions::new().with_idle_window(Some(Duration::ZERO)),
        ),
        &[&format!("sqlite://{}?idle_window=5", path.display())],
    )
    .await;
    assert!(!path.exists());
}
