//! The shared conformance suite on SQLite, one fresh database file per test.
#![cfg(all(feature = "conformance", feature = "sqlite"))]

use std::sync::Arc;

use leasehold::backends::sqlite::SqliteBackend;
use leasehold::conformance::TestStore;

async fn store() -> Option<TestStore> {
    let dir = tempfile::tempdir().expect("temp dir");
    let backend = SqliteBackend::open(dir.path().join("locks.db"))
        .await
        .expect("open sqlite");
    Some(TestStore::new(Arc::new(backend)).keeping(dir))
}

leasehold::conformance_tests!(store);
