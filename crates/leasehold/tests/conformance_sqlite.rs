//! The shared conformance suite on SQLite, one fresh database file per test,
//! woken and polling; the second client is another pool on the same file.
#![cfg(all(feature = "conformance", feature = "sqlite"))]

#[path = "support/sqlite.rs"]
mod sqlite;

use std::sync::Arc;

use leasehold::backends::sqlite::SqliteBackend;
use leasehold::conformance::{unblock, TestStore};

async fn store() -> Option<TestStore> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("locks.db");
    let open =
        |path| async move { Arc::new(SqliteBackend::open(path).await.expect("open sqlite")) };
    let (backend, second) = (open(path.clone()).await, open(path.clone()).await);
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
            .keeping(dir),
    )
}

leasehold::conformance_tests!(store; options, blocking);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
