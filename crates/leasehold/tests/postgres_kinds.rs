//! One key is one lock on PostgreSQL: a lease table written by the release
//! before kinds (no `kind` column) is migrated on open, keeps its leases
//! and its tokens, and its free keys can become reader-writer locks or
//! semaphores. Directly (`LEASEHOLD_TEST_POSTGRES`) and through PgBouncer
//! in transaction mode (`LEASEHOLD_TEST_PGBOUNCER`; the migration is one
//! statement the pooler path inlines).
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::unique;
use leasehold::backend::{Acquire, AcquireRequest, OwnerId};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::conformance::server_url;
use leasehold::{Backend, Key};
use postgres::{drop_table, pool, url};

/// The lease table as the release before kinds made it.
fn old_table(table: &str) -> String {
    format!(
        "CREATE TABLE {table} ( \
           key TEXT COLLATE \"C\" PRIMARY KEY, \
           fence BIGINT NOT NULL, \
           owner TEXT, \
           holder TEXT, \
           expires_at TIMESTAMPTZ)"
    )
}

async fn old_table_keeps_leases_and_tokens(connect_url: &str, server: &str) {
    let pool = pool(server).await;
    let name = unique("old_locks");
    let table = format!("\"{name}\"");
    sqlx_exec(&pool, &old_table(&table)).await;
    let owner = OwnerId::random();
    leasehold::sqlx::query(&format!(
        "INSERT INTO {table} VALUES \
           ('held', 7, $1, 'old:1', clock_timestamp() + interval '1 minute'), \
           ('free', 5, NULL, NULL, NULL), \
           ('sem', 3, NULL, NULL, NULL)"
    ))
    .bind(owner.to_string())
    .execute(&pool)
    .await
    .unwrap();
    // Opened twice: the migration is idempotent. No sweep: this test
    // follows the kept rows' tokens, and a release would start a pass that
    // deletes the row the previous scheme freed (its sweep and the tokens
    // after it are tests/postgres_storage.rs's subject).
    let options = PostgresOptions::new()
        .with_table(&name)
        .with_idle_window(None);
    drop(
        PostgresBackend::connect_with(connect_url, options.clone())
            .await
            .unwrap(),
    );
    let backend = PostgresBackend::connect_with(connect_url, options)
        .await
        .unwrap();
    leasehold::conformance::records_from_before_kinds_keep_leases_and_tokens(&backend, owner).await;
    let ttl = Duration::from_secs(30);
    let sem = Key::new("sem").unwrap();
    let permit = AcquireRequest::permit(sem.clone(), ttl, "new", 2).unwrap();
    let Acquire::Granted(p) = backend.try_acquire(&permit).await.unwrap() else {
        panic!("a free old key becomes a semaphore");
    };
    assert_eq!(p.token(), 4);
    let kinds: Vec<(String, Option<String>)> =
        leasehold::sqlx::query_as(&format!("SELECT key, kind FROM {table} ORDER BY key"))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        kinds,
        [
            ("free".to_owned(), Some("rw".to_owned())),
            ("held".to_owned(), None),
            ("sem".to_owned(), Some("sem".to_owned())),
        ]
    );
    drop(backend);
    for t in [
        table.clone(),
        format!("\"{name}_permits\""),
        format!("\"{name}_rw\""),
        format!("\"{name}_queue\""),
    ] {
        drop_table(&pool, &t).await;
    }
}

async fn sqlx_exec(pool: &leasehold::sqlx::PgPool, sql: &str) {
    leasehold::sqlx::query(sql).execute(pool).await.unwrap();
}

#[tokio::test]
async fn postgres_a_table_without_kinds_keeps_its_leases_and_tokens() {
    let Some(server) = url() else { return };
    old_table_keeps_leases_and_tokens(&server, &server).await;
}

#[tokio::test]
async fn pgbouncer_a_table_without_kinds_keeps_its_leases_and_tokens() {
    let Some(server) = url() else { return };
    let Some(pooler) = server_url("LEASEHOLD_TEST_PGBOUNCER") else {
        return;
    };
    old_table_keeps_leases_and_tokens(&format!("{pooler}?pooler=transaction"), &server).await;
}
