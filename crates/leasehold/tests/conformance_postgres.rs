//! The shared conformance suite on PostgreSQL (`LEASEHOLD_TEST_POSTGRES`),
//! woken and polling; the second client is a backend with its own pool, as
//! another process has.
//!
//! All tests share the default lease table; the suite gives each test its
//! own random key prefix, so they run in parallel on one server.
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::sync::Arc;

use leasehold::conformance::TestStore;

async fn store() -> Option<TestStore> {
    let url = postgres::url()?;
    let store = TestStore::new(Arc::new(postgres::connect(&url).await))
        .with_second_client(Arc::new(postgres::connect(&url).await))
        .with_url_at_port(postgres::url_at_port)
        .with_blocker(move |key| {
            let url = url.clone();
            async move { postgres::row_lock(&url, "leasehold_locks", key.as_str()).await }
        });
    let down = postgres::url_at_port(common::closed_port());
    Some(postgres::with_bad_options(store, down))
}

leasehold::conformance_tests!(store; options, unreachable, blocking);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
