//! The shared conformance suite on the in-memory reference store, woken and
//! polling.
#![cfg(feature = "conformance")]

use std::sync::Arc;

use leasehold::backends::memory::MemoryBackend;
use leasehold::conformance::TestStore;

async fn store() -> Option<TestStore> {
    // A clone shares the store: the only other client memory can have.
    let backend = MemoryBackend::new();
    Some(TestStore::new(Arc::new(backend.clone())).with_second_client(Arc::new(backend)))
}

leasehold::conformance_tests!(store; queue, hand_off);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
