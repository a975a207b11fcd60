//! Model-based property test of the lease protocol on the in-memory store,
//! which reads tokio's clock: on paused time, `Advance` moves the store's
//! clock exactly, so expiry, renewal and remaining ttls compare exactly.

mod lease_model;

use std::sync::Arc;

use lease_model::{ops, run, Clock, Tokens};
use leasehold::backends::memory::MemoryBackend;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn memory_store_matches_the_model(ops in ops(Clock::Paused)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(run(Arc::new(MemoryBackend::new()), Clock::Paused, Tokens::Next, "p:", &ops));
    }
}
