//! The shared conformance suite on SQLite, one fresh database file per test,
//! woken and polling; the second client is another pool on the same file.
#![cfg(all(feature = "conformance", feature = "sqlite"))]

#[path = "support/sqlite.rs"]
mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;

use leasehold::backends::sqlite::SqliteBackend;
use leasehold::conformance::{unblock, TestStore};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

async fn store() -> Option<TestStore> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("locks.db");
    let open =
        |path| async move { Arc::new(SqliteBackend::open(path).await.expect("open sqlite")) };
    let (backend, second) = (open(path.clone()).await, open(path.clone()).await);
    let passes = backend.clone();
    let counted = path.clone();
    Some(
        TestStore::new(backend)
            .with_second_client(second)
            .with_bad_option("sqlite path", || SqliteBackend::open(""))
            // The whole database's write lock, held by another connection.
            .with_blocker(move |_key| {
                let path = path.clone();
                async move {
                    let writer = sqlite::busy_writer_at(&path).await;
                    unblock(move || sqlite::commit(writer))
                }
            })
            .with_sweep(
                move |window| {
                    let backend = passes.clone();
                    async move { backend.sweep_idle(window).await }
                },
                move |prefix| records(counted.clone(), prefix),
            )
            .keeping(dir),
    )
}

/// The rows of every table of the file at `path` whose key starts with
/// `prefix`.
async fn records(path: PathBuf, prefix: String) -> u64 {
    let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path))
        .await
        .expect("open the file");
    let mut total = 0;
    for table in sqlite::TABLES {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE substr(key, 1, length(?1)) = ?1"
        ))
        .bind(&prefix)
        .fetch_one(&pool)
        .await
        .expect("count rows");
        total += n.unsigned_abs();
    }
    pool.close().await;
    total
}

leasehold::conformance_tests!(store; options, blocking, sweep, queue);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
