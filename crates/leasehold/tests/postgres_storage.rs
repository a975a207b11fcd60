//! Storage bounded by the keys in use on PostgreSQL: the rows of idle
//! keys (mutexes, and semaphores and rw locks with their anchors) go away,
//! and a key that comes back starts its fence at the server's clock, above
//! every token it had, also on tables written by the previous scheme. Reads `LEASEHOLD_TEST_POSTGRES`.
//! What every sweeping store shares (idle keys of every kind go, passes
//! never break a live grant) is the conformance group `sweep`
//! (conformance_postgres.rs); this file has what is the store's own.
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::{
    assert_31_idle_keys_swept, assert_bad_windows_refused, assert_order_7_above,
    assert_order_keys_above, leave_31_idle_keys, unique, use_order_keys_once, wait_until_swept,
    Tick,
};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::sqlx::{self, postgres::PgPool};
use leasehold::Locks;
use postgres::{drop_table, pool, url};

async fn rows(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The suffixes of a table's three: leases (and anchors), permits, rw.
const SUFFIXES: [&str; 3] = ["", "_permits", "_rw"];

/// Drops the three tables of `table`.
async fn drop_tables(pool: &PgPool, table: &str) {
    for t in SUFFIXES {
        drop_table(pool, &format!("\"{table}{t}\"")).await;
    }
}

/// The lease table `table` as the previous release created it.
fn old_lease_table(table: &str) -> String {
    format!(
        "CREATE TABLE \"{table}\" (key TEXT COLLATE \"C\" PRIMARY KEY, fence BIGINT NOT NULL, \
         owner TEXT, holder TEXT, expires_at TIMESTAMPTZ, kind TEXT)"
    )
}

async fn open(url: &str, table: &str, window: Option<Duration>) -> (PostgresBackend, Locks) {
    let backend = PostgresBackend::connect_with(
        url,
        PostgresOptions::new()
            .with_table(table)
            .with_idle_window(window),
    )
    .await
    .expect("connect to the test server");
    (backend.clone(), Locks::new(backend))
}

/// On the test server, the tables of the previous release that the
/// statements of `previous` (given a fresh table name from `prefix`) make:
/// a pool, the table's name, and the store opened on it with no sweep
/// after releases. `None` skips.
async fn open_previous(
    prefix: &str,
    previous: impl FnOnce(&str) -> Vec<String>,
) -> Option<(PgPool, String, PostgresBackend, Locks)> {
    let url = url()?;
    let pool = pool(&url).await;
    let table = unique(prefix);
    for statement in previous(&table) {
        sqlx::query(&statement).execute(&pool).await.unwrap();
    }
    let (backend, locks) = open(&url, &table, None).await;
    Some((pool, table, backend, locks))
}

#[tokio::test]
async fn idle_rows_go_and_the_keys_come_back_above_every_token() {
    let Some(url) = url() else { return };
    let table = unique("idle_locks");
    let (backend, locks) = open(&url, &table, None).await;
    let (before, held) = leave_31_idle_keys(&locks).await;
    let pool = pool(&url).await;
    assert_eq!(rows(&pool, &table).await, 32);

    assert_31_idle_keys_swept(|window| backend.sweep_idle(window)).await;
    // The held mutex stays.
    assert_eq!(rows(&pool, &table).await, 1);
    assert!(!held.is_lost());

    assert_order_keys_above(&locks, before).await;
    held.release().await.unwrap();
    drop_tables(&pool, &table).await;
}

#[tokio::test]
async fn a_table_of_the_previous_scheme_is_upgraded_in_place() {
    // As the previous release left it: a key freed with a NULL expiry at 41.
    let Some((pool, table, backend, locks)) = open_previous("old_idle", |table| {
        vec![
            old_lease_table(table),
            format!("INSERT INTO \"{table}\" VALUES ('order/1', 41, NULL, NULL, NULL, NULL)"),
        ]
    })
    .await
    else {
        return;
    };
    let guard = locks.try_acquire("order/1").await.unwrap();
    assert_eq!(guard.token(), 42, "the old counter goes on");
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend.sweep_idle(Duration::from_millis(10)).await.unwrap(),
        1
    );
    assert_eq!(rows(&pool, &format!("\"{table}\"")).await, 0);
    let guard = locks.try_acquire("order/1").await.unwrap();
    assert!(guard.token() > 42, "{}", guard.token());
    guard.release().await.unwrap();
    drop_tables(&pool, &table).await;
}

/// The three tables' row counts: leases (and anchors), permits, rw.
async fn all_rows(pool: &PgPool, table: &str) -> [i64; 3] {
    let mut counts = [0; 3];
    for (n, suffix) in counts.iter_mut().zip(SUFFIXES) {
        *n = rows(pool, &format!("\"{table}{suffix}\"")).await;
    }
    counts
}

#[tokio::test]
async fn semaphore_tables_of_the_previous_scheme_are_upgraded_in_place() {
    // As the previous release left them: a semaphore key anchored at 41
    // whose slots row counted to 45, its released slot removed; and a
    // reader-writer lock at 60.
    let Some((pool, table, backend, locks)) = open_previous("old_kinds", |table| {
        vec![
            old_lease_table(table),
            format!(
                "CREATE TABLE \"{table}_permits\" (key TEXT COLLATE \"C\" PRIMARY KEY, \
                 fence BIGINT NOT NULL, slots JSONB NOT NULL)"
            ),
            format!(
                "CREATE TABLE \"{table}_rw\" (key TEXT COLLATE \"C\" PRIMARY KEY, \
                 fence BIGINT NOT NULL, slots JSONB NOT NULL, mark JSONB)"
            ),
            format!(
                "INSERT INTO \"{table}\" VALUES ('pool/1', 41, NULL, NULL, NULL, 'sem'), \
                 ('doc/1', 50, NULL, NULL, NULL, 'rw')"
            ),
            format!("INSERT INTO \"{table}_permits\" VALUES ('pool/1', 45, '{{}}')"),
            format!("INSERT INTO \"{table}_rw\" VALUES ('doc/1', 60, '{{}}', NULL)"),
        ]
    })
    .await
    else {
        return;
    };
    let semaphore = locks.semaphore("pool/1", 2).unwrap();
    let permit = semaphore.try_acquire().await.unwrap();
    assert_eq!(permit.token(), 46, "the old counter goes on");
    permit.release().await.unwrap();
    let rw = locks.rw_lock("doc/1").unwrap();
    let write = rw.try_write().await.unwrap();
    assert_eq!(write.token(), 61, "the old counter goes on");
    write.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend.sweep_idle(Duration::from_millis(10)).await.unwrap(),
        2
    );
    assert_eq!(all_rows(&pool, &table).await, [0, 0, 0]);
    let permit = semaphore.try_acquire().await.unwrap();
    assert!(permit.token() > 46, "{}", permit.token());
    permit.release().await.unwrap();
    let write = rw.try_write().await.unwrap();
    assert!(write.token() > 61, "{}", write.token());
    write.release().await.unwrap();
    drop_tables(&pool, &table).await;
}

#[tokio::test]
async fn releases_start_the_sweep_that_empties_the_table() {
    let Some(url) = url() else { return };
    let table = unique("swept_locks");
    let (_backend, locks) = open(&url, &table, Some(Duration::from_millis(300))).await;
    let order_7 = use_order_keys_once(&locks, 500).await;
    // Semaphore keys too, whose releases start passes as well.
    for i in 0..500 {
        common::permit(&locks, &format!("pool/{i}"), 2)
            .await
            .release()
            .await
            .unwrap();
    }
    let pool = pool(&url).await;
    let quoted = format!("\"{table}\"");
    // Only a permit's release here: it must start passes too.
    wait_until_swept(
        &locks,
        Tick::Permit,
        Duration::from_secs(20),
        "rows",
        || rows(&pool, &quoted),
    )
    .await;
    assert_order_7_above(&locks, order_7).await;
    drop_tables(&pool, &table).await;
}

#[tokio::test]
async fn bad_windows_are_refused_before_any_io() {
    assert_bad_windows_refused(
        PostgresBackend::connect_with(
            "postgres://nobody@127.0.0.1:1/none",
            PostgresOptions::new().with_idle_window(Some(Duration::ZERO)),
        ),
        &["postgres://nobody@127.0.0.1:1/none?idle_window=soon"],
    )
    .await;
}
