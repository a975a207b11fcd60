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

leasehold::conformance_tests!(store; options, unreachable, blocking, queue);

/// Group `sweep` on a table of its own: its passes (1 ms window) would
/// otherwise delete the idle rows of every test on the shared table.
mod sweep {
    use std::sync::Arc;

    use leasehold::conformance::TestStore;
    use leasehold::sqlx;

    use super::postgres;

    const TABLE: &str = "leasehold_sweep_conformance";

    async fn store() -> Option<TestStore> {
        let url = postgres::url()?;
        let backend = postgres::on_table(&url, TABLE).await;
        let pool = postgres::pool(&url).await;
        let passes = backend.clone();
        Some(TestStore::new(Arc::new(backend)).with_sweep(
            move |window| {
                let backend = passes.clone();
                async move { backend.sweep_idle(window).await }
            },
            move |prefix| {
                let pool = pool.clone();
                async move {
                    let mut total = 0;
                    for suffix in ["", "_permits", "_rw"] {
                        let n: i64 = sqlx::query_scalar(&format!(
                            "SELECT count(*) FROM {TABLE}{suffix} WHERE key LIKE $1 || '%'"
                        ))
                        .bind(&prefix)
                        .fetch_one(&pool)
                        .await
                        .expect("count rows");
                        total += n.unsigned_abs();
                    }
                    total
                }
            },
        ))
    }

    leasehold::conformance_tests!(@group sweep store);
}

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
