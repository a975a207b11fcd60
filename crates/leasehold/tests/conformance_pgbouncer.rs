//! The shared conformance suite on PostgreSQL through PgBouncer in
//! transaction pooling mode (`LEASEHOLD_TEST_PGBOUNCER`, started by
//! scripts/services/pgbouncer.sh), twice: woken by a `LISTEN` connection
//! past the pooler (`?listen_url=` the server in `LEASEHOLD_TEST_POSTGRES`),
//! and polling (no listen URL).
#![cfg(all(feature = "conformance", feature = "postgres"))]

use std::sync::Arc;

use leasehold::backends::postgres::PostgresBackend;
use leasehold::conformance::{server_url, TestStore};

async fn connect(url: String) -> PostgresBackend {
    PostgresBackend::connect(&url)
        .await
        .expect("connect through LEASEHOLD_TEST_PGBOUNCER")
}

mod listening {
    use super::*;

    async fn store() -> Option<TestStore> {
        let pooler = server_url("LEASEHOLD_TEST_PGBOUNCER")?;
        let server = server_url("LEASEHOLD_TEST_POSTGRES")?;
        let backend = connect(format!("{pooler}?pooler=transaction&listen_url={server}")).await;
        Some(TestStore::new(Arc::new(backend)))
    }

    leasehold::conformance_tests!(store);
}

mod polling {
    use super::*;

    async fn store() -> Option<TestStore> {
        let pooler = server_url("LEASEHOLD_TEST_PGBOUNCER")?;
        let backend = connect(format!("{pooler}?pooler=transaction")).await;
        Some(TestStore::new(Arc::new(backend)).without_notifications())
    }

    leasehold::conformance_tests!(store);
}
