//! The shared conformance suite on a 3-member etcd cluster
//! (`LEASEHOLD_TEST_ETCD_CLUSTER`, every member in the URL): requests go to
//! any member, which forwards writes to the leader; the watch may sit on a
//! follower.
#![cfg(all(feature = "conformance", feature = "etcd"))]

#[path = "support/etcd.rs"]
mod etcd_fixtures;

async fn store() -> Option<leasehold::conformance::TestStore> {
    etcd_fixtures::conformance_store("LEASEHOLD_TEST_ETCD_CLUSTER").await
}

leasehold::conformance_tests!(store; queue, hand_off);
