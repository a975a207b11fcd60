//! The model-based property test on Redis (`LEASEHOLD_TEST_REDIS`), with
//! the real-clock variant (no expiry during a case), as on SQLite.
#![cfg(all(feature = "conformance", feature = "redis"))]

mod lease_model;

use std::sync::Arc;

use lease_model::{ops, run, Clock, Tokens};
use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::server_url;
use leasehold::Backend;
use proptest::prelude::*;

#[test]
fn redis_store_matches_the_model() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let options =
        RedisOptions::new().with_prefix(format!("leasehold-test-{:016x}", rand::random::<u64>()));
    let backend: Arc<dyn Backend> = Arc::new(
        rt.block_on(RedisBackend::connect_with(&url, options))
            .unwrap(),
    );
    proptest!(ProptestConfig::with_cases(48), |(ops in ops(Clock::Real))| {
        rt.block_on(run(backend.clone(), Clock::Real, Tokens::Increasing, &format!("case{:016x}:", rand::random::<u64>()), &ops));
    });
}
