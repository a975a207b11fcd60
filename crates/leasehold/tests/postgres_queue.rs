//! The PostgreSQL queue's row mark (queue.rs): a key's lease row is marked
//! `queued` while fair waiters queue for it, so that the acquire and the
//! release of keys nobody queues for never read the queue table, and the
//! mark goes with the last waiter. Reads `LEASEHOLD_TEST_POSTGRES`. The
//! order itself is the conformance group `queue` (conformance_postgres.rs).
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::unique;
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::sqlx::{self, postgres::PgPool};
use leasehold::{AcquireOptions, Locks};
use postgres::{drop_table, pool, url};

async fn marked(pool: &PgPool, table: &str, key: &str) -> bool {
    sqlx::query_scalar(&format!("SELECT queued FROM \"{table}\" WHERE key = $1"))
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn entries(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM \"{table}_queue\""))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Polls `check` for up to 5 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("still not {what} after 5 s");
}

#[tokio::test]
async fn a_row_is_marked_while_waiters_queue_and_the_mark_goes_with_the_last() {
    let Some(url) = url() else { return };
    let table = unique("queue_mark");
    let backend = PostgresBackend::connect_with(&url, PostgresOptions::new().with_table(&table))
        .await
        .expect("connect to the test server");
    let locks = Locks::new(backend);
    let pool = pool(&url).await;

    let plain = locks.try_acquire("plain").await.unwrap();
    plain.release().await.unwrap();
    assert!(!marked(&pool, &table, "plain").await, "nobody queued");

    let holder = locks.try_acquire("k").await.unwrap();
    let fair = AcquireOptions::new()
        .with_wait(Duration::from_secs(10))
        .with_fair(true);
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let locks = locks.clone();
        let fair = fair.clone();
        waiters.push(tokio::spawn(async move {
            let guard = locks.acquire_with("k", &fair).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        }));
    }
    eventually("two entries", || async {
        entries(&pool, &table).await == 2
    })
    .await;
    assert!(marked(&pool, &table, "k").await, "waiters queue");

    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(entries(&pool, &table).await, 0);
    assert!(
        !marked(&pool, &table, "k").await,
        "the last waiter has gone"
    );
    // Unmarked, the key is granted and freed on the short path again.
    let again = locks.try_acquire("k").await.unwrap();
    again.release().await.unwrap();
    assert!(!marked(&pool, &table, "k").await);

    for t in ["", "_permits", "_rw", "_queue"] {
        drop_table(&pool, &format!("\"{table}{t}\"")).await;
    }
}
