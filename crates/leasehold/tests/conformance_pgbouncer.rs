//! The shared conformance suite on PostgreSQL through PgBouncer in
//! transaction pooling mode (`LEASEHOLD_TEST_PGBOUNCER`, started by
//! scripts/services/pgbouncer.sh), twice: woken by a `LISTEN` connection
//! past the pooler (`?listen_url=` the server in `LEASEHOLD_TEST_POSTGRES`),
//! and polling (no listen URL). Row locks that block a key are taken on
//! the server directly.
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::sync::Arc;

use leasehold::backends::postgres::PostgresBackend;
use leasehold::conformance::{server_url, TestStore};

/// Two clients through the pooler at `url`, blocked through the server.
async fn store_at(url: String) -> Option<TestStore> {
    let server = postgres::url()?;
    let connect = || async {
        let backend = PostgresBackend::connect(&url)
            .await
            .expect("connect through LEASEHOLD_TEST_PGBOUNCER");
        Arc::new(backend)
    };
    Some(
        TestStore::new(connect().await)
            .with_second_client(connect().await)
            .with_blocker(move |key| {
                let server = server.clone();
                async move { postgres::row_lock(&server, "leasehold_locks", key.as_str()).await }
            }),
    )
}

mod listening {
    use super::*;

    async fn store() -> Option<TestStore> {
        let pooler = server_url("LEASEHOLD_TEST_PGBOUNCER")?;
        let server = server_url("LEASEHOLD_TEST_POSTGRES")?;
        store_at(format!("{pooler}?pooler=transaction&listen_url={server}")).await
    }

    leasehold::conformance_tests!(store; blocking, queue);
}

mod polling {
    use super::*;

    async fn store() -> Option<TestStore> {
        let pooler = server_url("LEASEHOLD_TEST_PGBOUNCER")?;
        let store = store_at(format!("{pooler}?pooler=transaction")).await?;
        Some(store.without_notifications())
    }

    leasehold::conformance_tests!(store; blocking);
}
