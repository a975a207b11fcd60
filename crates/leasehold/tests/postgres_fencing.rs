//! PostgreSQL's same-transaction lease check (`check_in`) and fenced writes
//! on a resource table. Against the real server in
//! `LEASEHOLD_TEST_POSTGRES` (skipped without it, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::{grant, unique};
use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::{Backend, Error, Key};
use postgres::{drop_table, products, stock, url};
use tokio::time::{sleep, timeout, Instant};

#[tokio::test]
async fn check_in_rejects_a_stale_holder_and_admits_the_current_one() {
    let Some(url) = url() else { return };
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let key = unique("checkin");
    let a = grant(&backend, &key, Duration::from_millis(300)).await;

    let mut tx = backend.pool().begin().await.unwrap();
    backend
        .check_in(&mut tx, &a)
        .await
        .expect("A holds the lease");
    tx.rollback().await.unwrap();

    sleep(Duration::from_millis(600)).await;
    // Expired, nobody took it yet: already rejected by the server's clock.
    let mut tx = backend.pool().begin().await.unwrap();
    match backend.check_in(&mut tx, &a).await {
        Err(Error::LeaseLost { key: k }) => assert_eq!(k, key),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    tx.rollback().await.unwrap();

    let b = grant(&backend, &key, Duration::from_secs(30)).await;
    let mut tx = backend.pool().begin().await.unwrap();
    assert!(matches!(
        backend.check_in(&mut tx, &a).await,
        Err(Error::LeaseLost { .. })
    ));
    tx.rollback().await.unwrap();
    let mut tx = backend.pool().begin().await.unwrap();
    backend.check_in(&mut tx, &b).await.expect("B holds it now");
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn check_in_holds_off_takeover_until_the_transaction_ends() {
    let Some(url) = url() else { return };
    let backend = PostgresBackend::connect(&url).await.unwrap();
    // A pool of its own: on the shared connection (the default) a
    // statement waits at most 50 ms for a row lock (postgres_shared.rs).
    let options = PostgresOptions::new().with_max_connections(2);
    let other = PostgresBackend::connect_with(&url, options).await.unwrap();
    let table = products(backend.pool(), 10).await;
    let key = unique("checkin-hold");
    let a = grant(&backend, &key, Duration::from_millis(500)).await;

    let mut tx = backend.pool().begin().await.unwrap();
    backend.check_in(&mut tx, &a).await.unwrap();
    // A's lease runs out by the clock while its transaction is open...
    sleep(Duration::from_millis(800)).await;
    let k = Key::new(key.clone()).unwrap();
    let mut acquire = tokio::spawn({
        let other = other.clone();
        // A waiting caller's attempt: it may queue on the row lock for up
        // to 10 s (a try-once attempt would report the key busy instead).
        let req = AcquireRequest::new(k.clone(), Duration::from_secs(30), "b")
            .unwrap()
            .with_lock_deadline(Instant::now() + Duration::from_secs(10));
        async move { other.try_acquire(&req).await }
    });
    let mut force = tokio::spawn({
        let other = other.clone();
        async move { other.force_release(&k).await }
    });
    // ...but nobody can take the key while A's FOR SHARE lock stands.
    assert!(timeout(Duration::from_millis(500), &mut acquire)
        .await
        .is_err());
    assert!(timeout(Duration::from_millis(100), &mut force)
        .await
        .is_err());
    sqlx::query(&format!(
        "UPDATE {table} SET stock = stock - 1 WHERE id = 1"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let granted = timeout(Duration::from_secs(10), acquire)
        .await
        .expect("acquire proceeds after A commits")
        .unwrap()
        .unwrap();
    timeout(Duration::from_secs(10), force)
        .await
        .expect("force-release proceeds after A commits")
        .unwrap()
        .unwrap();
    // Whichever ran first after the commit, A's lease was expired or broken.
    match granted {
        Acquire::Granted(b) => assert!(b.token() > a.token()),
        busy => panic!("acquire after A's commit found {busy:?}"),
    }
    assert_eq!(
        stock(backend.pool(), &table, 1).await,
        9,
        "A's write committed"
    );
    drop_table(backend.pool(), &table).await;
}

#[tokio::test]
async fn fenced_write_rejects_a_lower_token() {
    let Some(url) = url() else { return };
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let table = products(backend.pool(), 10).await;
    let key = unique("fenced");
    let fenced_write = |token: u64, stock: i32| {
        let pool = backend.pool().clone();
        let sql =
            format!("UPDATE {table} SET stock = $2, fence = $3 WHERE id = $1 AND fence <= $3");
        async move {
            sqlx::query(&sql)
                .bind(1_i64)
                .bind(stock)
                .bind(token as i64)
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected()
        }
    };
    let a = grant(&backend, &key, Duration::from_secs(30)).await;
    assert_eq!(fenced_write(a.token(), 9).await, 1);
    // A is evicted (it paused, say); B takes over and writes.
    assert!(backend.force_release(a.key()).await.unwrap());
    let b = grant(&backend, &key, Duration::from_secs(30)).await;
    assert!(b.token() > a.token());
    assert_eq!(fenced_write(b.token(), 5).await, 1);
    // A wakes up and writes with its old token: rejected.
    assert_eq!(fenced_write(a.token(), 8).await, 0);
    assert_eq!(stock(backend.pool(), &table, 1).await, 5);
    assert_eq!(
        fenced_write(b.token(), 4).await,
        1,
        "the same token may write again"
    );
    drop_table(backend.pool(), &table).await;
}
