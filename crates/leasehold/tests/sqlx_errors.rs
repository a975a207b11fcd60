//! A `sqlx::Error` from the user's own queries converts into
//! `leasehold::Error` by the rules of the database that raised it, so `?`
//! works on both in one function and `is_retryable()` stays meaningful.
//! Real errors from real databases: SQLite in a temp dir, PostgreSQL from
//! `LEASEHOLD_TEST_POSTGRES` (skipped without it, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(any(feature = "sqlite", feature = "postgres"))]

#[cfg(feature = "sqlite")]
#[path = "support/sqlite.rs"]
mod sqlite;

use leasehold::sqlx;
use leasehold::Error;

/// `e` converted: transient (`Unavailable`, retryable).
fn expect_transient(e: sqlx::Error) {
    let e = Error::from(e);
    assert!(matches!(e, Error::Unavailable { .. }), "transient: {e}");
    assert!(e.is_retryable());
}

/// `e` converted: permanent (`Backend`, neither retryable nor a lost lease).
fn expect_permanent(e: sqlx::Error) {
    let e = Error::from(e);
    assert!(matches!(e, Error::Backend { .. }), "permanent: {e}");
    assert!(!e.is_retryable() && !e.is_lease_lost());
}

/// SQLite's busy answer (SQLITE_BUSY, code 5) is transient for SQLite; a
/// PostgreSQL reading of the code would call it permanent.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_sqlite_busy_error_is_unavailable_and_a_syntax_error_is_permanent() {
    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::{Connection, SqliteConnection};

    let dir = tempfile::tempdir().unwrap();
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("data.db"))
        .create_if_missing(true)
        .busy_timeout(std::time::Duration::ZERO);
    let mut other = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::query("CREATE TABLE t (x INTEGER)")
        .execute(&mut other)
        .await
        .unwrap();
    let _writer = sqlite::busy_writer(options).await;

    let busy = sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut other)
        .await;
    expect_transient(busy.unwrap_err());

    let syntax = sqlx::query("SELEC 1").execute(&mut other).await;
    expect_permanent(syntax.unwrap_err());
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Duration;

    use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
    use leasehold::conformance::server_url;
    use leasehold::sqlx::{self, postgres::PgPoolOptions};
    use leasehold::Locks;

    /// A pool of up to `max_connections` to the test server, if there is one.
    async fn test_pool(max_connections: u32) -> Option<sqlx::PgPool> {
        let url = server_url("LEASEHOLD_TEST_POSTGRES")?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&url)
            .await
            .unwrap();
        Some(pool)
    }

    /// A cancelled statement (57014, here `statement_timeout`) is transient;
    /// a missing table is not.
    #[tokio::test]
    async fn postgres_errors_are_classified_by_sqlstate() {
        let Some(pool) = test_pool(2).await else {
            return;
        };
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SET LOCAL statement_timeout = 10")
            .execute(&mut *tx)
            .await
            .unwrap();
        let cancelled = sqlx::query("SELECT pg_sleep(5)").execute(&mut *tx).await;
        super::expect_transient(cancelled.unwrap_err());
        drop(tx);

        let missing = sqlx::query("SELECT * FROM leasehold_no_such_table")
            .execute(&pool)
            .await;
        super::expect_permanent(missing.unwrap_err());
    }

    /// The documented `check_in` function: `?` on sqlx and leasehold calls
    /// in one function returning `leasehold::Result`, and a stale holder is
    /// told apart by `is_lease_lost()`.
    #[tokio::test]
    async fn check_in_and_own_queries_compose_with_question_mark() {
        let Some(pool) = test_pool(4).await else {
            return;
        };
        let backend = PostgresBackend::from_pool(pool, PostgresOptions::new())
            .await
            .unwrap();
        let locks = Locks::new(backend.clone());
        let key = format!("sqlx-errors:{:016x}", rand::random::<u64>());
        let guard = locks.acquire(&key, Duration::from_secs(5)).await.unwrap();

        async fn write(
            backend: &PostgresBackend,
            guard: &leasehold::LeaseGuard,
        ) -> leasehold::Result<i32> {
            let mut tx = backend.pool().begin().await?;
            backend.check_in(&mut tx, guard.lease()).await?;
            let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *tx).await?;
            tx.commit().await?;
            Ok(one)
        }

        assert_eq!(write(&backend, &guard).await.unwrap(), 1);
        assert!(locks.force_release(&key).await.unwrap());
        let stale = write(&backend, &guard).await.unwrap_err();
        assert!(stale.is_lease_lost(), "{stale}");
    }
}
