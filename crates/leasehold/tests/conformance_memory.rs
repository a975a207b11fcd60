//! The shared conformance suite on the in-memory reference store.
#![cfg(feature = "conformance")]

use std::sync::Arc;

use leasehold::backends::memory::MemoryBackend;
use leasehold::conformance::TestStore;

async fn store() -> Option<TestStore> {
    Some(TestStore::new(Arc::new(MemoryBackend::new())))
}

leasehold::conformance_tests!(store);
