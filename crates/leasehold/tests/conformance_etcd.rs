//! The shared conformance suite on a single etcd member
//! (`LEASEHOLD_TEST_ETCD`), woken by the watch and polling; the second
//! client is another backend (its own connection and watch).
#![cfg(all(feature = "conformance", feature = "etcd"))]

#[path = "support/etcd.rs"]
mod etcd_fixtures;

async fn store() -> Option<leasehold::conformance::TestStore> {
    etcd_fixtures::conformance_store("LEASEHOLD_TEST_ETCD").await
}

leasehold::conformance_tests!(store; options, unreachable);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}
