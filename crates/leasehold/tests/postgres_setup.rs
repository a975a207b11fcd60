//! PostgreSQL set-up: the lease table's migration and name, and the URL
//! schemes `Locks::open` takes. Against the real server in
//! `LEASEHOLD_TEST_POSTGRES` (skipped without it, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::{grant, unique};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::{Backend, Error, Locks};
use postgres::{drop_table, pool, url};

#[tokio::test]
async fn migration_is_idempotent_and_table_is_configurable() {
    let Some(url) = url() else { return };
    let pool = pool(&url).await;
    let table = unique("Locks");
    let options = PostgresOptions::new().with_table(&table);
    // Concurrent first starts must not trip over each other's CREATE TABLE.
    let backends =
        futures_join((0..4).map(|_| PostgresBackend::from_pool(pool.clone(), options.clone())))
            .await;
    let backend = backends.into_iter().next().unwrap();
    assert!(backend.migration_sql().contains(&format!("\"{table}\"")));
    let lease = grant(&backend, "k", Duration::from_secs(5)).await;
    // Quoted, so the mixed-case name is kept as given.
    let fence: i64 = sqlx::query_scalar(&format!("SELECT fence FROM \"{table}\" WHERE key = 'k'"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(fence as u64, lease.token());
    backend.release(&lease).await.unwrap();
    let kept: Option<String> =
        sqlx::query_scalar(&format!("SELECT owner FROM \"{table}\" WHERE key = 'k'"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        kept, None,
        "release frees the row but keeps it (and its fence)"
    );
    drop_table(&pool, &format!("\"{table}\"")).await;
}

async fn futures_join<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = leasehold::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().expect("concurrent migration"));
    }
    out
}

#[tokio::test]
async fn locks_open_takes_both_url_schemes() {
    let Some(url) = url() else { return };
    let (_, rest) = url.split_once("://").expect("a URL");
    let key = unique("open");
    let first = Locks::open(&format!("postgres://{rest}")).await.unwrap();
    let second = Locks::open(&format!("postgresql://{rest}")).await.unwrap();
    let guard = first.try_acquire(&key).await.unwrap();
    match second.try_acquire(&key).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("the two handles must share the lock, got {other:?}"),
    }
    guard.release().await.unwrap();
    second
        .try_acquire(&key)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
