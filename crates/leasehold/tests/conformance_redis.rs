//! The shared conformance suite on Redis (`LEASEHOLD_TEST_REDIS`), woken and
//! polling, one random key prefix per test so the tests run in parallel on
//! one server; the second client is another backend on the same prefix.
#![cfg(all(feature = "conformance", feature = "redis"))]

use leasehold::backends::redis::RedisOptions;
use leasehold::conformance::TestStore;

#[path = "support/redis.rs"]
mod redis_fixtures;

async fn store() -> Option<TestStore> {
    redis_fixtures::conformance_store("LEASEHOLD_TEST_REDIS", "redis", RedisOptions::new()).await
}

leasehold::conformance_tests!(store; options, unreachable, queue, hand_off);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
