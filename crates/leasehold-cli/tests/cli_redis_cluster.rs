//! The `leasehold` binary against Redis Cluster, across real OS processes.
//!
//! Reads the cluster from `LEASEHOLD_TEST_REDIS_CLUSTER` (a
//! `redis+cluster://` URL; `scripts/services/redis-cluster.sh` starts one);
//! without it these tests skip (or fail, with `LEASEHOLD_REQUIRE_SERVERS=1`).
//! Each test uses its own key prefix. The demo, the bench and torture run
//! on the cluster too: their own Redis traffic goes through the same
//! cluster-aware connection as the locks.

mod common;
mod torture_common;

use common::*;

/// The cluster with a fresh key prefix, or `None` to skip.
fn cluster_store() -> Option<String> {
    redis_store_of("LEASEHOLD_TEST_REDIS_CLUSTER")
}

process_tests!(cluster_store());
// The demo's product and its lock share a slot: the race and both safe
// strategies show on a cluster as on one server.
demo_tests_without_row_lock!(cluster_store(), "redis");

/// The report: through one node, half the keys failed with MOVED.
/// Twelve keys spread over the slots of all three primaries.
#[test]
fn every_key_runs_whichever_node_owns_its_slot() {
    let Some(store) = cluster_store() else { return };
    for i in 0..12 {
        let key = format!("key-{i}");
        let out = run(leasehold(&store).args(["run", &key, "--", "true"]));
        assert!(out.status.success(), "{key}: {}", stderr(&out));
    }
}

/// Needs no server: the point is that there is none.
#[test]
fn a_cluster_that_is_down_exits_69_quickly_with_one_line() {
    let ports = free_ports(2);
    let store = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
        ports[0], ports[1]
    );
    let err = down_store_stderr(&store, &["run", "k", "--", "true"]);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Kills and pauses aimed at holders, on a cluster (no proxy: the URL names
/// several nodes). The failover run is in torture_redis_cluster_failover.rs.
#[test]
fn torture_passes_under_kills_and_pauses() {
    let Some(store) = cluster_store() else { return };
    torture_common::fenced_run_passes_and_faults_hit(&store, &["--faults", "kill,pause"]);
}
