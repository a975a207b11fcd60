//! The shared conformance suite on Redis (`LEASEHOLD_TEST_REDIS`), one random
//! key prefix per test so the tests run in parallel on one server.
#![cfg(all(feature = "conformance", feature = "redis"))]

use std::sync::Arc;

use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::{server_url, TestStore};

async fn store() -> Option<TestStore> {
    let url = server_url("LEASEHOLD_TEST_REDIS")?;
    let options =
        RedisOptions::new().with_prefix(format!("leasehold-test-{:016x}", rand::random::<u64>()));
    let backend = RedisBackend::connect_with(&url, options)
        .await
        .expect("connect to LEASEHOLD_TEST_REDIS");
    Some(TestStore::new(Arc::new(backend)))
}

leasehold::conformance_tests!(store);
