//! The shared conformance suite on PostgreSQL (`LEASEHOLD_TEST_POSTGRES`).
//!
//! All tests share the default lease table; the suite gives each test its
//! own random key prefix, so they run in parallel on one server.
#![cfg(all(feature = "conformance", feature = "postgres"))]

use std::sync::Arc;

use leasehold::backends::postgres::PostgresBackend;
use leasehold::conformance::{server_url, TestStore};

async fn store() -> Option<TestStore> {
    let url = server_url("LEASEHOLD_TEST_POSTGRES")?;
    let backend = PostgresBackend::connect(&url)
        .await
        .expect("connect to LEASEHOLD_TEST_POSTGRES");
    Some(TestStore::new(Arc::new(backend)))
}

leasehold::conformance_tests!(store);
